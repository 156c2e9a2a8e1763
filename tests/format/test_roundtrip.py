"""Write -> read round trips through the public API."""

from __future__ import annotations

import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from conftest import jpeg_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardfmt.format._writer as writer_module
from shardfmt import DatasetWriter, SchemaError, open_dataset
from shardfmt.format import FORMAT_VERSION, Schema, ShardReader, ShardWriter


def test_dataset_reads_back_every_record(small_dataset: Path) -> None:
    with open_dataset(small_dataset) as reader:
        assert len(reader) == 40
        assert len(reader.manifest.shards) > 1
        keys = [record["key"] for record in reader]
        assert keys == [f"rec{i:03d}" for i in range(40)]
        assert [reader[i]["label"] for i in range(40)] == [i % 3 for i in range(40)]
        assert bytes(reader[7]["image"][:3]) == b"\xff\xd8\xff"


def test_writer_refuses_to_grow_a_shard_past_the_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "MAX_SHARD_SIZE", 1024)
    with ShardWriter(tmp_path / "a.shard", schema=Schema.of(blob="bytes")) as shard:
        shard.write({"blob": bytes(500)})
        with pytest.raises(SchemaError, match="record 1 would grow the shard to 1304 bytes, over the limit of 1024"):
            shard.write({"blob": bytes(500)})
    with ShardReader(tmp_path / "a.shard") as reader:
        assert len(reader) == 1  # the refused record left nothing behind


# Properties: arbitrary records of every field type survive write -> read unchanged.

ALL_TYPES = Schema.of(image="jpeg", label="int64", score="float64", key="str", blob="bytes", meta="json")
JPEGS = [
    jpeg_bytes(8, 8, seed=1),
    jpeg_bytes(17, 9, seed=2),
    simplejpeg.encode_jpeg(np.full((8, 16, 1), 128, np.uint8), colorspace="GRAY", colorsubsampling="Gray"),
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 63), (1 << 64) - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
records = st.fixed_dictionaries(
    {
        "image": st.sampled_from(JPEGS),
        "label": st.integers(-(1 << 63), (1 << 63) - 1),
        "score": st.floats(allow_nan=True, allow_infinity=True),
        "key": st.text(max_size=20),
        "blob": st.binary(max_size=100),
        "meta": json_values,
    }
)
ROUNDTRIP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same(record: Any, expected: dict[str, Any]) -> None:
    assert bytes(record["image"]) == expected["image"]
    assert bytes(record["blob"]) == expected["blob"]
    assert struct.pack("<d", record["score"]) == struct.pack("<d", expected["score"])
    for name in ("label", "key", "meta"):
        assert record[name] == expected[name] and type(record[name]) is type(expected[name])


@ROUNDTRIP
@given(st.lists(records, max_size=6), st.sampled_from([8, 64, 4096]))
def test_every_field_type_round_trips(values: list[dict[str, Any]], alignment: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        paths = [Path(directory) / "a.shard", Path(directory) / "b.shard"]
        for path in paths:
            with ShardWriter(path, schema=ALL_TYPES, alignment=alignment) as shard:
                for value in values:
                    shard.write(value)
        assert paths[0].read_bytes() == paths[1].read_bytes(), "the writer is deterministic"
        with ShardReader(paths[0]) as reader:
            assert reader.schema == ALL_TYPES and len(reader) == len(values)
            for record, expected in zip(reader, values, strict=True):
                assert_same(record, expected)
                assert record.image_info().height > 0


@ROUNDTRIP
@given(st.lists(records, min_size=1, max_size=8), st.integers(1, 6000))
def test_datasets_round_trip_across_shard_rollover(values: list[dict[str, Any]], shard_size: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        with DatasetWriter(directory, schema=ALL_TYPES, shard_size=shard_size) as writer:
            for value in values:
                writer.write(value)
        with open_dataset(directory) as reader:
            assert len(reader) == len(values)
            assert sum(shard.num_records for shard in reader.manifest.shards) == len(values)
            for index, expected in enumerate(values):
                assert_same(reader[index], expected)


# Version 1.1: raw pixels and fixed-shape arrays, with 1.0 fields beside them.

from shardfmt.format._layout import NDARRAY_DTYPES  # noqa: E402

ARRAY_SHAPES = {
    "uint8": (3,),
    "uint16": (2, 2),
    "int16": (1,),
    "int32": (2, 1, 2),
    "int64": (2,),
    "float16": (4,),
    "float32": (2, 3),
    "float64": (1, 1),
}
FIELDS_1_1 = Schema.of(
    pixels="raw",
    mask="raw",
    label="int64",
    **{f"a_{name}": f"ndarray:{name}:{'x'.join(map(str, shape))}" for name, shape in ARRAY_SHAPES.items()},
)


def arrays(dtype: np.dtype[Any], shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    """Arrays of every bit pattern (NaN payloads, subnormals, negative zeros included)."""
    size = int(np.prod(shape)) * dtype.itemsize
    return st.binary(min_size=size, max_size=size).map(lambda data: np.frombuffer(data, dtype).reshape(shape).copy())


pixels = st.tuples(st.integers(1, 7), st.integers(1, 7), st.sampled_from([1, 3, 4])).flatmap(lambda hwc: arrays(np.dtype(np.uint8), hwc))
fields_records = st.fixed_dictionaries(
    {
        "pixels": pixels,
        "mask": st.tuples(st.integers(1, 5), st.integers(1, 5)).flatmap(lambda hw: arrays(np.dtype(np.uint8), hw)),
        "label": st.integers(-(1 << 63), (1 << 63) - 1),
        **{f"a_{name}": arrays(np.dtype(NDARRAY_DTYPES[name]), shape) for name, shape in ARRAY_SHAPES.items()},
    }
)


@ROUNDTRIP
@given(st.lists(fields_records, max_size=5), st.sampled_from([8, 64]))
def test_raw_and_ndarray_fields_round_trip(values: list[dict[str, Any]], alignment: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        paths = [Path(directory) / "a.shard", Path(directory) / "b.shard"]
        for path in paths:
            with ShardWriter(path, schema=FIELDS_1_1, alignment=alignment) as shard:
                for value in values:
                    shard.write(value)
        assert paths[0].read_bytes() == paths[1].read_bytes(), "the writer is deterministic"
        with ShardReader(paths[0]) as reader:
            assert reader.version == FORMAT_VERSION and reader.schema == FIELDS_1_1
            for record, expected in zip(reader, values, strict=True):
                mask = expected["mask"][:, :, None]
                for name, wanted in [("pixels", expected["pixels"]), ("mask", mask)]:
                    assert record[name].shape == wanted.shape and record[name].tobytes() == wanted.tobytes()
                    assert record.image_info(name).channels == wanted.shape[2]
                assert record["label"] == expected["label"]
                for name in ARRAY_SHAPES:
                    got, wanted = record[f"a_{name}"], expected[f"a_{name}"]
                    assert got.dtype == wanted.dtype and got.shape == wanted.shape
                    assert got.tobytes() == wanted.tobytes()  # bit for bit, NaN payloads included


def test_raw_sides_past_65535(tmp_path: Path) -> None:
    strip = np.arange(70_000, dtype=np.uint32).astype(np.uint8).reshape(1, 70_000, 1)
    with ShardWriter(tmp_path / "a.shard", schema=Schema.of(strip="raw")) as shard:
        shard.write({"strip": strip})
    with ShardReader(tmp_path / "a.shard") as reader:
        assert reader.record(0).image_info("strip").width == 70_000
        assert np.array_equal(reader.record(0)["strip"], strip)


def test_big_endian_arrays_are_stored_little_endian(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "a.shard", schema=Schema.of(v="ndarray:int32:2")) as shard:
        shard.write({"v": np.array([1, -2], ">i4")})
    with ShardReader(tmp_path / "a.shard") as reader:
        value = reader.record(0)["v"]
        assert value.dtype == np.dtype("<i4") and value.tolist() == [1, -2]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("raw", np.zeros((2, 2, 2), np.uint8), "has 2 channels; raw pixels have 1, 3, 4"),
        ("raw", np.zeros((2, 2, 5), np.uint8), "has 5 channels"),
        ("raw", np.zeros((2, 2, 3), np.float32), "needs uint8 pixels"),
        ("raw", np.zeros(4, np.uint8), "needs uint8 pixels"),
        ("raw", np.zeros((0, 3), np.uint8), "is 0 x 3"),
        ("raw", b"\x00" * 12, "needs uint8 pixels as a numpy array"),
        ("ndarray:float32:2x3", np.zeros((3, 2), np.float32), "has shape [3, 2], the schema declares [2, 3]"),
        ("ndarray:float32:2x3", np.zeros((2, 3), np.float64), "needs a numpy float32 array, got a float64 array"),
        ("ndarray:float32:2x3", [[0.0] * 3] * 2, "needs a numpy float32 array, got list"),
    ],
)
def test_writer_refuses_what_the_reader_would(tmp_path: Path, field: str, value: Any, says: str) -> None:
    with ShardWriter(tmp_path / "a.shard", schema=Schema.of(x=field)) as shard:
        with pytest.raises(SchemaError, match=re.escape(says)):
            shard.write({"x": value})


@pytest.mark.parametrize(
    ("spec", "cls", "says"),
    [
        ("ndarray:bfloat16:2", "UnsupportedVersionError", "dtype 'bfloat16'"),
        ("ndarray:float32:0", "SchemaError", "sizes are not all integers from 1"),
        ("ndarray:float32:1x1x1x1x1x1x1x1x1", "SchemaError", "1 to 8 sizes"),
        ("ndarray:float64:1073741824", "SchemaError", "over the field limit"),
        ("ndarray:float32", "SchemaError", "ndarray:DTYPE:SHAPE"),
        ("raw:uint8", "SchemaError", "takes no parameters"),
    ],
)
def test_schema_refuses_bad_array_parameters(spec: str, cls: str, says: str) -> None:
    import shardfmt

    with pytest.raises(getattr(shardfmt, cls), match=re.escape(says)):
        Schema.of(x=spec)
