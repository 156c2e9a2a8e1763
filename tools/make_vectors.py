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

from shardfmt import IMAGE_CLASSIFICATION, DatasetWriter, Schema  # noqa: E402
from shardfmt.checksum import checksum, format_checksum  # noqa: E402
from shardfmt.format.layout import (
    FOOTER_DTYPE,
    FOOTER_SIZE,
    FORMAT_VERSION,
    HEADER_DTYPE,
    HEADER_SIZE,
    MAX_RECORDS_PER_SHARD,
    MAX_SCHEMA_SIZE,
    NDARRAY_DTYPES,
    column_name,
)

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
    "pairs": (
        "a super-resolution record: a low- and a high-resolution image (2x), a one-channel mask and a label (v1.1)",
        PAIRS,
        [
            {"lr": raw_pixels(2, 3, 3, seed=i), "hr": raw_pixels(4, 6, 3, seed=10 + i), "mask": (raw_pixels(4, 6, 1, seed=i) % 3), "label": i}
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

    put_struct(0, HEADER_DTYPE, header, "header.", {
        "magic": '"\\x89SHARD\\r\\n"',
        "checksum": f"{hex64(int(header['checksum']))}: XXH3-64 of bytes [0, 56) + schema",
    })
    schema_end = HEADER_SIZE + int(header["schema_size"])
    put(HEADER_SIZE, schema_end, "schema", text=True)
    if int(header["header_size"]) > schema_end:
        put(schema_end, int(header["header_size"]), "header padding (zero) up to header_size")
    for index, row in enumerate(table):
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
    table_offset = int(footer["table_offset"])
    for index, row in enumerate(table):
        notes = {"checksum": f"{hex64(int(row['checksum']))}: XXH3-64 of the record's span"}
        put_struct(table_offset + index * table.dtype.itemsize, table.dtype, row, f"table[{index}].", notes)
    put_struct(len(data) - FOOTER_SIZE, FOOTER_DTYPE, footer, "footer.", {
        "magic": '"SHARDEND"',
        "table_checksum": f"{hex64(int(footer['table_checksum']))}: XXH3-64 of the table",
        "checksum": f"{hex64(int(footer['checksum']))}: XXH3-64 of footer bytes [0, 48)",
    })
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
    s.header()["flags"] = 1
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


@invalid("tiny", "table checksum: XXH3-64 of the record table")
def table_checksum(s: ShardBytes) -> Invalid:
    s.table()["label"][0] = 4
    s.reseal_footer()
    return "ChecksumError", s.table_offset, None, "open"


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


# --- the dataset -----------------------------------------------------------------------------


def write_dataset(directory: Path) -> dict[str, Any]:
    """Write the dataset vector and return what a reader must find in it."""
    records = [
        {"image": jpeg_rgb(8 + 8 * (i % 3), 16, seed=30 + i), "label": i % 2, "key": f"img-{i}"} for i in range(5)
    ]
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


# --- writing and checking --------------------------------------------------------------------


def dump_json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


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
        (out / "invalid" / f"{name}.json").write_bytes(dump_json(expected))
        index["invalid"][name] = rule
    (out / "dataset.json").write_bytes(dump_json(write_dataset(out / "dataset")))
    (out / "index.json").write_bytes(dump_json(index))


def compare(expected: Path, actual: Path) -> list[str]:
    """Return the relative paths that differ between two vector directories."""
    problems = []
    names = {p.relative_to(expected) for p in expected.rglob("*") if p.is_file()}
    names |= {p.relative_to(actual) for p in actual.rglob("*") if p.is_file()}
    for name in sorted(names):
        a, b = expected / name, actual / name
        if not a.is_file():
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
        shutil.copytree(fresh, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
