"""Malformed inputs: one hand-built bad file per error class and per rule of the spec.

Each shard test starts from valid bytes, breaks exactly one rule through a numpy view of the layout
dtypes, reseals the checksums that should still hold, and asserts the exact class, `.path`,
`.offset` and `.record` of the error and that its message reads as one plain sentence.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardfmt import (
    DatasetNotFoundError,
    DatasetWriter,
    FormatError,
    ManifestError,
    Schema,
    ShardfmtError,
    ShardNotFoundError,
    UnsupportedVersionError,
    open_dataset,
)
from shardfmt.layout import MAX_CLASSES, MAX_RECORDS_PER_SHARD, MAX_SHARD_SIZE

SCALARS = Schema.of(label="int64", score="float64")


def check_error(
    err: BaseException,
    cls: type[ShardfmtError],
    *,
    path: str | os.PathLike[str] | None,
    offset: int | None = None,
    record: int | None = None,
    says: str = "",
) -> None:
    """Assert `err` is exactly `cls` with this context, rendered as the style guide shows."""
    assert type(err) is cls, f"expected {cls.__name__}, got {type(err).__name__}: {err}"
    assert isinstance(err, ShardfmtError)
    expected_path = os.fspath(path) if path is not None else None
    assert (err.path, err.offset, err.record) == (expected_path, offset, record), str(err)
    prefix = [p for p in (expected_path, offset is not None and f"byte {offset}", record is not None and f"record {record}") if p]
    assert str(err) == ": ".join([*prefix, err.message])
    assert says in err.message, err.message
    # One plain line: no numpy reprs, no stray newlines, not a wall of text.
    assert "\n" not in err.message and "np." not in err.message and len(err.message) < 300, err.message


# --- manifests -------------------------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A dataset of two shards holding 3 + 2 scalar records."""
    root = tmp_path / "ds"
    # A shard of n scalar records is 192 (header) + 40 n (table) + 64 (footer) bytes: close at 3.
    with DatasetWriter(root, schema=SCALARS, shard_size=376, classes=["cat", "dog"]) as writer:
        for i in range(5):
            writer.write({"label": i % 2, "score": i / 4})
    counts = [s["num_records"] for s in json.loads((root / "manifest.json").read_text())["shards"]]
    assert counts == [3, 2], counts
    return root


def rewrite_manifest(root: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    path = root / "manifest.json"
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))
    return path


def set_key(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return change


def drop_key(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest.pop(key)


BAD_MANIFESTS = {
    "format": (set_key("format", value="zarr"), ManifestError, "expected \"shardfmt\""),
    "version-missing": (drop_key("format_version"), ManifestError, "missing 'format_version'"),
    "version-type": (set_key("format_version", value=1.0), ManifestError, "wrong type"),
    "version-shape": (set_key("format_version", value="1"), ManifestError, "MAJOR.MINOR"),
    "version-unicode-digits": (set_key("format_version", value="\u00b2.0"), ManifestError, "MAJOR.MINOR"),
    "version-arabic-digits": (set_key("format_version", value="\u0661.\u0660"), ManifestError, "MAJOR.MINOR"),
    "version-huge": (set_key("format_version", value="1" + "0" * 5000 + ".0"), ManifestError, "MAJOR.MINOR"),
    "version-major": (set_key("format_version", value="2.0"), UnsupportedVersionError, "major version 2"),
    "shard-format": (set_key("shard_format", value="tar"), UnsupportedVersionError, "'tar'"),
    "schema-missing": (drop_key("schema"), ManifestError, "missing 'schema'"),
    "schema-field-name": (set_key("schema", "fields", 0, "name", value="a-b"), ManifestError, "schema: field name"),
    "schema-field-type": (set_key("schema", "fields", 0, "type", value="webp"), UnsupportedVersionError, "'webp'"),
    "classes": (set_key("classes", value=["a", 1]), ManifestError, "list of strings"),
    "classes-limit": (set_key("classes", value=["c"] * (MAX_CLASSES + 1)), ManifestError, "limit"),
    "shards-type": (set_key("shards", value={}), ManifestError, "'shards' has the wrong type"),
    "shard-entry": (set_key("shards", 0, value=[]), ManifestError, "shards[0] is not an object"),
    "num-records-bool": (set_key("shards", 0, "num_records", value=True), ManifestError, "wrong type"),
    "num-records-negative": (set_key("shards", 1, "num_records", value=-1), ManifestError, "shards[1]: num_records -1"),
    "num-records-limit": (set_key("shards", 0, "num_records", value=MAX_RECORDS_PER_SHARD + 1), ManifestError, "outside"),
    "size-zero": (set_key("shards", 0, "size", value=0), ManifestError, "size 0"),
    "size-limit": (set_key("shards", 0, "size", value=MAX_SHARD_SIZE + 1), ManifestError, "outside"),
    "checksum-algorithm": (set_key("shards", 0, "checksum", value="crc32:00000000"), ManifestError, "16 lower-case hex"),
    "checksum-sign": (set_key("shards", 0, "checksum", value="xxh3_64:-123456789abcdef"), ManifestError, "hex"),
    "checksum-underscore": (set_key("shards", 0, "checksum", value="xxh3_64:0000_0000_0000_0"), ManifestError, "hex"),
    "checksum-upper": (set_key("shards", 0, "checksum", value="xxh3_64:0123456789ABCDEF"), ManifestError, "hex"),
    "checksum-fullwidth": (set_key("shards", 0, "checksum", value="xxh3_64:\uff10123456789abcdef"), ManifestError, "hex"),
    "duplicate-path": (set_key("shards", 1, "path", value="shard-00000.shard"), ManifestError, "listed twice"),
    "total-records": (set_key("num_records", value=6), ManifestError, '"num_records" is 6 but the shards add up to 5'),
    "total-bytes": (set_key("num_bytes", value=1), ManifestError, '"num_bytes" is 1'),
    "total-missing": (drop_key("num_bytes"), ManifestError, "missing 'num_bytes'"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifest_field(dataset: Path, case: str) -> None:
    change, cls, says = BAD_MANIFESTS[case]
    path = rewrite_manifest(dataset, change)
    with pytest.raises(ShardfmtError) as info:
        open_dataset(dataset)
    check_error(info.value, cls, path=path, says=says)


@pytest.mark.parametrize(
    "shard_path",
    ["../x.shard", "/etc/passwd", "a/../../x", "./shard-00000.shard", "a//b", "a/", "", "C:/x", "c:x", "a\\..\\x", "x\x00"],
)
def test_manifest_shard_path_must_stay_under_the_root(dataset: Path, shard_path: str) -> None:
    path = rewrite_manifest(dataset, set_key("shards", 0, "path", value=shard_path))
    with pytest.raises(ShardfmtError) as info:
        open_dataset(dataset)
    check_error(info.value, ManifestError, path=path, says="shards[0]: path")


def test_manifest_not_json(dataset: Path) -> None:
    path = dataset / "manifest.json"
    path.write_bytes(b"{\xff")
    with pytest.raises(ShardfmtError) as info:
        open_dataset(dataset)
    check_error(info.value, ManifestError, path=path, says="not valid UTF-8 JSON")


def test_manifest_not_an_object(dataset: Path) -> None:
    path = dataset / "manifest.json"
    path.write_text("[]")
    with pytest.raises(ShardfmtError) as info:
        open_dataset(path)
    check_error(info.value, ManifestError, path=path, says="not a JSON object")


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ShardfmtError) as info:
        open_dataset(tmp_path)
    check_error(info.value, DatasetNotFoundError, path=tmp_path, says="no manifest.json")
    assert isinstance(info.value, FileNotFoundError)


def test_missing_shard(dataset: Path) -> None:
    (dataset / "shard-00001.shard").unlink()
    with open_dataset(dataset) as reader:
        assert reader[0]["label"] == 0  # shards open lazily: the first one is fine
        with pytest.raises(ShardfmtError) as info:
            reader[3]
    check_error(info.value, ShardNotFoundError, path=dataset / "shard-00001.shard", says="does not exist")
    assert isinstance(info.value, FileNotFoundError)


def test_manifest_count_disagrees_with_shard(dataset: Path) -> None:
    def change(manifest: dict[str, Any]) -> None:
        manifest["shards"][0]["num_records"] += 1
        manifest["num_records"] += 1

    path = rewrite_manifest(dataset, change)
    with open_dataset(dataset) as reader, pytest.raises(ShardfmtError) as info:
        reader[0]
    check_error(info.value, ManifestError, path=path, says="holds 3 records but the manifest says 4")


def test_manifest_size_disagrees_with_shard(dataset: Path) -> None:
    shard = dataset / "shard-00000.shard"
    size = shard.stat().st_size
    with open(shard, "ab") as out:
        out.write(bytes(64))
    with open_dataset(dataset) as reader, pytest.raises(ShardfmtError) as info:
        reader[0]
    check_error(info.value, FormatError, path=shard, says=f"file is {size + 64} bytes but the manifest says {size}")


def test_manifest_schema_disagrees_with_shard(dataset: Path) -> None:
    path = rewrite_manifest(dataset, set_key("schema", "fields", 1, "name", value="weight"))
    with open_dataset(dataset) as reader, pytest.raises(ShardfmtError) as info:
        reader[0]
    check_error(info.value, ManifestError, path=path, says="schema that differs")
