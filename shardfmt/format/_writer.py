"""Writing binary shards: one streaming pass, under a temporary name until `close()` commits it.

`ShardWriter` writes one shard; each field's value is encoded by its type (`fieldtypes`).
`dataset.writer.DatasetWriter` rolls records over into shards of a target size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._checksum import Hasher, checksum
from .._errors import SchemaError
from .._storage.atomic import SYNC_EVERY, AtomicFile, Transaction
from ._layout import (
    DEFAULT_ALIGNMENT,
    FOOTER_CHECKED_BYTES,
    FOOTER_DTYPE,
    FOOTER_MAGIC,
    FORMAT_VERSION,
    HEADER_CHECKED_BYTES,
    HEADER_DTYPE,
    HEADER_SIZE,
    MAGIC,
    MAX_ALIGNMENT,
    MAX_RECORDS_PER_SHARD,
    MAX_SCHEMA_SIZE,
    MAX_SHARD_SIZE,
    MIN_ALIGNMENT,
    SHARD_SUFFIX,
    TABLE_BLOCK_ROWS,
    TABLE_BLOCKS,
    align_up,
    table_blocks,
)
from ._schema import Schema

__all__ = ["DEFAULT_SHARD_SIZE", "ShardInfo", "ShardWriter", "block_checksums", "shard_name"]

DEFAULT_SHARD_SIZE = 256 * 1024 * 1024


@dataclass(frozen=True)
class ShardInfo:
    """A finished shard: its path, record count, byte size and XXH3-64 of the whole file."""

    path: Path
    num_records: int
    size: int
    checksum: int


def shard_name(index: int, *, suffix: str = SHARD_SUFFIX) -> str:
    """Return the file name of shard number `index`: ``shard-00000.shard`` (or with `suffix`)."""
    return f"shard-{index:05d}{suffix}"


def _encode_header(schema: Schema, *, alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """Return the header bytes of a shard with `schema`: struct, schema, zero padding."""
    schema_bytes = schema.to_bytes()
    if len(schema_bytes) > MAX_SCHEMA_SIZE:
        raise SchemaError(f"schema encodes to {len(schema_bytes)} bytes, over the limit of {MAX_SCHEMA_SIZE}")
    header_size = align_up(HEADER_SIZE + len(schema_bytes), alignment)
    header = np.zeros((), HEADER_DTYPE)
    header["magic"] = MAGIC
    header["major"], header["minor"] = FORMAT_VERSION
    header["flags"] = TABLE_BLOCKS
    header["header_size"] = header_size
    header["schema_size"] = len(schema_bytes)
    header["alignment"] = alignment
    raw = bytearray(header.tobytes())
    header["checksum"] = checksum(bytes(raw[:HEADER_CHECKED_BYTES]) + schema_bytes)
    raw = bytearray(header.tobytes())
    raw += schema_bytes
    raw += bytes(header_size - len(raw))
    return bytes(raw)


def block_checksums(table_bytes: bytes | memoryview, record_size: int) -> bytes:
    """Return the block checksums of a record table (flag TABLE_BLOCKS): the XXH3-64 of each
    block of TABLE_BLOCK_ROWS rows of `record_size` bytes, in order, as little-endian u64s."""
    step = TABLE_BLOCK_ROWS * record_size
    num_blocks = table_blocks(len(table_bytes) // record_size) if record_size else 0
    view = memoryview(table_bytes)
    sums = [checksum(view[k * step : (k + 1) * step]) for k in range(num_blocks)]
    return np.array(sums, dtype="<u8").tobytes()


class ShardWriter(Transaction):
    """Write records to one shard file.

    Args:
        path: the final path; bytes go to a hidden temporary name until `close()`.
        schema: the fields every record has.
        alignment: payload alignment, a power of two from 8 to 65536.

    Use as a context manager: leaving the block normally commits, an exception removes the
    temporary file, so a crash never leaves a half-written shard under the final name.
    """

    def __init__(self, path: str | os.PathLike[str], *, schema: Schema, alignment: int = DEFAULT_ALIGNMENT) -> None:
        if not MIN_ALIGNMENT <= alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of two from {MIN_ALIGNMENT} to {MAX_ALIGNMENT}")
        self.schema = schema
        self.alignment = alignment
        self._dtype = schema.record_dtype()
        self._rows: list[tuple[Any, ...]] = []
        self._file = AtomicFile(path, sync_every=SYNC_EVERY, direct=True)
        self._hasher = Hasher()
        self.closed = False
        self._names = frozenset(schema.names)
        self._kinds = [(field, field.kind) for field in schema.fields]
        self._end = 0  # bytes emitted so far: the file's position, without asking the file
        self._emit(_encode_header(schema, alignment=alignment))

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def num_records(self) -> int:
        return len(self._rows)

    @property
    def size(self) -> int:
        """Bytes the shard would have if closed now (header, payload, table, block checksums
        and footer)."""
        rows = len(self._rows)
        return self._end + rows * self._dtype.itemsize + 8 * table_blocks(rows) + FOOTER_DTYPE.itemsize

    def _emit(self, data: bytes | bytearray | memoryview) -> None:
        self._file.write(data)
        self._hasher.update(data)
        self._end += len(data)

    def write(self, record: Mapping[str, Any]) -> int:
        """Append one record and return its index in the shard.

        Args:
            record: a value for every field of the schema: bytes-like JPEG data for "jpeg",
                a uint8 numpy array H x W x C (C 1, 3 or 4; H x W for one channel) for "raw",
                a numpy array of the declared dtype and shape for "ndarray", bytes-like for
                "bytes", str for "str", a JSON-serialisable value for "json", an int for
                "int64", a float for "float64".

        Raises:
            SchemaError: a field is missing, extra, of the wrong type, too large, or a "jpeg"
                value is not a JPEG with 1 or 3 channels that libjpeg-turbo decodes, a "raw"
                value not uint8 pixels with 1, 3 or 4 channels, an "ndarray" value not of the
                declared dtype and shape; or the record would take the shard past
                MAX_SHARD_SIZE or MAX_RECORDS_PER_SHARD.
        """
        if self.closed:
            raise ValueError("write() on a closed ShardWriter")
        if len(self._rows) >= MAX_RECORDS_PER_SHARD:
            raise SchemaError(f"a shard holds at most {MAX_RECORDS_PER_SHARD} records")
        extra = record.keys() - self._names
        if extra:
            raise SchemaError(f"record has fields not in the schema: {', '.join(sorted(map(str, extra)))}")
        index = len(self._rows)
        start = position = self._end
        pieces: list[bytes | memoryview] = []
        columns: list[Any] = []
        for field, kind in self._kinds:
            if field.name not in record:
                raise SchemaError(f"record {index} has no value for field {field.name!r}")
            data, field_columns = kind.encode(field, record[field.name], f"record {index}: field {field.name!r}")
            if data is None:
                columns.extend(field_columns)
                continue
            padded = align_up(position, self.alignment)
            if padded > position:
                pieces.append(bytes(padded - position))
            pieces.append(data)
            columns.extend((padded, len(data), *field_columns))
            position = padded + len(data)
        end = align_up(position, self.alignment)
        if end > position:
            pieces.append(bytes(end - position))
        grown = self.size + (end - start) + self._dtype.itemsize + (8 if index % TABLE_BLOCK_ROWS == 0 else 0)
        if grown > MAX_SHARD_SIZE:
            raise SchemaError(f"record {index} would grow the shard to {grown} bytes, over the limit of {MAX_SHARD_SIZE}")
        record_hasher = Hasher()
        for piece in pieces:
            record_hasher.update(piece)
            self._emit(piece)
        self._rows.append((start, end - start, record_hasher.intdigest(), *columns))
        return index

    def close(self) -> ShardInfo:
        """Write the table, its block checksums and the footer, fsync and move the shard to its final name."""
        if self.closed:
            raise ValueError("close() on a closed ShardWriter")
        table = np.array(self._rows, dtype=self._dtype) if self._rows else np.zeros(0, self._dtype)
        table_offset = self._end
        table_bytes = table.tobytes()
        sums = block_checksums(table_bytes, self._dtype.itemsize)
        footer = np.zeros((), FOOTER_DTYPE)
        footer["table_offset"] = table_offset
        footer["num_records"] = len(self._rows)
        footer["record_size"] = self._dtype.itemsize
        footer["reserved0"] = TABLE_BLOCK_ROWS
        footer["table_checksum"] = checksum(sums)
        footer["magic"] = FOOTER_MAGIC
        footer["checksum"] = checksum(footer.tobytes()[:FOOTER_CHECKED_BYTES])
        self._emit(table_bytes)
        self._emit(sums)
        self._emit(footer.tobytes())
        size = self._end
        self._file.commit()
        self.closed = True
        return ShardInfo(self.path, len(self._rows), size, self._hasher.intdigest())

    def abort(self) -> None:
        """Discard the shard: remove its temporary file."""
        if not self.closed:
            self._file.abort()
            self.closed = True
