"""Regenerate the golden vectors of the current format version: spec/vectors/v<MAJOR>.<MINOR>/.

    python tools/make_vectors.py            # (re)write the vectors
    python tools/make_vectors.py --check    # compare instead: exit 1 and name what differs

Everything is deterministic: JPEG payloads are encoded by libjpeg-turbo (through simplejpeg, with
the exact integer DCT) from block-flat patterns, so they do not depend on DCT rounding. Vectors of
released versions are never regenerated; only the directory of `FORMAT_VERSION` is written.

The directory holds:

    index.json              every vector with its description
    valid/NAME.shard        a shard and NAME.json, what a reader must find in it
    valid/tiny.txt          the annotated byte listing of tiny.shard (spec/format.md shows it)
    invalid/NAME.shard      a shard that breaks one rule and NAME.json, the error a reader must report
    dataset/                a complete dataset: manifest.json and two shards
    dataset.json            the records a reader must find in dataset/
"""

from __future__ import annotations

import argparse
import filecmp
import json
import math
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the vectors come from this checkout's shardfmt, installed or not

from shardbytes import ShardBytes, build_shard  # noqa: E402

from shardfmt import DatasetWriter  # noqa: E402
from shardfmt._checksum import checksum, format_checksum  # noqa: E402
from shardfmt._checksum import file_checksum as checksum_of_file  # noqa: E402
from shardfmt.format import IMAGE_CLASSIFICATION, Field, Schema, ShardReader, ShardWriter  # noqa: E402
from shardfmt.format._layout import (  # noqa: E402
    FOOTER_DTYPE,
    FOOTER_SIZE,
    FORMAT_VERSION,
    HEADER_DTYPE,
    HEADER_SIZE,
    MAX_CLASSES,
    MAX_FIELD_SIZE,
    MAX_RECORDS_PER_SHARD,
    MAX_SCHEMA_SIZE,
    MAX_SHARD_SIZE,
    NDARRAY_DTYPES,
    TABLE_BLOCK_ROWS,
    column_name,
)
from shardfmt.format._schema import tar_schema as tar_dataset_schema  # noqa: E402
from shardfmt.tar._index import INDEX_SCHEMA  # noqa: E402

VERSION = f"v{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}"
DEFAULT_OUT = ROOT / "spec" / "vectors" / VERSION


# --- payloads --------------------------------------------------------------------------------


def flat_blocks(height: int, width: int, channels: int, *, seed: int) -> np.ndarray[Any, Any]:
    """A uint8 image whose every 16x16 block has one colour, so its JPEG is exact to encode."""
    y = np.arange(height)[:, None] // 16
    x = np.arange(width)[None, :] // 16
    planes = [(y * (37 + 11 * c) + x * (91 + 7 * c) + seed * 53 + c * 80) % 256 for c in range(channels)]
    return np.stack(planes, axis=-1).astype(np.uint8)


def jpeg_rgb(height: int, width: int, *, seed: int) -> bytes:
    return bytes(simplejpeg.encode_jpeg(flat_blocks(height, width, 3, seed=seed), quality=75, colorsubsampling="420"))


def jpeg_gray(height: int, width: int, *, seed: int) -> bytes:
    image = flat_blocks(height, width, 1, seed=seed)
    return bytes(simplejpeg.encode_jpeg(image, quality=75, colorspace="GRAY", colorsubsampling="Gray"))


# --- valid shards ----------------------------------------------------------------------------

def raw_pixels(height: int, width: int, channels: int, *, seed: int) -> np.ndarray[Any, Any]:
    """Small uint8 pixels H x W x C whose every byte differs from its neighbours."""
    values = (np.arange(height * width * channels) * 37 + seed * 11) % 256
    return values.astype(np.uint8).reshape(height, width, channels)


ALL_TYPES = Schema.of(image="jpeg", label="int64", score="float64", key="str", blob="bytes", meta="json")
TINY = Schema.of(data="bytes", label="int64")
ARRAYS = Schema.of(
    u8="ndarray:uint8:3",
    u16="ndarray:uint16:2",
    i16="ndarray:int16:2x2",
    i32="ndarray:int32:1",
    i64="ndarray:int64:2",
    f16="ndarray:float16:3",
    f32="ndarray:float32:2x1x2",
    f64="ndarray:float64:4",
)
PAIRS = Schema.of(lr="raw", hr="raw", mask="raw", label="int64")

VALID: dict[str, tuple[str, Schema, list[dict[str, Any]], int]] = {
    "empty": ("no records: header, empty table, footer", IMAGE_CLASSIFICATION, [], 64),
    "tiny": (
        "one record with a bytes and an int64 field; spec/format.md walks through its bytes",
        TINY,
        [{"data": b"hello", "label": 3}],
        64,
    ),
    "several": (
        "five image-classification records of varied sizes",
        IMAGE_CLASSIFICATION,
        [
            {"image": jpeg_rgb(h, w, seed=i), "label": i % 3, "key": f"sample-{i:02d}"}
            for i, (h, w) in enumerate([(8, 8), (24, 40), (16, 16), (40, 8), (8, 56)])
        ],
        64,
    ),
    "all-types": (
        "every field type; non-ASCII and empty strings, empty bytes, nested JSON, extreme numbers",
        ALL_TYPES,
        [
            {
                "image": jpeg_rgb(16, 24, seed=7),
                "label": -(1 << 63),
                "score": -0.0,
                "key": "",
                "blob": b"",
                "meta": None,
            },
            {
                "image": jpeg_gray(8, 16, seed=8),
                "label": (1 << 63) - 1,
                "score": 5e-324,
                "key": "\u00f1and\u00fa \u65e5\u672c\u8a9e \U0001f980",
                "blob": bytes(range(256)),
                "meta": {"b": [1, 2.5, "x"], "a": {"nested": True}, "\u00e9": None},
            },
            {
                "image": jpeg_rgb(8, 8, seed=9),
                "label": -1,
                "score": math.inf,
                "key": "a\x00b\nc",
                "blob": b"\x00" * 64,
                "meta": "a string",
            },
            {
                "image": jpeg_rgb(8, 32, seed=10),
                "label": 0,
                "score": math.nan,
                "key": "last",
                "blob": b"\xff",
                "meta": [],
            },
        ],
        64,
    ),
    "blocks": (
        "1,030 records in two table blocks, the second of 6 rows, each with its block checksum (v1.2)",
        Schema.of(label="int64"),
        [{"label": i} for i in range(TABLE_BLOCK_ROWS + 6)],
        64,
    ),
    "scalars": (
        "only int64 and float64 fields: every record has an empty payload span",
        Schema.of(label="int64", score="float64"),
        [
            {"label": 0, "score": 0.5},
            {"label": -2, "score": -math.inf},
            {"label": 1 << 40, "score": 1.7976931348623157e308},
        ],
        64,
    ),
    "grayscale": (
        "single-channel JPEGs (channels column 1)",
        Schema.of(image="jpeg"),
        [{"image": jpeg_gray(h, w, seed=20 + h)} for h, w in [(8, 8), (16, 24)]],
        64,
    ),
    "raw": (
        "raw pixels with 1, 3 and 4 channels (v1.1)",
        Schema.of(pixels="raw"),
        [
            {"pixels": raw_pixels(3, 5, 1, seed=1)},
            {"pixels": raw_pixels(2, 2, 3, seed=2)},
            {"pixels": raw_pixels(1, 3, 4, seed=3)},
        ],
        64,
    ),
    "ndarray": (
        "one ndarray field of every dtype: extreme integers, signed zero, subnormals, infinities, NaN (v1.1)",
        ARRAYS,
        [
            {
                "u8": np.array([0, 128, 255], np.uint8),
                "u16": np.array([0, 65535], np.uint16),
                "i16": np.array([[-32768, -1], [0, 32767]], np.int16),
                "i32": np.array([-(1 << 31)], np.int32),
                "i64": np.array([-(1 << 63), (1 << 63) - 1], np.int64),
                "f16": np.array([-0.0, 6e-08, 65504.0], np.float16),
                "f32": np.array([[[1.5, -2.25]], [[math.inf, 1e-45]]], np.float32),
                "f64": np.array([math.nan, -math.inf, 5e-324, 0.1], np.float64),
            },
            {
                "u8": np.array([1, 2, 3], np.uint8),
                "u16": np.array([258, 772], np.uint16),
                "i16": np.array([[1, 2], [3, 4]], np.int16),
                "i32": np.array([(1 << 31) - 1], np.int32),
                "i64": np.array([0, -2], np.int64),
                "f16": np.array([1.0, -2.0, 0.5], np.float16),
                "f32": np.array([[[0.0, -0.0]], [[3.0, -4.0]]], np.float32),
                "f64": np.array([1.0, -1.0, 1e300, -0.0], np.float64),
            },
        ],
        64,
    ),
    "ndarray-nan": (
        "NaN in float16, float32 and float64 ndarray values: a writer writes the quiet NaN without payload and with sign 0, "
        "7e00, 7fc00000 and 7ff8000000000000 (v1.1)",
        Schema.of(f16="ndarray:float16:2", f32="ndarray:float32:2", f64="ndarray:float64:2"),
        [
            {
                "f16": np.array([math.nan, -0.0], np.float16),
                "f32": np.array([-0.0, math.nan], np.float32),
                "f64": np.array([math.nan, -math.inf], np.float64),
            },
        ],
        64,
    ),
    "pairs": (
        "a super-resolution record: a low- and a high-resolution image (2x), a one-channel mask and a label (v1.1)",
        PAIRS,
        [
            {
                "lr": raw_pixels(2, 3, 3, seed=i),
                "hr": raw_pixels(4, 6, 3, seed=10 + i),
                "mask": (raw_pixels(4, 6, 1, seed=i) % 3),
                "label": i,
            }
            for i in range(2)
        ],
        8,
    ),
    "align8": (
        "alignment 8, the minimum: fields and records start at multiples of 8",
        Schema.of(key="str", blob="bytes", label="int64"),
        [
            {"key": "a", "blob": b"\x01\x02\x03", "label": 1},
            {"key": "longer key", "blob": b"", "label": 2},
            {"key": "", "blob": bytes(range(9)), "label": 3},
        ],
        8,
    ),
    "json-values": (
        "json values as a canonical writer encodes them: escapes, number forms, 64-bit integers, non-ASCII text (v1.1)",
        Schema.of(meta="json"),
        [
            {
                "meta": {
                    "z": [1, -0.0, 2.5, 1e-07, 1e16, 1.7976931348623157e308, 5e-324],
                    "a": 'tab\there "q" \\ \u0001\u001f \u007f \u00e9 \u65e5\u672c \U0001f980',
                    "n": None,
                    "t": True,
                    "f": False,
                }
            },
            {"meta": "a string, long enough to be replaced by another value"},
            {"meta": [(1 << 64) - 1, -(1 << 63), 0]},
            {"meta": []},
        ],
        64,
    ),
}


def hex64(value: int) -> str:
    """A u64 (checksum, float bits) as 0x and 16 lower-case hex digits: its value, not its bytes."""
    return f"0x{int(value):016x}"


def float_bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


def float_value(value: float) -> float | str:
    """A float64 for JSON: the number, or "NaN", "Infinity", "-Infinity"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def array_value(array: np.ndarray[Any, Any]) -> Any:
    """An ndarray for JSON: nested lists in row-major order; floats as `float_value` writes them
    (a float16 or float32 element as the float64 of the same value, which is exact)."""
    if array.dtype.kind != "f":
        return array.tolist()
    return np.vectorize(lambda x: float_value(float(x)), otypes=[object])(array).tolist()


def describe(data: bytes) -> dict[str, Any]:
    """What a reader must find in a valid shard: every header, footer and table value, every payload."""
    shard = ShardBytes(data)
    header = shard.header()[0]
    footer = shard.footer()[0]
    schema = shard.schema()
    table = shard.table()
    records = []
    for row in table:
        columns: dict[str, Any] = {}
        for name in table.dtype.names:
            value = row[name]
            if name == "checksum" or table.dtype[name].kind == "f":
                columns[name] = hex64(float_bits(float(value)) if table.dtype[name].kind == "f" else int(value))
            else:
                columns[name] = int(value)
        values: dict[str, Any] = {}
        for field in schema.fields:
            if field.type == "int64":
                values[field.name] = int(row[field.name])
            elif field.type == "float64":
                values[field.name] = float_value(float(row[field.name]))
            else:
                start = int(row[column_name(field.name, "offset")])
                payload = bytes(data[start : start + int(row[column_name(field.name, "size")])])
                if field.type == "str":
                    values[field.name] = payload.decode("utf-8")
                elif field.type == "json":
                    values[field.name] = json.loads(payload)
                elif field.type == "ndarray":
                    values[field.name] = array_value(np.frombuffer(payload, NDARRAY_DTYPES[field.dtype or ""]).reshape(field.shape or ()))
                else:
                    values[field.name] = payload.hex()
        records.append({"row": columns, "values": values})
    return {
        "size": len(data),
        "file_checksum": format_checksum(checksum(data)),
        "schema": shard.schema_bytes.decode("utf-8"),
        "header": {
            "magic": bytes(header["magic"]).hex(),
            "major": int(header["major"]),
            "minor": int(header["minor"]),
            "flags": int(header["flags"]),
            "header_size": int(header["header_size"]),
            "schema_size": int(header["schema_size"]),
            "alignment": int(header["alignment"]),
            "reserved": [int(x) for x in header["reserved"]],
            "checksum": hex64(int(header["checksum"])),
        },
        "footer": {
            "table_offset": int(footer["table_offset"]),
            "num_records": int(footer["num_records"]),
            "record_size": int(footer["record_size"]),
            "reserved0": int(footer["reserved0"]),
            "table_checksum": hex64(int(footer["table_checksum"])),
            "reserved": [int(x) for x in footer["reserved"]],
            "checksum": hex64(int(footer["checksum"])),
            "magic": bytes(footer["magic"]).hex(),
        },
        "records": records,
    }


# --- the annotated listing -------------------------------------------------------------------


def _annotate_record(put: Callable[[int, int, str], None], schema: Schema, index: int, row: Any) -> None:
    """Annotate the span of record `index` (its table row `row`): each field's payload and padding."""
    position = int(row["offset"])
    for field in schema.variable_fields:
        start = int(row[column_name(field.name, "offset")])
        stop = start + int(row[column_name(field.name, "size")])
        if start > position:
            put(position, start, f"record {index}: padding (zero) to alignment")
        if stop > start:
            put(start, stop, f"record {index}: field {field.name!r} ({field.type}, {stop - start} bytes)")
        position = stop
    end = int(row["offset"]) + int(row["size"])
    if end > position:
        put(position, end, f"record {index}: padding (zero) to alignment")


def annotate(data: bytes) -> str:
    """List every byte of a valid shard in file order, one item per line, with its meaning."""
    shard = ShardBytes(data)
    header = shard.header()[0]
    footer = shard.footer()[0]
    schema = shard.schema()
    table = shard.table()
    lines = ["offset    bytes                                            meaning"]

    def put(start: int, stop: int, meaning: str, text: bool = False) -> None:
        for i, at in enumerate(range(start, max(stop, start + 1), 16)):
            chunk = data[at : min(stop, at + 16)]
            note = meaning if i == 0 else ""
            if text:
                note = f"{meaning if i == 0 else ' ' * len(meaning)}  {chunk.decode('ascii', 'replace')}"
            lines.append(f"{at:08x}  {chunk.hex(' '):<47}  {note}".rstrip())

    def put_struct(base: int, dtype: np.dtype[Any], value: Any, prefix: str, notes: Mapping[str, str]) -> None:
        for name in dtype.names:
            offset = base + dtype.fields[name][1]  # type: ignore[index]
            item = value[name]
            shown = notes.get(name) or (
                ", ".join(str(int(x)) for x in item) if np.ndim(item) else str(int(item) if np.issubdtype(type(item), np.integer) else item)
            )
            put(offset, offset + dtype[name].itemsize, f"{prefix}{name} = {shown}")

    put_struct(
        0,
        HEADER_DTYPE,
        header,
        "header.",
        {
            "magic": '"\\x89SHARD\\r\\n"',
            "checksum": f"{hex64(int(header['checksum']))}: XXH3-64 of bytes [0, 56) + schema",
        },
    )
    schema_end = HEADER_SIZE + int(header["schema_size"])
    put(HEADER_SIZE, schema_end, "schema", text=True)
    if int(header["header_size"]) > schema_end:
        put(schema_end, int(header["header_size"]), "header padding (zero) up to header_size")
    for index, row in enumerate(table):
        _annotate_record(put, schema, index, row)
    table_offset = int(footer["table_offset"])
    for index, row in enumerate(table):
        notes = {"checksum": f"{hex64(int(row['checksum']))}: XXH3-64 of the record's span"}
        put_struct(table_offset + index * table.dtype.itemsize, table.dtype, row, f"table[{index}].", notes)
    if shard.flagged:
        rows = table.dtype.itemsize
        for block, value in enumerate(shard.block_sums()):
            first, last = block * TABLE_BLOCK_ROWS, min((block + 1) * TABLE_BLOCK_ROWS, len(table)) - 1
            rows_of = f"table[{first}]" if first == last else f"table[{first}] to table[{last}]"
            at = shard.rows_end + 8 * block
            put(at, at + 8, f"block checksum {block} = {hex64(int(value))}: XXH3-64 of {rows_of} ({(last - first + 1) * rows} bytes)")
    sums = "the block checksums" if shard.flagged else "the table"
    put_struct(
        len(data) - FOOTER_SIZE,
        FOOTER_DTYPE,
        footer,
        "footer.",
        {
            "magic": '"SHARDEND"',
            "table_checksum": f"{hex64(int(footer['table_checksum']))}: XXH3-64 of {sums}",
            "checksum": f"{hex64(int(footer['checksum']))}: XXH3-64 of footer bytes [0, 48)",
        },
    )
    return "\n".join(lines) + "\n"


# --- invalid shards --------------------------------------------------------------------------
# Each breaks one rule of a valid vector and returns (error class, offset, record, when, rule).

Invalid = tuple[str, int, "int | None", str]
INVALID: dict[str, tuple[str, str, Callable[[ShardBytes], Invalid]]] = {}


def invalid(base: str, rule: str) -> Callable[[Callable[[ShardBytes], Invalid]], Callable[[ShardBytes], Invalid]]:
    def register(function: Callable[[ShardBytes], Invalid]) -> Callable[[ShardBytes], Invalid]:
        INVALID[function.__name__.replace("_", "-")] = (base, rule, function)
        return function

    return register


@invalid("tiny", "magic: bytes [0, 8) must be 89 53 48 41 52 44 0d 0a")
def bad_magic(s: ShardBytes) -> Invalid:
    s.header()["magic"] = b"\x89SHARD\n\n"
    return "FormatError", 0, None, "open"


@invalid("tiny", "major version: a reader refuses a major it does not implement")
def unknown_major(s: ShardBytes) -> Invalid:
    s.header()["major"] = 2
    s.reseal_header()
    return "UnsupportedVersionError", 8, None, "open"


@invalid("tiny", "flags: a reader refuses any flag bit it does not know")
def unknown_flag(s: ShardBytes) -> Invalid:
    s.header()["flags"] |= 2
    s.reseal_header()
    return "UnsupportedVersionError", 12, None, "open"


@invalid("tiny", "schema_size limit: at most MAX_SCHEMA_SIZE bytes")
def schema_too_large(s: ShardBytes) -> Invalid:
    s.header()["schema_size"] = MAX_SCHEMA_SIZE + 1
    return "LimitError", 24, None, "open"


@invalid("tiny", "header checksum: XXH3-64 of header bytes [0, 56) and the schema")
def header_checksum(s: ShardBytes) -> Invalid:
    s.data[HEADER_SIZE + 20] ^= 0x01
    return "ChecksumError", 56, None, "open"


@invalid("tiny", "field types: a reader refuses a type it does not know")
def unknown_field_type(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"bytes"', b'"x-unknown"'))
    return "UnsupportedVersionError", HEADER_SIZE, None, "open"


@invalid("tiny", "footer checksum: XXH3-64 of footer bytes [0, 48)")
def footer_checksum(s: ShardBytes) -> Invalid:
    s.footer()["table_checksum"] ^= 1
    return "ChecksumError", s.footer_offset + 48, None, "open"


@invalid("tiny", "num_records limit: at most MAX_RECORDS_PER_SHARD, refused before anything is allocated")
def too_many_records(s: ShardBytes) -> Invalid:
    s.footer()["num_records"] = MAX_RECORDS_PER_SHARD + 1
    s.reseal_footer()
    return "LimitError", s.footer_offset + 8, None, "open"


@invalid("tiny", "table checksum: under TABLE_BLOCKS, XXH3-64 of the block checksums, compared on open (v1.2)")
def table_checksum(s: ShardBytes) -> Invalid:
    s.block_sums()[0] ^= 1
    return "ChecksumError", s.rows_end, None, "open"


@invalid("tiny", "table block checksum: block 0's bytes against its block checksum, on open (v1.2)")
def table_block_0_checksum(s: ShardBytes) -> Invalid:
    s.table()["label"][0] = 4
    return "ChecksumError", s.table_offset, 0, "open"


@invalid("blocks", "table block checksum: a later block's bytes against its block checksum, when the block is first used (v1.2)")
def table_block_checksum(s: ShardBytes) -> Invalid:
    s.table()["label"][TABLE_BLOCK_ROWS + 3] = 0
    return "ChecksumError", s.column_offset(TABLE_BLOCK_ROWS, "offset"), TABLE_BLOCK_ROWS, "read"


@invalid("tiny", "table checksum without TABLE_BLOCKS: XXH3-64 of the whole table, as in 1.1 (v1.2)")
def table_checksum_without_blocks(s: ShardBytes) -> Invalid:
    s.drop_table_blocks()
    s.table()["label"][0] = 4
    s.reseal_footer()
    return "ChecksumError", s.table_offset, None, "open"


@invalid("tiny", "flags: TABLE_BLOCKS came with 1.2, and this header says 1.1: a bit its version does not define (v1.2)")
def flag_newer_than_header(s: ShardBytes) -> Invalid:
    s.header()["minor"] = 1
    s.reseal_header()
    return "UnsupportedVersionError", 12, None, "open"


@invalid("tiny", "block size: under TABLE_BLOCKS, footer reserved0 is 1024 (v1.2)")
def block_rows(s: ShardBytes) -> Invalid:
    s.footer()["reserved0"] = 512
    s.reseal_footer()
    return "FormatError", s.footer_offset + 20, None, "open"


@invalid("blocks", "table placement: under TABLE_BLOCKS, a block checksum per 1024 rows lies between table and footer (v1.2)")
def block_checksums_missing(s: ShardBytes) -> Invalid:
    s.drop_table_blocks()
    s.header()["flags"] = 1
    s.reseal_header()
    s.footer()["reserved0"] = TABLE_BLOCK_ROWS
    s.reseal_footer()
    return "FormatError", s.footer_offset, None, "open"


@invalid("tiny", "file length: the footer is the last 64 bytes, so a truncated file has no footer magic")
def truncated(s: ShardBytes) -> Invalid:
    s.truncate(len(s) - 1)
    return "FormatError", len(s) - 8, None, "open"


@invalid("several", "records are contiguous: record i starts where record i-1 ends")
def record_gap(s: ShardBytes) -> Invalid:
    s.table()["offset"][1] += 64
    s.reseal_table()
    return "FormatError", s.column_offset(1, "offset"), 1, "open"


@invalid("several", "each variable field starts at the next multiple of the alignment")
def field_unaligned(s: ShardBytes) -> Invalid:
    s.table()["image.offset"][2] += 8
    s.reseal_table()
    return "FormatError", s.column_offset(2, "image.offset"), 2, "open"


@invalid("several", "record checksum: XXH3-64 of the record's span, checked when its payload is read")
def record_checksum(s: ShardBytes) -> Invalid:
    row = s.table()[3]
    s.data[int(row["image.offset"]) + 100] ^= 0x10
    return "ChecksumError", int(row["offset"]), 3, "read"


@invalid("raw", "raw payload size: height x width x channels bytes (v1.1)")
def raw_size_mismatch(s: ShardBytes) -> Invalid:
    s.table()["pixels.height"][0] = 2  # 2 x 5 x 1 pixels, but 15 bytes stored
    s.reseal_table()
    return "FormatError", s.column_offset(0, "pixels.size"), 0, "open"


@invalid(
    "raw",
    "raw size: height x width x channels is compared exactly; 3340214413 x 4141967055 x 4 wraps to the 12 bytes stored in "
    "64-bit arithmetic, but height x width is over MAX_FIELD_SIZE first (v1.1)",
)
def raw_size_overflow(s: ShardBytes) -> Invalid:
    s.table()["pixels.height"][2] = 3340214413  # record 2: 1 x 3 x 4 pixels, 12 bytes
    s.table()["pixels.width"][2] = 4141967055  # 3340214413 * 4141967055 * 4 = 3 * 2**64 + 12
    s.reseal_table()
    return "FormatError", s.column_offset(2, "pixels.size"), 2, "open"


@invalid("raw", "raw channels: 1, 3 or 4 (v1.1)")
def raw_channels(s: ShardBytes) -> Invalid:
    s.table()["pixels.channels"][2] = 2
    s.reseal_table()
    return "FormatError", s.column_offset(2, "pixels.channels"), 2, "open"


@invalid("raw", "raw sides: height and width are at least 1 (v1.1)")
def raw_zero_width(s: ShardBytes) -> Invalid:
    s.table()["pixels.width"][1] = 0
    s.reseal_table()
    return "FormatError", s.column_offset(1, "pixels.height"), 1, "open"


@invalid("ndarray", "ndarray payload size: the product of the shape times the dtype's size (v1.1)")
def ndarray_size_mismatch(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"shape":[4]', b'"shape":[5]'))  # f64: 40 bytes declared, 32 stored
    return "FormatError", s.column_offset(0, "f64.size"), 0, "open"


@invalid("ndarray", "ndarray dtype: a reader refuses a dtype it does not know (v1.1)")
def ndarray_unknown_dtype(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"float16"', b'"bfloat16"'))
    return "UnsupportedVersionError", HEADER_SIZE, None, "open"


@invalid("ndarray", "ndarray shape: 1 to 8 sizes, each at least 1 (v1.1)")
def ndarray_bad_shape(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"shape":[2,2]', b'"shape":[2,0]'))
    return "FormatError", HEADER_SIZE, None, "open"


# Rules that had no vector in the first 1.1 draft: every step of spec/format.md section 10 that a
# reader must check now has at least one.

STATED_SIZE: dict[str, int] = {}
"""Invalid vectors whose file is longer than the committed bytes: the .shard file followed by
zero bytes up to this size (a sparse file, or a byte source that reports the size)."""


def set_payload(s: ShardBytes, record: int, field: str, text: bytes) -> int:
    """Overwrite a field's payload with `text`, padded with spaces (JSON whitespace) to the
    field's size, and reseal the record; return the field's offset."""
    row = s.table()[record]
    start, size = int(row[column_name(field, "offset")]), int(row[column_name(field, "size")])
    if len(text) > size:
        raise ValueError(f"{text!r} does not fit the {size} bytes of field {field!r} of record {record}")
    s.data[start : start + size] = text + b" " * (size - len(text))
    s.reseal_record(record)
    return start


@invalid("tiny", "file size: at least 128 bytes, a header and a footer")
def too_short(s: ShardBytes) -> Invalid:
    s.truncate(127)
    return "FormatError", 0, None, "open"


@invalid(
    "tiny",
    (
        "file size: at most MAX_SHARD_SIZE (2^40) bytes, checked on the size alone (the file is stated larger: the vector's size key, "
        "2^40 + 1)"
    ),
)
def too_large(s: ShardBytes) -> Invalid:
    STATED_SIZE["too-large"] = MAX_SHARD_SIZE + 1
    return "LimitError", 0, None, "open"


@invalid("tiny", "alignment: a power of two (48 is not)")
def alignment_not_power_of_two(s: ShardBytes) -> Invalid:
    s.header()["alignment"] = 48
    s.reseal_header()
    return "FormatError", 28, None, "open"


@invalid("tiny", "alignment: at least 8 (4 is a power of two, but too small)")
def alignment_too_small(s: ShardBytes) -> Invalid:
    s.header()["alignment"] = 4
    s.reseal_header()
    return "FormatError", 28, None, "open"


@invalid("tiny", "header_size: align_up(64 + schema_size, alignment)")
def header_size_wrong(s: ShardBytes) -> Invalid:
    s.header()["header_size"] = 256
    s.reseal_header()
    return "FormatError", 16, None, "open"


@invalid("tiny", "header_size: the header and a footer fit in the file (alignment 65536 makes a 65536-byte header)")
def header_past_end(s: ShardBytes) -> Invalid:
    s.header()["alignment"] = 65536
    s.header()["header_size"] = 65536
    s.reseal_header()
    return "FormatError", 16, None, "open"


@invalid("tiny", "header reserved bytes [32, 56) are zero (only the second field is not; the offset is 32 all the same)")
def header_reserved(s: ShardBytes) -> Invalid:
    s.header()["reserved"][0, 1] = 1
    s.reseal_header()
    return "FormatError", 32, None, "open"


@invalid("tiny", "header padding [64 + schema_size, header_size) is zero; reported at its first byte")
def header_padding(s: ShardBytes) -> Invalid:
    s.data[HEADER_SIZE + s.schema_size + 10] = 1
    return "FormatError", HEADER_SIZE + s.schema_size, None, "open"


@invalid("tiny", "schema: UTF-8 (a byte that starts no UTF-8 sequence)")
def schema_not_utf8(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"data"', b'"dat\xff"'))
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("tiny", "schema: JSON text without a byte-order mark")
def schema_bom(s: ShardBytes) -> Invalid:
    s.replace_schema(b"\xef\xbb\xbf" + s.schema_bytes)
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("tiny", 'schema: no object has a name twice ("type" twice; taking either would read another shard)')
def schema_duplicate_key(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"type":"bytes"', b'"type":"bytes","type":"int64"'))
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("tiny", "schema: at least one field")
def schema_no_fields(s: ShardBytes) -> Invalid:
    s.replace_schema(b'{"fields":[]}')
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("tiny", "schema: field names are unique")
def schema_duplicate_name(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"label"', b'"data"'))
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("tiny", "schema: no field is named offset, size or checksum")
def schema_reserved_name(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"label"', b'"checksum"'))
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("ndarray", "ndarray shape: integers; 3.0 is a number with a fraction, not an integer (v1.1)")
def ndarray_shape_not_integer(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"shape":[3]', b'"shape":[3.0]'))
    return "FormatError", HEADER_SIZE, None, "open"


@invalid(
    "ndarray",
    "ndarray shape: the product times the dtype's size is at most MAX_FIELD_SIZE; an invalid schema, so FormatError, not LimitError (v1.1)",
)
def ndarray_too_large(s: ShardBytes) -> Invalid:
    s.replace_schema(s.schema_bytes.replace(b'"shape":[4]', b'"shape":[134217729]'))  # float64: 2^30 + 8 bytes
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("raw", "field types exist in the header's version: raw came with 1.1, and this header says 1.0 (v1.1)")
def type_newer_than_header(s: ShardBytes) -> Invalid:
    s.drop_table_blocks()  # a 1.0 header has no TABLE_BLOCKS (step 6 would refuse it first)
    s.header()["minor"] = 0
    s.reseal_header()
    return "FormatError", HEADER_SIZE, None, "open"


@invalid("tiny", "footer reserved0 is zero")
def footer_reserved0(s: ShardBytes) -> Invalid:
    s.footer()["reserved0"] = 1
    s.reseal_footer()
    return "FormatError", s.footer_offset + 20, None, "open"


@invalid("tiny", "footer reserved fields are zero (only the second u64 is not; the offset is F + 20 all the same)")
def footer_reserved(s: ShardBytes) -> Invalid:
    s.footer()["reserved"][0, 1] = 1
    s.reseal_footer()
    return "FormatError", s.footer_offset + 20, None, "open"


@invalid("tiny", "record_size: the row size the schema defines (48 here)")
def record_size_wrong(s: ShardBytes) -> Invalid:
    s.footer()["record_size"] = 56
    s.reseal_footer()
    return "FormatError", s.footer_offset + 16, None, "open"


@invalid("tiny", "table_offset: a multiple of the alignment")
def table_unaligned(s: ShardBytes) -> Invalid:
    s.footer()["table_offset"] = 264
    s.reseal_footer()
    return "FormatError", s.footer_offset, None, "open"


@invalid("tiny", "table_offset: not before header_size")
def table_in_header(s: ShardBytes) -> Invalid:
    s.footer()["table_offset"] = 128
    s.reseal_footer()
    return "FormatError", s.footer_offset, None, "open"


@invalid("tiny", "the table ends where the footer starts: table_offset + num_records x record_size = F")
def table_end(s: ShardBytes) -> Invalid:
    s.footer()["num_records"] = 2
    s.reseal_footer()
    return "FormatError", s.footer_offset, None, "open"


@invalid("tiny", "no records: table_offset = header_size (here 64 payload bytes belong to no record)")
def payload_without_records(s: ShardBytes) -> Invalid:
    header_size, table_offset = int(s.header()[0]["header_size"]), s.table_offset
    del s.data[table_offset : s.footer_offset]  # drop the table's one row
    s.footer()["num_records"] = 0
    s.reseal_table()
    return "FormatError", header_size, None, "open"


@invalid("grayscale", "record spans lie before the table: offset <= table_offset and size <= table_offset")
def span_outside(s: ShardBytes) -> Invalid:
    s.table()["size"][1] = 1 << 40
    s.reseal_table()
    return "FormatError", s.column_offset(1, "offset"), 1, "open"


@invalid("grayscale", "the last record ends at table_offset")
def last_record_short(s: ShardBytes) -> Invalid:
    s.table()["size"][1] -= 64
    s.reseal_table()
    return "FormatError", s.column_offset(1, "offset"), 1, "open"


@invalid("grayscale", "record sizes are multiples of the alignment (record 0 is 8 bytes longer, record 1 8 bytes shorter)")
def record_size_unaligned(s: ShardBytes) -> Invalid:
    s.table()["size"][0] += 8
    s.table()["offset"][1] += 8
    s.table()["size"][1] -= 8
    s.reseal_table()
    return "FormatError", s.column_offset(0, "size"), 0, "open"


@invalid("grayscale", "variable-size fields are at most MAX_FIELD_SIZE bytes")
def field_too_large(s: ShardBytes) -> Invalid:
    s.table()["image.size"][1] = MAX_FIELD_SIZE + 1
    s.reseal_table()
    return "LimitError", s.column_offset(1, "image.size"), 1, "open"


@invalid("grayscale", "jpeg sides: height and width at least 1")
def jpeg_zero_height(s: ShardBytes) -> Invalid:
    s.table()["image.height"][1] = 0
    s.reseal_table()
    return "FormatError", s.column_offset(1, "image.height"), 1, "open"


@invalid("grayscale", "jpeg channels: 1 or 3 (4 is a raw field's, not a jpeg field's)")
def jpeg_channels(s: ShardBytes) -> Invalid:
    s.table()["image.channels"][1] = 4
    s.reseal_table()
    return "FormatError", s.column_offset(1, "image.channels"), 1, "open"


@invalid("grayscale", "jpeg reserved column is zero")
def jpeg_reserved(s: ShardBytes) -> Invalid:
    s.table()["image.reserved"][0] = 1
    s.reseal_table()
    return "FormatError", s.column_offset(0, "image.reserved"), 0, "open"


@invalid("raw", "raw reserved column is zero (v1.1)")
def raw_reserved(s: ShardBytes) -> Invalid:
    s.table()["pixels.reserved"][1] = 7
    s.reseal_table()
    return "FormatError", s.column_offset(1, "pixels.reserved"), 1, "open"


@invalid("tiny", "the span ends at the aligned end of its fields (data is now 0 bytes, so the span should be too)")
def span_end(s: ShardBytes) -> Invalid:
    s.table()["data.size"][0] = 0
    s.reseal_table()
    return "FormatError", s.column_offset(0, "size"), 0, "open"


@invalid("scalars", "record checksum of an empty span: the XXH3-64 of no bytes, checked on open since nothing is read later")
def empty_span_checksum(s: ShardBytes) -> Invalid:
    s.table()["checksum"][1] = 0
    s.reseal_table()
    return "ChecksumError", int(s.table()["offset"][1]), 1, "open"


@invalid("tiny", "record padding is zero: checked after the record checksum, which matches here; reported at the first non-zero byte")
def padding_not_zero(s: ShardBytes) -> Invalid:
    at = int(s.table()["data.offset"][0]) + int(s.table()["data.size"][0]) + 3
    s.data[at] = 0x20
    s.reseal_record(0)
    return "FormatError", at, 0, "read"


@invalid("align8", "str values are UTF-8")
def str_not_utf8(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "key", b"longer k\xe9y"), 1, "read"


@invalid("json-values", "json values are JSON text")
def json_not_json(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "meta", b'{"a":'), 1, "read"


@invalid("json-values", "json values: NaN, Infinity and -Infinity are not JSON")
def json_nan(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "meta", b'{"loss":NaN}'), 1, "read"


@invalid("json-values", "json values: no object has a name twice")
def json_duplicate_name(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "meta", b'{"a":1,"a":2}'), 1, "read"


@invalid("json-values", "json values: no byte-order mark")
def json_bom(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "meta", b"\xef\xbb\xbf{}"), 1, "read"


@invalid("json-values", "json values: a number with a fraction or exponent is finite as a binary64 (1e400 is not)")
def json_huge_number(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "meta", b"[1e400]"), 1, "read"


@invalid("json-values", "json values: an integer is from -2^63 to 2^64 - 1")
def json_big_integer(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "meta", b"[18446744073709551616]"), 1, "read"


@invalid("json-values", "json values: strings are Unicode text; a \\u escape of a lone surrogate is not")
def json_lone_surrogate(s: ShardBytes) -> Invalid:
    return "FormatError", set_payload(s, 1, "meta", b'["\\ud800"]'), 1, "read"


# The order of the table rules: each pins one reading of "rule by rule, lowest record first".


@invalid("grayscale", "order: rule 24 for every record before rule 28 for any (record 0 breaks 28c, record 1 rule 24)")
def order_rule_before_field(s: ShardBytes) -> Invalid:
    s.table()["image.height"][0] = 0
    s.table()["size"][1] = 1 << 40
    s.reseal_table()
    return "FormatError", s.column_offset(1, "offset"), 1, "open"


@invalid(
    "align8",
    "order: field by field; a field's checks (a to f) all before the next field's (record 0 breaks 28a on blob, record 1 28b on key)",
)
def order_field_before_check(s: ShardBytes) -> Invalid:
    s.table()["blob.size"][0] = MAX_FIELD_SIZE + 1
    s.table()["key.offset"][1] += 8
    s.reseal_table()
    return "FormatError", s.column_offset(1, "key.offset"), 1, "open"


@invalid("grayscale", "order: within a field, one check for every record before the next check (record 0 breaks 28d, record 1 28c)")
def order_check_before_record(s: ShardBytes) -> Invalid:
    s.table()["image.channels"][0] = 2
    s.table()["image.height"][1] = 0
    s.reseal_table()
    return "FormatError", s.column_offset(1, "image.height"), 1, "open"


# --- the dataset -----------------------------------------------------------------------------


def write_dataset(directory: Path) -> dict[str, Any]:
    """Write the dataset vector and return what a reader must find in it."""
    records = [{"image": jpeg_rgb(8 + 8 * (i % 3), 16, seed=30 + i), "label": i % 2, "key": f"img-{i}"} for i in range(5)]
    with DatasetWriter(directory, schema=IMAGE_CLASSIFICATION, shard_size=2048, classes=["cat", "dog"]) as writer:
        for record in records:
            writer.write(record)
    manifest = json.loads((directory / "manifest.json").read_text())
    if [shard["num_records"] for shard in manifest["shards"]] != [3, 2]:
        raise RuntimeError(f"dataset vector should hold shards of 3 and 2 records, not {manifest['shards']}")
    return {
        "description": "a complete dataset of two shards (3 + 2 records) and its manifest",
        "num_records": len(records),
        "classes": ["cat", "dog"],
        "records": [{"image": r["image"].hex(), "label": r["label"], "key": r["key"]} for r in records],
    }


# --- invalid datasets ------------------------------------------------------------------------
# Each is the base dataset (two shards of label-only records, 2 + 1, classes cat and dog) with one
# rule of spec/manifest.md "Reading a dataset" broken. A dataset that fails before any shard is
# opened (steps 1 to 9) holds its manifest only: a reader must not need the shards to refuse it.

LABELS = Schema.of(label="int64")
DatasetCase = tuple[int, str, str, str, "int | None", "int | None", str]
"""(step, error kind, message, path the error names relative to the dataset ("." for the
dataset itself), offset, record, when)."""
INVALID_DATASETS: dict[str, tuple[str, bool, Callable[[Path, dict[str, Any]], DatasetCase]]] = {}


def invalid_dataset(
    rule: str, *, shards: bool = False
) -> Callable[[Callable[[Path, dict[str, Any]], DatasetCase]], Callable[[Path, dict[str, Any]], DatasetCase]]:
    """Register a broken dataset: `shards` keeps the shard files (for steps 10 to 12)."""

    def register(function: Callable[[Path, dict[str, Any]], DatasetCase]) -> Callable[[Path, dict[str, Any]], DatasetCase]:
        INVALID_DATASETS[function.__name__.replace("_", "-")] = (rule, shards, function)
        return function

    return register


def manifest_text(manifest: dict[str, Any]) -> bytes:
    """The manifest as the reference writer encodes it (sorted keys, two-space indent, UTF-8)."""
    return (json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / "manifest.json").write_bytes(manifest_text(manifest))


def patch_manifest(directory: Path, manifest: dict[str, Any], old: bytes, new: bytes) -> None:
    """Write the manifest with one piece of its text replaced (for what json.dumps cannot write)."""
    text = manifest_text(manifest)
    if text.count(old) != 1:
        raise ValueError(f"{old!r} is not in the manifest exactly once")
    (directory / "manifest.json").write_bytes(text.replace(old, new))


M = "manifest.json"


@invalid_dataset("manifest.json exists: a directory without one is not a dataset (a conversion that has not finished)", shards=True)
def no_manifest(d: Path, m: dict[str, Any]) -> DatasetCase:
    (d / M).unlink()
    message = "no manifest.json: not a shardfmt dataset, or its conversion has not finished (rerun `shardfmt convert --resume`)"
    return 1, "DatasetNotFoundError", message, ".", None, None, "open"


@invalid_dataset("manifest.json is a regular file")
def manifest_is_a_directory(d: Path, m: dict[str, Any]) -> DatasetCase:
    (d / M).unlink()
    (d / M).mkdir()
    (d / M / "note.txt").write_bytes(b"manifest.json is a folder here\n")
    return 1, "ManifestError", "is not a regular file, so it cannot be a manifest", M, None, None, "open"


@invalid_dataset("the manifest is UTF-8")
def manifest_not_utf8(d: Path, m: dict[str, Any]) -> DatasetCase:
    patch_manifest(d, m, b'"cat"', b'"c\xe0t"')
    return 2, "ManifestError", "not valid JSON text: not UTF-8: byte 23 (0xe0) starts no valid sequence", M, None, None, "open"


@invalid_dataset("the manifest has no byte-order mark")
def manifest_bom(d: Path, m: dict[str, Any]) -> DatasetCase:
    (d / M).write_bytes(b"\xef\xbb\xbf" + manifest_text(m))
    return 2, "ManifestError", "not valid JSON text: the text starts with a byte-order mark (EF BB BF)", M, None, None, "open"


@invalid_dataset("no object of the manifest has a name twice")
def manifest_duplicate_name(d: Path, m: dict[str, Any]) -> DatasetCase:
    patch_manifest(d, m, b'  "format": "shardfmt",\n', b'  "format": "shardfmt",\n  "format": "zarr",\n')
    return 2, "ManifestError", "not valid JSON text: an object has the name 'format' twice", M, None, None, "open"


@invalid_dataset("NaN is not JSON, not even in a free-form object")
def manifest_nan(d: Path, m: dict[str, Any]) -> DatasetCase:
    patch_manifest(d, m, b'"stats": {}', b'"stats": {"loss": NaN}')
    return 2, "ManifestError", "not valid JSON text: NaN is not a JSON number", M, None, None, "open"


@invalid_dataset("a number with a fraction or exponent is finite as a binary64 (1e400 is not)")
def manifest_huge_number(d: Path, m: dict[str, Any]) -> DatasetCase:
    patch_manifest(d, m, b'"stats": {}', b'"stats": {"loss": 1e400}')
    return 2, "ManifestError", "not valid JSON text: the number '1e400' is beyond the range of a binary64 float", M, None, None, "open"


@invalid_dataset("the manifest is a JSON object")
def manifest_not_an_object(d: Path, m: dict[str, Any]) -> DatasetCase:
    (d / M).write_bytes(b"[]\n")
    return 2, "ManifestError", "the manifest is not a JSON object", M, None, None, "open"


@invalid_dataset('format is "shardfmt"')
def format_missing(d: Path, m: dict[str, Any]) -> DatasetCase:
    del m["format"]
    write_manifest(d, m)
    return 3, "ManifestError", '"format" is None, expected "shardfmt"', M, None, None, "open"


@invalid_dataset("format_version is a string")
def version_not_a_string(d: Path, m: dict[str, Any]) -> DatasetCase:
    patch_manifest(d, m, b'"format_version": "1.2"', b'"format_version": 1.2')
    return 3, "ManifestError", "manifest: 'format_version' has the wrong type (float)", M, None, None, "open"


@invalid_dataset("format_version has one spelling: no leading zero")
def version_leading_zero(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["format_version"] = "01.1"
    write_manifest(d, m)
    return 3, "ManifestError", '"format_version" \'01.1\' is not "MAJOR.MINOR" in decimal digits', M, None, None, "open"


@invalid_dataset("the major version is one the reader implements")
def version_major(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["format_version"] = "2.0"
    write_manifest(d, m)
    return (
        4,
        "UnsupportedVersionError",
        "format version 2.0 needs a reader for major version 2; this reader knows 1.x",
        M,
        None,
        None,
        "open",
    )


@invalid_dataset("shard_format is present and a string: a manifest without it is malformed, not too new")
def shard_format_missing(d: Path, m: dict[str, Any]) -> DatasetCase:
    del m["shard_format"]
    write_manifest(d, m)
    return 5, "ManifestError", "manifest: missing 'shard_format'", M, None, None, "open"


@invalid_dataset("shard_format is one the reader implements")
def shard_format_unknown(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shard_format"] = "zip"
    write_manifest(d, m)
    return 5, "UnsupportedVersionError", "shard_format 'zip' is unknown to this reader", M, None, None, "open"


@invalid_dataset("shard_format is one the reader implements: the empty string is a string (not a malformed manifest) and names no format")
def shard_format_empty(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shard_format"] = ""
    write_manifest(d, m)
    return 5, "UnsupportedVersionError", "shard_format '' is unknown to this reader", M, None, None, "open"


@invalid_dataset("the schema is valid")
def schema_invalid(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["schema"]["fields"][0]["name"] = "a-b"
    write_manifest(d, m)
    return 6, "ManifestError", "schema: field name 'a-b' is not an ASCII identifier of 1 to 64 characters", M, None, None, "open"


@invalid_dataset("the schema's field types are known")
def schema_unknown_type(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["schema"]["fields"][0]["type"] = "webp"
    write_manifest(d, m)
    message = (
        "schema: field 'label' has type 'webp', which this reader does not know (known: bytes, float64, int64, jpeg, json, ndarray, raw, "
        "str); upgrade shardfmt"
    )
    return 6, "UnsupportedVersionError", message, M, None, None, "open"


@invalid_dataset("the schema's ndarray dtypes are known: an unknown one is too new, like an unknown type (v1.1)")
def schema_unknown_dtype(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["schema"]["fields"].append({"dtype": "bfloat16", "name": "box", "shape": [4], "type": "ndarray"})
    write_manifest(d, m)
    message = (
        "schema: ndarray field 'box' has dtype 'bfloat16', which this reader does not know "
        "(known: uint8, uint16, int16, int32, int64, float16, float32, float64); upgrade shardfmt"
    )
    return 6, "UnsupportedVersionError", message, M, None, None, "open"


@invalid_dataset("the schema's types exist in the manifest's version: raw came with 1.1 (v1.1)")
def schema_newer_than_version(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["format_version"] = "1.0"
    m["schema"]["fields"].append({"name": "mask", "type": "raw"})
    write_manifest(d, m)
    message = "schema: field 'mask' has type 'raw', which format version 1.1 added, but the version stated is 1.0"
    return 6, "ManifestError", message, M, None, None, "open"


@invalid_dataset("a tar dataset has the schema of tar shards: image (jpeg), label (int64) or none, key (str), member fields")
def tar_schema(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shard_format"] = "tar"
    write_manifest(d, m)
    return (
        6,
        "ManifestError",
        "schema: tar shards hold image (jpeg), then label (int64) or no label, then key (str), then member fields, not label (int64)",
        M,
        None,
        None,
        "open",
    )


@invalid_dataset("classes is null or an array of strings")
def classes_not_strings(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["classes"] = ["cat", 1]
    write_manifest(d, m)
    return 7, "ManifestError", '"classes" must be null or a list of strings', M, None, None, "open"


@invalid_dataset("converter, where present, is an object whose name is a string")
def converter_name(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["converter"]["name"] = 7
    write_manifest(d, m)
    return 7, "ManifestError", '"converter.name" must be a string', M, None, None, "open"


@invalid_dataset("rejects, where present, is an object whose count is an integer of at least 0")
def rejects_count(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["rejects"]["count"] = -1
    write_manifest(d, m)
    return 7, "ManifestError", '"rejects.count" must be an integer of at least 0', M, None, None, "open"


@invalid_dataset("strict_jpeg, where present, is a boolean")
def strict_jpeg_not_boolean(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["strict_jpeg"] = "yes"
    write_manifest(d, m)
    return 7, "ManifestError", "\"strict_jpeg\" must be true or false, got 'yes'", M, None, None, "open"


@invalid_dataset("shard paths stay inside the dataset root")
def shard_path_parent(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shards"][1]["path"] = "../shard-00001.shard"
    write_manifest(d, m)
    return 8, "ManifestError", "shards[1]: path '../shard-00001.shard' has an empty, '.' or '..' component", M, None, None, "open"


@invalid_dataset("shard paths are unique, compared ignoring case and Unicode normalisation (one file on macOS and Windows)")
def shard_path_case(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shards"][1]["path"] = "SHARD-00000.shard"
    write_manifest(d, m)
    message = (
        "shards[1]: path 'SHARD-00000.shard' names the same file as 'shard-00000.shard' (paths are compared ignoring case and Unicode "
        "normalisation)"
    )
    return 8, "ManifestError", message, M, None, None, "open"


@invalid_dataset(
    "an entry's path (syntax, then uniqueness against every path listed before it) is checked before its num_records "
    "(this entry breaks both)"
)
def shard_path_before_count(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shards"][1]["path"] = "shard-00000.shard"
    m["shards"][1]["num_records"] = -1
    write_manifest(d, m)
    return 8, "ManifestError", "shards[1]: path 'shard-00000.shard' is listed twice", M, None, None, "open"


@invalid_dataset("num_records and size are integers: 264.0 is a number with a fraction, not an integer")
def shard_size_not_integer(d: Path, m: dict[str, Any]) -> DatasetCase:
    patch_manifest(d, m, b'"size": 264', b'"size": 264.0')
    return 8, "ManifestError", "shards[0]: 'size' has the wrong type (float)", M, None, None, "open"


@invalid_dataset("checksums are xxh3_64: and 16 lower-case hex digits")
def shard_checksum_upper(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shards"][0]["checksum"] = m["shards"][0]["checksum"].upper().replace("XXH3_64", "xxh3_64")
    write_manifest(d, m)
    shown = m["shards"][0]["checksum"]
    return 8, "ManifestError", f"shards[0]: checksum {shown!r} is not 'xxh3_64:' and 16 lower-case hex digits", M, None, None, "open"


@invalid_dataset("a binary dataset's shards have no index")
def index_in_binary(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shards"][0]["index"] = {"checksum": m["shards"][0]["checksum"], "path": "shard-00000.idx", "size": 256}
    write_manifest(d, m)
    return 8, "ManifestError", "shards[0]: \"index\" is only for tar shards, and shard_format is 'binary'", M, None, None, "open"


@invalid_dataset("a tar dataset's shards each have an index")
def tar_without_index(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shard_format"] = "tar"
    m["schema"] = IMAGE_CLASSIFICATION.to_json()
    write_manifest(d, m)
    return 8, "ManifestError", "shards[0]: missing 'index'", M, None, None, "open"


@invalid_dataset("num_records is the sum of the shards' num_records")
def total_records(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["num_records"] = 4
    write_manifest(d, m)
    return 9, "ManifestError", '"num_records" is 4 but the shards add up to 3', M, None, None, "open"


@invalid_dataset("num_bytes is an integer: 480.0 is not")
def total_bytes_not_integer(d: Path, m: dict[str, Any]) -> DatasetCase:
    text = f'"num_bytes": {m["num_bytes"]}'.encode()
    patch_manifest(d, m, text, text + b".0")
    return 9, "ManifestError", "manifest: 'num_bytes' has the wrong type (float)", M, None, None, "open"


@invalid_dataset("a shard the manifest names exists", shards=True)
def shard_missing(d: Path, m: dict[str, Any]) -> DatasetCase:
    (d / "shard-00001.shard").unlink()
    return 10, "ShardNotFoundError", "shard file does not exist", "shard-00001.shard", None, None, "read"


@invalid_dataset("a shard is a regular file", shards=True)
def shard_is_a_directory(d: Path, m: dict[str, Any]) -> DatasetCase:
    (d / "shard-00001.shard").unlink()
    (d / "shard-00001.shard").mkdir()
    (d / "shard-00001.shard" / "note.txt").write_bytes(b"shard-00001.shard is a folder here\n")
    return 10, "ShardNotFoundError", "is not a regular file, so it cannot be a shard", "shard-00001.shard", None, None, "read"


@invalid_dataset(
    "a shard, its symbolic links resolved, lies inside the dataset root (this one links to a valid vector outside it)", shards=True
)
def shard_outside_root(d: Path, m: dict[str, Any]) -> DatasetCase:
    (d / "shard-00001.shard").unlink()
    os.symlink("../../valid/scalars.shard", d / "shard-00001.shard")
    message = (
        "is a symbolic link (or lies under one) that resolves to ../../valid/scalars.shard, outside the dataset root; a reader does not "
        "follow links out of the root"
    )
    return 10, "ShardNotFoundError", message, "shard-00001.shard", None, None, "read"


@invalid_dataset("a shard has the size its entry states", shards=True)
def shard_size(d: Path, m: dict[str, Any]) -> DatasetCase:
    stated = m["shards"][1]["size"]
    m["shards"][1]["size"] = stated + 64
    m["num_bytes"] += 64
    write_manifest(d, m)
    return 11, "FormatError", f"file is {stated} bytes but the manifest says {stated + 64}", "shard-00001.shard", None, None, "read"


@invalid_dataset("a shard holds the records its entry states", shards=True)
def shard_record_count(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["shards"][1]["num_records"] = 2
    m["num_records"] = 4
    write_manifest(d, m)
    return 12, "ManifestError", "shard shard-00001.shard holds 1 records but the manifest says 2", M, None, None, "read"


@invalid_dataset("a shard's schema equals the manifest's (compared as parsed fields, not as bytes)", shards=True)
def shard_schema(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["schema"]["fields"][0]["type"] = "float64"
    write_manifest(d, m)
    return 12, "ManifestError", "shard shard-00000.shard has a schema that differs from the manifest's", M, None, None, "read"


@invalid_dataset("a shard's format version is not newer than the manifest's (here 1.2 shards, a 1.1 manifest)", shards=True)
def shard_newer_than_manifest(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["format_version"] = "1.1"
    write_manifest(d, m)
    return 12, "ManifestError", "shard shard-00000.shard has format version 1.2, newer than the manifest's 1.1", M, None, None, "read"


@invalid_dataset("with classes, every label names one: 0 <= label < len(classes)", shards=True)
def label_names_no_class(d: Path, m: dict[str, Any]) -> DatasetCase:
    m["classes"] = ["cat"]
    write_manifest(d, m)
    table_offset = 128  # header 64 + schema 46, aligned to 64; label is at byte 24 of a 32-byte row
    return 12, "FormatError", "label 1 names no class (the manifest has 1)", "shard-00000.shard", table_offset + 32 + 24, 1, "read"


@invalid_dataset("the optional whole-file checksum: compared last, by a verification pass (shardfmt verify)", shards=True)
def file_checksum(d: Path, m: dict[str, Any]) -> DatasetCase:
    actual = m["shards"][1]["checksum"]
    m["shards"][1]["checksum"] = "xxh3_64:0000000000000000"
    write_manifest(d, m)
    message = f"whole-file checksum {actual} differs from the manifest's xxh3_64:0000000000000000: the file was changed or replaced"
    return 13, "ChecksumError", message, "shard-00001.shard", None, None, "verify"


def write_invalid_datasets(out: Path) -> dict[str, str]:
    """Write every invalid dataset vector into `out`; return name -> rule."""
    out.mkdir()
    rules = {}
    for name, (rule, keep_shards, break_rule) in INVALID_DATASETS.items():
        directory = out / name
        # A shard of n label-only records is 128 + 32 n + 8 + 64 bytes: closed at 2 records.
        with DatasetWriter(directory, schema=LABELS, shard_size=264, classes=["cat", "dog"]) as writer:
            for label in (0, 1, 1):
                writer.write({"label": label})
        manifest = json.loads((directory / M).read_text())
        if [shard["num_records"] for shard in manifest["shards"]] != [2, 1]:
            raise RuntimeError(f"the base dataset should hold shards of 2 and 1 records, not {manifest['shards']}")
        if not keep_shards:
            for shard in manifest["shards"]:
                (directory / shard["path"]).unlink()
        step, error, message, path, offset, record, when = break_rule(directory, manifest)
        expected = {
            "rule": rule,
            "step": step,
            "error": error,
            "message": message,
            "path": path,
            "offset": offset,
            "record": record,
            "when": when,
        }
        (out / f"{name}.json").write_bytes(dump_json(expected))
        rules[name] = rule
    return rules


# --- tar datasets (spec/tar.md) -------------------------------------------------------------
# Valid tar datasets as the reference writer writes them, and copies of "labelled" (or of
# "image-text") whose member index breaks one check of spec/tar.md section 7, rewritten as a valid
# binary shard with the manifest's index size and checksum updated, so that only that check fails.

TAR_VALID: dict[str, tuple[str, Schema, list[str] | None, list[dict[str, Any]]]] = {
    "labelled": (
        "image, label and key: KEY.cls and KEY.jpg per sample (one RGB and one grayscale JPEG)",
        tar_dataset_schema(),
        ["cat", "dog"],
        [
            {"image": jpeg_rgb(8, 8, seed=41), "label": 0, "key": "cat/0001"},
            {"image": jpeg_gray(8, 16, seed=42), "label": 1, "key": "dog/0002"},
        ],
    ),
    "image-text": (
        "no labels; a caption (txt, str) and metadata (json) per sample: the layout img2dataset writes",
        tar_dataset_schema(labelled=False, members=(("json", "json"), ("txt", "str"))),
        None,
        [
            {
                "image": jpeg_rgb(8, 8, seed=43),
                "key": "000000000",
                "json": {"url": "https://example.com/a.jpg", "width": 8},
                "txt": "a red caf\u00e9",
            },
            {"image": jpeg_rgb(16, 8, seed=44), "key": "000000001", "json": None, "txt": ""},
        ],
    ),
    "members": (
        "labelled, with a bytes member (seg_png) and a text member (txt) per sample",
        tar_dataset_schema(members=(("seg_png", "bytes"), ("txt", "str"))),
        ["a"],
        [{"image": jpeg_gray(8, 8, seed=45), "label": 0, "key": "k", "seg_png": b"\x89PNG\r\n\x1a\n", "txt": "one"}],
    ),
}

TarCase = tuple[int | str, str, str, "int | None", "int | None", str]
"""(the check of tar.md section 7 it breaks, error kind, message, column whose offset the error
carries or None, record or None, when)."""
TAR_INVALID: dict[str, tuple[str, str, Callable[[list[dict[str, Any]], int], TarCase]]] = {}


def tar_invalid(
    base: str, rule: str
) -> Callable[[Callable[[list[dict[str, Any]], int], TarCase]], Callable[[list[dict[str, Any]], int], TarCase]]:
    """Register a broken member index: the function edits the index rows of `base` (given the
    tar's size) in place."""

    def register(function: Callable[[list[dict[str, Any]], int], TarCase]) -> Callable[[list[dict[str, Any]], int], TarCase]:
        TAR_INVALID[function.__name__.replace("_", "-")] = (base, rule, function)
        return function

    return register


def _in_tar(message: str, size: int) -> str:
    return f"{message} (tar shard-00000.tar, {size} bytes)"


@tar_invalid("labelled", "check 1: image_offset is a multiple of 512 and at least 512")
def tar_offset_unaligned(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["image_offset"] += 1
    return 1, "FormatError", _in_tar("image data does not start on a 512-byte block after a header", size), "image_offset", 1, "read"


@tar_invalid("labelled", "check 1: an image_offset of 0 leaves no room for a header")
def tar_offset_zero(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[0]["image_offset"] = 0
    return 1, "FormatError", _in_tar("image data does not start on a 512-byte block after a header", size), "image_offset", 0, "read"


@tar_invalid("labelled", "check 2: image_offset is not past the tar's end")
def tar_offset_past_end(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["image_offset"] = size + 512
    return 2, "FormatError", _in_tar("image data starts past the end of the tar", size), "image_offset", 1, "read"


@tar_invalid("labelled", "check 2 passes for an image_offset equal to the tar's size (an empty image there); its checksum fails on read")
def tar_offset_at_end(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["image_offset"], rows[1]["image_size"] = size, 0
    return "checksum", "ChecksumError", f"image member [{size}, {size}) does not match its checksum: the tar is corrupt", None, 1, "read"


@tar_invalid("labelled", "check 3: image_size is from 0 to MAX_FIELD_SIZE (it breaks check 4 too: check 3 comes first)")
def tar_size_too_large(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[0]["image_size"] = MAX_FIELD_SIZE + 1
    return 3, "FormatError", _in_tar(f"image size is outside [0, {MAX_FIELD_SIZE}]", size), "image_size", 0, "read"


@tar_invalid("labelled", "check 4: image_offset + image_size is not past the tar's end")
def tar_image_past_end(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["image_size"] = size - rows[1]["image_offset"] + 1
    return 4, "FormatError", _in_tar("image data runs past the end of the tar", size), "image_size", 1, "read"


@tar_invalid("labelled", "check 5: image_height and image_width are from 1 to 65,535")
def tar_zero_height(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["image_width"] = 0
    return 5, "FormatError", _in_tar("image height or width is outside [1, 65535]", size), "image_height", 1, "read"


@tar_invalid("labelled", "check 6: image_channels is 1 or 3")
def tar_channels(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[0]["image_channels"] = 4
    return 6, "FormatError", _in_tar("image channels are not 1 or 3", size), "image_channels", 0, "read"


@tar_invalid("labelled", "check 7: label is -1 or from 0 to MAX_CLASSES - 1")
def tar_label_range(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["label"] = MAX_CLASSES
    return 7, "FormatError", _in_tar(f"label is outside [-1, {MAX_CLASSES})", size), "label", 1, "read"


@tar_invalid("labelled", "check 7: a labelled dataset has no label -1")
def tar_label_missing(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[0]["label"] = -1
    return 7, "FormatError", _in_tar("label is -1 (no label member) in a labelled dataset", size), "label", 0, "read"


@tar_invalid("image-text", "check 7: a dataset without labels has label -1 only")
def tar_label_unlabelled(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["label"] = 0
    return 7, "FormatError", _in_tar("label is not -1 in a dataset without labels", size), "label", 1, "read"


@tar_invalid(
    "labelled", "check 7: the label range is checked over every record before the -1 rule (record 0 breaks the second, record 1 the first)"
)
def tar_label_order(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[0]["label"] = -1
    rows[1]["label"] = MAX_CLASSES
    return 7, "FormatError", _in_tar(f"label is outside [-1, {MAX_CLASSES})", size), "label", 1, "read"


@tar_invalid("labelled", "check 8: images do not overlap and leave room for a header; the later image in offset order is reported")
def tar_overlap(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[0]["image_offset"] = rows[1]["image_offset"] + 512  # record 0 now comes second in offset order
    return (
        8,
        "FormatError",
        _in_tar("image data overlaps another record's image or leaves no room for its header", size),
        "image_offset",
        0,
        "read",
    )


@tar_invalid("image-text", "check 9: every member field has a [data offset, size] span inside the tar in members")
def tar_member_missing(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["members"] = {ext: span for ext, span in rows[1]["members"].items() if ext != "txt"}
    return 9, "FormatError", _NO_SPAN.format("txt"), "members.offset", 1, "read"


_NO_SPAN = "members has no valid span for field {!r} (a [data offset, size] or [data offset, size, checksum] inside the tar)"


@tar_invalid("image-text", "check 9: members is an object; one that is JSON but not an object has no span for any field")
def tar_members_not_object(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[1]["members"] = ["txt", "json"]
    return 9, "FormatError", _NO_SPAN.format("json"), "members.offset", 1, "read"


@tar_invalid("image-text", "check 9: a member's checksum is from 0 to 2^64 - 1")
def tar_member_checksum_range(rows: list[dict[str, Any]], size: int) -> TarCase:
    rows[0]["members"]["json"][2] = -1
    return 9, "FormatError", _NO_SPAN.format("json"), "members.offset", 0, "read"


@tar_invalid("labelled", "the index has the schema of a member index")
def tar_index_schema(rows: list[dict[str, Any]], size: int) -> TarCase:
    for row in rows:
        row["extra"] = 0
    names = ", ".join([*INDEX_SCHEMA.names, "extra"])
    return "schema", "FormatError", f"is not a tar member index: its fields are {names}", None, None, "read"


def _rewrite_index(directory: Path, rows: list[dict[str, Any]], schema: Schema = INDEX_SCHEMA) -> None:
    """Write `rows` as the member index of ``directory/shard-00000.tar`` and update the manifest."""
    index_path = directory / "shard-00000.tar.idx"
    index_path.unlink()
    with ShardWriter(index_path, schema=schema) as writer:
        for row in rows:
            writer.write(row)
    manifest = json.loads((directory / M).read_text())
    size, digest = checksum_of_file(index_path)
    manifest["shards"][0]["index"].update(size=size, checksum=format_checksum(digest))
    write_manifest(directory, manifest)


def write_older_tar_index(out: Path, name: str, base: str) -> str:
    """A copy of valid tar dataset `base` whose member index has the spans of an index written
    before member checksums ([data offset, size]): still read, its members unchecked."""
    description, schema, classes, records = TAR_VALID[base]
    _write_tar_base(out / name, schema, classes, records)
    rows = _index_rows(out / name / "shard-00000.tar.idx")
    for row in rows:
        row["members"] = {ext: span[:2] for ext, span in row["members"].items()}
    _rewrite_index(out / name, rows)
    described = f"{description}; its member index written before member checksums (spans of two numbers): read, members unchecked"
    _write_valid_tar_json(out, name, described, schema, classes, records)
    return described


def write_flipped_member(out: Path, name: str, base: str) -> str:
    """A copy of valid tar dataset `base` with one bit of record 0's txt member flipped in the tar."""
    rule = "a member field is checked against the checksum of its span when it is read"
    _write_tar_base(out / name, *TAR_VALID[base][1:])
    start, size, _ = _index_rows(out / name / "shard-00000.tar.idx")[0]["members"]["txt"]
    tar = out / name / "shard-00000.tar"
    data = bytearray(tar.read_bytes())
    data[start] ^= 0x01
    tar.write_bytes(bytes(data))
    key = TAR_VALID[base][3][0]["key"]
    message = f"member field 'txt' of sample {key!r} [{start}, {start + size}) does not match its checksum: the tar is corrupt"
    expected = {"base": base, "rule": rule, "check": "member-checksum", "error": "ChecksumError", "message": message,
                "path": "shard-00000.tar", "offset": start, "record": 0, "when": "read"}
    (out / f"{name}.json").write_bytes(dump_json(expected))
    return rule


def _write_valid_tar_json(
    out: Path, name: str, description: str, schema: Schema, classes: list[str] | None, records: list[dict[str, Any]]
) -> None:
    values = []
    for record in records:
        values.append({key: (value.hex() if isinstance(value, bytes) else value) for key, value in record.items()})
    rows = [{**row, "key": row["key"].hex(), "image_checksum": hex64(row["image_checksum"] % (1 << 64))}
            for row in _index_rows(out / name / "shard-00000.tar.idx")]
    expected = {
        "description": description,
        "valid": True,
        "schema": schema.to_json(),
        "classes": classes,
        "records": values,
        "index": rows,
    }
    (out / f"{name}.json").write_bytes(dump_json(expected))


def _write_tar_base(directory: Path, schema: Schema, classes: list[str] | None, records: list[dict[str, Any]]) -> None:
    with DatasetWriter(directory, schema=schema, shard_format="tar", shard_size=1 << 30, classes=classes) as writer:
        for record in records:
            writer.write(record)


def _index_rows(path: Path) -> list[dict[str, Any]]:
    with ShardReader(path) as index:
        return [{name: (bytes(value) if isinstance(value, memoryview) else value) for name, value in index.record(i).items()}
                for i in range(len(index))]


def write_tar_datasets(out: Path) -> dict[str, str]:
    """Write the valid and invalid tar dataset vectors into `out`; return name -> description or rule."""
    out.mkdir()
    described: dict[str, str] = {}
    for name, (description, schema, classes, records) in TAR_VALID.items():
        _write_tar_base(out / name, schema, classes, records)
        _write_valid_tar_json(out, name, description, schema, classes, records)
        described[name] = description
    described["image-text-older-index"] = write_older_tar_index(out, "image-text-older-index", "image-text")
    described["tar-member-flipped"] = write_flipped_member(out, "tar-member-flipped", "image-text")
    for name, (base, rule, break_rule) in TAR_INVALID.items():
        directory = out / name
        _write_tar_base(directory, *TAR_VALID[base][1:])
        index_path = directory / "shard-00000.tar.idx"
        rows = _index_rows(index_path)
        check, error, message, column, record, when = break_rule(rows, (directory / "shard-00000.tar").stat().st_size)
        schema = INDEX_SCHEMA if "extra" not in rows[0] else Schema((*INDEX_SCHEMA.fields, Field("extra", "int64")))
        _rewrite_index(directory, rows, schema)
        offset = None
        path = "shard-00000.tar.idx"
        if column is not None:
            with ShardReader(index_path) as index:
                offset = index.locate_column(record, column)[1]
        elif check == "checksum":
            path, offset = "shard-00000.tar", rows[record]["image_offset"]
        expected = {"base": base, "rule": rule, "check": check, "error": error, "message": message, "path": path,
                    "offset": offset, "record": record, "when": when}
        (out / f"{name}.json").write_bytes(dump_json(expected))
        described[name] = rule
    return described


# --- sampling --------------------------------------------------------------------------------


BATCH_CASES: list[dict[str, Any]] = [
    {"num_records": 10, "batch_size": 3, "seed": 0, "epoch": 0, "world_size": 1, "drop_last": False},
    {"num_records": 10, "batch_size": 3, "seed": 0, "epoch": 1, "world_size": 1, "drop_last": False},
    {"num_records": 10, "batch_size": 3, "seed": 0, "epoch": 0, "world_size": 1, "drop_last": True},
    {"num_records": 10, "batch_size": 3, "seed": 0, "epoch": 0, "world_size": 1, "drop_last": False, "shuffle": False},
    {"num_records": 17, "batch_size": 4, "seed": 1234, "epoch": 3, "world_size": 3, "drop_last": False},
    {"num_records": 17, "batch_size": 4, "seed": 1234, "epoch": 3, "world_size": 3, "drop_last": True},
    {"num_records": 13, "batch_size": 3, "seed": 7, "epoch": 0, "world_size": 2, "drop_last": False},  # rank 1 ends 2 + 1
    {"num_records": 8, "batch_size": 1, "seed": 5, "epoch": 2, "world_size": 4, "drop_last": False},
    {"num_records": 6, "batch_size": 2, "seed": (1 << 64) - 1, "epoch": (1 << 64) - 1, "world_size": 1, "drop_last": False},
    {"num_records": 6, "batch_size": 2, "seed": -1, "epoch": 0, "world_size": 1, "drop_last": False},  # -1 is 2^64 - 1
    {
        "num_records": 12,
        "batch_size": 4,
        "seed": 3,
        "epoch": 1,
        "world_size": 2,
        "drop_last": False,
        "shard_sizes": [4, 0, 5, 3],
        "window": 1,
    },
    {
        "num_records": 12,
        "batch_size": 4,
        "seed": 3,
        "epoch": 1,
        "world_size": 2,
        "drop_last": False,
        "shard_sizes": [4, 0, 5, 3],
        "window": 2,
    },
    {
        "num_records": 12,
        "batch_size": 4,
        "seed": 3,
        "epoch": 1,
        "world_size": 2,
        "drop_last": True,
        "shard_sizes": [4, 0, 5, 3],
        "window": 4,
    },
]
"""(N, batch size, seed, epoch, world size, drop_last, and optionally shuffle, shard sizes and a
window): every rank's batches are written."""


def sampling_batches() -> dict[str, Any]:
    from shardfmt._sampling.keys import ORDER_STREAM, mix64, record_keys, sample_batches

    cases = []
    for case in BATCH_CASES:
        options = {"shuffle": True, "shard_sizes": None, "window": None, **case}
        ranks = []
        for rank in range(case["world_size"]):
            plan = sample_batches(
                options["num_records"],
                batch_size=options["batch_size"],
                seed=options["seed"],
                epoch=options["epoch"],
                rank=rank,
                world_size=options["world_size"],
                shuffle=options["shuffle"],
                drop_last=options["drop_last"],
                shard_sizes=options["shard_sizes"],
                window=options["window"],
            )
            ranks.append([[int(i) for i in plan.batch(b)] for b in range(len(plan))])
        cases.append({**options, "batches": ranks})
    with np.errstate(over="ignore"):
        mixes = [[x, int(mix64(np.uint64(x)))] for x in (0, 1, (1 << 64) - 1, 0x4F52444552)]
    keys = [[0, 0, i, hex64(int(record_keys(0, ORDER_STREAM, 0, np.array([i], np.uint64))[0]))] for i in range(3)]
    return {
        "description": (
            "epoch orders by the sorted-key rule (every record's key sorted, the rule for datasets whose keys a loader "
            "sorts in memory), with and without a window of shards, split over ranks and into batches: "
            "batches[r] is rank r's list of batches of dataset record indices (spec/sampling.md)"
        ),
        "mix64": [[hex64(x), hex64(y)] for x, y in mixes],
        "order_keys": [{"seed": seed, "epoch": epoch, "index": index, "key": key} for seed, epoch, index, key in keys],
        "cases": cases,
    }


FEISTEL_CASES: list[dict[str, Any]] = [
    {"num_records": 10, "batch_size": 3, "seed": 0, "epoch": 0, "world_size": 1},
    {"num_records": 1000, "batch_size": 8, "seed": 7, "epoch": 2, "world_size": 3, "first": 2},
    {"num_records": 6, "batch_size": 2, "seed": -1, "epoch": (1 << 64) - 1, "world_size": 1},
    {"num_records": 12, "batch_size": 4, "seed": 3, "epoch": 1, "world_size": 2, "shard_sizes": [4, 0, 5, 3], "window": 2},
    {"num_records": 12, "batch_size": 4, "seed": 3, "epoch": 1, "world_size": 2, "shard_sizes": [4, 0, 5, 3], "window": 4},
    # windows of 2 of these shards: at least two windows hold only empty shards, and give no positions
    {"num_records": 7, "batch_size": 2, "seed": 9, "epoch": 0, "world_size": 1, "shard_sizes": [0, 0, 0, 4, 0, 0, 3], "window": 2},
    {
        "num_records": 70_000,
        "batch_size": 8,
        "seed": 1,
        "epoch": 0,
        "world_size": 2,
        "shard_sizes": [30_000, 25_000, 15_000],
        "window": 1,
        "first": 2,
    },
    {"num_records": 10**9, "batch_size": 8, "seed": 0, "epoch": 0, "world_size": 1024, "ranks": [0, 1023], "first": 2},
    {
        "num_records": 10**9,
        "batch_size": 8,
        "seed": 0,
        "epoch": 5,
        "world_size": 1024,
        "ranks": [0],
        "first": 2,
        "shard_sizes": "10000 x 100000",
        "window": 64,
    },
]
"""Feistel orders: (N, batch size, seed, epoch, world size, and optionally a window over shard
sizes, the ranks and the number of first batches to write)."""


def _shard_sizes(value: Any) -> Any:
    if isinstance(value, str):  # "COUNT x SIZE": too many shards to list
        count, size = (int(part) for part in value.split(" x "))
        return np.full(count, size, np.int64)
    return value


def sampling_feistel() -> dict[str, Any]:
    from shardfmt._sampling.orders import epoch_order
    from shardfmt._sampling.permutation import FEISTEL_STREAM, ROUNDS, permute, round_keys
    from shardfmt._sampling.ranks import RankPlan

    cases = []
    for case in FEISTEL_CASES:
        options = {"shard_sizes": None, "window": None, **case}
        order = epoch_order(
            "feistel",
            num_records=options["num_records"],
            seed=options["seed"],
            epoch=options["epoch"],
            shard_sizes=_shard_sizes(options["shard_sizes"]),
            window=options["window"],
        )
        ranks = options.get("ranks", list(range(options["world_size"])))
        batches = {}
        for rank in ranks:
            plan = RankPlan(order, batch_size=options["batch_size"], rank=rank, world_size=options["world_size"], drop_last=False)
            batches[str(rank)] = [plan.batch(b).tolist() for b in range(min(len(plan), options.get("first", len(plan))))]
        cases.append({**options, "ranks": ranks, "batches": batches})
    permutations = [
        {
            "size": size,
            "seed": seed,
            "stream": hex64(FEISTEL_STREAM),
            "epoch": epoch,
            "index": index,
            "round_keys": [hex64(int(k)) for k in round_keys(seed=seed, stream=FEISTEL_STREAM, epoch=epoch, index=index)],
            "image": permute(np.arange(min(size, 16)), size=size, seed=seed, epoch=epoch, index=index).tolist(),
        }
        for size, seed, epoch, index in ((1, 0, 0, 0), (2, 0, 0, 0), (5, 0, 0, 0), (16, 9, 1, 0), (17, 9, 1, 3), (10**9, 0, 0, 0))
    ]
    return {
        "description": (
            f"epoch orders by the Feistel rule ({ROUNDS} rounds, cycle walking; with a window, one bijection per window), "
            "split over ranks and into batches: batches[rank] is that rank's first batches of dataset record indices; "
            "permutations gives the round keys and the images of positions 0..15 of single bijections (spec/sampling.md)"
        ),
        "permutations": permutations,
        "cases": cases,
    }


MIXTURE_CASES: list[dict[str, Any]] = [
    {"sizes": [13, 9, 5], "weights": [1, 2, 1], "epoch_size": 30, "seed": 3, "epochs": [0, 1], "world_size": 2, "batch_size": 4},
    {"sizes": [10, 40], "weights": [0.1, 0.9], "epoch_size": 7, "seed": 0, "epochs": [0, 1, 2, 3], "world_size": 1, "batch_size": 7},
    {"sizes": [3, 1000, 7], "weights": [1, 1, 0], "epoch_size": 9, "seed": 12, "epochs": [4], "world_size": 3, "batch_size": 2},
    {"sizes": [2, 3], "weights": [1, 1], "epoch_size": 7, "seed": 5, "epochs": [0], "world_size": 1, "batch_size": 7, "shuffle": False},
]
"""Mixtures: source sizes, weights, epoch size, seed, the epochs written, world size, batch size."""


def sampling_mixture() -> dict[str, Any]:
    from shardfmt._sampling.mixture import MixtureOrder, allocate
    from shardfmt._sampling.ranks import RankPlan

    cases = []
    for case in MIXTURE_CASES:
        options = {"shuffle": True, **case}
        counts = allocate(options["weights"], epoch_size=options["epoch_size"])
        epochs = {}
        for epoch in options["epochs"]:
            order = MixtureOrder(options["sizes"], counts=counts, seed=options["seed"], epoch=epoch, shuffle=options["shuffle"])
            plans = [
                RankPlan(order, batch_size=options["batch_size"], rank=r, world_size=options["world_size"], drop_last=False)
                for r in range(options["world_size"])
            ]
            epochs[str(epoch)] = [[plan.batch(b).tolist() for b in range(len(plan))] for plan in plans]
        cases.append({**options, "counts": counts, "batches": epochs})
    return {
        "description": (
            "mixtures: counts are each source's records an epoch (largest remainders); batches[epoch][rank] is that rank's "
            "batches of indices into the concatenation of the sources in order (spec/sampling.md, Mixtures)"
        ),
        "cases": cases,
    }


ELASTIC_CASES: list[dict[str, Any]] = [
    {"order": "feistel", "num_records": 103, "batch_size": 4, "seed": 5, "epoch": 1, "hops": [[4, 3], [3, 2], [8, None]]},
    {"order": "sorted-key", "num_records": 103, "batch_size": 4, "seed": 5, "epoch": 1, "hops": [[4, 6], [2, None]]},
    {"order": "feistel", "num_records": 50, "batch_size": 3, "seed": 0, "epoch": 0, "hops": [[3, 5], [4, None]], "refuses": [8]},
]
"""Elastic resumes: an order, and hops of [world size, batches every rank takes] (None: to the end);
`refuses`: world sizes a loader refuses to resume the last hop on (fewer records left than ranks)."""


def sampling_elastic() -> dict[str, Any]:
    from shardfmt._sampling.keys import check_split
    from shardfmt._sampling.orders import epoch_order
    from shardfmt._sampling.ranks import RankPlan, delivered_records

    cases = []
    for case in ELASTIC_CASES:
        order = epoch_order(case["order"], num_records=case["num_records"], seed=case["seed"], epoch=case["epoch"])
        start, hops, refused = 0, [], []
        for world_size, taken in case["hops"]:
            if taken is None:
                for other in case.get("refuses", []):
                    try:
                        check_split(case["num_records"] - start, batch_size=case["batch_size"], world_size=other, drop_last=False)
                    except ValueError:
                        refused.append({"world_size": other, "start": start})
                    else:
                        raise RuntimeError(f"{other} ranks can take the rest of the epoch: not a refusal")
            plans = [
                RankPlan(order, batch_size=case["batch_size"], rank=r, world_size=world_size, drop_last=False, start=start)
                for r in range(world_size)
            ]
            count = len(plans[0]) if taken is None else taken
            hops.append(
                {"world_size": world_size, "start": start, "batches": [[plan.batch(b).tolist() for b in range(count)] for plan in plans]}
            )
            start += delivered_records(
                case["num_records"] - start, batch_size=case["batch_size"], world_size=world_size, drop_last=False, batches=count
            )
        cases.append(
            {**{k: v for k, v in case.items() if k not in ("hops", "refuses")}, "hops": hops, **({"refuses": refused} if refused else {})}
        )
    return {
        "description": (
            "resuming on other numbers of ranks: each hop starts at position start of the epoch order (the records every "
            "earlier hop delivered) and lists each rank's batches taken there (spec/sampling.md, Resuming on another number of ranks)"
        ),
        "cases": cases,
    }


CROP_CASES: list[dict[str, Any]] = [
    {
        "pipeline": {"op": "random_resized_crop", "size": [224, 224], "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3], "flip": 0.5},
        "height": 375,
        "width": 500,
    },
    {
        "pipeline": {"op": "random_resized_crop", "size": [224, 224], "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3], "flip": 0.5},
        "height": 2000,
        "width": 3000,
    },
    {
        "pipeline": {"op": "random_resized_crop", "size": [32, 32], "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3], "flip": 0.5},
        "height": 31,
        "width": 29,
    },
    {
        "pipeline": {"op": "random_resized_crop", "size": [64, 64], "scale": [0.9, 1.0], "ratio": [0.75, 4 / 3], "flip": 0.5},
        "height": 20,
        "width": 400,
    },
    {
        "pipeline": {"op": "random_resized_crop", "size": [64, 64], "scale": [0.9, 1.0], "ratio": [0.75, 4 / 3], "flip": 0.5},
        "height": 400,
        "width": 20,
    },
    {
        "pipeline": {"op": "random_resized_crop", "size": [16, 16], "scale": [1.0, 1.0], "ratio": [1.0, 1.0], "flip": 0.0},
        "height": 30,
        "width": 30,
    },
    # Records 66 and 131: snapping to 2 grows the box to 64 rows, 4 times the output, so a second
    # round snaps it to 4 (a single pass would stop at the multiple of 2).
    {
        "pipeline": {"op": "random_resized_crop", "size": [16, 16], "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3], "flip": 0.5},
        "height": 100,
        "width": 130,
        "at": [[0, 0, 66], [0, 0, 131]],
    },
    {"pipeline": {"op": "random_crop", "size": [96, 96], "flip": 0.5}, "height": 300, "width": 200},
    {"pipeline": {"op": "random_crop", "size": [96, 96], "flip": 0.5}, "height": 50, "width": 120},
    {"pipeline": {"op": "center_crop", "size": [224, 224], "resize": 256}, "height": 375, "width": 500},
    {"pipeline": {"op": "center_crop", "size": [224, 224], "resize": 256}, "height": 1001, "width": 333},
    {"pipeline": {"op": "center_crop", "size": [24, 32], "resize": 40}, "height": 81, "width": 95},
    {"pipeline": {"op": "resize", "size": [224, 224]}, "height": 1000, "width": 1795},
    {"pipeline": {"op": "resize", "size": [12, 12]}, "height": 100, "width": 47},
    {
        "pipeline": {"op": "random_resized_crop", "size": [48, 48], "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3], "flip": 0.5},
        "height": 120,
        "width": 160,
        "fields": [
            {"height": 240, "width": 320, "size": [96, 96], "snap": True},
            {"height": 120, "width": 160, "size": [48, 48], "snap": False},
        ],
    },
    {
        "pipeline": {"op": "random_crop", "size": [32, 32], "flip": 0.5},
        "height": 64,
        "width": 80,
        "fields": [
            {"height": 256, "width": 320, "size": [128, 128], "snap": True},
            {"height": 100, "width": 125, "size": [50, 50], "snap": True},
        ],
    },
    {
        "pipeline": {"op": "center_crop", "size": [64, 64], "resize": 72},
        "height": 300,
        "width": 500,
        "fields": [
            {"height": 150, "width": 250, "size": [32, 32], "snap": True},
            {"height": 301, "width": 499, "size": [64, 64], "snap": False},
        ],
    },
]
"""A pipeline (its configuration), the reference image field's size and, optionally, further image
fields: size, output size and whether the carried box is snapped (a jpeg field decoded with
bilinear interpolation). Each case is drawn for the (seed, epoch, record) of CROP_DRAWS, or of its
"at" list."""
CROP_DRAWS = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (2024, 7, 123456)]


def sampling_crops() -> dict[str, Any]:
    from shardfmt._sampling.keys import AUGMENT_STREAM, record_keys, uniforms
    from shardfmt.ops._crop import pipeline_from_config, scale_plan, snap_to_scale

    cases = []
    for case in CROP_CASES:
        pipeline = pipeline_from_config(dict(case["pipeline"]))
        height, width = np.array([case["height"]], np.int64), np.array([case["width"]], np.int64)
        draws = []
        for seed, epoch, record in case.get("at", CROP_DRAWS):
            key = record_keys(seed, AUGMENT_STREAM, epoch, np.array([record], np.uint64))
            plan = pipeline.plan(height, width, key)
            entry: dict[str, Any] = {
                "seed": seed,
                "epoch": epoch,
                "record": record,
                "key": hex64(int(key[0])),
                "u": [float(u) for u in uniforms(key, 4)[0]],
                "box": [int(plan.top[0]), int(plan.left[0]), int(plan.height[0]), int(plan.width[0])],
                "flip": bool(plan.flip[0]),
            }
            boxes = []
            for field in case.get("fields", []):
                fh, fw = np.array([field["height"]], np.int64), np.array([field["width"]], np.int64)
                carried = scale_plan(plan, fh, fw, height, width)
                if field["snap"]:
                    carried = snap_to_scale(carried, fh, fw, tuple(field["size"]))
                boxes.append([int(carried.top[0]), int(carried.left[0]), int(carried.height[0]), int(carried.width[0])])
            if boxes:
                entry["field_boxes"] = boxes
            draws.append(entry)
        cases.append({**{k: v for k, v in case.items() if k != "at"}, "draws": draws})
    return {
        "description": (
            "crop boxes (top, left, height, width) in source pixels and flips of the reference image field, and the "
            "boxes carried to further image fields, for given sizes, seed, epoch, record and pipeline; u holds the "
            "record's first four draws as floats (spec/sampling.md)"
        ),
        "cases": cases,
    }


EVAL_CASES: list[dict[str, Any]] = [
    {"size": [224, 224], "resize": 256, "height": 375, "width": 500},
    {"size": [224, 224], "resize": 256, "height": 1001, "width": 333},
    {"size": [224, 224], "resize": 256, "height": 256, "width": 257},
    {"size": [24, 32], "resize": 40, "height": 81, "width": 95},
    {"size": [64, 64], "resize": 73, "height": 500, "width": 375},
    {"size": [64, 64], "resize": 73, "height": 64, "width": 64},
    {"size": [224, 224], "resize": 256, "height": 375, "width": 500, "field_size": [112, 112]},
    {"size": [32, 32], "resize": 40, "height": 90, "width": 61, "field_size": [33, 33]},
]
"""CenterCrop's evaluation rule: the pipeline's size and resize, the image's size and, optionally,
the output size of a further image field, whose resize is scaled from the pipeline's."""


def sampling_eval_crops() -> dict[str, Any]:
    from shardfmt.ops._crop import CenterCrop, field_resize

    cases = []
    for case in EVAL_CASES:
        pipeline = CenterCrop(tuple(case["size"]), resize=case["resize"])
        field_size = tuple(case.get("field_size", case["size"]))
        resized_h, resized_w, top, left = pipeline.resized_crop(case["height"], case["width"], size=field_size)
        cases.append(
            {
                **case,
                "field_resize": field_resize(pipeline.resize, pipeline.size, field_size),
                "resized": [resized_h, resized_w],
                "crop": [top, left, field_size[0], field_size[1]],
            }
        )
    return {
        "description": (
            "CenterCrop's evaluation rule (torchvision's Resize then CenterCrop): the size the whole image is resized "
            "to and the box [top, left, height, width] cut from it, for given image sizes (spec/sampling.md)"
        ),
        "cases": cases,
    }


STEP_CASES: list[dict[str, Any]] = [
    {"step": "TrivialAugmentWide", "args": {}, "height": 224, "width": 224, "position": 0},
    {"step": "RandAugment", "args": {"num_ops": 2, "magnitude": 9}, "height": 224, "width": 224, "position": 0},
    {"step": "RandAugment", "args": {"num_ops": 3, "magnitude": 15, "num_magnitude_bins": 21}, "height": 160, "width": 331, "position": 2},
    {"step": "AutoAugment", "args": {}, "height": 224, "width": 224, "position": 1},
    {"step": "AutoAugment", "args": {"policy": "cifar10"}, "height": 32, "width": 32, "position": 0},
    {"step": "AutoAugment", "args": {"policy": "svhn", "interpolation": "bilinear"}, "height": 32, "width": 32, "position": 0},
    {"step": "AugMix", "args": {}, "height": 224, "width": 224, "position": 0},
    {"step": "AugMix", "args": {"severity": 5, "mixture_width": 2, "chain_depth": 2, "alpha": 0.5, "all_ops": False}, "height": 32,
     "width": 48, "position": 1},
    {"step": "RandomErasing", "args": {"p": 0.5}, "height": 224, "width": 224, "position": 3},
    {"step": "RandomErasing", "args": {"p": 1.0, "scale": [0.1, 0.9], "ratio": [0.5, 2.0]}, "height": 40, "width": 30, "position": 0},
]
"""Augmentation steps (class and arguments), the sample's size and the step's position j in the
augment list; each case is drawn for the (seed, epoch, record) of STEP_DRAWS."""
STEP_DRAWS = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (7, 3, 12), (2024, 7, 123456), (1, 0, 5), (1, 0, 6), (1, 0, 7)]


def _step_draw(step: Any, case: dict[str, Any], seed: int, epoch: int, record: int) -> dict[str, Any]:
    """One draw of an augment-steps case: the key, the operations chosen (or the erased box) and the first draws."""
    from shardfmt import ops
    from shardfmt._sampling.keys import STEP_STREAM, record_keys, uniforms
    from shardfmt.ops._autoaugment import OPERATIONS, SIGNED_OPERATIONS, magnitude_table

    height, width = case["height"], case["width"]
    key = record_keys(seed, STEP_STREAM + case["position"], epoch, np.array([record], np.uint64))
    u = uniforms(key, step.draws)
    entry: dict[str, Any] = {"seed": seed, "epoch": epoch, "record": record, "key": hex64(int(key[0]))}
    if isinstance(step, ops.RandomErasing):
        entry["box"] = [int(v) for v in step.boxes(u, height=height, width=width)[0]]
    else:
        params = step.parameters(u)[0]
        family, bins = (
            ("wide", step.num_magnitude_bins)
            if isinstance(step, ops.TrivialAugmentWide)
            else ("standard", getattr(step, "num_magnitude_bins", 10))
        )
        if isinstance(step, ops.AugMix):  # the weights first, then the chains' slots
            entry["weights"] = [float(v) for v in params[: 1 + step.mixture_width]]
            params, family = params[1 + step.mixture_width :], "augmix"
        applied: list[Any] = []
        for slot in range(len(params) // 3):
            operation, bin_index, sign = (int(v) for v in params[3 * slot : 3 * slot + 3])
            if operation < 0:
                applied.append(None)
                continue
            table = magnitude_table(family, OPERATIONS[operation], bins, height=height, width=width)
            magnitude = table[bin_index] if len(table) > 1 else 0.0
            signed = OPERATIONS[operation] in SIGNED_OPERATIONS
            applied.append(
                [
                    OPERATIONS[operation],
                    bin_index if len(table) > 1 else None,
                    float_value(-magnitude if sign and signed else magnitude),
                ]
            )
        entry["operations"] = applied
    entry["u"] = [float(v) for v in u[0][:5]]
    return entry


def sampling_steps() -> dict[str, Any]:
    from shardfmt import ops

    cases = []
    for case in STEP_CASES:
        step = getattr(ops, case["step"])(**{k: tuple(v) if isinstance(v, list) else v for k, v in case["args"].items()})
        draws = [_step_draw(step, case, seed, epoch, record) for seed, epoch, record in STEP_DRAWS]
        cases.append({**case, "draws": draws})
    return {
        "description": (
            "augmentation steps' draws: for each (seed, epoch, record), the step's key (stream STEP + position), its first "
            "draws as floats, and the operations chosen ([name, bin, signed magnitude], null where a sub-policy's operation "
            "does not run) or the erased box (top, left, height, width; all 0 when nothing is erased) (spec/sampling.md)"
        ),
        "cases": cases,
    }


POLICY_CASES: list[dict[str, Any]] = [
    {"step": "AutoAugment", "args": {"policy": "imagenet"}, "height": 224, "width": 224, "position": 0},
    {"step": "AutoAugment", "args": {"policy": "cifar10"}, "height": 32, "width": 32, "position": 0},
    {"step": "AutoAugment", "args": {"policy": "svhn"}, "height": 32, "width": 32, "position": 0},
]
"""AutoAugment's three policies; each is drawn at seed 0, epoch 0 for records chosen to reach every sub-policy."""


def _policy_records(step: Any, position: int, *, count: int = 4096) -> list[int]:
    """For each sub-policy s: the first record (seed 0, epoch 0) that draws s, then the first that
    draws s and runs each of its operations whose probability is not 0 (when that is another record)."""
    from shardfmt._sampling.keys import STEP_STREAM, record_keys, uniforms
    from shardfmt.ops._autoaugment import POLICIES

    u = uniforms(record_keys(0, STEP_STREAM + position, 0, np.arange(count, dtype=np.uint64)), step.draws)
    chosen = np.floor(25 * u[:, 0]).astype(int)
    records: list[int] = []
    for s, pair in enumerate(POLICIES[step.policy]):
        first = int(np.flatnonzero(chosen == s)[0])
        runs = chosen == s
        for i, (_, probability, _) in enumerate(pair):
            if probability > 0:
                runs &= u[:, 1 + i] <= probability
        both = int(np.flatnonzero(runs)[0])
        records += [first] if first == both else [first, both]
    return records


def sampling_policies() -> dict[str, Any]:
    from shardfmt import ops

    cases = []
    for case in POLICY_CASES:
        step = ops.AutoAugment(**case["args"])
        draws = []
        for record in _policy_records(step, case["position"]):
            entry = _step_draw(step, case, 0, 0, record)
            draws.append({"sub_policy": int(25 * entry["u"][0]), **entry})
        cases.append({**case, "draws": draws})
    return {
        "description": (
            "AutoAugment's policies, every sub-policy reached: for each record (seed 0, epoch 0, position 0), the sub-policy "
            "floor(25 u_1) it draws, its key, its first draws and the operations that run, as in augment-steps "
            "(spec/sampling.md, AutoAugment's policies)"
        ),
        "cases": cases,
    }


COIN_STEP_CASES: list[dict[str, Any]] = [
    {"step": "ColorJitter", "args": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}, "position": 0},
    {"step": "ColorJitter", "args": {"brightness": [0.5, 1.5], "contrast": 0, "saturation": 0.2, "hue": [-0.05, 0.2]}, "position": 1},
    {"step": "RandomRotation", "args": {"degrees": 30}, "position": 0},
    {"step": "RandomRotation", "args": {"degrees": [-10, 45], "fill": [255, 0, 0]}, "position": 2},
    {"step": "RandomGrayscale", "args": {}, "position": 0},
    {"step": "RandomGrayscale", "args": {"p": 0.5}, "position": 1},
    {"step": "RandomVerticalFlip", "args": {}, "position": 0},
    {"step": "RandomVerticalFlip", "args": {"p": 0.25}, "position": 3},
]
"""ColorJitter, RandomRotation, RandomGrayscale and RandomVerticalFlip: class, arguments and the step's position j."""
USER_STEP_POSITIONS = (0, 2)
"""Positions of a user's step whose generator seeds the vector gives."""


def _coin_step_outcome(step: Any, u: np.ndarray) -> dict[str, Any]:
    from shardfmt import ops

    params = step.parameters(u)[0]
    if isinstance(step, ops.ColorJitter):
        factors = [None if math.isnan(v) else float(v) for v in params[4:]]
        return {"order": [["brightness", "contrast", "saturation", "hue"][int(n)] for n in params[:4]], "factors": factors}
    if isinstance(step, ops.RandomRotation):
        return {"angle": float(params[0])}
    return {"applies": bool(params[0])}


def _user_step_seeds(seed: int, epoch: int, record: int, position: int) -> dict[str, Any]:
    """A user's step's generator key K_j, the global seed G_j and the first draw of each generator so seeded."""
    import random

    import torch

    from shardfmt._sampling.keys import RNG_STREAM, STEP_STREAM, record_keys
    from shardfmt.ops._augment import seed_global_generators

    records = np.array([record], np.uint64)
    step_key = int(record_keys(seed, STEP_STREAM + position, epoch, records)[0])
    global_key = int(record_keys(seed, RNG_STREAM + position, epoch, records)[0])
    generator = torch.Generator()
    generator.manual_seed(step_key)
    given = float(torch.rand(1, generator=generator, dtype=torch.float64)[0])
    torch_state, numpy_state, python_state = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        seed_global_generators(global_key)
        drawn = [float(torch.rand(1, dtype=torch.float64)[0]), float(np.random.random()), random.random()]
    finally:
        torch.random.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    return {
        "seed": seed, "epoch": epoch, "record": record, "position": position, "generator_key": hex64(step_key),
        "global_key": hex64(global_key), "generator_rand": given, "torch_rand": drawn[0], "numpy_random": drawn[1],
        "python_random": drawn[2],
    }


def sampling_step_draws() -> dict[str, Any]:
    from shardfmt import ops
    from shardfmt._sampling.keys import STEP_STREAM, record_keys, uniforms

    cases = []
    for case in COIN_STEP_CASES:
        step = getattr(ops, case["step"])(**{k: tuple(v) if isinstance(v, list) else v for k, v in case["args"].items()})
        draws = []
        for seed, epoch, record in STEP_DRAWS:
            key = record_keys(seed, STEP_STREAM + case["position"], epoch, np.array([record], np.uint64))
            u = uniforms(key, step.draws)
            draws.append(
                {"seed": seed, "epoch": epoch, "record": record, "key": hex64(int(key[0])), "u": [float(v) for v in u[0]],
                 **_coin_step_outcome(step, u)}
            )
        cases.append({**case, "draws": draws})
    user = [_user_step_seeds(seed, epoch, record, j) for j in USER_STEP_POSITIONS for seed, epoch, record in STEP_DRAWS]
    cases.append({"step": "user", "draws": user})
    return {
        "description": (
            "the draws of ColorJitter (order of the adjustments, factors, null where not applied), RandomRotation (angle), "
            "RandomGrayscale and RandomVerticalFlip (applies), and a user's step's seeds: the generator's key K_j, the global "
            "key G_j, and the first float64 of torch.rand from a generator seeded with K_j, of torch.rand, numpy.random.random "
            "and random.random after the global generators are seeded from G_j (spec/sampling.md, Augmentation steps)"
        ),
        "cases": cases,
    }


JSON_TEXT_CASES: list[tuple[str, str]] = [
    ("value", "-0"),
    ("value", "[0, -0, -0.0, -0e0, 0e0, 1E2, -1e-400]"),
    ("value", '{"num_records": -0}'),
    ("schema", '{"fields":[{"name":"a","type":"int64","dtype":"uint8","shape":[3]}]}'),
    ("schema", '{"fields":[{"dtype":5,"name":"a","shape":"x","type":"str"}]}'),
    ("schema", '{"fields":[{"dtype":"float32","name":"a","shape":[-0,2],"type":"ndarray"}]}'),
    ("schema", '{"fields":[{"dtype":"float32","name":"a","shape":[1.0],"type":"ndarray"}]}'),
    ("schema", '{"fields":[{"dtype":"complex64","name":"a","shape":[1],"type":"ndarray"}]}'),
    ("schema", '{"fields":[{"dtype":"float32","name":"a","type":"ndarray"}]}'),
]
"""JSON texts and schemas whose reading a rule of spec/format.md decides: negative zeros, and the
dtype and shape keys on fields of every kind."""


def _json_value(value: Any) -> Any:
    """A parsed JSON value for a vector: integers as they are, binary64 numbers as {"float": hex bits}."""
    if isinstance(value, float):
        return {"float": hex64(float_bits(value))}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value


def json_text_cases() -> dict[str, Any]:
    import shardfmt
    from shardfmt._jsontext import parse_json

    cases = []
    for kind, text in JSON_TEXT_CASES:
        case: dict[str, Any] = {"kind": kind, "text": text}
        if kind == "value":
            case["value"] = _json_value(parse_json(text.encode()))
        else:
            try:
                schema = Schema.from_bytes(text.encode())
            except shardfmt.UnsupportedVersionError:
                case["error"] = "UnsupportedVersionError"
            except shardfmt.SchemaError:  # a shard reader reports it as FormatError at offset 64 (step 14)
                case["error"] = "FormatError"
            else:
                case["canonical"] = schema.to_bytes().decode()
        cases.append(case)
    return {
        "description": (
            "JSON texts and schema texts: the value each denotes (integers as numbers, binary64 numbers as {\"float\": bits}), "
            "or a schema's canonical encoding, or the error a reader reports for it (spec/format.md, sections 4 and 7)"
        ),
        "cases": cases,
    }


SHARD_PLAN_CASES: list[dict[str, Any]] = [
    {"shard_size": 100, "sizes": [40, 40, 40, 40, 40, 40, 40]},
    {"shard_size": 100, "sizes": [100, 1, 99, 250, 0, 0, 5]},
    {"shard_size": 100, "sizes": [30, 30, 30]},
    {"shard_size": 100, "sizes": []},
    {"shard_size": 1000, "sizes": [1] * 10, "max_records": 4},
    {"shard_size": 268435456, "sizes": [110000] * 2441 + [150000] * 3},
]
"""Conversion's shard cutting: record sizes in output order, the shard size, and (to show the
record bound without 2^24 records) a smaller bound in place of MAX_RECORDS_PER_SHARD."""


def shard_plans() -> dict[str, Any]:
    from shardfmt._convert.plan import plan_shards

    cases = []
    for case in SHARD_PLAN_CASES:
        kwargs = {"max_records": case["max_records"]} if "max_records" in case else {}
        spans = plan_shards(case["sizes"], shard_size=case["shard_size"], **kwargs)
        sizes: Any = case["sizes"] if len(case["sizes"]) <= 16 else _run_lengths(case["sizes"])
        cases.append({**case, "sizes": sizes, "shards": [list(span) for span in spans]})
    return {
        "description": (
            "how conversion cuts records into shards: record sizes in output order (or [size, count] runs), shard_size, "
            "max_records where it is not 2^24, and the [start, stop) record range of each shard (spec/conversion.md)"
        ),
        "cases": cases,
    }


def _run_lengths(values: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def _pixel_image(height: int, width: int, channels: int) -> np.ndarray[Any, Any]:
    """A smooth image with edges (gradients, a disc, stripes): every decoder choice shows in it."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = [
        255 * x / (width - 1),
        255 * y / (height - 1),
        128 + 100 * np.sin(x / 3.0) * np.cos(y / 5.0),
    ]
    disc = (y - height / 2) ** 2 + (x - width / 3) ** 2 < (height / 4) ** 2
    stripes = (x.astype(int) // 3) % 2 == 0
    pixels = np.stack(planes, axis=2)
    pixels[disc] = [250, 30, 60]
    pixels[stripes & (y > 3 * height / 4)] = [10, 10, 10]
    image = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
    return image if channels == 3 else image[:, :, 1:2].copy()


PIXEL_IMAGES: list[dict[str, Any]] = [
    {"name": "rgb-420", "height": 40, "width": 56, "channels": 3, "quality": 90, "subsampling": "420"},
    {"name": "rgb-444", "height": 33, "width": 21, "channels": 3, "quality": 75, "subsampling": "444"},
    {"name": "gray", "height": 24, "width": 30, "channels": 1, "quality": 85, "subsampling": "444"},
]
"""Small JPEGs the pixel vector encodes with libjpeg (their bytes are in the vector)."""
PIXEL_CROPS: list[dict[str, Any]] = [
    {"box": [3, 5, 30, 40], "size": [16, 16], "interpolation": "bilinear", "flip": False},
    {"box": [3, 5, 30, 40], "size": [16, 16], "interpolation": "bicubic", "flip": True},
    {"box": [0, 0, 20, 20], "size": [32, 24], "interpolation": "bilinear", "flip": False},
    {"box": [2, 1, 19, 17], "size": [7, 9], "interpolation": "nearest", "flip": False},
    {"box": [1, 2, 16, 16], "size": [16, 16], "interpolation": "bilinear", "flip": True},
]
"""Boxes [top, left, height, width] of every image, each resized to `size` [h, w] by `interpolation`."""
PIXEL_OPERATIONS: list[tuple[str, float, int]] = [
    ("VerticalFlip", 0.0, 0), ("Invert", 0.0, 0), ("Posterize", 3.0, 0), ("Solarize", 128.0, 0), ("Equalize", 0.0, 0),
    ("AutoContrast", 0.0, 1), ("Rotate", 20.0, 0), ("ShearX", 0.25, 0), ("ShearY", -0.2, 0), ("TranslateX", 5.0, 0),
    ("TranslateY", -3.0, 0), ("Brightness", 0.5, 1), ("Color", -0.4, 1), ("Contrast", 0.3, 1), ("Sharpness", 0.6, 1),
    ("Grayscale", 0.0, 1),
]
"""Steps and operations run on the evaluation crop of "rgb-420": (name, magnitude, tolerance in levels)."""


def _pixel_summary(pixels: np.ndarray[Any, Any]) -> dict[str, Any]:
    """An H x W x C uint8 array as its shape, XXH3-64 of its bytes and a few values."""
    height, width = pixels.shape[:2]
    points = [(0, 0), (height // 2, width // 3), (height - 1, width - 1), (height // 3, width - 2)]
    return {
        "shape": list(pixels.shape),
        "checksum": format_checksum(checksum(np.ascontiguousarray(pixels).tobytes())),
        "samples": [[y, x, [int(v) for v in pixels[y, x]]] for y, x in points],
    }


def _resized(pixels: np.ndarray[Any, Any], size: list[int], interpolation: str, flip: bool) -> np.ndarray[Any, Any]:
    """torch's interpolate of the box as an image of its own (antialiased uint8 kernels, or nearest-exact)."""
    import torch

    source = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)[None]
    if list(pixels.shape[:2]) == size:
        out = source
    elif interpolation == "nearest":
        out = torch.nn.functional.interpolate(source, size=tuple(size), mode="nearest-exact")
    else:
        out = torch.nn.functional.interpolate(source, size=tuple(size), mode=interpolation, antialias=True, align_corners=False)
    if flip:
        out = out.flip(3)
    return out[0].permute(1, 2, 0).contiguous().numpy()


def _operated(pixels: np.ndarray[Any, Any], name: str, magnitude: float) -> np.ndarray[Any, Any]:
    """The reference's pixels after one step or operation on an H x W x 3 sample."""
    from shardfmt.ops._autoaugment import OPERATIONS, apply_operation
    from shardfmt.ops._imageops import ImageOps

    height, width = pixels.shape[:2]
    if name == "VerticalFlip":
        return pixels[::-1].copy()
    ops = ImageOps(height, width)
    planes = np.ascontiguousarray(pixels.transpose(2, 0, 1)).astype(np.float32)
    if name == "Grayscale":
        ops.colour.grayscale(planes)
        result = planes
    else:
        result = apply_operation(ops, planes, OPERATIONS.index(name), magnitude, (0.0, 0.0, 0.0))
    return np.ascontiguousarray(result.transpose(1, 2, 0)).astype(np.uint8)


def pixel_vectors() -> dict[str, Any]:
    import simplejpeg

    images = []
    for spec in PIXEL_IMAGES:
        source = _pixel_image(spec["height"], spec["width"], spec["channels"])
        data = simplejpeg.encode_jpeg(
            source, quality=spec["quality"], colorspace="RGB" if spec["channels"] == 3 else "GRAY",
            colorsubsampling=spec["subsampling"] if spec["channels"] == 3 else "Gray",
        )
        colorspace = "RGB" if spec["channels"] == 3 else "GRAY"
        decoded = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=False, fastupsample=False)
        crops = []
        for crop in PIXEL_CROPS:
            top, left, h, w = crop["box"]
            top, left = min(top, spec["height"] - 1), min(left, spec["width"] - 1)
            h, w = min(h, spec["height"] - top), min(w, spec["width"] - left)
            out = _resized(decoded[top : top + h, left : left + w], crop["size"], crop["interpolation"], crop["flip"])
            crops.append({**crop, "box": [top, left, h, w], **_pixel_summary(out)})
        images.append({**spec, "jpeg": data.hex(), "decoded": _pixel_summary(decoded), "crops": crops})
    base = images[0]
    decoded = simplejpeg.decode_jpeg(bytes.fromhex(base["jpeg"]), colorspace="RGB", fastdct=False, fastupsample=False)
    sample = _resized(decoded, [24, 33], "bilinear", False)
    steps = [
        {"step": name, "magnitude": magnitude, "tolerance": tolerance, **_pixel_summary(_operated(sample, name, magnitude))}
        for name, magnitude, tolerance in PIXEL_OPERATIONS
    ]
    return {
        "description": (
            "pixels: small JPEGs (hex), their decoded pixels (ISLOW IDCT, fancy upsampling), boxes of them resized by the "
            "antialiased bilinear and bicubic kernels or nearest, flipped; and the steps' pixels on one sample, each as its "
            "shape, XXH3-64 of its H x W x C bytes and a few [y, x, values] (spec/pixels.md)"
        ),
        "cases": images + [{"sample": {"image": base["name"], "resized_to": [24, 33], "interpolation": "bilinear"},
                            **_pixel_summary(sample), "steps": steps}],
    }


LINSPACE_CASES: list[tuple[str, float, float, int]] = [
    ("ShearX, ShearY (TrivialAugmentWide); Brightness, Color, Contrast, Sharpness (TrivialAugmentWide)", 0.0, 0.99, 31),
    ("ShearX, ShearY (RandAugment, AutoAugment, AugMix)", 0.0, 0.3, 10),
    ("ShearX, ShearY (RandAugment, 31 bins)", 0.0, 0.3, 31),
    ("TranslateX, TranslateY (TrivialAugmentWide)", 0.0, 32.0, 31),
    ("TranslateX, TranslateY (RandAugment, AutoAugment) of a side of 224: 150 / 331 * 224", 0.0, 150.0 / 331.0 * 224, 10),
    ("TranslateX, TranslateY (RandAugment, 31 bins) of a side of 224", 0.0, 150.0 / 331.0 * 224, 31),
    ("TranslateX (RandAugment, 21 bins) of a side of 331", 0.0, 150.0 / 331.0 * 331, 21),
    ("TranslateY (RandAugment, 21 bins) of a side of 160", 0.0, 150.0 / 331.0 * 160, 21),
    ("TranslateX, TranslateY (AugMix) of a side of 224: 224 / 3", 0.0, 224 / 3.0, 10),
    ("TranslateX, TranslateY (AutoAugment) of a side of 32", 0.0, 150.0 / 331.0 * 32, 10),
    ("TranslateX, TranslateY (AugMix) of a side of 32: 32 / 3", 0.0, 32 / 3.0, 10),
    ("TranslateX (AugMix) of a side of 48: 48 / 3", 0.0, 48 / 3.0, 10),
    ("Rotate (TrivialAugmentWide)", 0.0, 135.0, 31),
    ("Rotate (RandAugment, AutoAugment, AugMix)", 0.0, 30.0, 10),
    ("Brightness, Color, Contrast, Sharpness (RandAugment, AutoAugment, AugMix)", 0.0, 0.9, 10),
    ("Brightness, Color, Contrast, Sharpness (RandAugment, 21 bins)", 0.0, 0.9, 21),
    ("Brightness, Color, Contrast, Sharpness (RandAugment, 31 bins)", 0.0, 0.9, 31),
    ("Solarize (TrivialAugmentWide, RandAugment with 31 bins)", 255.0, 0.0, 31),
    ("Solarize (RandAugment, AutoAugment, AugMix)", 255.0, 0.0, 10),
    ("no step's table: a != 0, the two readings differ in the A + i step branch (i = 3, 6)", 0.1, 1.0, 21),
    ("no step's table: a != 0, the two readings differ in both branches (i = 14, 15, 19)", 0.3, 0.9, 31),
    ("no step's table: one value", 0.5, 2.0, 1),
]
"""torch's float32 linspace: (what uses it, a, b, n); a and b are binary64 numbers, rounded to float32."""


def _linspace_twice_rounded(a: float, b: float, n: int) -> list[float]:
    """The other reading of spec/sampling.md's linspace: ``i * step`` rounded to float32, then the sum."""
    start, end = np.float32(a), np.float32(b)
    if n == 1:
        return [float(start)]
    step = (end - start) / np.float32(n - 1) if n > 1 else np.float32(0)
    return [float(start + np.float32(i) * step) if i < n // 2 else float(end - np.float32(n - 1 - i) * step) for i in range(n)]


def sampling_linspace() -> dict[str, Any]:
    import torch

    cases = []
    for use, a, b, n in LINSPACE_CASES:
        values = [float(v) for v in torch.linspace(a, b, n, dtype=torch.float32).tolist()]
        other = _linspace_twice_rounded(a, b, n)
        differs = [i for i in range(n) if values[i] != other[i]]
        cases.append({"use": use, "a": a, "b": b, "n": n, "values": values, "twice_rounded_differs_at": differs})
    return {
        "description": (
            "torch's float32 linspace(a, b, n) as the magnitude tables use it: every value (a float32 read back as a binary64), "
            "each rounded once from the exact A + i step or B - (n - 1 - i) step; twice_rounded_differs_at lists the indices "
            "where rounding i step first gives another value (spec/sampling.md, The auto-augment family)"
        ),
        "cases": cases,
    }


REPEAT_CASES: list[dict[str, Any]] = [
    {"order": "sorted-key", "num_records": 10, "repeats": 3, "batch_size": 4, "seed": 0, "epoch": 0, "world_size": 3},
    {"order": "sorted-key", "num_records": 7, "repeats": 2, "batch_size": 3, "seed": 5, "epoch": 1, "world_size": 1},
    {"order": "feistel", "num_records": 9, "repeats": 4, "batch_size": 2, "seed": 11, "epoch": 2, "world_size": 2},
    {
        "order": "sorted-key", "num_records": 12, "repeats": 3, "batch_size": 2, "seed": 0, "epoch": 0, "world_size": 3,
        "repeats_epoch": "records",
    },
    {
        "order": "feistel", "num_records": 10, "repeats": 4, "batch_size": 3, "seed": 11, "epoch": 2, "world_size": 2,
        "repeats_epoch": "records",
    },
]
"""Repeated augmentation: (order, N, copies, batch size, seed, epoch, world size), and the epoch's
length where it is RASampler's ("records": N positions) rather than every copy (k N)."""


def sampling_repeats() -> dict[str, Any]:
    from shardfmt._sampling.orders import epoch_order
    from shardfmt._sampling.permutation import RepeatedOrder, draw_epoch, repeated_size
    from shardfmt._sampling.ranks import RankPlan

    cases = []
    for case in REPEAT_CASES:
        base = epoch_order(case["order"], num_records=case["num_records"], seed=case["seed"], epoch=case["epoch"])
        size = repeated_size(case["num_records"], case["repeats"], case.get("repeats_epoch", "copies"))
        order = RepeatedOrder(base, case["repeats"], size=size)
        ranks = []
        for rank in range(case["world_size"]):
            plan = RankPlan(order, batch_size=case["batch_size"], rank=rank, world_size=case["world_size"], drop_last=False)
            ranks.append(
                [
                    [[int(r), int(c)] for r, c in zip(order.at(plan.positions(b)), order.copies(plan.positions(b)), strict=True)]
                    for b in range(len(plan))
                ]
            )
        draw_epochs = [int(draw_epoch(case["epoch"], c, case["repeats"])) for c in range(case["repeats"])]
        cases.append({**case, "draw_epochs": draw_epochs, "batches": ranks})
    return {
        "description": (
            "repeated augmentation: every position of the epoch order taken `repeats` times in a row, split over ranks; "
            "batches[r] is rank r's list of batches of [record, copy] pairs, and draw_epochs[c] the epoch whose draws copy c takes "
            "(spec/sampling.md, Repeated augmentation)"
        ),
        "cases": cases,
    }


BATCH_STEP_CASES: list[dict[str, Any]] = [
    {"step": {"MixUp": {"alpha": 0.2, "num_classes": 10}}, "height": 224, "width": 224},
    {"step": {"MixUp": {"alpha": 1.0, "num_classes": 10}}, "height": 224, "width": 224},
    {"step": {"CutMix": {"alpha": 1.0, "num_classes": 10}}, "height": 224, "width": 224},
    {"step": {"CutMix": {"alpha": 0.5, "num_classes": 10}}, "height": 30, "width": 50},
    {
        "step": {
            "RandomChoice": {
                "steps": [{"MixUp": {"alpha": 0.8, "num_classes": 10}}, {"CutMix": {"alpha": 1.0, "num_classes": 10}}],
                "p": [0.5, 0.5],
            }
        },
        "height": 64,
        "width": 64,
    },
]
"""Batch steps (class and arguments; RandomChoice's steps likewise) and the images' size; each is
drawn at position 0 for the (seed, epoch, batch) of BATCH_DRAWS."""
BATCH_DRAWS = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (5, 2, 17), (2024, 7, 123456)]


def _batch_step(spec: dict[str, Any]) -> Any:
    from shardfmt import ops

    (name, args), = spec.items()
    if name == "RandomChoice":
        return ops.RandomChoice([_batch_step(inner) for inner in args["steps"]], p=args["p"])
    return getattr(ops, name)(**args)


def _batch_outcome(step: Any, u: np.ndarray, height: int, width: int) -> dict[str, Any]:
    from shardfmt import ops

    if isinstance(step, ops.RandomChoice):
        chosen = step.choose(u)
        return {"choice": chosen, **_batch_outcome(step.steps[chosen], u[1:], height, width)}
    if isinstance(step, ops.CutMix):
        x1, y1, x2, y2, lam = step.box(u, height=height, width=width)
        return {"box": [x1, y1, x2, y2], "lam": lam}
    return {"lam": step.lam(u)}


def sampling_batch_steps() -> dict[str, Any]:
    from shardfmt._sampling.keys import BATCH_STREAM, record_keys, uniforms

    cases = []
    for case in BATCH_STEP_CASES:
        step = _batch_step(case["step"])
        draws = []
        for seed, epoch, batch in BATCH_DRAWS:
            key = record_keys(seed, BATCH_STREAM, epoch, np.array([batch], np.uint64))
            u = uniforms(key, step.draws)[0]
            draws.append(
                {
                    "seed": seed,
                    "epoch": epoch,
                    "batch": batch,
                    "key": hex64(int(key[0])),
                    "u": [float(v) for v in u],
                    **_batch_outcome(step, u, case["height"], case["width"]),
                }
            )
        cases.append({**case, "draws": draws})
    return {
        "description": (
            "batch steps' draws at position 0 of a batch_augment list: for each (seed, epoch, batch), the key (stream BATCH), "
            "the draws as floats, lam (the Beta(alpha, alpha) quantile; for CutMix the label weight the box leaves), CutMix's "
            "box [x1, y1, x2, y2] and RandomChoice's choice (spec/sampling.md, Batch steps)"
        ),
        "cases": cases,
    }


# --- writing and checking --------------------------------------------------------------------


def dump_json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def dump_cases(value: dict[str, Any]) -> bytes:
    """Like `dump_json`, but each item of ``value["cases"]`` on one line: the sampling vectors
    hold many short lists, which one number per line would make ten times longer."""
    head = {key: item for key, item in value.items() if key != "cases"}
    lines = [json.dumps(case, ensure_ascii=False) for case in value["cases"]]
    text = json.dumps(head, indent=2, ensure_ascii=False)[:-2]
    return (text + ',\n  "cases": [\n    ' + ",\n    ".join(lines) + "\n  ]\n}\n").encode()


def generate(out: Path) -> None:
    """Write every vector of the current version into `out` (which must be empty or absent)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "valid").mkdir()
    (out / "invalid").mkdir()
    index: dict[str, Any] = {"format_version": VERSION[1:], "valid": {}, "invalid": {}, "dataset": "dataset"}
    shards: dict[str, bytes] = {}
    for name, (description, schema, records, alignment) in VALID.items():
        data = build_shard(schema, records, alignment=alignment)
        shards[name] = data
        (out / "valid" / f"{name}.shard").write_bytes(data)
        (out / "valid" / f"{name}.json").write_bytes(dump_json({"description": description, **describe(data)}))
        index["valid"][name] = description
    (out / "valid" / "tiny.txt").write_text(annotate(shards["tiny"]))
    for name, (base, rule, break_rule) in INVALID.items():
        shard = ShardBytes(shards[base])
        error, offset, record, when = break_rule(shard)
        (out / "invalid" / f"{name}.shard").write_bytes(bytes(shard))
        expected = {"base": base, "rule": rule, "error": error, "offset": offset, "record": record, "when": when}
        if name in STATED_SIZE:
            expected["size"] = STATED_SIZE[name]
        (out / "invalid" / f"{name}.json").write_bytes(dump_json(expected))
        index["invalid"][name] = rule
    (out / "dataset.json").write_bytes(dump_json(write_dataset(out / "dataset")))
    index["invalid_datasets"] = write_invalid_datasets(out / "invalid-datasets")
    index["tar_datasets"] = write_tar_datasets(out / "tar-datasets")
    (out / "sampling").mkdir()
    (out / "sampling" / "sorted-keys-batches.json").write_bytes(dump_cases(sampling_batches()))
    (out / "sampling" / "crops.json").write_bytes(dump_cases(sampling_crops()))
    (out / "sampling" / "eval-crops.json").write_bytes(dump_cases(sampling_eval_crops()))
    (out / "sampling" / "feistel-batches.json").write_bytes(dump_cases(sampling_feistel()))
    (out / "sampling" / "mixture-batches.json").write_bytes(dump_cases(sampling_mixture()))
    (out / "sampling" / "elastic-batches.json").write_bytes(dump_cases(sampling_elastic()))
    (out / "sampling" / "augment-steps.json").write_bytes(dump_cases(sampling_steps()))
    (out / "sampling" / "repeats-batches.json").write_bytes(dump_cases(sampling_repeats()))
    (out / "sampling" / "batch-steps.json").write_bytes(dump_cases(sampling_batch_steps()))
    (out / "sampling" / "linspace.json").write_bytes(dump_cases(sampling_linspace()))
    (out / "json-text.json").write_bytes(dump_cases(json_text_cases()))
    (out / "shard-plans.json").write_bytes(dump_cases(shard_plans()))
    (out / "pixels.json").write_bytes(dump_cases(pixel_vectors()))
    (out / "sampling" / "step-draws.json").write_bytes(dump_cases(sampling_step_draws()))
    (out / "sampling" / "autoaugment-policies.json").write_bytes(dump_cases(sampling_policies()))
    index["sampling"] = {
        "sorted-keys-batches": "epoch orders by the sorted-key rule, split over ranks and into batches",
        "feistel-batches": "epoch orders by the Feistel rule (with and without a window), the first batches of chosen ranks",
        "mixture-batches": "mixtures: per-source counts and every rank's batches of chosen epochs",
        "elastic-batches": "an epoch resumed on other numbers of ranks, hop by hop",
        "crops": "crop boxes and flips of every pipeline, carried to further image fields",
        "eval-crops": "CenterCrop's evaluation rule: the resized size and the box cut from it",
        "augment-steps": "the operations, magnitudes and erased boxes the auto-augment steps and random erasing draw",
        "repeats-batches": "repeated augmentation: every rank's batches of (record, copy) pairs",
        "batch-steps": "MixUp's and CutMix's lam, CutMix's boxes and RandomChoice's choices",
        "linspace": "the magnitude tables' float32 linspace, every value, and where rounding twice differs",
        "step-draws": "the draws of ColorJitter, RandomRotation, RandomGrayscale, RandomVerticalFlip, and a user step's seeds",
        "autoaugment-policies": "AutoAugment's three policies: records that reach every sub-policy, and the operations they run",
    }
    index["json_text"] = "JSON texts and schema texts: negative zeros, dtype and shape keys, and what a reader finds or refuses"
    index["shard_plans"] = "conversion's shard cutting: record sizes and the shard boundaries they give"
    index["pixels"] = "small JPEGs and their decoded, cropped, resized, flipped and augmented pixels"
    index["canonical"] = sorted(index["valid"])
    (out / "index.json").write_bytes(dump_json(index))


def compare(expected: Path, actual: Path) -> list[str]:
    """Return the relative paths that differ between two vector directories (a symbolic link
    differs if its target text does)."""
    problems = []
    names = {p.relative_to(expected) for p in expected.rglob("*") if p.is_file() or p.is_symlink()}
    names |= {p.relative_to(actual) for p in actual.rglob("*") if p.is_file() or p.is_symlink()}
    for name in sorted(names):
        a, b = expected / name, actual / name
        if a.is_symlink() or b.is_symlink():
            if not (a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)):
                problems.append(f"{name}: symbolic links differ")
        elif not a.is_file():
            problems.append(f"{name}: not in {expected}")
        elif not b.is_file():
            problems.append(f"{name}: not generated")
        elif not filecmp.cmp(a, b, shallow=False):
            problems.append(f"{name}: bytes differ")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed vectors instead of writing")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"vector directory (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch) / VERSION
        generate(fresh)
        if args.check:
            problems = compare(args.out, fresh)
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1 if problems else 0
        if args.out.exists():
            shutil.rmtree(args.out)
        shutil.copytree(fresh, args.out, symlinks=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
