"""Reading binary shards: validate the header, the footer and the record table before touching
a payload.

`ShardReader` opens one shard: it checks the header and the footer on open, and the record table
a block of `CHECK_BLOCK_ROWS` rows at a time: block 0 on open, any other before one of its rows
is first used, its bytes against its block checksum (a 1.2 shard; an older one has one checksum
for the whole table, checked on open) and then the structural rules (vectorised, no per-record
Python; each field type adds its own rules, see `fieldtypes`), so that opening a shard reads and
costs the same whatever its number of records. Payloads come back as memoryviews of the memory map,
verified against their checksum on access. `ShardReaderBase` is what every shard reader offers
(records by index, verification on read, closing), so that `tar.reader.TarShardReader` reads a
tar shard through the same interface; `Record` is one record as a mapping.
"""

from __future__ import annotations

import bisect
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from .._checksum import checksum
from .._errors import (
    ChecksumError,
    FormatError,
    LimitError,
    SchemaError,
    UnsupportedVersionError,
)
from .._storage import ByteSource, LocalFile, open_source
from ._fieldtypes import InvalidValue, RaiseFirst
from ._layout import (
    FLAG_SINCE_MINOR,
    FOOTER_CHECKED_BYTES,
    FOOTER_DTYPE,
    FOOTER_MAGIC,
    FOOTER_SIZE,
    FORMAT_VERSION,
    HEADER_CHECKED_BYTES,
    HEADER_DTYPE,
    HEADER_SIZE,
    KNOWN_FLAGS,
    MAGIC,
    MAX_ALIGNMENT,
    MAX_FIELD_SIZE,
    MAX_RECORDS_PER_SHARD,
    MAX_SCHEMA_SIZE,
    MAX_SHARD_SIZE,
    MIN_ALIGNMENT,
    TABLE_BLOCK_ROWS,
    TABLE_BLOCKS,
    align_up,
    blocks_read,
    column_name,
    table_blocks,
)
from ._schema import Schema

__all__ = ["CHECK_BLOCK_ROWS", "ImageInfo", "Record", "RowCheck", "ShardReader", "ShardReaderBase", "close_on_error"]

_NO_PAYLOAD = memoryview(b"")
CHECK_BLOCK_ROWS = TABLE_BLOCK_ROWS
"""Rows of the record table checked together: block 0 when a shard is opened, every other block
when one of its rows is first used (spec/format.md, section 10). The same blocks as those of the
block checksums of a 1.2 shard, so that a block is hashed and checked in one step."""
_Reader = TypeVar("_Reader", bound="ShardReaderBase")


class _Closable(Protocol):
    def close(self) -> None: ...


@contextmanager
def close_on_error(resource: _Closable) -> Iterator[None]:
    """Close `resource` if the block raises (anything, KeyboardInterrupt too), then re-raise."""
    try:
        yield
    except BaseException:
        resource.close()
        raise

EMPTY_CHECKSUM = checksum(b"")
"""The XXH3-64 of no bytes: the checksum of every empty record span (0x2d06800538d394c2)."""


@dataclass(frozen=True)
class ImageInfo:
    """Size of an image field, from the record table (no payload is read)."""

    height: int
    width: int
    channels: int


class Record(Mapping[str, Any]):
    """One record: field name -> value, decoded by the field's type (`fieldtypes`). JPEG and
    bytes fields are zero-copy memoryviews, raw fields read-only uint8 numpy arrays H x W x C and
    ndarray fields read-only numpy arrays of their shape (both zero-copy views of the shard), str
    fields str, json fields the parsed value, int64 and float64 Python numbers."""

    __slots__ = ("_shard", "index")

    def __init__(self, shard: ShardReaderBase, index: int) -> None:
        self._shard = shard
        self.index = index

    @property
    def shard(self) -> str:
        return self._shard.path

    def __getitem__(self, name: str) -> Any:
        schema = self._shard.schema
        if name not in schema.names:
            raise KeyError(name)
        field = schema.field(name)
        kind = field.kind
        data = self._shard.payload(self.index, name) if kind.is_variable else _NO_PAYLOAD
        try:
            return kind.decode(field, self._shard.table, self.index, data)
        except InvalidValue as err:
            raise self._invalid(name, str(err)) from err

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


RowCheck = Callable[["ShardReaderBase", int, int], None]
"""A rule on table rows [start, stop) of a reader, raising for the first row that breaks it."""


class ShardReaderBase(ABC):
    """What every shard reader offers: a record table over a byte source, records by index,
    payloads verified on read, closing. `ShardReader` reads binary shards and
    `tar.reader.TarShardReader` tar shards; a subclass sets `schema` and `table` when it opens.

    Attributes:
        source: the shard's bytes, for range reads (a memory map, a remote object, a cached file).
        path: how messages name the shard.
        verify: check a record's checksum whenever one of its payloads is read.
        schema: the fields of every record.
        table: one row per record, with the columns of `Schema.record_dtype()`; ``offset``,
            ``size`` and ``checksum`` are the span of `source` that a record's checksum covers.
    """

    schema: Schema
    table: np.ndarray[Any, Any]
    _record_type: ClassVar[type[Record]] = Record
    _span_noun: ClassVar[str] = "payload"
    """How messages name the span a record's checksum covers."""
    _file_noun: ClassVar[str] = "shard"
    """How messages name the file."""

    def __init__(self, path: str | os.PathLike[str], *, verify: bool, source: ByteSource | None) -> None:
        self.source = source if source is not None else open_source(os.fspath(path))
        self.path = self.source.path
        self.verify = verify

    def __len__(self) -> int:
        return len(self.table)

    def _start_checks(self) -> None:
        """Mark every block of rows unchecked (a subclass calls it once `table` is set), then
        check block 0."""
        self._unchecked = bytearray(b"\1") * -(-len(self.table) // CHECK_BLOCK_ROWS)
        self._checked_blocks: list[int] = []
        self._row_checks: list[RowCheck] = []
        if self._unchecked:
            self._check_block(0)

    def add_row_check(self, check: RowCheck) -> None:
        """Add a rule that every row must pass before it is used: `check(reader, start, stop)`
        runs now on the blocks already checked, and on every other block when it is checked."""
        for block in self._checked_blocks:
            check(self, *self._block_rows(block))
        self._row_checks.append(check)

    def check_row(self, index: int) -> None:
        """Check the block of rows that holds record `index` unless it was checked: call it
        before reading the record's table row (`payload`, `record` and `image_info` do).

        Raises:
            FormatError: a row of that block breaks a rule (subclasses say which kind).
        """
        if index < 0:
            index += len(self.table)
        if self._unchecked[index // CHECK_BLOCK_ROWS]:
            self._check_block(index // CHECK_BLOCK_ROWS)

    def unread_table(self, indices: list[int]) -> list[tuple[int, int]]:
        """The byte ranges of the table that checking the rows of records `indices` would read
        for the first time (for a read-ahead hint); none by default."""
        return []

    def check_all(self) -> None:
        """Check every block of rows not checked yet: call it before reading whole columns."""
        for block in range(len(self._unchecked)):
            if self._unchecked[block]:
                self._check_block(block)

    def _block_rows(self, block: int) -> tuple[int, int]:
        start = block * CHECK_BLOCK_ROWS
        return start, min(start + CHECK_BLOCK_ROWS, len(self.table))

    def _check_block(self, block: int) -> None:
        start, stop = self._block_rows(block)
        position = bisect.bisect_left(self._checked_blocks, block)
        before = self._checked_blocks[position - 1] if position else None
        after = self._checked_blocks[position] if position < len(self._checked_blocks) else None
        self._check_rows(start, stop, before=before, after=after)
        for check in self._row_checks:
            check(self, start, stop)
        self._unchecked[block] = 0
        self._checked_blocks.insert(position, block)

    def _check_rows(self, start: int, stop: int, *, before: int | None, after: int | None) -> None:
        """Check the structural rules of rows [start, stop); `before` and `after` are the
        nearest blocks already checked on either side. Default: none (a table built checked)."""
        return

    @abstractmethod
    def locate_column(self, index: int, column: str) -> tuple[str, int]:
        """Return the file and the byte offset where `column` of record `index` is stored."""

    def payload(self, index: int, field: str) -> memoryview:
        """Return the bytes of variable-size `field` of record `index` as a read-only view.

        Raises:
            SchemaError: `field` is not a variable-size field of the schema.
            ChecksumError: verification is on and the record's bytes do not match its checksum.
        """
        self.check_row(index)
        row = self.table[index]
        try:
            start, size = int(row[column_name(field, "offset")]), int(row[column_name(field, "size")])
        except ValueError as err:  # numpy: no such column
            names = ", ".join(f.name for f in self.schema.variable_fields)
            raise SchemaError(f"no variable-size field {field!r} in this {self._file_noun} (fields: {names})") from err
        if self.verify:
            self.verify_record(index)
        return self.source.read(start, start + size)

    def check_file(self, index: int) -> None:
        """Check, before records are read from the memory map, that the file was not truncated
        since it was opened: reading the bytes it lost would end the process with SIGBUS. One
        ``stat`` call; a file truncated after it (while its bytes are being read) is not caught.

        Raises:
            FormatError: naming the file, its size now and then, and record `index` about to be read.
        """
        if not isinstance(self.source, LocalFile):
            return
        size = self.source.shrunk()
        if size is not None:
            raise FormatError(
                f"the {self._file_noun} file was truncated to {size} bytes after it was opened ({self.source.size} bytes then): "
                "it changed while it was being read; restore it (or convert the dataset again) and start anew",
                path=self.path,
                offset=size,
                record=index,
            )

    def verify_record(self, index: int) -> None:
        """Check record `index`'s span against its XXH3-64.

        Raises:
            ChecksumError: naming the file, the record and the span's first byte.
        """
        self.check_row(index)
        row = self.table[index]
        start, size = int(row["offset"]), int(row["size"])
        if checksum(self.source.read(start, start + size)) != int(row["checksum"]):
            raise ChecksumError(
                f"{self._span_noun} [{start}, {start + size}) does not match its checksum: the {self._file_noun} is corrupt",
                path=self.path,
                offset=start,
                record=index,
            )

    def image_info(self, index: int, field: str = "image") -> ImageInfo:
        """Return the height, width and channels of image `field` of record `index`."""
        self.check_row(index)
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
        self.check_row(index)
        return self._record_type(self, index % len(self))

    def __iter__(self) -> Iterator[Record]:
        for i in range(len(self)):
            self.check_row(i)
            yield self._record_type(self, i)

    def close(self) -> None:
        self.source.close()

    def __enter__(self: _Reader) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ShardReader(ShardReaderBase):
    """One binary shard, validated on open, its table rows a block at a time on first use.

    Args:
        path: the shard file.
        verify: check each record's XXH3-64 when its payload is read (about 4 us per 100 KB).
        expected_size: the size the manifest states; a mismatch raises before anything else.
        source: the shard's bytes (a remote object, a cached shard); default: a memory map of `path`.

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
        super().__init__(path, verify=verify, source=source)
        with close_on_error(self):
            self._open(expected_size)

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
        self._read_header(size)
        num_records, table_offset, table_checksum = self._read_footer(size)
        self._read_table(num_records, table_offset, size - FOOTER_SIZE, table_checksum)

    def _read_header(self, size: int) -> None:
        """Validation steps of the header and schema; set schema, version, alignment and
        header_size."""
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
        self._check_flags(flags, major, minor)
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
        self.schema = self._parse_schema(bytes(schema_bytes), minor)
        self.version = (major, minor)
        self.table_blocks = bool(flags & TABLE_BLOCKS)
        """The table has block checksums (flag TABLE_BLOCKS)."""
        self.alignment = alignment
        self.header_size = header_size

    def _check_flags(self, flags: int, major: int, minor: int) -> None:
        """Step 6: no bit this reader does not know, none newer than the header's version."""
        if flags & ~KNOWN_FLAGS:
            raise self._fail(UnsupportedVersionError, f"header flags 0x{flags:08x} hold bits this reader does not know", 12)
        for flag, since in FLAG_SINCE_MINOR.items():
            if flags & flag and minor < since:  # a bit its version does not define: unknown to a reader of that version
                message = f"header flag 0x{flag:x} came with format version 1.{since}, but the version stated is {major}.{minor}"
                raise self._fail(UnsupportedVersionError, message, 12)

    def _parse_schema(self, data: bytes, minor: int) -> Schema:
        """The header's schema, valid for the header's minor version."""
        try:
            schema = Schema.from_bytes(data)
            schema.check_version(minor)
        except UnsupportedVersionError as err:
            raise self._fail(UnsupportedVersionError, err.message, HEADER_SIZE) from err
        except SchemaError as err:
            raise self._fail(FormatError, f"schema: {err.message}", HEADER_SIZE) from err
        return schema

    def _read_footer(self, size: int) -> tuple[int, int, int]:
        """Validation steps of the footer; return the number of records, the table's offset and
        its checksum."""
        footer_offset = size - FOOTER_SIZE
        raw_footer = self.source.read(footer_offset, size)
        footer = np.frombuffer(raw_footer, FOOTER_DTYPE, count=1)[0]
        if bytes(raw_footer[-8:]) != FOOTER_MAGIC:
            found = bytes(raw_footer[-8:])
            raise self._fail(FormatError, f"footer magic is {found!r}, expected {FOOTER_MAGIC!r}: file truncated or extended?", size - 8)
        if checksum(bytes(raw_footer[:FOOTER_CHECKED_BYTES])) != int(footer["checksum"]):
            offset = footer_offset + FOOTER_CHECKED_BYTES
            raise self._fail(ChecksumError, "footer checksum does not match: the footer is corrupt", offset)
        block_rows = TABLE_BLOCK_ROWS if self.table_blocks else 0
        if int(footer["reserved0"]) != block_rows:
            raise self._fail(FormatError, self._reserved0_problem(int(footer["reserved0"])), footer_offset + 20)
        if any(int(x) for x in footer["reserved"]):
            raise self._fail(FormatError, "reserved footer bytes are not zero", footer_offset + 20)
        self.dtype = self.schema.record_dtype()
        record_size = int(footer["record_size"])
        if record_size != self.dtype.itemsize:
            message = f"record_size {record_size} differs from the {self.dtype.itemsize} bytes the schema defines"
            raise self._fail(FormatError, message, footer_offset + 16)
        num_records = int(footer["num_records"])
        if num_records > MAX_RECORDS_PER_SHARD:
            raise self._fail(LimitError, f"{num_records} records exceed the limit of {MAX_RECORDS_PER_SHARD}", footer_offset + 8)
        table_offset = int(footer["table_offset"])
        header_size = self.header_size
        if table_offset % self.alignment or not header_size <= table_offset <= footer_offset:
            message = f"table offset {table_offset} is unaligned or outside [{header_size}, {footer_offset}]"
            raise self._fail(FormatError, message, footer_offset)
        sums = 8 * table_blocks(num_records) if self.table_blocks else 0
        if table_offset + num_records * record_size + sums != footer_offset:
            after = f" and its {sums // 8} block checksums" if self.table_blocks else ""
            raise self._fail(
                FormatError,
                f"table [{table_offset}, {table_offset + num_records * record_size}) of {num_records} records{after} "
                f"does not end where the footer starts ({footer_offset})",
                footer_offset,
            )
        return num_records, table_offset, int(footer["table_checksum"])

    def _reserved0_problem(self, found: int) -> str:
        if self.table_blocks:
            return f"footer reserved0 (rows per table block) is {found}, not {TABLE_BLOCK_ROWS} (flag TABLE_BLOCKS)"
        return "reserved footer bytes are not zero"

    def _read_table(self, num_records: int, table_offset: int, footer_offset: int, table_checksum: int) -> None:
        """Check the table checksum (of a 1.2 shard: of its block checksums), then block 0."""
        rows_end = table_offset + num_records * self.dtype.itemsize
        self._unverified = bytearray(table_blocks(num_records))
        if self.table_blocks:  # step 22 reads the block checksums only; the rows wait for use
            sums = self.source.read(rows_end, footer_offset)
            if checksum(sums) != table_checksum:
                message = "block checksums of the record table do not match the footer's table_checksum: the table is corrupt"
                raise self._fail(ChecksumError, message, rows_end)
            self._block_sums: np.ndarray[Any, Any] = np.frombuffer(sums, "<u8")
            self._unverified = bytearray(b"\1") * len(self._unverified)
        elif isinstance(self.source, LocalFile):  # step 22 reads every byte of the table: in one go
            self.source.will_need(table_offset, footer_offset)
        self._rows: np.ndarray[Any, Any] | None = None
        if self.table_blocks and not self.source.zero_copy:  # a range read per block, when it is verified
            self._rows = np.zeros(num_records * self.dtype.itemsize, np.uint8)
            table_bytes: memoryview | np.ndarray[Any, Any] = self._rows
        else:  # of a memory map, a view: a flagged shard's rows are read when their block is verified
            table_bytes = read = self.source.read(table_offset, rows_end)
            if not self.table_blocks and checksum(read) != table_checksum:
                raise self._fail(ChecksumError, "record table checksum does not match: the table is corrupt", table_offset)
        self.table_offset = table_offset
        self.table: np.ndarray[Any, Any] = np.frombuffer(table_bytes, self.dtype, count=num_records)
        self.table.flags.writeable = False
        self._variable_names = tuple(field.name for field in self.schema.fields if field.is_variable)
        if num_records == 0 and self.header_size != table_offset:
            raise self._fail(FormatError, f"no records, yet {table_offset - self.header_size} payload bytes", self.header_size)
        self._start_checks()

    def unread_table(self, indices: list[int]) -> list[tuple[int, int]]:
        """The table blocks (of a flagged table) not verified yet that checking the rows of
        `indices` reads: each row's block and the block before it (rule 25)."""
        if not self.table_blocks or not any(self._unverified):
            return []
        ranges, row = [], self.dtype.itemsize
        for block in blocks_read(indices):
            if self._unverified[block]:
                start, stop = self._block_rows(block)
                ranges.append((self.table_offset + start * row, self.table_offset + stop * row))
        return ranges

    def _verify_block(self, block: int) -> None:
        """Step 22 for block `block` of a flagged table: its rows against its block checksum."""
        if not self._unverified[block]:
            return
        start, stop = self._block_rows(block)
        row = self.dtype.itemsize
        first, end = self.table_offset + start * row, self.table_offset + stop * row
        data = self.source.read(first, end)
        if checksum(data) != int(self._block_sums[block]):
            message = (
                f"record table block {block}, bytes [{first}, {end}) (records {start} to {stop - 1}), "
                "does not match its block checksum: the table is corrupt"
            )
            raise self._fail(ChecksumError, message, first, start)
        if self._rows is not None:
            self._rows[first - self.table_offset : end - self.table_offset] = np.frombuffer(data, np.uint8)
        self._unverified[block] = 0

    def _end_of(self, index: int) -> int:
        """Where record `index`'s span ends (H for index -1), as stored, even in a row not
        checked: past T it is T + 1, which no checked offset equals."""
        if index < 0:
            return self.header_size
        row = self.table[index]
        return min(int(row["offset"]) + int(row["size"]), self.table_offset + 1)

    def _check_rows(self, start: int, stop: int, *, before: int | None, after: int | None) -> None:
        """Rules 24 to 29 and step 30 for empty spans on rows [start, stop), each for every row
        before the next; rule 25 across the block's edges too: its first row starts where row
        start - 1 ends, after the last row of the nearest checked block before it, and its
        last row ends before the first of the nearest checked block after it. A flagged
        table's block is verified against its checksum first, then the block before it, whose
        last row rule 25 reads."""
        block = start // CHECK_BLOCK_ROWS
        self._verify_block(block)
        if block:
            self._verify_block(block - 1)
        table, a = self.table[start:stop], np.uint64(self.alignment)

        def raise_first(bad: np.ndarray[Any, Any], message: str, column: str, cls: type[FormatError] = FormatError) -> None:
            if bad.any():
                i = start + int(np.argmax(bad))
                raise self._fail(cls, message, self.locate_column(i, column)[1], i)

        offsets, sizes = table["offset"], table["size"]
        limit = np.uint64(self.table_offset)
        raise_first((offsets > limit) | (sizes > limit), "record span lies outside the payload region", "offset")
        starts = np.empty(len(table), np.uint64)
        starts[0] = self._end_of(start - 1)
        starts[1:] = offsets[:-1] + sizes[:-1]
        raise_first(offsets != starts, "record does not start where the previous one ends (records must be contiguous)", "offset")
        self._check_edges(start, stop, before=before, after=after)
        self._raise_first_field_rules(table, raise_first, a)
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
                start + i,
            )

    def _check_edges(self, start: int, stop: int, *, before: int | None, after: int | None) -> None:
        """Rule 26 for the last block, then what rules 25 and 26 give every row of a table
        checked whole: rows [start, stop) lie in [H, T), in order with the checked rows."""
        n, row = len(self.table), self.dtype.itemsize
        if stop == n and self._end_of(n - 1) != self.table_offset:
            end = int(self.table["offset"][-1]) + int(self.table["size"][-1])
            message = f"last record ends at {end}, not at the table ({self.table_offset})"
            raise self._fail(FormatError, message, self.table_offset + (n - 1) * row, n - 1)
        first, end = int(self.table["offset"][start]), self._end_of(stop - 1)
        low = self.header_size if before is None else self._end_of(self._block_rows(before)[1] - 1)
        if first < low:
            message = f"record starts at {first}, before {low}, where the records before it end (records must be contiguous)"
            raise self._fail(FormatError, message, self.locate_column(start, "offset")[1], start)
        high = self.table_offset if after is None else int(self.table["offset"][self._block_rows(after)[0]])
        if end > high:
            message = f"record ends at {end}, past {high}, where the records after it start (records must be contiguous)"
            raise self._fail(FormatError, message, self.locate_column(stop - 1, "offset")[1], stop - 1)

    def _raise_first_field_rules(self, table: np.ndarray[Any, Any], raise_first: RaiseFirst, a: np.uint64) -> None:
        """Rules 27 to 29 on the rows of `table` (a block of the record table)."""
        offsets, sizes = table["offset"], table["size"]
        raise_first(sizes % a != 0, f"record size is not a multiple of the alignment {self.alignment}", "size")
        position = offsets.copy()
        for field in self.schema.fields:
            kind = field.kind
            if kind.is_variable:
                f_off = table[column_name(field.name, "offset")]
                f_size = table[column_name(field.name, "size")]
                raise_first(
                    f_size > np.uint64(MAX_FIELD_SIZE),
                    f"field {field.name!r} is larger than the limit of {MAX_FIELD_SIZE} bytes",
                    column_name(field.name, "size"),
                    LimitError,
                )
                expected = (position + a - np.uint64(1)) & ~(a - np.uint64(1))
                message = f"field {field.name!r} payload is not at the next aligned offset of its record"
                raise_first(f_off != expected, message, column_name(field.name, "offset"))
                position = f_off + f_size
            kind.check_table(field, table, raise_first)
        ends = (position + a - np.uint64(1)) & ~(a - np.uint64(1))
        raise_first(ends != offsets + sizes, "record span does not end at the aligned end of its last field", "size")

    def verify_record(self, index: int) -> None:
        """Check record `index`'s span against its XXH3-64, then that its padding is zero.

        Raises:
            ChecksumError: naming the shard, the record and the span's first byte.
            FormatError: a padding byte is not zero (at its offset).
        """
        super().verify_record(index)
        row = self.table[index]
        start = int(row["offset"])
        span = self.source.read(start, start + int(row["size"]))
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

    def locate_column(self, index: int, column: str) -> tuple[str, int]:
        fields = self.dtype.fields
        if fields is None:  # the table's dtype is always structured; a plain one is a bug here
            raise TypeError(f"the record table's dtype {self.dtype} has no fields")
        return self.path, self.table_offset + index * self.dtype.itemsize + int(fields[column][1])
