"""`ConcatReader`: the sources of a `Mixture` as one sequence of records, and `open_records`,
which opens what a loader is given (a dataset, tars, or a mixture) without reading a record table.

Records are numbered source after source, in the mixture's order; shards likewise. Every source
is a `DatasetReader` (binary or tar, local or by URL) and must have the schema of the first.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import SchemaError
from .._sampling.mixture import Mixture
from .._storage import RemoteOptions
from ..format._reader import Record, ShardReaderBase
from ..format._schema import Schema
from .reader import DatasetReader

__all__ = ["ConcatReader", "RecordSource", "open_records"]


class ConcatReader:
    """Several datasets with one schema as one sequence of records.

    Offers what the loader uses of a `DatasetReader`: `schema`, `classes` (the sources' if they
    all agree, else None), `cumulative` (records before each shard, over all sources),
    `num_shards`, `is_remote`, `fingerprint`, `shard`, `shard_path`, `locate`, `open_shards`, `close`.

    Args:
        paths: each source as `open_dataset` takes it.
        names: how messages name the sources.
        verify, remote: as for `DatasetReader` (`remote` applies to every source given by URL).

    Raises:
        SchemaError: a source's schema differs from the first source's.
        DatasetNotFoundError, ManifestError, ...: a source cannot be opened.
    """

    def __init__(self, paths: Sequence[Any], *, names: Sequence[str], verify: bool = True, remote: RemoteOptions | None = None) -> None:
        self.readers: list[DatasetReader] = []
        try:
            for path in paths:
                self.readers.append(DatasetReader(list(path) if isinstance(path, tuple) else path, verify=verify, remote=remote))
        except BaseException:
            self.close()
            raise
        self.names = list(names)
        first = self.readers[0]
        for name, reader in zip(self.names, self.readers, strict=True):
            if reader.schema != first.schema:
                self.close()
                raise SchemaError(
                    f"source {name!r} does not have the schema of source {self.names[0]!r} "
                    f"({schema_difference(reader.schema, first.schema)}): "
                    "a mixture's sources share one schema"
                )
        self.schema = first.schema
        self.classes = first.classes if all(r.classes == first.classes for r in self.readers) else None
        self.verify = verify
        self.sizes = [len(r) for r in self.readers]
        counts = np.concatenate([np.diff(r.cumulative) for r in self.readers])
        self.cumulative = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._first_shard = np.concatenate([[0], np.cumsum([r.num_shards for r in self.readers], dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.cumulative[-1])

    @property
    def fingerprint(self) -> str:
        """The sources' fingerprints (`DatasetReader.fingerprint`) in order, joined by "+"."""
        return "+".join(reader.fingerprint for reader in self.readers)

    @property
    def num_shards(self) -> int:
        return int(self._first_shard[-1])

    @property
    def is_remote(self) -> bool:
        """Whether any source is read by URL."""
        return any(r.is_remote for r in self.readers)

    @property
    def strict_jpeg(self) -> bool:
        """Whether every source's manifest says its JPEG payloads all decode (``strict_jpeg``)."""
        return all(r.strict_jpeg for r in self.readers)

    def _owner(self, shard_index: int) -> tuple[DatasetReader, int]:
        source = bisect.bisect_right(self._first_shard.tolist(), shard_index) - 1
        return self.readers[source], shard_index - int(self._first_shard[source])

    def shard(self, shard_index: int) -> ShardReaderBase:
        reader, local = self._owner(shard_index)
        return reader.shard(local)

    def shard_path(self, shard_index: int) -> str:
        reader, local = self._owner(shard_index)
        return reader.shard_path(local)

    def read_ahead(self, shards: list[int], rows: list[int]) -> None:
        """`DatasetReader.read_ahead`, each shard passed to the source that holds it."""
        by_source: dict[int, tuple[DatasetReader, list[int], list[int]]] = {}
        for shard, row in zip(shards, rows, strict=True):
            reader, local = self._owner(shard)
            by_source.setdefault(id(reader), (reader, [], []))
            by_source[id(reader)][1].append(local)
            by_source[id(reader)][2].append(row)
        for reader, local_shards, local_rows in by_source.values():
            reader.read_ahead(local_shards, local_rows)

    def locate(self, index: int) -> tuple[int, int]:
        """Return (shard number, record number within it) of record `index` of the concatenation."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"record {index} out of range for a mixture of {n}")
        index %= n
        shard_index = int(np.searchsorted(self.cumulative, index, side="right")) - 1
        return shard_index, index - int(self.cumulative[shard_index])

    def open_shards(self, shard_indices: Sequence[int], *, threads: int = 16) -> None:
        for shard_index in shard_indices:
            self.shard(shard_index)

    def __getitem__(self, index: int) -> Record:
        shard_index, local = self.locate(index)
        return self.shard(shard_index).record(local)

    def close(self) -> None:
        for reader in self.readers:
            reader.close()


RecordSource = DatasetReader | ConcatReader


def open_records(
    path: Mixture | str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, verify: bool = True, remote: RemoteOptions | None = None
) -> RecordSource:
    """Open a dataset (as `open_dataset`) or the sources of a `Mixture`; no record table is read."""
    if isinstance(path, Mixture):
        return ConcatReader(path.paths, names=path.names, verify=verify, remote=remote)
    return DatasetReader(path, verify=verify, remote=remote)


def schema_difference(ours: Schema, theirs: Schema) -> str:
    """What sets schema `ours` apart from `theirs`, field by field (name and type, as
    ``ndarray:float32:3x4``), for messages."""
    mine, other = {f.name: f.spec for f in ours.fields}, {f.name: f.spec for f in theirs.fields}
    parts = [f"{name!r} is {spec}, not {other[name]}" for name, spec in mine.items() if name in other and other[name] != spec]
    parts += [f"{name!r} ({spec}) is not in the other" for name, spec in mine.items() if name not in other]
    parts += [f"{name!r} ({spec}) is missing" for name, spec in other.items() if name not in mine]
    if not parts and ours.names != theirs.names:
        parts.append(f"the fields come in another order: {', '.join(ours.names)} against {', '.join(theirs.names)}")
    return "; ".join(parts) or f"{ours.to_json()} against {theirs.to_json()}"
