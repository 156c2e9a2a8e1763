"""Where a dataset lives. `classify_location` is the one place that decides what a location string
names: a local path, a URL, local WebDataset tars or tars by URL (`Location`), and where its
manifest is. `locate_dataset` opens the manifest and the shards of a dataset in a local folder or
at a URL (`DatasetLocation`).

Opening costs a bounded number of requests: the manifest is one GET; a shard is two range reads,
its header (whose size the manifest's schema gives) and its record table with its block
checksums and the footer (which start ``num_records * record_size + 8 * blocks + 64`` bytes
before the end, all known from the manifest; a shard older than 1.2 has no block checksums, and
its table lies inside that read too). A
tar shard (``shard_format: "tar"``) is one GET of its member index, whose size the manifest
gives; the tar itself is only read record by record (or, with the cache, downloaded whole).
"""

from __future__ import annotations

import enum
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from .._errors import DatasetNotFoundError, ManifestError
from .._storage.cache import CachedFile, ShardCache
from .._storage.local import LocalFile, LocalStore
from .._storage.options import RemoteOptions, default_cache_dir
from .._storage.protocol import ByteSource, Store
from .._storage.remote import FsspecStore
from .._storage.urls import is_url, local_path
from ..format._layout import (
    DEFAULT_ALIGNMENT,
    FOOTER_SIZE,
    HEADER_SIZE,
    MAX_MANIFEST_SIZE,
    TABLE_BLOCK_ROWS,
    align_up,
    blocks_read,
    table_blocks,
)
from ..format._manifest import MANIFEST_NAME, Manifest, ShardEntry
from ..format._schema import Schema

__all__ = [
    "DatasetLocation",
    "Location",
    "LocationKind",
    "classify_location",
    "locate_dataset",
    "split_manifest_url",
]

_TAR_SUFFIX = ".tar"
_PIPE = "pipe:"
"""webdataset's prefix for a shell command that writes a tar to stdout."""


class LocationKind(enum.Enum):
    """What a location string names (see `classify_location`)."""

    PATH = "path"
    """A local file or folder: a dataset root, a manifest, a source folder or listing."""
    URL = "url"
    """A remote object or prefix (``s3://``, ``gs://``, ``https://``, ``memory://``, ...)."""
    TARS = "tars"
    """Local WebDataset tars: a path ending in ``.tar`` that is not a folder, or a brace
    pattern of them (``shards-{000..099}.tar``)."""
    URL_TARS = "url-tars"
    """Tars named by URL, or by webdataset's ``pipe:`` command."""


@dataclass(frozen=True)
class Location:
    """What a location string names, as `classify_location` decides it.

    Attributes:
        kind: path, URL, local tars or tars by URL.
        text: the string as given.
        path: for `PATH` and `TARS`, the local path or brace pattern with ``file://`` stripped;
            None for the remote kinds.
        url: for `URL` and `URL_TARS`, the URL as given (query string and all); None for the
            local kinds.
    """

    kind: LocationKind
    text: str
    path: str | None = None
    url: str | None = None

    @property
    def is_remote(self) -> bool:
        """True for a URL (of a dataset or of tars): bytes come through a store, not a file."""
        return self.url is not None

    @property
    def is_tars(self) -> bool:
        """True if the location names WebDataset tars rather than a folder or a file."""
        return self.kind in (LocationKind.TARS, LocationKind.URL_TARS)

    def manifest_path(self) -> Path:
        """Return the manifest of a local dataset: the location itself if it is a file whose
        name ends in ``.json``, else ``manifest.json`` inside it.

        Raises:
            ValueError: the location is a URL (see `manifest_url`).
        """
        if self.path is None:
            raise ValueError(f"{self.text[:80]!r} is a URL, not a local path")
        path = Path(self.path)
        return path if _names_manifest(path.name) and not path.is_dir() else path / MANIFEST_NAME

    def manifest_url(self) -> tuple[str, str]:
        """Return (dataset root URL, manifest key) of a remote dataset: a URL whose path ends in
        ``.json`` names the manifest itself, any other names the root holding ``manifest.json``.
        A query string (a presigned URL's signature) stays on the root.

        Raises:
            ValueError: the location is local (see `manifest_path`).
        """
        if _names_manifest(self._url_parts()[0]):
            return self.split_url()
        base, suffix = self._url_parts()
        return base.rstrip("/") + suffix, MANIFEST_NAME

    def split_url(self) -> tuple[str, str]:
        """Return (URL of the folder, name) for the URL of one object, such as a listing
        (``s3://b/data/train.csv`` -> ``("s3://b/data", "train.csv")``); a query string stays on
        the folder.

        Raises:
            ValueError: the location is local.
        """
        base, suffix = self._url_parts()
        folder, _, name = base.rstrip("/").rpartition("/")
        return folder + suffix, name

    def _url_parts(self) -> tuple[str, str]:
        """(the URL without its query string, "?" and the query string or "")."""
        if self.url is None:
            raise ValueError(f"{self.text[:80]!r} is a local path, not a URL")
        base, question, query = self.url.partition("?")
        return base, question + query if question else ""


def classify_location(text: str | os.PathLike[str]) -> Location:
    """Decide what a location string names; every reader of a location asks here.

    The rules, in order:

    1. ``pipe:...`` (webdataset's shell command) names tars by URL.
    2. A URL (``scheme://`` with a scheme of two or more characters, other than ``file://``; see
       `storage.urls.is_url`) names tars if its path, without the query string, ends in
       ``.tar`` (a brace pattern too), else a remote dataset or source.
    3. Anything else is local, with ``file://`` stripped: tars if it ends in ``.tar`` and is not
       an existing folder, else a path.

    A list or tuple of locations always names tars: classify each item on its own. Only rule 3
    looks at the file system (whether the path is a folder).

    Examples::

        classify_location("s3://bucket/train")              # URL; .manifest_url() is
                                                            # ("s3://bucket/train", "manifest.json")
        classify_location("s3://bucket/lists/train.csv")    # URL; .split_url() is
                                                            # ("s3://bucket/lists", "train.csv")
        classify_location("file:///data/x-{000..009}.tar")  # TARS; .path is "/data/x-{000..009}.tar"
        classify_location("https://host/x.tar?sig=1")       # URL_TARS
        classify_location("/data/imagenet")                 # PATH; .manifest_path() is
                                                            # Path("/data/imagenet/manifest.json")

    Args:
        text: the location, as a user wrote it.

    Returns:
        A `Location`: its kind and the normalised path or URL.
    """
    text = os.fspath(text)
    if text.startswith(_PIPE):
        return Location(LocationKind.URL_TARS, text, url=text)
    if is_url(text):
        kind = LocationKind.URL_TARS if text.partition("?")[0].endswith(_TAR_SUFFIX) else LocationKind.URL
        return Location(kind, text, url=text)
    path = local_path(text)
    kind = LocationKind.TARS if path.endswith(_TAR_SUFFIX) and not os.path.isdir(path) else LocationKind.PATH
    return Location(kind, text, path=path)


def split_manifest_url(url: str) -> tuple[str, str]:
    """Return (dataset root URL, manifest key) for a dataset URL or the URL of its manifest:
    ``classify_location(url).manifest_url()``.

    Raises:
        ValueError: `url` is a local path.
    """
    return classify_location(url).manifest_url()


def _names_manifest(name: str) -> bool:
    """True if a file name (or a URL's path) names a manifest rather than a dataset root."""
    return name.endswith(".json")


def _shard_windows(entry: ShardEntry, schema: Schema) -> tuple[tuple[int, int], ...]:
    """The two ranges that validating a shard reads: its header, and its table with its block
    checksums and the footer (placed as a 1.2 writer places them: the table of an older shard,
    which has no block checksums, starts 8 bytes a block later, inside the same range).

    The header is 64 bytes plus the canonical schema, padded to the default alignment; a shard
    written with a larger alignment or another schema encoding only costs a further read.
    """
    header = align_up(HEADER_SIZE + len(schema.to_bytes()), DEFAULT_ALIGNMENT)
    table = entry.size - FOOTER_SIZE - entry.num_records * schema.record_dtype().itemsize - 8 * table_blocks(entry.num_records)
    return ((0, min(header, entry.size)), (max(0, table), entry.size))


def shard_read_ahead(entry: ShardEntry, schema: Schema, rows: list[int]) -> list[tuple[int, int]]:
    """What opening a binary shard and checking the table rows of records `rows` reads, placed
    from the manifest alone as a 1.2 writer places it (a read-ahead hint; a shard placed
    otherwise is read right all the same): the header, the block checksums with the footer,
    block 0, and each row's block with the block before it (rule 25 reads its last row)."""
    header, (table, end) = _shard_windows(entry, schema)
    row = schema.record_dtype().itemsize
    blocks = {0} | blocks_read(rows)
    ranges = [header, (table + entry.num_records * row, end)]
    for block in blocks:
        first = table + block * TABLE_BLOCK_ROWS * row
        ranges.append((first, min(first + TABLE_BLOCK_ROWS * row, table + entry.num_records * row)))
    return ranges


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

    def open_shard(self, entry: ShardEntry, schema: Schema, *, whole: bool = False) -> ByteSource:
        """Open a shard for `ShardReader`: mapped if local, two range reads if remote. For a
        tar shard, the tar: no read on open (its table comes from the member index). With
        `whole`, a remote shard is fetched whole at once (a full check reads every byte)."""
        if not self.is_remote:
            return LocalFile(self.store.describe(entry.path))
        windows = _shard_windows(entry, schema) if entry.index is None else ()
        if whole:
            windows = ((0, entry.size),)
        if self.cache is not None:
            return CachedFile(
                self.store,
                entry.path,
                size=entry.size,
                checksum=entry.checksum,
                cache=self.cache,
                namespace=self.namespace,
                windows=windows,
            )
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
    location = classify_location(path)
    if not location.is_remote:
        manifest = location.manifest_path()
        return DatasetLocation(LocalStore(manifest.parent), manifest.name, manifest.parent, os.fspath(manifest))
    root, key = location.manifest_url()
    store = FsspecStore(root, storage_options=options.storage_options, retry=options.retry)
    cache = None
    namespace = ""
    if options.mode == "cache":
        cache = ShardCache(options.cache_dir or default_cache_dir(), size_limit=options.cache_size)
        namespace = hashlib.sha256(store.root.encode()).hexdigest()[:16]
    return DatasetLocation(store, key, store.root, store.describe(key), cache, namespace)
