"""`DatasetWriter`: records into binary or tar shards of about a given size, then the manifest,
written last as the commit point."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import SchemaError
from .._storage.atomic import Transaction
from ..format._manifest import IndexEntry, Manifest, ShardEntry
from ..format._schema import Schema, tar_schema_problem
from ..format._writer import DEFAULT_SHARD_SIZE, ShardWriter, shard_name
from ..tar._writer import TarShardWriter, encode_member

__all__ = ["DatasetWriter"]

__all__ = ["DatasetWriter"]


class DatasetWriter(Transaction):
    """Write records into shards of about `shard_size` bytes and commit a manifest on `close()`.

    Args:
        directory: the dataset root; created if missing. Shards are ``shard-NNNNN.shard``, or
            ``shard-NNNNN.tar`` with their member index ``shard-NNNNN.tar.idx``.
        schema: the fields of every record.
        shard_size: target shard size in bytes; a shard is closed once it reaches it, so it may
            exceed it by one record.
        classes: class names in label order, stored in the manifest.
        options: free-form options recorded under "converter" in the manifest.
        shard_format: "binary" (spec/format.md) or "tar" (WebDataset tars, spec/tar.md), which
            needs a schema of `format.schema.tar_schema`: ``KEY.jpg``, ``KEY.cls`` if labelled,
            and a member per further field (its name the extension) per record.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        schema: Schema,
        shard_size: int = DEFAULT_SHARD_SIZE,
        classes: Sequence[str] | None = None,
        options: Mapping[str, Any] | None = None,
        shard_format: str = "binary",
    ) -> None:

        if shard_size <= 0:
            raise ValueError(f"shard_size must be positive, got {shard_size}")
        if shard_format not in ("binary", "tar"):
            raise ValueError(f"shard_format must be 'binary' or 'tar', got {shard_format!r}")
        problem = tar_schema_problem(schema) if shard_format == "tar" else None
        if problem is not None:
            raise SchemaError(problem)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.shard_size = shard_size
        self.classes = list(classes) if classes is not None else None
        self._check_labels = self.classes is not None and "label" in schema.names and schema.field("label").type == "int64"
        """With classes, every label must name one (spec/manifest.md, reading step 12)."""
        self.options = dict(options or {})
        self.shard_format = shard_format
        self.shards: list[Any] = []
        """`ShardInfo` of each finished shard, or `tar.writer.TarShardInfo` for tar shards."""
        self._current: Any = None

    def _open_shard(self) -> Any:
        number = len(self.shards)
        if self.shard_format == "binary":
            return ShardWriter(self.directory / shard_name(number), schema=self.schema)

        return TarShardWriter(self.directory / shard_name(number, suffix=".tar"), labelled="label" in self.schema.names)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (see `ShardWriter.write`, and `tar.TarShardWriter.write` for tars)."""
        if self._check_labels and self.classes is not None:
            label = record.get("label")
            if isinstance(label, (int, np.integer)) and not isinstance(label, (bool, np.bool_)) and not 0 <= label < len(self.classes):
                raise SchemaError(f"label {label} names no class: the dataset has {len(self.classes)} classes")
        if self._current is None:
            self._current = self._open_shard()
        try:
            if self.shard_format == "binary":
                self._current.write(record)
            else:
                if set(record) != set(self.schema.names):
                    raise SchemaError(
                        f"a tar record has exactly the fields {', '.join(self.schema.names)}, got {', '.join(sorted(map(str, record)))}"
                    )
                members = {
                    field.name: encode_member(field.type, record[field.name], f"field {field.name!r}")
                    for field in self.schema.fields[self.schema.names.index("key") + 1 :]
                }
                self._current.write(record["key"], image=record["image"], label=record.get("label"), members=members)
        except BaseException:
            self.abort()
            raise
        if self._current.size >= self.shard_size:
            self.shards.append(self._current.close())
            self._current = None

    def close(self) -> Any:
        """Close the last shard and write manifest.json last; return the `Manifest`."""

        if self._current is not None and (self._current.num_records or not self.shards):
            self.shards.append(self._current.close())
        elif self._current is not None:
            self._current.abort()
        self._current = None
        entries = []
        for info in self.shards:
            if self.shard_format == "binary":
                entries.append(ShardEntry(info.path.name, info.num_records, info.size, info.checksum))
            else:
                index = IndexEntry(info.index.path.name, info.index.size, info.index.checksum)
                entries.append(ShardEntry(info.tar.path.name, info.tar.num_records, info.tar.size, info.tar.checksum, index))
        manifest = Manifest(
            schema=self.schema,
            classes=self.classes,
            shards=tuple(entries),
            shard_format=self.shard_format,
            converter={"name": "shardfmt", "options": self.options},
        )
        manifest.write(self.directory)
        self.closed = True
        return manifest

    def abort(self) -> None:
        if self._current is not None:
            self._current.abort()
            self._current = None
