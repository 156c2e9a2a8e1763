"""spec/manifest.schema.json: manifests that DatasetWriter writes validate against it, manifests the
reader rejects are rejected by it too (where JSON Schema can say so), and its patterns accept
exactly what the reader accepts."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import jpeg_bytes
from converting import convert
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_malformed import BAD_MANIFESTS

from shardfmt import DatasetWriter, ManifestError
from shardfmt._checksum import parse_checksum
from shardfmt._dataset.tars import index_tars
from shardfmt._synthetic import make_imagefolder
from shardfmt.format import IMAGE_CLASSIFICATION, Schema
from shardfmt.format._fieldtypes import FIELD_TYPES
from shardfmt.format._layout import (
    MAX_CLASSES,
    MAX_FIELD_NAME_LENGTH,
    MAX_FIELDS,
    MAX_RECORDS_PER_SHARD,
    MAX_SHARD_SIZE,
    MAX_SHARDS,
)
from shardfmt.format._manifest import _VERSION_RE, Manifest, _unsafe_path

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "spec" / "manifest.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
ALL_TYPES = Schema.of(image="jpeg", label="int64", score="float64", key="str", blob="bytes", meta="json")


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def write(root: Path, schema: Schema, records: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    with DatasetWriter(root, schema=schema, **options) as writer:
        for record in records:
            writer.write(record)
    value: dict[str, Any] = json.loads((root / "manifest.json").read_text())
    return value


def test_written_manifests_validate(tmp_path: Path) -> None:
    from conftest import jpeg_bytes

    image = jpeg_bytes(8, 8)
    manifests = [
        write(tmp_path / "empty", IMAGE_CLASSIFICATION, []),
        write(
            tmp_path / "classes",
            IMAGE_CLASSIFICATION,
            [{"image": image, "label": i % 2, "key": f"k{i}"} for i in range(6)],
            classes=["chat", "h\u00e9risson"],
            shard_size=2048,
            options={"quality": 90, "nested": {"list": [1, None]}},
        ),
        write(
            tmp_path / "all-types",
            ALL_TYPES,
            [{"image": image, "label": -1, "score": math.inf, "key": "\u65e5", "blob": b"", "meta": {"a": [1]}}],
        ),
    ]
    assert len(manifests[1]["shards"]) > 1
    for manifest in manifests:
        VALIDATOR.validate(manifest)


def test_only_converted_manifests_say_strict_jpeg(tmp_path: Path) -> None:
    source = make_imagefolder(tmp_path / "src", num_classes=2, per_class=2, size=(16, 16), seed=0)
    for shard_format in ("binary", "tar"):
        manifest = convert(source, tmp_path / shard_format, workers=1, shard_format=shard_format).manifest
        assert manifest.strict_jpeg is True
        assert Manifest.load(tmp_path / shard_format).strict_jpeg is True
        VALIDATOR.validate(manifest.to_json())
        assert manifest.to_json()["strict_jpeg"] is True
    # Tars indexed where they lie and datasets written from given bytes had no strict decode.
    indexed = tmp_path / "indexed"
    indexed.mkdir()
    for shard in (tmp_path / "tar").glob("*.tar"):
        shutil.copy(shard, indexed / shard.name)
    assert index_tars([indexed]).strict_jpeg is False
    written = write(tmp_path / "written", IMAGE_CLASSIFICATION, [{"image": jpeg_bytes(8, 8), "label": 0, "key": "k"}])
    assert "strict_jpeg" not in written
    assert "strict_jpeg" not in json.loads((indexed / "manifest.json").read_text())


def test_vector_manifests_validate() -> None:
    paths = sorted((ROOT / "spec" / "vectors").glob("v*/dataset/manifest.json"))
    assert [path.relative_to(ROOT / "spec" / "vectors").as_posix() for path in paths] == [
        "v1.0/dataset/manifest.json",
        "v1.1/dataset/manifest.json",
        "v1.2/dataset/manifest.json",
    ]
    for path in paths:
        VALIDATOR.validate(json.loads(path.read_text()))


def test_schema_states_the_layout_limits() -> None:
    shard = SCHEMA["$defs"]["shard"]["properties"]
    fields = SCHEMA["$defs"]["schema"]["properties"]["fields"]
    assert SCHEMA["properties"]["classes"]["maxItems"] == MAX_CLASSES
    assert SCHEMA["properties"]["shards"]["maxItems"] == MAX_SHARDS
    assert shard["num_records"]["maximum"] == MAX_RECORDS_PER_SHARD
    assert shard["size"]["maximum"] == MAX_SHARD_SIZE
    assert fields["maxItems"] == MAX_FIELDS
    assert f"{{0,{MAX_FIELD_NAME_LENGTH - 1}}}" in SCHEMA["$defs"]["field"]["properties"]["name"]["pattern"]
    assert sorted(SCHEMA["$defs"]["field"]["properties"]["type"]["enum"]) == sorted(FIELD_TYPES)


# JSON Schema cannot express uniqueness of a key across array items or sums over them; an unknown
# shard_format or major version is well-formed, and refused by the reader as too new. The class
# limit is checked above: validating a million items one by one takes seconds.
NOT_EXPRESSIBLE = {"duplicate-path", "total-records", "total-bytes", "shard-format", "version-major", "classes-limit"}
# JSON Schema counts 5.0 as an integer; the reader takes only a number without fraction or exponent.
NOT_EXPRESSIBLE |= {"size-float"}


@pytest.mark.parametrize("case", sorted(set(BAD_MANIFESTS) - NOT_EXPRESSIBLE))
def test_schema_rejects_what_the_reader_rejects(tmp_path: Path, case: str) -> None:
    manifest = write(
        tmp_path / "ds", Schema.of(label="int64", score="float64"), [{"label": i, "score": 0.0} for i in range(3)], shard_size=308
    )
    assert len(manifest["shards"]) == 2
    change, _, _ = BAD_MANIFESTS[case]
    change(manifest)
    assert not VALIDATOR.is_valid(manifest)


def validates(definition: dict[str, Any], value: str) -> bool:
    return bool(jsonschema.Draft202012Validator(definition).is_valid(value))


PATH_PIECES = st.sampled_from(["a", "b.shard", ".", "..", "/", ":", "\\", "\x00", "\n", "\u00e9", "C:"])


@settings(max_examples=300, deadline=None)
@given(st.lists(PATH_PIECES, max_size=8).map("".join))
@example("../x")
@example("/etc/passwd")
@example("a/b:c")
@example("x.shard\n")
@example("..\n")
def test_shard_path_pattern_is_the_reader_rule(path: str) -> None:
    assert validates(SCHEMA["$defs"]["shard_path"], path) == (_unsafe_path(path) is None)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789.\u0661\u00b2 +\n", max_size=14))
@example("1.0")
@example("1.0\n")
@example("123456.0")
def test_format_version_pattern_is_the_reader_rule(version: str) -> None:
    assert validates(SCHEMA["properties"]["format_version"], version) == (_VERSION_RE.fullmatch(version) is not None)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789abcdefABx_:-+ ", max_size=20).map(lambda s: "xxh3_64:" + s))
@example("xxh3_64:0123456789abcdef")
@example("xxh3_64:0123456789abcdef\n")
def test_checksum_pattern_is_the_reader_rule(text: str) -> None:
    try:
        parse_checksum(text)
        accepted = True
    except ValueError:
        accepted = False
    checksum_schema = SCHEMA["$defs"]["shard"]["properties"]["checksum"]
    assert validates(checksum_schema, text) == accepted


def test_free_form_keys_are_free_for_both(tmp_path: Path) -> None:
    from shardfmt.format._manifest import Manifest

    manifest = write(tmp_path / "ds", Schema.of(label="int64"), [{"label": 1}])
    manifest["converter"]["tool"] = {"version": [1, 2]}
    manifest["stats"] = {"anything": ["at", 1, None]}
    manifest["rejects"]["extra"] = True
    manifest["future_key"] = 1
    VALIDATOR.validate(manifest)
    assert Manifest.from_bytes(json.dumps(manifest).encode()).converter["tool"] == {"version": [1, 2]}


def test_a_tar_manifest_has_the_tar_schema(tmp_path: Path) -> None:
    from shardfmt.format._manifest import Manifest

    manifest = write(tmp_path / "ds", IMAGE_CLASSIFICATION, [])
    manifest["shard_format"] = "tar"
    for entry in manifest["shards"]:
        entry["index"] = {"path": entry["path"] + ".idx", "size": 1, "checksum": entry["checksum"]}
    VALIDATOR.validate(manifest)
    Manifest.from_bytes(json.dumps(manifest).encode())
    manifest["schema"]["fields"][2]["type"] = "bytes"
    assert not VALIDATOR.is_valid(manifest)
    with pytest.raises(ManifestError, match="tar shards hold image"):
        Manifest.from_bytes(json.dumps(manifest).encode())


def test_version_1_1_field_types_validate(tmp_path: Path) -> None:
    import numpy as np

    schema = Schema.of(lr="raw", box="ndarray:float32:2x2", label="int64")
    manifest = write(tmp_path / "ds", schema, [{"lr": np.zeros((2, 3, 3), np.uint8), "box": np.zeros((2, 2), np.float32), "label": 1}])
    VALIDATOR.validate(manifest)
    array = manifest["schema"]["fields"][1]
    assert array == {"dtype": "float32", "name": "box", "shape": [2, 2], "type": "ndarray"}
    for broken in ({k: v for k, v in array.items() if k != "shape"}, dict(array, dtype="bfloat16"), dict(array, shape=[0])):
        manifest["schema"]["fields"][1] = broken
        assert not VALIDATOR.is_valid(manifest)
