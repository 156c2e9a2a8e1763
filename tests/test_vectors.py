"""Golden vectors: tools/make_vectors.py reproduces spec/vectors/ byte for byte, and every vector
of every version reads back exactly as its JSON says (valid) or fails exactly as it says (invalid)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import make_vectors
import numpy as np
import pytest

import shardfmt
from shardfmt import ShardfmtError, ShardReader, open_dataset
from shardfmt.checksum import checksum, format_checksum
from shardfmt.format.fieldtypes import FIELD_TYPES
from shardfmt.format.layout import (
    FOOTER_DTYPE,
    FOOTER_SIZE,
    HEADER_DTYPE,
    NDARRAY_DTYPES,
)

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "spec" / "vectors"
VALID = sorted(VECTORS.glob("v*/valid/*.shard"))
INVALID = sorted(VECTORS.glob("v*/invalid/*.shard"))
DATASETS = sorted(VECTORS.glob("v*/dataset"))


def vector_id(path: Path) -> str:
    return f"{path.parts[-3]}/{path.stem}"


def test_generator_reproduces_the_committed_vectors(tmp_path: Path) -> None:
    fresh = tmp_path / make_vectors.VERSION
    make_vectors.generate(fresh)
    assert make_vectors.compare(make_vectors.DEFAULT_OUT, fresh) == []


def test_every_version_has_vectors() -> None:
    current = VECTORS / make_vectors.VERSION
    assert current.is_dir(), "run tools/make_vectors.py"
    assert [p.name for p in sorted(VECTORS.glob("v*"))] == ["v1.0", "v1.1"]
    for version in sorted(VECTORS.glob("v*")):
        index = json.loads((version / "index.json").read_text())
        assert index["format_version"] == version.name[1:]
        assert sorted(index["valid"]) == sorted(p.stem for p in version.glob("valid/*.shard"))
        assert sorted(index["invalid"]) == sorted(p.stem for p in version.glob("invalid/*.shard"))
        assert sum(p.stat().st_size for p in version.rglob("*") if p.is_file()) < 256 * 1024


RELEASED = {"v1.0": "xxh3_64:084edbc861925c74"}
"""XXH3-64 over the sorted relative paths and bytes of each released version's vectors: they
are never regenerated or edited, only read by every later reader."""


@pytest.mark.parametrize("version", sorted(RELEASED))
def test_released_vectors_are_unchanged(version: str) -> None:
    files = sorted(p for p in (VECTORS / version).rglob("*") if p.is_file())
    listing = b"".join(str(p.relative_to(VECTORS / version)).encode() + b"\0" + p.read_bytes() for p in files)
    assert format_checksum(checksum(listing)) == RELEASED[version]


def test_every_field_type_has_a_valid_vector() -> None:
    current = VECTORS / make_vectors.VERSION
    types = {field.type for path in current.glob("valid/*.shard") for field in ShardReader(path).schema.fields}
    assert types == set(FIELD_TYPES)
    dtypes = {field.dtype for path in current.glob("valid/*.shard") for field in ShardReader(path).schema.fields}
    assert set(NDARRAY_DTYPES) <= dtypes


def expect_u64(value: Any, text: str) -> None:
    """A checksum or float64 column: JSON holds the u64 value as 0x and 16 hex digits."""
    bits = struct.unpack("<Q", struct.pack("<d", float(value)))[0] if isinstance(value, np.floating) else int(value)
    assert f"0x{bits:016x}" == text


@pytest.mark.parametrize("path", VALID, ids=vector_id)
def test_valid_vector_reads_back(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    data = path.read_bytes()
    assert len(data) == expected["size"]
    assert format_checksum(checksum(data)) == expected["file_checksum"]

    # The layout dtypes decode header and footer as the vector says.
    header = np.frombuffer(data, HEADER_DTYPE, count=1)[0]
    footer = np.frombuffer(data, FOOTER_DTYPE, count=1, offset=len(data) - FOOTER_SIZE)[0]
    for struct_value, values in ((header, expected["header"]), (footer, expected["footer"])):
        for name, value in values.items():
            if name == "magic":
                assert bytes(struct_value[name]).hex() == value
            elif name.endswith("checksum"):
                expect_u64(struct_value[name], value)
            else:
                assert np.array(struct_value[name]).tolist() == value, name

    with ShardReader(path) as reader:
        assert reader.version == (expected["header"]["major"], expected["header"]["minor"])
        assert reader.alignment == expected["header"]["alignment"]
        assert reader.header_size == expected["header"]["header_size"]
        assert reader.table_offset == expected["footer"]["table_offset"]
        assert reader.schema == shardfmt.Schema.from_bytes(expected["schema"].encode())
        assert len(reader) == expected["footer"]["num_records"] == len(expected["records"])
        for index, record in enumerate(expected["records"]):
            row = reader.table[index]
            assert list(reader.table.dtype.names) == list(record["row"]), "table columns in spec order"
            for name, value in record["row"].items():
                if isinstance(value, str):
                    expect_u64(row[name], value)
                else:
                    assert int(row[name]) == value, name
            reader.verify_record(index)
            actual = reader.record(index)
            for field in reader.schema.fields:
                check_value(field.type, actual[field.name], record["values"][field.name])


def check_value(field_type: str, actual: Any, expected: Any) -> None:
    if field_type in ("jpeg", "bytes"):
        assert bytes(actual).hex() == expected
    elif field_type == "raw":
        assert actual.dtype == np.uint8 and actual.ndim == 3 and not actual.flags.writeable
        assert actual.tobytes().hex() == expected
    elif field_type == "ndarray":
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        numbers = np.vectorize(lambda x: special.get(x, x) if isinstance(x, str) else x, otypes=[object])(np.array(expected, dtype=object))
        wanted = numbers.astype(actual.dtype)
        assert actual.shape == wanted.shape and not actual.flags.writeable
        assert np.array_equal(actual, wanted, equal_nan=actual.dtype.kind == "f")
        assert np.array_equal(np.signbit(actual), np.signbit(wanted)) if actual.dtype.kind == "f" else True
    elif field_type == "float64":
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        number = special.get(expected, expected) if isinstance(expected, str) else expected
        assert struct.pack("<d", actual) == struct.pack("<d", number) or (math.isnan(actual) and math.isnan(number))
    else:
        assert actual == expected and type(actual) is type(expected)


@pytest.mark.parametrize("path", INVALID, ids=vector_id)
def test_invalid_vector_fails_as_stated(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    with pytest.raises(ShardfmtError) as info:
        reader = ShardReader(path)
        assert expected["when"] == "read", "the vector should have failed on open"
        with reader:
            for index in range(len(reader)):
                dict(reader.record(index))
    err = info.value
    assert type(err).__name__ == expected["error"]
    assert type(err) is getattr(shardfmt, expected["error"])
    assert (err.offset, err.record) == (expected["offset"], expected["record"]), str(err)
    assert err.path == str(path)


@pytest.mark.parametrize("directory", DATASETS, ids=lambda p: p.parts[-2])
def test_dataset_vector_reads_back(directory: Path) -> None:
    expected = json.loads((directory.parent / "dataset.json").read_text())
    with open_dataset(directory) as reader:
        assert len(reader) == expected["num_records"]
        assert reader.classes == expected["classes"]
        for record, values in zip(reader, expected["records"], strict=True):
            assert bytes(record["image"]).hex() == values["image"]
            assert (record["label"], record["key"]) == (values["label"], values["key"])
        for entry in reader.manifest.shards:
            data = (directory / entry.path).read_bytes()
            assert (len(data), checksum(data)) == (entry.size, entry.checksum)


def test_annotated_listing_covers_every_byte() -> None:
    listing = (VECTORS / make_vectors.VERSION / "valid" / "tiny.txt").read_text().splitlines()[1:]
    data = (VECTORS / make_vectors.VERSION / "valid" / "tiny.shard").read_bytes()
    rebuilt = b"".join(bytes.fromhex(line[10:57].replace(" ", "")) for line in listing)
    offsets = [int(line[:8], 16) for line in listing]
    assert rebuilt == data
    assert offsets == sorted(offsets)
