"""How a dataset given by URL is read: `RemoteOptions` (range reads or a local shard cache,
credentials, retries, prefetch) and the default cache folder."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .retry import RetryPolicy

__all__ = ["DEFAULT_CACHE_SIZE", "RemoteOptions", "default_cache_dir"]

DEFAULT_CACHE_SIZE: Final = 32 << 30
"""Default size limit of the shard cache: 32 GiB."""
MODES: Final = ("range", "cache")


def default_cache_dir() -> str:
    """``$SHARDFMT_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardfmt``, else ``~/.cache/shardfmt``."""
    if os.environ.get("SHARDFMT_CACHE_DIR"):
        return os.environ["SHARDFMT_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardfmt")


@dataclass(frozen=True)
class RemoteOptions:
    """How to read a dataset given by URL.

    Attributes:
        mode: "range" (default): records are fetched on demand with ranged GETs, nothing is
            written locally. "cache": each shard is downloaded whole into `cache_dir` on first
            use, checked against the manifest's checksum, and read memory-mapped from there.
        cache_dir: the cache folder (default `default_cache_dir()`); one folder may serve many
            processes and datasets at once.
        cache_size: bytes the cache may hold before the least recently used shards are removed
            (default 32 GiB); at least the largest shard.
        storage_options: passed to fsspec: credentials, ``endpoint_url``, ``anon``, ...; kept
            out of `repr`, error messages and logs.
        retry: attempts and backoff of every request.
        prefetch_shards: with mode "cache", how many shards the `Loader` downloads ahead of the
            ones its workers are reading, in the order its batches need them.
        prefetch_threads: parallel downloads of the prefetcher.
    """

    mode: str = "range"
    cache_dir: str | None = None
    cache_size: int = DEFAULT_CACHE_SIZE
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    retry: RetryPolicy = RetryPolicy()
    prefetch_shards: int = 4
    prefetch_threads: int = 4

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.cache_size < 1:
            raise ValueError(f"cache_size must be positive, got {self.cache_size}")
        if self.prefetch_shards < 0 or self.prefetch_threads < 1:
            raise ValueError("prefetch_shards must be >= 0 and prefetch_threads >= 1")
