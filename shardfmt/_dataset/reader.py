"""`DatasetReader` and `open_dataset`: the shards a manifest lists (binary or tar, local or by URL),
or local tars opened directly, as one indexable sequence of records."""

from __future__ import annotations

import bisect
import functools
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np

from .._arguments import check_path
from .._checksum import checksum, format_checksum
from .._errors import FormatError, ManifestError, RemoteError, ShardNotFoundError
from .._storage import LocalFile, LocalStore, RemoteOptions, expand_user
from .._storage.local import read_ahead
from ..format._manifest import ShardEntry
from ..format._reader import Record, ShardReader, ShardReaderBase
from ..format._schema import IMAGE_CLASSIFICATION, Schema
from ..tar._reader import TarShardReader
from .locate import DatasetLocation, locate_dataset, shard_read_ahead
from .tars import open_tars, tar_sources

__all__ = ["DatasetReader", "open_dataset", "open_located_shard", "open_shard"]


class DatasetReader:
    """A dataset: the shards its manifest lists, as one sequence of records.

    Shards are opened lazily, on the first access to one of their records, and each is checked
    against the manifest's size on open. Binary shards are read by `ShardReader`, tar shards
    (``shard_format: "tar"``) by `tar.reader.TarShardReader` through their member index; both
    offer the same record table. Use `open_dataset` to make one.

    A dataset given by URL is read through `location` (range reads or the shard cache of
    `RemoteOptions`), binary and tar shards alike; tars themselves must be local to be opened
    directly.

    Attributes:
        location: where the manifest and shards live, and how shards open (`locate.DatasetLocation`).
        root: the directory shard paths are relative to (for a URL: the URL, without credentials).
        index_root: the directory index paths of tar shards are relative to: `root`, except for
            tars opened directly, whose indexes live in a cache (see `open_dataset`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        verify: bool = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        path = expand_user(path)
        for item in path if isinstance(path, (list, tuple)) else [path]:
            if isinstance(item, (str, os.PathLike)):
                check_path("path", item)  # a 100,000-character path is a ValueError, not ENAMETOOLONG
        tars = tar_sources(path)
        self._confine = tars is None  # shards a manifest names stay inside its root; tars named directly need not
        if tars is None:
            # tar_sources took every list or tuple: what is left names one dataset
            self.location = locate_dataset(cast("str | os.PathLike[str]", path), remote=remote)
            self.manifest = self.location.load_manifest()
            self.root = self.location.root
            self.index_root = self.root
        else:
            self.manifest, root, self.index_root = open_tars(tars)
            self.root = root
            self.location = DatasetLocation(LocalStore(root), "manifest.json", root, os.fspath(root / "manifest.json"))
        self._check_cache_size()
        self.verify = verify
        self.schema = self.manifest.schema
        self.classes = self.manifest.classes
        counts = [shard.num_records for shard in self.manifest.shards]
        self.cumulative = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._readers: dict[int, ShardReaderBase] = {}

    def __len__(self) -> int:
        return int(self.cumulative[-1])

    @property
    def fingerprint(self) -> str:
        """What the records are, as 16 hex digits: the XXH3-64 of every shard's record count,
        size and checksum (from the manifest, in order), and the schema. Two datasets with the
        same records have the same fingerprint wherever they lie; a loader state records it, so
        that a state is not loaded into a loader of another dataset of the same length."""
        shards = [[entry.num_records, entry.size, entry.checksum] for entry in self.manifest.shards]
        text = json.dumps({"schema": self.manifest.schema.to_json(), "shards": shards}, sort_keys=True, separators=(",", ":"))
        return format_checksum(checksum(text.encode()))

    def _check_cache_size(self) -> None:
        """A shard cache must hold the largest shard (else no worker could read it): said now,
        with the size to ask for, rather than at the first record of that shard."""
        cache = self.location.cache
        if cache is None or not self.manifest.shards:
            return
        largest = max(self.manifest.shards, key=lambda entry: entry.size)
        if largest.size > cache.size_limit:
            raise RemoteError(
                f"shard {largest.path} is {largest.size} bytes, more than the shard cache may hold "
                f"(cache_size={cache.size_limit}): raise cache_size to at least {largest.size}",
                path=self.location.manifest_path,
            )

    @property
    def num_shards(self) -> int:
        return len(self.manifest.shards)

    @property
    def is_remote(self) -> bool:
        """Whether the dataset is read by URL."""
        return bool(self.location.is_remote)

    @property
    def strict_jpeg(self) -> bool:
        """Whether the manifest says every JPEG payload decodes without error (``strict_jpeg``)."""
        return bool(self.manifest.strict_jpeg)

    def shard(self, shard_index: int) -> ShardReaderBase:
        """Open (once) and return shard number `shard_index`, checked against the manifest: a
        `ShardReader`, or a `tar.reader.TarShardReader` for a tar shard."""
        reader = self._readers.get(shard_index)
        if reader is None:
            entry = self.manifest.shards[shard_index]
            if not self.location.is_remote:
                reader = open_shard(
                    Path(self.root), entry, verify=self.verify, index_root=Path(self.index_root), confine=self._confine, schema=self.schema
                )
            else:
                reader = self._open_remote(entry)
            try:
                self._check_shard(entry, reader)
            except BaseException:
                reader.close()
                raise
            self._readers[shard_index] = reader
        return reader

    def read_ahead(self, shards: list[int], rows: list[int]) -> None:
        """Hint the kernel to read, all at once, what reading records `rows` of `shards` (one
        pair per record) will first need of a local dataset: of a binary shard not open yet,
        its header, footer, block checksums and the table blocks of the rows; of one open, the
        table blocks of the rows not verified yet. From a cold page cache the disk then serves
        a chunk's shard opens and table checks together, not one after another. Nothing for a
        remote dataset, whose opens are range reads of windows."""
        if self.location.is_remote:
            return
        rows_of: dict[int, list[int]] = {}
        for shard, row in zip(shards, rows, strict=True):
            rows_of.setdefault(shard, []).append(row)
        for shard, of_shard in rows_of.items():
            reader = self._readers.get(shard)
            if reader is None:
                entry = self.manifest.shards[shard]
                if entry.index is None:
                    read_ahead(Path(self.root) / entry.path, shard_read_ahead(entry, self.schema, of_shard), size=entry.size)
            elif isinstance(reader.source, LocalFile):
                ranges = reader.unread_table(of_shard)
                if ranges:
                    reader.source.prefetch(ranges)

    def _check_shard(self, entry: ShardEntry, reader: ShardReaderBase) -> None:
        """Manifest step 12: the shard agrees with its entry and with the manifest."""
        manifest_path = self.location.manifest_path
        if len(reader) != entry.num_records:
            raise ManifestError(
                f"shard {entry.path} holds {len(reader)} records but the manifest says {entry.num_records}", path=manifest_path
            )
        if reader.schema != self.schema:
            raise ManifestError(f"shard {entry.path} has a schema that differs from the manifest's", path=manifest_path)
        # a shard reader is a TarShardReader or a ShardReader
        major, minor = reader.index.version if isinstance(reader, TarShardReader) else cast(ShardReader, reader).version
        stated = self.manifest.format_version
        if major != stated[0] or minor > stated[1]:
            raise ManifestError(
                f"{'index of ' if entry.index is not None else ''}shard {entry.path} has format version {major}.{minor}, "
                f"newer than the manifest's {stated[0]}.{stated[1]}",
                path=manifest_path,
            )
        if self.classes is not None and "label" in self.schema.names and self.schema.field("label").type == "int64":
            reader.add_row_check(functools.partial(check_labels_rows, num_classes=len(self.classes)))

    def _open_remote(self, entry: ShardEntry) -> ShardReaderBase:
        return open_located_shard(self.location, entry, self.schema, verify=self.verify)

    def shard_path(self, shard_index: int) -> str:
        """How messages name shard number `shard_index` (a path, or a URL without credentials)."""
        return self.location.shard_path(self.manifest.shards[shard_index])

    def open_shards(self, shard_indices: Sequence[int], *, threads: int = 16) -> None:
        """Open several shards at once, `threads` at a time for a remote dataset (each costs
        two range reads), in this thread for a local one."""
        todo = [i for i in shard_indices if i not in self._readers]
        if not self.location.is_remote or len(todo) < 2:
            for i in todo:
                self.shard(i)
            return
        with ThreadPoolExecutor(min(threads, len(todo))) as pool:
            list(pool.map(self.shard, todo))

    def locate(self, index: int) -> tuple[int, int]:
        """Return (shard number, record number within it) of dataset record `index`."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"record {index} out of range for a dataset of {n}")
        index %= n
        shard_index = bisect.bisect_right(self.cumulative, index) - 1
        return shard_index, index - int(self.cumulative[shard_index])

    def __getitem__(self, index: int) -> Record:
        shard_index, local = self.locate(index)
        return self.shard(shard_index).record(local)

    def __iter__(self) -> Iterator[Record]:
        for shard_index in range(len(self.manifest.shards)):
            yield from self.shard(shard_index)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __enter__(self) -> DatasetReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_shard(
    root: Path, entry: ShardEntry, *, verify: bool = True, index_root: Path | None = None, confine: bool = True,
    schema: Schema = IMAGE_CLASSIFICATION,
) -> ShardReaderBase:
    """Open the shard a manifest entry names, checked against the entry's sizes.

    Args:
        root: the folder the entry's path is relative to.
        entry: the manifest entry.
        verify: check each record's checksum when its payload is read.
        index_root: the folder a tar shard's index path is relative to (default `root`).
        confine: refuse a shard (or index) whose path, symbolic links resolved, leaves its root.
        schema: the manifest's schema, which a tar shard is read with (a binary shard states its own).

    Returns:
        A `ShardReader`, or a `tar.reader.TarShardReader` for an entry with an index.

    Raises:
        ShardNotFoundError: the shard (or index) leaves its root, does not exist or is not a file.
    """
    index_root = root if index_root is None else index_root
    if confine:
        _check_inside(root, entry.path)
        if entry.index is not None:
            _check_inside(index_root, entry.index.path)
    if entry.index is None:
        return ShardReader(root / entry.path, verify=verify, expected_size=entry.size)
    return TarShardReader(
        root / entry.path,
        index=index_root / entry.index.path,
        verify=verify,
        expected_size=entry.size,
        expected_index_size=entry.index.size,
        schema=schema,
    )


def open_located_shard(
    location: DatasetLocation, entry: ShardEntry, schema: Schema, *, verify: bool = True, whole: bool = False
) -> ShardReaderBase:
    """Open the shard a manifest entry names, wherever its dataset lives: a local one as
    `open_shard` does; one given by URL, a binary shard with two range reads (header; table and
    footer), a tar shard with one GET of its member index and none of the tar.

    Args:
        location: the dataset's location (`locate.locate_dataset`).
        entry, schema: the shard's manifest entry and the manifest's schema.
        verify: check each record's checksum when its payload is read.
        whole: fetch a remote shard whole at once, for a check that reads every byte of it.

    Raises:
        ShardNotFoundError: the shard (or index) is missing or leaves its root.
        FormatError: it breaks a structural rule.
        RemoteError: the store failed after its retries.
    """
    if not location.is_remote:
        return open_shard(Path(location.root), entry, verify=verify, schema=schema)
    source = location.open_shard(entry, schema, whole=whole)
    try:
        if entry.index is None:
            return ShardReader(source.path, verify=verify, expected_size=entry.size, source=source)
        index = location.open_index(entry)
        return TarShardReader(
            source.path, index=index.path, verify=verify, expected_size=entry.size,
            expected_index_size=entry.index.size, source=source, index_source=index, schema=schema,
        )
    except BaseException:
        source.close()
        raise


def _check_inside(root: Path, relative: str) -> None:
    """Manifest step 10: the file a manifest path names, every symbolic link resolved, lies
    inside the dataset root (itself resolved), so a dataset from a stranger cannot make the
    reader open any other file the user can read."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(root / relative)
    if os.path.commonpath([real_root, real]) != real_root:
        raise ShardNotFoundError(
            f"is a symbolic link (or lies under one) that resolves to {os.path.relpath(real, real_root)}, outside the "
            "dataset root; a reader does not follow links out of the root",
            path=root / relative,
        )


def check_labels(reader: ShardReaderBase, schema: Schema, num_classes: int) -> None:
    """Check that every label of a shard names a class: 0 <= label < `num_classes`, for the
    int64 field named "label" (manifest step 12; nothing to check without one).

    Raises:
        FormatError: naming the shard (a tar shard's index, where its labels live), the record
            and the offset of its label column.
    """
    if "label" not in schema.names or schema.field("label").type != "int64":
        return
    reader.check_all()
    check_labels_rows(reader, 0, len(reader), num_classes=num_classes)


def check_labels_rows(reader: ShardReaderBase, start: int, stop: int, *, num_classes: int) -> None:
    """`check_labels` on rows [start, stop) of the shard's "label" column: a `RowCheck` that a
    dataset adds to each shard it opens, so that a label is checked with its block of rows."""
    labels: np.ndarray[Any, Any] = reader.table["label"][start:stop]
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        index = start + int(np.argmax(bad))
        path, offset = reader.locate_column(index, "label")
        raise FormatError(
            f"label {int(labels[index - start])} names no class (the manifest has {num_classes})", path=path, offset=offset, record=index
        )


def open_dataset(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, verify: bool = True, remote: RemoteOptions | None = None
) -> DatasetReader:
    """Open a dataset by its directory or its manifest.json, locally or by URL, or local WebDataset
    tars directly.

    Args:
        path: the dataset root or its manifest: a local path (``~`` expanded), or a URL that fsspec can open
            (``s3://bucket/prefix``, ``gs://...``, ``https://host/data``, ...), binary or tar
            shards; or local tars: a path ending in ``.tar``, a pattern with braces
            (``shards-{000..099}.tar``), or a list of those. Tars opened directly are indexed on
            first open into a cache, and found there afterwards (see `tars.open_tars` for
            where); a directory without manifest.json is never a dataset, even one full of tars
            (index it with `tars.index_tars`).
        verify: check each record's checksum when its payload is read: a binary shard's record
            checksum covers every field; in a tar shard the image member and each member
            field (a caption, JSON, bytes) are checked against their own checksums in the
            member index when read (labels and keys are index values, checked on open); an
            index written before member checksums existed has none, and its member fields
            are read unchecked.
        remote: for a URL, how to read it: range reads (default) or a local shard cache,
            credentials, retries (see `RemoteOptions`).

    Returns:
        A `DatasetReader`: ``len()``, ``reader[i]`` -> `Record`, iteration in order.

    Raises:
        DatasetNotFoundError: no manifest (not a dataset, or an unfinished conversion).
        ManifestError, UnsupportedVersionError: the manifest is invalid or too new.
        ShardNotFoundError, FormatError: a tar opened directly is missing or malformed.
        RemoteError: a remote store failed after its retries.
        ValueError: tars named by URL (they must be local to be opened directly), or a path over
            4096 bytes (a name within it over 255).
    """
    return DatasetReader(path, verify=verify, remote=remote)
