"""Where a dataset lives: `locate_dataset` opens the manifest and the shards of a dataset in a local
folder or at a URL (`DatasetLocation`).

Opening costs a bounded number of requests: the manifest is one GET; a shard is two range reads,
its header (whose size the manifest's schema gives) and its record table with the footer (which
start ``num_records * record_size + 64`` bytes before the end, both known from the manifest). A
tar shard (``shard_format: "tar"``) is one GET of its member index, whose size the manifest
gives; the tar itself is only read record by record (or, with the cache, downloaded whole).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DatasetNotFoundError, ManifestError
from ..format.layout import (
    DEFAULT_ALIGNMENT,
    FOOTER_SIZE,
    HEADER_SIZE,
    MAX_MANIFEST_SIZE,
    align_up,
)
from ..format.manifest import Manifest, ShardEntry, find_manifest
from ..format.schema import Schema
from ..storage.cache import CachedFile, ShardCache
from ..storage.local import LocalFile, LocalStore
from ..storage.options import RemoteOptions, default_cache_dir
from ..storage.protocol import ByteSource, Store
from ..storage.remote import FsspecStore
from ..storage.urls import is_url, local_path, split_manifest_url

__all__ = ["DatasetLocation", "locate_dataset", "shard_windows"]


def shard_windows(entry: ShardEntry, schema: Schema) -> tuple[tuple[int, int], ...]:
    """The two ranges that validating a shard reads: its header, and its table with the footer.

    The header is 64 bytes plus the canonical schema, padded to the default alignment; a shard
    written with a larger alignment or another schema encoding only costs a further read.
    """
    header = align_up(HEADER_SIZE + len(schema.to_bytes()), DEFAULT_ALIGNMENT)
    table = entry.size - FOOTER_SIZE - entry.num_records * schema.record_dtype().itemsize
    return ((0, min(header, entry.size)), (max(0, table), entry.size))


@dataclass
class DatasetLocation:
    """Where a dataset lives and how its shards open.

    Attributes:
        store: the folder or bucket prefix holding manifest.json and the shards.
        manifest_key: the manifest's key in the store.
        root: the dataset root: a `Path` for a local dataset, the URL (without credentials)
            for a remote one.
        manifest_path: how messages name the manifest.
        cache: the shard cache in mode "cache", else None.
    """

    store: Store
    manifest_key: str
    root: Path | str
    manifest_path: str
    cache: ShardCache | None = None
    namespace: str = ""

    @property
    def is_remote(self) -> bool:
        return not isinstance(self.store, LocalStore)

    def load_manifest(self) -> Manifest:
        """Read and validate the manifest: one GET for a remote dataset (see `Manifest.load`)."""
        if not self.is_remote:
            return Manifest.load(self.manifest_path)
        try:
            data = self.store.get(self.manifest_key, start=0, stop=MAX_MANIFEST_SIZE + 1, exact=False)
        except FileNotFoundError as err:
            raise DatasetNotFoundError(
                "no manifest.json: not a shardfmt dataset, or its conversion has not finished", path=self.root
            ) from err
        if len(data) > MAX_MANIFEST_SIZE:
            raise ManifestError(f"more than the manifest limit of {MAX_MANIFEST_SIZE} bytes", path=self.manifest_path)
        return Manifest.from_bytes(data, path=self.manifest_path)

    def shard_path(self, entry: ShardEntry) -> str:
        """How messages name the shard of `entry`."""
        return self.store.describe(entry.path)

    def open_shard(self, entry: ShardEntry, schema: Schema) -> ByteSource:
        """Open a shard for `ShardReader`: mapped if local, two range reads if remote. For a
        tar shard, the tar: no read on open (its table comes from the member index)."""
        if not self.is_remote:
            return LocalFile(self.store.describe(entry.path))
        windows = shard_windows(entry, schema) if entry.index is None else ()
        if self.cache is not None:
            return CachedFile(self.store, entry.path, size=entry.size, checksum=entry.checksum, cache=self.cache, namespace=self.namespace, windows=windows)
        return self.store.open(entry.path, size=entry.size, windows=windows)

    def open_index(self, entry: ShardEntry) -> ByteSource:
        """Open the member index of a tar shard: mapped if local, one GET of the whole index
        (its size is in the manifest) if remote.

        Raises:
            ValueError: `entry` is not a tar shard.
        """
        if entry.index is None:
            raise ValueError(f"shard {entry.path} has no member index: it is not a tar shard")
        if not self.is_remote:
            return LocalFile(self.store.describe(entry.index.path))
        return self.store.open(entry.index.path, size=entry.index.size, windows=((0, entry.index.size),))

    def fetch_shard(self, entry: ShardEntry) -> None:
        """Bring a whole shard into the cache (mode "cache"); nothing otherwise."""
        if self.cache is not None:
            self.cache.fetch(self.store, entry.path, size=entry.size, checksum=entry.checksum, namespace=self.namespace)


def locate_dataset(path: str | os.PathLike[str], *, remote: RemoteOptions | None = None) -> DatasetLocation:
    """Find the dataset at a local path or URL (its root, or its manifest.json).

    Raises:
        RemoteError: the URL's scheme has no fsspec implementation installed.
    """
    options = remote if remote is not None else RemoteOptions()
    text = os.fspath(path)
    if not is_url(text):
        manifest = find_manifest(local_path(text))
        return DatasetLocation(LocalStore(manifest.parent), manifest.name, manifest.parent, os.fspath(manifest))
    root, key = split_manifest_url(text)
    store = FsspecStore(root, storage_options=options.storage_options, retry=options.retry)
    cache = None
    namespace = ""
    if options.mode == "cache":
        cache = ShardCache(options.cache_dir or default_cache_dir(), size_limit=options.cache_size)
        namespace = hashlib.sha256(store.root.encode()).hexdigest()[:16]
    return DatasetLocation(store, key, store.root, store.describe(key), cache, namespace)

