"""The field type registry and the interface both shard readers share."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conftest import jpeg_bytes

from shardfmt import SchemaError
from shardfmt.format import IMAGE_CLASSIFICATION, ShardReader, ShardWriter
from shardfmt.format._fieldtypes import FIELD_TYPES, IMAGE_TYPES, HeadedJpeg, JpegType
from shardfmt.format._jpeg import read_jpeg_info
from shardfmt.format._reader import ShardReaderBase
from shardfmt.tar import TarShardReader, TarShardWriter


def test_the_registry_names_every_type_once() -> None:
    assert sorted(FIELD_TYPES) == ["bytes", "float64", "int64", "jpeg", "json", "ndarray", "raw", "str"]
    assert all(kind.name == name for name, kind in FIELD_TYPES.items())
    assert IMAGE_TYPES == {"jpeg", "raw"}
    assert sorted(name for name, kind in FIELD_TYPES.items() if kind.is_variable) == ["bytes", "jpeg", "json", "ndarray", "raw", "str"]
    assert [name for name, kind in FIELD_TYPES.items() if kind.takes_parameters] == ["ndarray"]


def test_a_fixed_size_type_encodes_into_the_table_and_a_variable_one_into_the_payload() -> None:
    label = IMAGE_CLASSIFICATION.field("label")
    key = IMAGE_CLASSIFICATION.field("key")
    assert label.kind.encode(label, np.int32(7), "here") == (None, (7,))
    assert key.kind.encode(key, "café", "here") == (b"caf\xc3\xa9", ())
    with pytest.raises(SchemaError, match=r"^here needs an int, got bool$"):
        label.kind.encode(label, True, "here")


def test_the_jpeg_rule_is_the_same_for_both_writers() -> None:
    data = jpeg_bytes(8, 16)
    image = IMAGE_CLASSIFICATION.field("image")
    payload, columns = image.kind.encode(image, data, "here")
    assert bytes(payload or b"") == data and columns == (8, 16, 3, 0)
    assert JpegType.unstorable(read_jpeg_info(data)) is None


def test_a_jpeg_with_its_headers_read_is_written_as_the_bytes_alone(tmp_path: Path) -> None:
    """HeadedJpeg skips the writer's own header parse; the shard is byte for byte the same, and
    the storable rule still applies to the headers given."""
    data = jpeg_bytes(8, 16)
    for name, value in (("plain", data), ("headed", HeadedJpeg(data, read_jpeg_info(data)))):
        with ShardWriter(tmp_path / f"{name}.shard", schema=IMAGE_CLASSIFICATION) as writer:
            writer.write({"image": value, "label": 4, "key": "k"})
        with TarShardWriter(tmp_path / f"{name}.tar") as tar:
            tar.write("k", image=value, label=4)
    assert (tmp_path / "plain.shard").read_bytes() == (tmp_path / "headed.shard").read_bytes()
    assert (tmp_path / "plain.tar").read_bytes() == (tmp_path / "headed.tar").read_bytes()
    image = IMAGE_CLASSIFICATION.field("image")
    cmyk = dataclasses.replace(read_jpeg_info(data), components=4)
    with pytest.raises(SchemaError, match="4 components"):
        image.kind.encode(image, HeadedJpeg(data, cmyk), "here")


@pytest.fixture
def both_readers(tmp_path: Path) -> list[ShardReaderBase]:
    with ShardWriter(tmp_path / "a.shard", schema=IMAGE_CLASSIFICATION) as writer:
        writer.write({"image": jpeg_bytes(8, 16), "label": 4, "key": "k"})
    with TarShardWriter(tmp_path / "a.tar") as tar:
        tar.write("k", image=jpeg_bytes(8, 16), label=4)
    return [ShardReader(tmp_path / "a.shard"), TarShardReader(tmp_path / "a.tar")]


def test_both_readers_serve_the_same_record(both_readers: list[ShardReaderBase]) -> None:
    for reader in both_readers:
        with reader:
            record = reader.record(-1)
            assert (len(reader), record["label"], record["key"], bytes(record["image"])) == (1, 4, "k", jpeg_bytes(8, 16))
            assert (reader.image_info(0).height, reader.image_info(0).width) == (8, 16)
            assert [r.index for r in reader] == [0]


def test_both_readers_refuse_the_payload_of_a_fixed_size_field(both_readers: list[ShardReaderBase]) -> None:
    for reader, noun in zip(both_readers, ("shard", "tar"), strict=True):
        with reader, pytest.raises(SchemaError, match=rf"^no variable-size field 'label' in this {noun} \(fields: image, key\)$"):
            reader.payload(0, "label")


def test_locate_column_points_into_the_file_that_stores_the_column(both_readers: list[ShardReaderBase], tmp_path: Path) -> None:
    binary, tar = both_readers
    with binary, tar:
        label = binary.dtype.fields["label"][1]
        assert binary.locate_column(0, "label") == (str(tmp_path / "a.shard"), binary.table_offset + label)
        index = tar.index
        assert tar.locate_column(0, "label") == (str(tmp_path / "a.tar.idx"), index.table_offset + index.dtype.fields["label"][1])
