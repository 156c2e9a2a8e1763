"""The bytes of a binary shard: the single source of truth for magic, versions, structs and limits.

A shard is, in file order::

    header   64 bytes  HEADER_DTYPE, then the schema (canonical JSON), zero-padded to `alignment`
    payload            each record's variable-size fields, every field starting at a multiple of
                       `alignment`, records back to back with no gaps
    table              num_records rows of the record dtype built by `record_dtype(schema)`
    block checksums    (1.2, flag TABLE_BLOCKS) one XXH3-64 per block of TABLE_BLOCK_ROWS rows
    footer   64 bytes  FOOTER_DTYPE: where the table is, how many rows, its checksum

Every integer is little-endian. spec/format.md describes the same bytes in prose and tables; when
this module and the spec disagree, that is a bug in one of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np

MAGIC: Final = b"\x89SHARD\r\n"
"""Eight bytes at offset 0. The 0x89 and CR LF catch 7-bit and text-mode transfers."""
FOOTER_MAGIC: Final = b"SHARDEND"
"""The last eight bytes of every shard."""

FORMAT_VERSION: Final = (1, 2)
"""(major, minor). A reader refuses another major; a newer minor only adds field types (with
limits on their own parameters), flags and optional manifest keys, which a reader either
understands or refuses by name. 1.1 added the "raw" and "ndarray" field types and MAX_NDIM;
1.2 the header flag TABLE_BLOCKS, which a 1.2 writer always sets."""
SHARD_SUFFIX: Final = ".shard"

HEADER_SIZE: Final = 64
FOOTER_SIZE: Final = 64
DEFAULT_ALIGNMENT: Final = 64
"""Payload alignment the writer uses: a cache line, and a multiple of every numeric itemsize."""

HEADER_DTYPE: Final = np.dtype(
    [
        ("magic", "S8"),
        ("major", "<u2"),
        ("minor", "<u2"),
        ("flags", "<u4"),
        ("header_size", "<u8"),
        ("schema_size", "<u4"),
        ("alignment", "<u4"),
        ("reserved", "<u8", (3,)),
        ("checksum", "<u8"),
    ]
)
"""`checksum` is xxh3_64 of header bytes [0, 56) followed by the schema bytes."""
HEADER_CHECKED_BYTES: Final = 56

FOOTER_DTYPE: Final = np.dtype(
    [
        ("table_offset", "<u8"),
        ("num_records", "<u8"),
        ("record_size", "<u4"),
        ("reserved0", "<u4"),
        ("table_checksum", "<u8"),
        ("reserved", "<u8", (2,)),
        ("checksum", "<u8"),
        ("magic", "S8"),
    ]
)
"""`table_checksum` is xxh3_64 of the table bytes, or under TABLE_BLOCKS of the block checksums,
and `reserved0` is then TABLE_BLOCK_ROWS; `checksum` is xxh3_64 of footer bytes [0, 48)."""
FOOTER_CHECKED_BYTES: Final = 48

TABLE_BLOCKS: Final = 1
"""Header flag bit 0 (1.2): the record table is followed by the XXH3-64 of each block of
TABLE_BLOCK_ROWS rows (the last block may be shorter), 8 bytes each, and the footer's
`table_checksum` covers those checksums instead of the table, so a reader verifies the table a
block at a time, when it first uses the block, instead of hashing all of it on open."""
KNOWN_FLAGS: Final = TABLE_BLOCKS
"""Bit mask of header flags this reader understands; any other bit must be 0."""
FLAG_SINCE_MINOR: Final = {TABLE_BLOCKS: 2}
"""The minor version of major 1 that added each flag: an older header with it set is malformed."""
TABLE_BLOCK_ROWS: Final = 1024
"""Rows per table block under TABLE_BLOCKS, stored in the footer's `reserved0`; fixed in 1.2."""

# Record table: three columns every record has, then the columns of each field in schema order
# (those of each field type are in fieldtypes.py).
BASE_COLUMNS: Final = [("offset", "<u8"), ("size", "<u8"), ("checksum", "<u8")]
"""`offset`/`size`: the record's payload span (all its variable-size fields with padding);
`checksum`: xxh3_64 of exactly those `size` bytes."""

NDARRAY_DTYPES: Final = {
    "uint8": "<u1",
    "uint16": "<u2",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
}
"""The element types an "ndarray" field may declare, all little-endian, by schema name."""
TYPE_SINCE_MINOR: Final = {"jpeg": 0, "int64": 0, "float64": 0, "str": 0, "bytes": 0, "json": 0, "raw": 1, "ndarray": 1}
"""The minor version of major 1 that added each field type: a shard or manifest that states an
older version than one of its types needs is malformed (every ndarray dtype came with 1.1)."""

# Limits. Each is checked before anything is allocated for the value it bounds; spec/limits.md
# gives the reason for every number.
MAX_SCHEMA_SIZE: Final = 64 * 1024
MAX_FIELDS: Final = 64
MAX_FIELD_NAME_LENGTH: Final = 64
MAX_RECORDS_PER_SHARD: Final = 1 << 24
MAX_FIELD_SIZE: Final = 1 << 30
MAX_SHARD_SIZE: Final = 1 << 40
MAX_ALIGNMENT: Final = 1 << 16
MIN_ALIGNMENT: Final = 8
MAX_IMAGE_SIDE: Final = 65535
MAX_NDIM: Final = 8
MAX_MANIFEST_SIZE: Final = 256 * 1024 * 1024
MAX_SHARDS: Final = 1 << 20
MAX_CLASSES: Final = 1 << 20
JPEG_CHANNELS: Final = (1, 3)
RAW_CHANNELS: Final = (1, 3, 4)


def align_up(value: int, alignment: int) -> int:
    """Return the smallest multiple of `alignment` (a power of two) that is >= `value`."""
    return (value + alignment - 1) & ~(alignment - 1)


def table_blocks(num_records: int) -> int:
    """Return how many blocks of TABLE_BLOCK_ROWS rows a table of `num_records` rows has."""
    return -(-num_records // TABLE_BLOCK_ROWS)


def blocks_read(rows: Iterable[int]) -> set[int]:
    """Return the table blocks that checking the rows `rows` reads: each row's block and the
    block before it, whose last row rule 25 reads (spec/format.md, section 10)."""
    return {block for row in rows for block in (row // TABLE_BLOCK_ROWS, row // TABLE_BLOCK_ROWS - 1) if block >= 0}


def column_name(field: str, column: str) -> str:
    """Return the record-table column name of `column` of `field` ("" is the field itself)."""
    return field if not column else f"{field}.{column}"
