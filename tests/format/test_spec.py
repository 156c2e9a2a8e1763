"""spec/ and shardfmt/format/_layout.py describe the same bytes: the tables, limits and examples of the
written format are checked against the code, so neither can drift from the other."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardfmt
from shardfmt._checksum import checksum
from shardfmt.format import _layout as layout
from shardfmt.format._fieldtypes import FIELD_TYPES
from shardfmt.format._layout import (
    FOOTER_DTYPE,
    HEADER_DTYPE,
    column_name,
)

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
VECTORS = SPEC / "vectors" / f"v{layout.FORMAT_VERSION[0]}.{layout.FORMAT_VERSION[1]}"
TYPE_NAMES = {"<u2": "u16", "<u4": "u32", "<u8": "u64", "<i8": "i64", "<f8": "f64"}


def read(name: str) -> str:
    return (SPEC / name).read_text()


@pytest.mark.parametrize(("dtype", "prefix"), [(HEADER_DTYPE, ""), (FOOTER_DTYPE, "F + ")])
def test_struct_tables_match_the_layout(dtype: np.dtype[Any], prefix: str) -> None:
    text = read("format.md")
    for name in dtype.names:
        offset, size = dtype.fields[name][1], dtype[name].itemsize
        row = re.compile(rf"^\| {re.escape(prefix)}{offset} \| {size} \| [^|]+ \| `{name}` \|", re.MULTILINE)
        assert row.search(text), f"format.md has no row for {name} at {prefix}{offset}, {size} bytes"
    assert dtype.itemsize == 64


def test_record_table_columns_match_the_layout() -> None:
    text = read("format.md")
    for type_name, kind in FIELD_TYPES.items():
        columns = kind.columns
        if columns[0][0]:
            listed = ", ".join(f"`{column_name('NAME', col)}` {TYPE_NAMES[fmt]}" for col, fmt in columns)
        else:
            listed = f"`NAME` {TYPE_NAMES[columns[0][1]]} (the value itself)"
        size = sum(int(fmt[-1]) for _, fmt in columns)
        row = re.compile(rf"^\| [^|]*`{type_name}`[^|]* \| {re.escape(listed)} \| {size} \|$", re.MULTILINE)
        assert row.search(text), f"format.md lists other columns for {type_name}: expected {listed}"


def test_every_limit_is_in_limits_md_with_its_number() -> None:
    text = read("limits.md")
    names = [name for name in dir(layout) if name.startswith(("MAX_", "MIN_"))]
    assert names == [
        "MAX_ALIGNMENT",
        "MAX_CLASSES",
        "MAX_FIELDS",
        "MAX_FIELD_NAME_LENGTH",
        "MAX_FIELD_SIZE",
        "MAX_IMAGE_SIDE",
        "MAX_MANIFEST_SIZE",
        "MAX_NDIM",
        "MAX_RECORDS_PER_SHARD",
        "MAX_SCHEMA_SIZE",
        "MAX_SHARDS",
        "MAX_SHARD_SIZE",
        "MIN_ALIGNMENT",
    ]
    for name in names:
        value = getattr(layout, name)
        rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        assert rows, f"limits.md has no row for {name}"
        assert f"{value:,}" in rows[0] or str(value) in rows[0], f"limits.md row for {name} lacks {value:,}"


def test_worked_example_is_the_vector_listing() -> None:
    listing = (VECTORS / "valid" / "tiny.txt").read_text()
    assert f"```text\n{listing}```" in read("format.md")


def test_manifest_example_is_the_vector_manifest() -> None:
    example = re.search(r"## Example\n.*?```json\n(.*?)```", read("manifest.md"), re.DOTALL)
    assert example is not None
    assert example.group(1) == (VECTORS / "dataset" / "manifest.json").read_text()


def test_checksum_test_values() -> None:
    text = read("format.md")
    inputs = {
        "empty": b"",
        "`abc` (3 bytes)": b"abc",
        "bytes 0x00, 0x01, ..., 0xff (256 bytes)": bytes(range(256)),
        "those 256 bytes repeated 8 times (2048 bytes)": bytes(range(256)) * 8,
    }
    for label, data in inputs.items():
        assert f"| {label} | `{checksum(data):016x}` |" in text


def test_error_kinds_are_the_library_classes() -> None:
    text = read("README.md")
    kinds = re.findall(r"^\| `(\w+Error)` \|", text, re.MULTILINE)
    assert len(kinds) == 7
    for kind in kinds:
        assert issubclass(getattr(shardfmt, kind), shardfmt.ShardfmtError)
    for kind in ("ChecksumError", "LimitError", "UnsupportedVersionError"):
        assert issubclass(getattr(shardfmt, kind), shardfmt.FormatError)


def test_magic_bytes_in_the_header_table() -> None:
    text = read("format.md")
    assert layout.MAGIC.hex(" ") in text and layout.FOOTER_MAGIC.hex(" ") in text


def test_spec_index_links_exist() -> None:
    for name in re.findall(r"\]\(([\w./-]+)\)", read("README.md")):
        assert (SPEC / name).exists(), name
    assert json.loads(read("manifest.schema.json"))["title"].endswith(
        f"{layout.FORMAT_VERSION[0]}.{layout.FORMAT_VERSION[1]}"
    )
