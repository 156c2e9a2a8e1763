"""Write -> read round trips through the public API."""

from __future__ import annotations

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

import shardfmt.writer as writer_module
from shardfmt import DatasetWriter, Schema, SchemaError, ShardReader, ShardWriter, open_dataset


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
        with pytest.raises(SchemaError, match="record 1 would grow the shard to 1296 bytes, over the limit of 1024"):
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
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
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
