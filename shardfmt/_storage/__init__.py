"""Bytes only: local files (memory-mapped), remote objects through fsspec (range reads), a local
cache of whole remote shards, retries, atomic files and URLs, behind one small `Store` /
`ByteSource` protocol. Nothing here knows what a shard or a manifest is."""

from __future__ import annotations

from .local import LocalFile, LocalStore
from .options import DEFAULT_CACHE_SIZE, RemoteOptions, default_cache_dir
from .protocol import ByteSource, Store
from .retry import RetryPolicy
from .urls import Redactor, expand_user, is_url

__all__ = [
    "DEFAULT_CACHE_SIZE",
    "ByteSource",
    "LocalFile",
    "LocalStore",
    "Redactor",
    "RemoteOptions",
    "RetryPolicy",
    "expand_user",
    "Store",
    "default_cache_dir",
    "is_url",
    "open_source",
    "open_store",
]


def open_source(path: str) -> ByteSource:
    """Open `path` for range reads. Local paths are memory-mapped."""
    return LocalFile(path)


def open_store(location: str, *, remote: RemoteOptions | None = None) -> Store:
    """Open a local folder or a URL as a `Store` (credentials from `RemoteOptions.storage_options`)."""
    from .remote import FsspecStore
    from .urls import local_path

    if not is_url(location):
        return LocalStore(local_path(location))
    options = remote if remote is not None else RemoteOptions()
    return FsspecStore(location, storage_options=options.storage_options, retry=options.retry)
