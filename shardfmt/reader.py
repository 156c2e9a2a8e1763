"""Reading binary shards and datasets: validate the header and footer before touching payload.

`ShardReader` opens one shard: it checks the header, the footer and every structural rule of the
record table (vectorised, no per-record Python) before it hands out a byte. Payloads come back as
memoryviews of the memory map, verified against their checksum on access. `DatasetReader` (from
`open_dataset`) joins the shards that a manifest lists into one indexable sequence of records.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .checksum import checksum
from .errors import (
    ChecksumError,
    FormatError,
    LimitError,
    ManifestError,
    SchemaError,
    ShardNotFoundError,
    UnsupportedVersionError,
)
from .jsontext import JsonTextError, parse_json
from .layout import (
    FOOTER_CHECKED_BYTES,
    FOOTER_DTYPE,
    FOOTER_MAGIC,
    FOOTER_SIZE,
    FORMAT_VERSION,
    HEADER_CHECKED_BYTES,
    HEADER_DTYPE,
    HEADER_SIZE,
    JPEG_CHANNELS,
    KNOWN_FLAGS,
    MAGIC,
    MAX_ALIGNMENT,
    MAX_FIELD_SIZE,
    MAX_RECORDS_PER_SHARD,
    MAX_SCHEMA_SIZE,
    MAX_SHARD_SIZE,
    MIN_ALIGNMENT,
    NDARRAY_DTYPES,
    RAW_CHANNELS,
    align_up,
    column_name,
)
from .manifest import ShardEntry
from .schema import Schema
from .storage import ByteSource, DatasetLocation, LocalStore, RemoteOptions, locate_dataset, open_source
from .storage.urls import is_url

__all__ = ["DatasetReader", "ImageInfo", "Record", "ShardReader", "check_labels", "open_dataset", "open_shard"]

_CHANNELS = {"jpeg": JPEG_CHANNELS, "raw": RAW_CHANNELS}
"""Image types and the channel counts each allows."""
EMPTY_CHECKSUM = checksum(b"")
"""The XXH3-64 of no bytes: the checksum of every empty record span (0x2d06800538d394c2)."""


@dataclass(frozen=True)
class ImageInfo:
    """Size of an image field, from the record table (no payload is read)."""

    height: int
    width: int
    channels: int


class ShardReader:
    """One binary shard, validated on open.

    Args:
        path: the shard file.
        verify: check each record's XXH3-64 when its payload is read (about 4 us per 100 KB).
        expected_size: the size the manifest states; a mismatch raises before anything else.

    Raises:
        ShardNotFoundError: the file does not exist.
        FormatError: a structural rule is broken (subclasses say which kind).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool = True,
        expected_size: int | None = None,
        source: ByteSource | None = None,
    ) -> None:
        self.source = source if source is not None else open_source(os.fspath(path))
        self.path = self.source.path
        self.verify = verify
        try:
            self._open(expected_size)
        except BaseException:
            self.source.close()
            raise

    def _fail(self, cls: type[FormatError], message: str, offset: int | None = None, record: int | None = None) -> FormatError:
        return cls(message, path=self.path, offset=offset, record=record)

    def _open(self, expected_size: int | None) -> None:
        size = self.source.size
        if expected_size is not None and size != expected_size:
            raise self._fail(FormatError, f"file is {size} bytes but the manifest says {expected_size}")
        if size < HEADER_SIZE + FOOTER_SIZE:
            raise self._fail(FormatError, f"file is {size} bytes, shorter than header and footer ({HEADER_SIZE + FOOTER_SIZE})", 0)
        if size > MAX_SHARD_SIZE:
            raise self._fail(LimitError, f"file is {size} bytes, over the shard limit of {MAX_SHARD_SIZE}", 0)
        raw_header = self.source.read(0, HEADER_SIZE)
        header = np.frombuffer(raw_header, HEADER_DTYPE, count=1)[0]
        if bytes(raw_header[:8]) != MAGIC:
            raise self._fail(FormatError, f"magic is {bytes(raw_header[:8])!r}, expected {MAGIC!r}: not a shardfmt shard", 0)
        major, minor = int(header["major"]), int(header["minor"])
        if major != FORMAT_VERSION[0]:
            raise self._fail(
                UnsupportedVersionError,
                f"format version {major}.{minor} needs a reader for major version {major}; this reader knows {FORMAT_VERSION[0]}.x",
                8,
            )
        flags = int(header["flags"])
        if flags & ~KNOWN_FLAGS:
            raise self._fail(UnsupportedVersionError, f"header flags 0x{flags:08x} hold bits this reader does not know", 12)
        alignment = int(header["alignment"])
        if not MIN_ALIGNMENT <= alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
            raise self._fail(FormatError, f"alignment {alignment} is not a power of two from {MIN_ALIGNMENT} to {MAX_ALIGNMENT}", 28)
        schema_size = int(header["schema_size"])
        if schema_size > MAX_SCHEMA_SIZE:
            raise self._fail(LimitError, f"schema of {schema_size} bytes exceeds the limit of {MAX_SCHEMA_SIZE}", 24)
        header_size = int(header["header_size"])
        if header_size != align_up(HEADER_SIZE + schema_size, alignment):
            raise self._fail(
                FormatError,
                f"header_size {header_size} is not {HEADER_SIZE} + schema_size {schema_size} rounded up to {alignment}",
                16,
            )
        if header_size + FOOTER_SIZE > size:
            raise self._fail(FormatError, f"header of {header_size} bytes runs past the end of the file ({size})", 16)
        if any(int(x) for x in header["reserved"]):
            raise self._fail(FormatError, "reserved header bytes [32, 56) are not zero", 32)
        schema_bytes = self.source.read(HEADER_SIZE, HEADER_SIZE + schema_size)
        if checksum(bytes(raw_header[:HEADER_CHECKED_BYTES]) + bytes(schema_bytes)) != int(header["checksum"]):
            raise self._fail(ChecksumError, "header checksum does not match: the header or schema is corrupt", 56)
        padding = self.source.read(HEADER_SIZE + schema_size, header_size)
        if any(padding):
            raise self._fail(FormatError, "header padding is not zero", HEADER_SIZE + schema_size)
        try:
            self.schema = Schema.from_bytes(bytes(schema_bytes))
            self.schema.check_version(minor)
        except UnsupportedVersionError as err:
            raise self._fail(UnsupportedVersionError, err.message, HEADER_SIZE) from err
        except SchemaError as err:
            raise self._fail(FormatError, f"schema: {err.message}", HEADER_SIZE) from err
        self.version = (major, minor)
        self.alignment = alignment
        self.header_size = header_size

        footer_offset = size - FOOTER_SIZE
        raw_footer = self.source.read(footer_offset, size)
        footer = np.frombuffer(raw_footer, FOOTER_DTYPE, count=1)[0]
        if bytes(raw_footer[-8:]) != FOOTER_MAGIC:
            raise self._fail(FormatError, f"footer magic is {bytes(raw_footer[-8:])!r}, expected {FOOTER_MAGIC!r}: file truncated or extended?", size - 8)
        if checksum(bytes(raw_footer[:FOOTER_CHECKED_BYTES])) != int(footer["checksum"]):
            raise self._fail(ChecksumError, "footer checksum does not match: the footer is corrupt", footer_offset + FOOTER_CHECKED_BYTES)
        if int(footer["reserved0"]) or any(int(x) for x in footer["reserved"]):
            raise self._fail(FormatError, "reserved footer bytes are not zero", footer_offset + 20)
        self.dtype = self.schema.record_dtype()
        record_size = int(footer["record_size"])
        if record_size != self.dtype.itemsize:
            raise self._fail(FormatError, f"record_size {record_size} differs from the {self.dtype.itemsize} bytes the schema defines", footer_offset + 16)
        num_records = int(footer["num_records"])
        if num_records > MAX_RECORDS_PER_SHARD:
            raise self._fail(LimitError, f"{num_records} records exceed the limit of {MAX_RECORDS_PER_SHARD}", footer_offset + 8)
        table_offset = int(footer["table_offset"])
        if table_offset % alignment or not header_size <= table_offset <= footer_offset:
            raise self._fail(FormatError, f"table offset {table_offset} is unaligned or outside [{header_size}, {footer_offset}]", footer_offset)
        if table_offset + num_records * record_size != footer_offset:
            raise self._fail(
                FormatError,
                f"table [{table_offset}, {table_offset + num_records * record_size}) of {num_records} records "
                f"does not end where the footer starts ({footer_offset})",
                footer_offset,
            )
        table_bytes = self.source.read(table_offset, footer_offset)
        if checksum(table_bytes) != int(footer["table_checksum"]):
            raise self._fail(ChecksumError, "record table checksum does not match: the table is corrupt", table_offset)
        self.table_offset = table_offset
        self.table: np.ndarray[Any, Any] = np.frombuffer(table_bytes, self.dtype, count=num_records)
        self._variable_names = tuple(field.name for field in self.schema.fields if field.is_variable)
        self._check_table()

    def _check_table(self) -> None:
        """Check every structural rule of the table at once; report the first broken record."""
        table, n, a = self.table, len(self.table), np.uint64(self.alignment)
        if n == 0:
            if self.header_size != self.table_offset:
                raise self._fail(FormatError, f"no records, yet {self.table_offset - self.header_size} payload bytes", self.header_size)
            return
        row = self.dtype.itemsize
        offsets, sizes = table["offset"], table["size"]
        limit = np.uint64(self.table_offset)
        bad = (offsets > limit) | (sizes > limit)
        self._raise_first(bad, "record span lies outside the payload region", "offset")
        starts = np.empty(n, np.uint64)
        starts[0] = self.header_size
        starts[1:] = offsets[:-1] + sizes[:-1]
        self._raise_first(offsets != starts, "record does not start where the previous one ends (records must be contiguous)", "offset")
        if int(offsets[-1]) + int(sizes[-1]) != self.table_offset:
            raise self._fail(FormatError, f"last record ends at {int(offsets[-1]) + int(sizes[-1])}, not at the table ({self.table_offset})", self.table_offset + (n - 1) * row, n - 1)
        self._raise_first(sizes % a != 0, f"record size is not a multiple of the alignment {self.alignment}", "size")
        position = offsets.copy()
        for field in self.schema.fields:
            if field.is_variable:
                f_off = table[column_name(field.name, "offset")]
                f_size = table[column_name(field.name, "size")]
                self._raise_first(
                    f_size > np.uint64(MAX_FIELD_SIZE),
                    f"field {field.name!r} is larger than the limit of {MAX_FIELD_SIZE} bytes",
                    column_name(field.name, "size"),
                    LimitError,
                )
                expected = (position + a - np.uint64(1)) & ~(a - np.uint64(1))
                self._raise_first(f_off != expected, f"field {field.name!r} payload is not at the next aligned offset of its record", column_name(field.name, "offset"))
                position = f_off + f_size
            if field.type in _CHANNELS:
                self._check_image(field.name, field.type, table)
            elif field.nbytes is not None:
                self._raise_first(
                    table[column_name(field.name, "size")] != np.uint64(field.nbytes),
                    f"ndarray {field.name!r} payload size is not the {field.nbytes} bytes of its {field.dtype} shape {list(field.shape or ())}",
                    column_name(field.name, "size"),
                )
        ends = (position + a - np.uint64(1)) & ~(a - np.uint64(1))
        self._raise_first(ends != offsets + sizes, "record span does not end at the aligned end of its last field", "size")
        # Step 30 for empty spans: nothing will ever be hashed for them, so their checksum (the
        # XXH3-64 of no bytes) is compared now; it is reported at the record's offset.
        empty = (sizes == 0) & (table["checksum"] != np.uint64(EMPTY_CHECKSUM))
        if empty.any():
            i = int(np.argmax(empty))
            raise self._fail(
                ChecksumError,
                f"empty record span has checksum 0x{int(table['checksum'][i]):016x}, not that of no bytes "
                f"(0x{EMPTY_CHECKSUM:016x}): the shard is corrupt",
                int(offsets[i]),
                i,
            )

    def _check_image(self, name: str, type_: str, table: np.ndarray[Any, Any]) -> None:
        """Rules 28c to 28f: sides, channels, reserved column and, for raw, the payload size."""
        h = table[column_name(name, "height")]
        w = table[column_name(name, "width")]
        c = table[column_name(name, "channels")]
        channels = _CHANNELS[type_]
        self._raise_first((h == 0) | (w == 0), f"image {name!r} has a zero height or width", column_name(name, "height"))
        self._raise_first(
            ~np.isin(c, channels), f"{type_} image {name!r} channels are not {' or '.join(map(str, channels))}", column_name(name, "channels")
        )
        self._raise_first(table[column_name(name, "reserved")] != 0, f"image {name!r} reserved column is not zero", column_name(name, "reserved"))
        if type_ == "raw":
            # h * w is exact in u64 (both < 2^32); bounded by the field limit before the channel
            # product, so that nothing wraps around.
            pixels = h.astype(np.uint64) * w.astype(np.uint64)
            expected = np.where(pixels <= np.uint64(MAX_FIELD_SIZE), pixels * c.astype(np.uint64), np.uint64(0))
            self._raise_first(
                (pixels > np.uint64(MAX_FIELD_SIZE)) | (table[column_name(name, "size")] != expected),
                f"raw image {name!r} payload size is not height x width x channels",
                column_name(name, "size"),
            )

    def _raise_first(
        self, bad: np.ndarray[Any, Any], message: str, column: str, cls: type[FormatError] = FormatError
    ) -> None:
        if bad.any():
            i = int(np.argmax(bad))
            offset = self.table_offset + i * self.dtype.itemsize + self.dtype.fields[column][1]  # type: ignore[index]
            raise self._fail(cls, message, offset, i)

    def __len__(self) -> int:
        return len(self.table)

    def payload(self, index: int, field: str) -> memoryview:
        """Return the bytes of variable-size `field` of record `index` as a read-only view.

        Raises:
            ChecksumError: verification is on and the record's bytes do not match its checksum.
        """
        row = self.table[index]
        if self.verify:
            self.verify_record(index)
        start = int(row[column_name(field, "offset")])
        return self.source.read(start, start + int(row[column_name(field, "size")]))

    def verify_record(self, index: int) -> None:
        """Check record `index`'s payload span against its XXH3-64.

        Raises:
            ChecksumError: naming the shard, the record and the span's first byte.
        """
        row = self.table[index]
        start, size = int(row["offset"]), int(row["size"])
        span = self.source.read(start, start + size)
        if checksum(span) != int(row["checksum"]):
            raise ChecksumError(
                f"payload [{start}, {start + size}) does not match its checksum: the shard is corrupt",
                path=self.path,
                offset=start,
                record=index,
            )
        self._check_padding(index, row, span, start)

    def _check_padding(self, index: int, row: Any, span: memoryview, start: int) -> None:
        """Step 30, after the checksum: every byte of the span that belongs to no field is zero."""
        position = start
        gaps = []
        for name in self._variable_names:
            field_start = int(row[column_name(name, "offset")])
            gaps.append((position, field_start))
            position = field_start + int(row[column_name(name, "size")])
        gaps.append((position, start + len(span)))
        for gap_start, gap_stop in gaps:
            if gap_stop > gap_start:
                rest = bytes(span[gap_start - start : gap_stop - start]).lstrip(b"\0")
                if rest:
                    at = gap_stop - len(rest)
                    raise FormatError(
                        f"padding byte at {at} is 0x{rest[0]:02x}, not zero (a writer fills padding with zeros)",
                        path=self.path,
                        offset=at,
                        record=index,
                    )

    def image_info(self, index: int, field: str = "image") -> ImageInfo:
        """Return the height, width and channels of image `field` of record `index`."""
        row = self.table[index]
        return ImageInfo(
            int(row[column_name(field, "height")]),
            int(row[column_name(field, "width")]),
            int(row[column_name(field, "channels")]),
        )

    def record(self, index: int) -> Record:
        """Return record `index` as a mapping from field name to value."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"record {index} out of range for a shard of {len(self)}")
        return Record(self, index % len(self))

    def __iter__(self) -> Iterator[Record]:
        for i in range(len(self)):
            yield Record(self, i)

    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Record(Mapping[str, Any]):
    """One record: field name -> value. JPEG and bytes fields are zero-copy memoryviews, raw
    fields read-only uint8 numpy arrays H x W x C and ndarray fields read-only numpy arrays of
    their shape (both zero-copy views of the shard), str fields str, json fields the parsed
    value, int64 and float64 Python numbers."""

    __slots__ = ("_shard", "index")

    def __init__(self, shard: ShardReader, index: int) -> None:
        self._shard = shard
        self.index = index

    @property
    def shard(self) -> str:
        return self._shard.path

    def __getitem__(self, name: str) -> Any:
        field = self._shard.schema.field(name) if name in self._shard.schema.names else None
        if field is None:
            raise KeyError(name)
        if not field.is_variable:
            value = self._shard.table[self.index][name]
            return int(value) if field.type == "int64" else float(value)
        data = self._shard.payload(self.index, name)
        if field.type == "str":
            try:
                return bytes(data).decode("utf-8")
            except UnicodeDecodeError as err:
                raise self._invalid(name, f"is not valid UTF-8: {err}") from err
        if field.type == "json":
            try:
                return parse_json(data)
            except JsonTextError as err:
                raise self._invalid(name, f"is not valid JSON text: {err}") from err
        if field.type == "raw":
            info = self.image_info(name)
            return np.frombuffer(data, np.uint8).reshape(info.height, info.width, info.channels)
        if field.type == "ndarray":
            return np.frombuffer(data, NDARRAY_DTYPES[field.dtype or ""]).reshape(field.shape or ())
        return data

    def _invalid(self, name: str, problem: str) -> FormatError:
        offset = int(self._shard.table[self.index][column_name(name, "offset")])
        return FormatError(f"field {name!r} {problem}", path=self.shard, offset=offset, record=self.index)

    def image_info(self, name: str = "image") -> ImageInfo:
        return self._shard.image_info(self.index, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shard.schema.names)

    def __len__(self) -> int:
        return len(self._shard.schema.fields)

    def __repr__(self) -> str:
        return f"Record({self._shard.path!r}, {self.index})"


class DatasetReader:
    """A dataset: the shards its manifest lists, as one sequence of records.

    Shards are opened lazily, on the first access to one of their records, and each is checked
    against the manifest's size on open. Binary shards are read by `ShardReader`, tar shards
    (``shard_format: "tar"``) by `tarreader.TarShardReader` through their member index; both
    offer the same record table. Use `open_dataset` to make one.

    A dataset given by URL is read through `location` (range reads or the shard cache of
    `RemoteOptions`), binary and tar shards alike; tars themselves must be local to be opened
    directly.

    Attributes:
        location: where the manifest and shards live, and how shards open (`storage.DatasetLocation`).
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
        from .tarindex import open_tars, tar_sources

        tars = None if _is_dataset_url(path) else tar_sources(path)
        self._confine = tars is None  # shards a manifest names stay inside its root; tars named directly need not
        if tars is None:
            self.location = locate_dataset(path, remote=remote)  # type: ignore[arg-type]
            self.manifest = self.location.load_manifest()
            self.root = self.location.root
            self.index_root = self.root
        else:
            self.manifest, root, self.index_root = open_tars(tars)
            self.root = root
            self.location = DatasetLocation(LocalStore(root), "manifest.json", root, os.fspath(root / "manifest.json"))
        self.verify = verify
        self.schema = self.manifest.schema
        self.classes = self.manifest.classes
        counts = [shard.num_records for shard in self.manifest.shards]
        self.cumulative = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self._readers: dict[int, Any] = {}

    def __len__(self) -> int:
        return int(self.cumulative[-1])

    def shard(self, shard_index: int) -> Any:
        """Open (once) and return shard number `shard_index`, checked against the manifest: a
        `ShardReader`, or a `tarreader.TarShardReader` for a tar shard."""
        reader = self._readers.get(shard_index)
        if reader is None:
            entry = self.manifest.shards[shard_index]
            if not self.location.is_remote:
                reader = open_shard(Path(self.root), entry, verify=self.verify, index_root=Path(self.index_root), confine=self._confine)
            else:
                reader = self._open_remote(entry)
            try:
                self._check_shard(entry, reader)
            except BaseException:
                reader.close()
                raise
            self._readers[shard_index] = reader
        return reader

    def _check_shard(self, entry: ShardEntry, reader: Any) -> None:
        """Manifest step 12: the shard agrees with its entry and with the manifest."""
        manifest_path = self.location.manifest_path
        if len(reader) != entry.num_records:
            raise ManifestError(f"shard {entry.path} holds {len(reader)} records but the manifest says {entry.num_records}", path=manifest_path)
        if reader.schema != self.schema:
            raise ManifestError(f"shard {entry.path} has a schema that differs from the manifest's", path=manifest_path)
        major, minor = reader.index.version if entry.index is not None else reader.version
        stated = self.manifest.format_version
        if major != stated[0] or minor > stated[1]:
            raise ManifestError(
                f"{'index of ' if entry.index is not None else ''}shard {entry.path} has format version {major}.{minor}, "
                f"newer than the manifest's {stated[0]}.{stated[1]}",
                path=manifest_path,
            )
        if self.classes is not None:
            check_labels(reader, self.schema, len(self.classes))

    def _open_remote(self, entry: ShardEntry) -> Any:
        """Open a shard of a dataset given by URL: a binary shard with two range reads (header;
        table and footer), a tar shard with one GET of its member index and none of the tar."""
        source = self.location.open_shard(entry, self.schema)
        try:
            if entry.index is None:
                return ShardReader(source.path, verify=self.verify, expected_size=entry.size, source=source)
            from .tarreader import TarShardReader

            index = self.location.open_index(entry)
            return TarShardReader(
                source.path, index=index.path, verify=self.verify, expected_size=entry.size,
                expected_index_size=entry.index.size, source=source, index_source=index,
            )
        except BaseException:
            source.close()
            raise

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
    root: Path, entry: ShardEntry, *, verify: bool = True, index_root: Path | None = None, confine: bool = True
) -> Any:
    """Open the shard a manifest entry names, checked against the entry's sizes.

    Args:
        root: the folder the entry's path is relative to.
        entry: the manifest entry.
        verify: check each record's checksum when its payload is read.
        index_root: the folder a tar shard's index path is relative to (default `root`).
        confine: refuse a shard (or index) whose path, symbolic links resolved, leaves its root.

    Returns:
        A `ShardReader`, or a `tarreader.TarShardReader` for an entry with an index.

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
    from .tarreader import TarShardReader

    return TarShardReader(
        root / entry.path,
        index=index_root / entry.index.path,
        verify=verify,
        expected_size=entry.size,
        expected_index_size=entry.index.size,
    )


def _check_inside(root: Path, relative: str) -> None:
    """Manifest step 10: the file a manifest path names, every symbolic link resolved, lies
    inside the dataset root (itself resolved)."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(root / relative)
    if os.path.commonpath([real_root, real]) != real_root:
        raise ShardNotFoundError(
            "is a symbolic link (or lies under one) that leads out of the dataset root; "
            "a reader does not follow links out of the root",
            path=root / relative,
        )


def check_labels(reader: Any, schema: Schema, num_classes: int) -> None:
    """Check that every label of a shard names a class: 0 <= label < `num_classes`, for the
    int64 field named "label" (manifest step 12; nothing to check without one).

    Raises:
        FormatError: naming the shard (a tar shard's index, where its labels live), the record
            and the offset of its label column.
    """
    if "label" not in schema.names or schema.field("label").type != "int64":
        return
    labels: np.ndarray[Any, Any] = reader.table["label"]
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        index = int(np.argmax(bad))
        table = getattr(reader, "index", reader)  # a tar's labels live in its member index
        column = table.dtype.fields["label"][1]
        raise FormatError(
            f"label {int(labels[index])} names no class (the manifest has {num_classes})",
            path=table.path,
            offset=table.table_offset + index * table.dtype.itemsize + column,
            record=index,
        )


def _is_dataset_url(path: Any) -> bool:
    """True for a dataset given by URL; a URL naming tars (``.tar``, braces) is refused here, since
    tars opened directly are indexed and memory-mapped locally."""
    if not isinstance(path, (str, os.PathLike)) or not is_url(os.fspath(path)):
        return False
    base = os.fspath(path).partition("?")[0]
    if base.endswith(".tar") or "{" in base:
        raise ValueError(
            f"{base[:80]!r}: only local tars can be opened directly (they are indexed and memory-mapped here); "
            "index them into a dataset (shardfmt index), put it in the store and open the dataset's URL"
        )
    return True


def open_dataset(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *, verify: bool = True, remote: RemoteOptions | None = None
) -> DatasetReader:
    """Open a dataset by its directory or its manifest.json, locally or by URL, or local WebDataset
    tars directly.

    Args:
        path: the dataset root or its manifest: a local path, or a URL that fsspec can open
            (``s3://bucket/prefix``, ``gs://...``, ``https://host/data``, ...), binary or tar
            shards; or local tars: a path ending in ``.tar``, a pattern with braces
            (``shards-{000..099}.tar``), or a list of those. Tars opened directly are indexed on
            first open into a cache, and found there afterwards (see `tarindex.open_tars` for
            where); a directory without manifest.json is never a dataset, even one full of tars
            (index it with `tarindex.index_tars`).
        verify: check each record's checksum when its payload is read.
        remote: for a URL, how to read it: range reads (default) or a local shard cache,
            credentials, retries (see `RemoteOptions`).

    Returns:
        A `DatasetReader`: ``len()``, ``reader[i]`` -> `Record`, iteration in order.

    Raises:
        DatasetNotFoundError: no manifest (not a dataset, or an unfinished conversion).
        ManifestError, UnsupportedVersionError: the manifest is invalid or too new.
        ShardNotFoundError, FormatError: a tar opened directly is missing or malformed.
        RemoteError: a remote store failed after its retries.
        ValueError: tars named by URL (they must be local to be opened directly).
    """
    return DatasetReader(path, verify=verify, remote=remote)
