"""Writing binary shards: one streaming pass, under a temporary name until `close()` commits it.

`ShardWriter` writes one shard; `DatasetWriter` rolls records over into shards of a target size
and writes the manifest last, as the commit point of the whole dataset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .checksum import Hasher, checksum
from .errors import SchemaError
from .fileio import AtomicFile
from .jpeg import read_jpeg_info
from .jsontext import parse_json
from .layout import (
    DEFAULT_ALIGNMENT,
    FOOTER_CHECKED_BYTES,
    FOOTER_DTYPE,
    FOOTER_MAGIC,
    FORMAT_VERSION,
    HEADER_CHECKED_BYTES,
    HEADER_DTYPE,
    HEADER_SIZE,
    JPEG_CHANNELS,
    MAGIC,
    NDARRAY_DTYPES,
    RAW_CHANNELS,
    MAX_ALIGNMENT,
    MAX_FIELD_SIZE,
    MAX_RECORDS_PER_SHARD,
    MAX_SCHEMA_SIZE,
    MAX_SHARD_SIZE,
    MIN_ALIGNMENT,
    SHARD_SUFFIX,
    align_up,
)
from .schema import Field, Schema

__all__ = ["DEFAULT_SHARD_SIZE", "DatasetWriter", "ShardInfo", "ShardWriter", "jpeg_columns", "shard_name"]

DEFAULT_SHARD_SIZE = 256 * 1024 * 1024
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


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


def encode_header(schema: Schema, *, alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """Return the header bytes of a shard with `schema`: struct, schema, zero padding."""
    schema_bytes = schema.to_bytes()
    if len(schema_bytes) > MAX_SCHEMA_SIZE:
        raise SchemaError(f"schema encodes to {len(schema_bytes)} bytes, over the limit of {MAX_SCHEMA_SIZE}")
    header_size = align_up(HEADER_SIZE + len(schema_bytes), alignment)
    header = np.zeros((), HEADER_DTYPE)
    header["magic"] = MAGIC
    header["major"], header["minor"] = FORMAT_VERSION
    header["header_size"] = header_size
    header["schema_size"] = len(schema_bytes)
    header["alignment"] = alignment
    raw = bytearray(header.tobytes())
    header["checksum"] = checksum(bytes(raw[:HEADER_CHECKED_BYTES]) + schema_bytes)
    raw = bytearray(header.tobytes())
    raw += schema_bytes
    raw += bytes(header_size - len(raw))
    return bytes(raw)


class ShardWriter:
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
        self._file = AtomicFile(path)
        self._hasher = Hasher()
        self._closed = False
        self._names = frozenset(schema.names)
        self._end = 0  # bytes emitted so far: the file's position, without asking the file
        self._emit(encode_header(schema, alignment=alignment))

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def num_records(self) -> int:
        return len(self._rows)

    @property
    def size(self) -> int:
        """Bytes the shard would have if closed now (header, payload, table and footer)."""
        return self._end + len(self._rows) * self._dtype.itemsize + FOOTER_DTYPE.itemsize

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
        if self._closed:
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
        for field in self.schema.fields:
            if field.name not in record:
                raise SchemaError(f"record {index} has no value for field {field.name!r}")
            value = record[field.name]
            if not field.is_variable:
                columns.append(_scalar(field, value, index))
                continue
            data, extra_columns = _encode_variable(field, value, index)
            padded = align_up(position, self.alignment)
            if padded > position:
                pieces.append(bytes(padded - position))
            pieces.append(data)
            columns.extend((padded, len(data), *extra_columns))
            position = padded + len(data)
        end = align_up(position, self.alignment)
        if end > position:
            pieces.append(bytes(end - position))
        grown = self.size + (end - start) + self._dtype.itemsize
        if grown > MAX_SHARD_SIZE:
            raise SchemaError(f"record {index} would grow the shard to {grown} bytes, over the limit of {MAX_SHARD_SIZE}")
        record_hasher = Hasher()
        for piece in pieces:
            record_hasher.update(piece)
            self._emit(piece)
        self._rows.append((start, end - start, record_hasher.intdigest(), *columns))
        return index

    def close(self) -> ShardInfo:
        """Write the table and footer, fsync and move the shard to its final name."""
        if self._closed:
            raise ValueError("close() on a closed ShardWriter")
        table = np.array(self._rows, dtype=self._dtype) if self._rows else np.zeros(0, self._dtype)
        table_offset = self._end
        table_bytes = table.tobytes()
        footer = np.zeros((), FOOTER_DTYPE)
        footer["table_offset"] = table_offset
        footer["num_records"] = len(self._rows)
        footer["record_size"] = self._dtype.itemsize
        footer["table_checksum"] = checksum(table_bytes)
        footer["magic"] = FOOTER_MAGIC
        footer["checksum"] = checksum(footer.tobytes()[:FOOTER_CHECKED_BYTES])
        self._emit(table_bytes)
        self._emit(footer.tobytes())
        size = self._end
        self._file.commit()
        self._closed = True
        return ShardInfo(self.path, len(self._rows), size, self._hasher.intdigest())

    def abort(self) -> None:
        """Discard the shard: remove its temporary file."""
        if not self._closed:
            self._file.abort()
            self._closed = True

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()


def _scalar(field: Field, value: Any, index: int) -> int | float:
    if field.type == "int64":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise SchemaError(f"record {index}: field {field.name!r} needs an int, got {type(value).__name__}")
        if not _INT64_MIN <= int(value) <= _INT64_MAX:
            raise SchemaError(f"record {index}: field {field.name!r} value {value} does not fit in int64")
        return int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SchemaError(f"record {index}: field {field.name!r} needs a float, got {type(value).__name__}")
    return float(value)


def _encode_variable(field: Field, value: Any, index: int) -> tuple[bytes | memoryview, tuple[int, ...]]:
    where = f"record {index}: field {field.name!r}"
    if field.type == "raw":
        return _encode_raw(value, where)
    if field.type == "ndarray":
        return _encode_array(field, value, where), ()
    if field.type == "str":
        if not isinstance(value, str):
            raise SchemaError(f"{where} needs a str, got {type(value).__name__}")
        try:
            data: bytes | memoryview = value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise SchemaError(f"{where} is not encodable as UTF-8: {err}") from err
    elif field.type == "json":
        try:
            data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
            parse_json(data)  # what readers refuse is not written: integers beyond 64 bits, ...
        except (TypeError, ValueError) as err:
            raise SchemaError(f"{where} is not JSON-serialisable: {err}") from err
    else:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SchemaError(f"{where} needs bytes, got {type(value).__name__}")
        data = memoryview(value).cast("B")
    if len(data) > MAX_FIELD_SIZE:
        raise SchemaError(f"{where} is {len(data)} bytes, over the limit of {MAX_FIELD_SIZE}")
    if field.type != "jpeg":
        return data, ()
    return data, jpeg_columns(data, where)


def jpeg_columns(data: bytes | memoryview, where: str) -> tuple[int, int, int, int]:
    """Return the table columns (height, width, channels, reserved) of a storable JPEG.

    Raises:
        SchemaError: naming `where`: not a JPEG, or not 8-bit, non-lossless with 1 or 3 channels.
    """
    try:
        info = read_jpeg_info(data)
    except ValueError as err:
        raise SchemaError(f"{where} is not a JPEG: {err}") from err
    if info.components not in JPEG_CHANNELS or info.lossless or info.precision != 8:
        raise SchemaError(
            f"{where}: a JPEG with {info.components} components, {info.precision}-bit"
            f"{', lossless' if info.lossless else ''} cannot be stored; convert it to 8-bit RGB or grayscale"
        )
    return (info.height, info.width, info.components, 0)


def _encode_raw(value: Any, where: str) -> tuple[memoryview, tuple[int, ...]]:
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim not in (2, 3):
        kind = f"{value.dtype} array of {value.ndim} dimensions" if isinstance(value, np.ndarray) else type(value).__name__
        raise SchemaError(f"{where} needs uint8 pixels as a numpy array H x W x C or H x W, got a {kind}")
    height, width = value.shape[:2]
    channels = value.shape[2] if value.ndim == 3 else 1
    if channels not in RAW_CHANNELS:
        raise SchemaError(f"{where} has {channels} channels; raw pixels have {', '.join(map(str, RAW_CHANNELS))}")
    if height == 0 or width == 0:
        raise SchemaError(f"{where} is {height} x {width}: a raw image needs at least one pixel")
    if value.size > MAX_FIELD_SIZE:
        raise SchemaError(f"{where} is {value.size} bytes, over the limit of {MAX_FIELD_SIZE}")
    data = memoryview(np.ascontiguousarray(value)).cast("B")
    return data, (height, width, channels, 0)


def _encode_array(field: Field, value: Any, where: str) -> memoryview:
    expected = np.dtype(NDARRAY_DTYPES[field.dtype or ""])
    if not isinstance(value, np.ndarray) or value.dtype.newbyteorder("<") != expected:
        kind = f"a {value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__
        raise SchemaError(f"{where} needs a numpy {field.dtype} array, got {kind}")
    if value.shape != field.shape:
        raise SchemaError(f"{where} has shape {list(value.shape)}, the schema declares {list(field.shape or ())}")
    return memoryview(np.ascontiguousarray(value, dtype=expected)).cast("B")


class DatasetWriter:
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
            needs the ``IMAGE_CLASSIFICATION`` schema: ``KEY.cls`` and ``KEY.jpg`` per record.
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
        from .schema import IMAGE_CLASSIFICATION

        if shard_size <= 0:
            raise ValueError(f"shard_size must be positive, got {shard_size}")
        if shard_format not in ("binary", "tar"):
            raise ValueError(f"shard_format must be 'binary' or 'tar', got {shard_format!r}")
        if shard_format == "tar" and schema != IMAGE_CLASSIFICATION:
            raise SchemaError("tar shards hold the IMAGE_CLASSIFICATION schema (image, label, key) only")
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
        """`ShardInfo` of each finished shard, or `tar.TarShardInfo` for tar shards."""
        self._current: Any = None

    def _open_shard(self) -> Any:
        number = len(self.shards)
        if self.shard_format == "binary":
            return ShardWriter(self.directory / shard_name(number), schema=self.schema)
        from .tar import TarShardWriter

        return TarShardWriter(self.directory / shard_name(number, suffix=".tar"))

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
                    raise SchemaError(f"a tar record has exactly the fields {', '.join(self.schema.names)}, got {', '.join(sorted(map(str, record)))}")
                self._current.write(record["key"], image=record["image"], label=record["label"])
        except BaseException:
            self.abort()
            raise
        if self._current.size >= self.shard_size:
            self.shards.append(self._current.close())
            self._current = None

    def close(self) -> Any:
        """Close the last shard and write manifest.json last; return the `Manifest`."""
        from .manifest import IndexEntry, Manifest, ShardEntry

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
        return manifest

    def abort(self) -> None:
        if self._current is not None:
            self._current.abort()
            self._current = None

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()
