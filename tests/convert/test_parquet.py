"""Parquet files as a conversion source: the Hugging Face layout (an image struct with bytes, a
label column, ClassLabel names in the schema metadata), rejects per row, globs, URLs, resume and
workers, on Parquet files written here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest
from click.testing import CliRunner
from conftest import jpeg_bytes, tree_bytes
from converting import convert

from shardfmt import ConvertError, open_dataset
from shardfmt._cli import main
from shardfmt._convert import destination as convert_output
from shardfmt._convert.loop import _chunks
from shardfmt._convert.plan import ConversionPlan
from shardfmt._convert.sources import tablefiles

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hf_metadata(names: list[str]) -> dict[str, str]:
    """Schema metadata as the Hugging Face datasets library writes it."""
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    return {"huggingface": json.dumps({"info": {"features": features}})}


def image(seed: int) -> dict[str, Any]:
    return {"bytes": jpeg_bytes(24, 32, seed=seed), "path": f"{seed}.jpg"}


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    """Two files as the Hub lays them out: train-00000 (6 rows in row groups of 4 and 2) with a
    null image (row 2), a corrupt one (row 3), a null label (row 4); train-00001 (3 rows)."""
    data = tmp_path / "data"
    data.mkdir()
    first = [image(0), image(1), None, {"bytes": b"\xff\xd8\xff\xe0 not a JPEG", "path": "x.jpg"}, image(4), image(5)]
    labels = ["dog", "cat", "cat", "dog", None, "bird"]
    table = pa.table({"image": pa.array(first, IMAGE_STRUCT), "label": labels})
    pq.write_table(table, data / "train-00000-of-00002.parquet", row_group_size=4)
    second = pa.table({"image": pa.array([image(6), image(7), image(8)], IMAGE_STRUCT), "label": ["cat", "bird", "dog"]})
    pq.write_table(second, data / "train-00001-of-00002.parquet")
    (data / "test-00000-of-00001.parquet").write_bytes(b"not matched by the pattern")
    return data


def test_a_glob_of_hub_files_with_string_labels_nulls_and_a_corrupt_image(hub: Path, tmp_path: Path) -> None:
    result = convert(str(hub / "train-*.parquet"), tmp_path / "out", workers=1)
    assert (result.num_inputs, result.num_records, result.num_rejects) == (8, 6, 3)
    manifest = result.manifest
    assert manifest.classes == ["bird", "cat", "dog"]
    assert manifest.converter["input"] == "parquet"
    assert manifest.converter["options"]["image_column"] == "image"
    with open_dataset(tmp_path / "out") as dataset:
        assert [(r["key"], r["label"]) for r in dataset] == [
            ("train-00000-of-00002/0", 2), ("train-00000-of-00002/1", 1), ("train-00000-of-00002/5", 0),
            ("train-00001-of-00002/0", 1), ("train-00001-of-00002/1", 0), ("train-00001-of-00002/2", 2),
        ]
        assert dataset[0]["image"] == jpeg_bytes(24, 32, seed=0)  # a baseline JPEG is kept byte for byte
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["path"], r["key"], r["reason"]) for r in rejects] == [
        ("train-00000-of-00002.parquet", "train-00000-of-00002/2", "no-image"),
        ("train-00000-of-00002.parquet", "train-00000-of-00002/3", "corrupt"),
        ("train-00000-of-00002.parquet", "train-00000-of-00002/4", "no-label"),
    ]
    assert rejects[0]["detail"] == "row 2 (row group 0): the image is null (neither bytes nor a path)"
    assert rejects[2]["detail"] == "row 4 (row group 1): the label is null"


def test_class_names_come_from_the_hugging_face_features(tmp_path: Path) -> None:
    table = pa.table({"image": pa.array([jpeg_bytes(seed=i) for i in range(4)], pa.binary()), "label": pa.array([2, 0, 3, -1], pa.int64())})
    pq.write_table(table.replace_schema_metadata(hf_metadata(["apple", "pear", "plum"])), tmp_path / "fruit.parquet")
    result = convert(tmp_path / "fruit.parquet", tmp_path / "out", workers=1)
    assert result.manifest.classes == ["apple", "pear", "plum"]
    with open_dataset(tmp_path / "out") as dataset:
        assert [r["label"] for r in dataset] == [2, 0]
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["key"], r["reason"], r["detail"]) for r in rejects] == [
        ("fruit/2", "bad-label", "row 2 (row group 0): label 3 names no class (the files name 3 classes)"),
        ("fruit/3", "no-label", "row 3 (row group 0): the label is -1, the Hugging Face mark of an example without a label; "
                                "--label-column none (label_column='none') converts the records without labels"),
    ]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"info": {"features": {"label": {"_type": "ClassLabel", "names": 5}}}}), "has names 5, not a list"),
        (json.dumps({"info": {"features": {"label": {"_type": "ClassLabel", "names": ["a", 3, None]}}}}), r"has names \['a', 3, None\]"),
        (json.dumps({"info": {"features": {"label": {"_type": "ClassLabel", "names": ["a", "a"]}}}}), "distinct"),
        (json.dumps({"info": "features"}), "no mapping of features"),
    ],
)
def test_malformed_class_label_metadata_is_a_convert_error(tmp_path: Path, metadata: str, message: str) -> None:
    """Before, such metadata was ignored without a word, and a label of 7 among 3 classes was kept."""
    table = pa.table({"image": pa.array([jpeg_bytes(seed=i) for i in range(2)], pa.binary()), "label": pa.array([0, 7], pa.int64())})
    pq.write_table(table.replace_schema_metadata({"huggingface": metadata}), tmp_path / "fruit.parquet")
    with pytest.raises(ConvertError, match=message) as info:
        convert(tmp_path / "fruit.parquet", tmp_path / "out", workers=1)
    assert "Hugging Face" in str(info.value) and str(info.value.path).endswith("fruit.parquet")


def test_integer_labels_without_names_and_a_key_column(tmp_path: Path) -> None:
    table = pa.table({"jpg": [jpeg_bytes(seed=i) for i in range(3)], "fine": pa.array([7, 3, 7], pa.int32()), "id": ["a7", None, "c9"]})
    pq.write_table(table, tmp_path / "x.parquet")
    result = convert(tmp_path / "x.parquet", tmp_path / "out", workers=1, image_column="jpg", label_column="fine", key_column="id")
    assert result.manifest.classes is None
    assert result.manifest.converter["options"]["key_column"] == "id"
    with open_dataset(tmp_path / "out") as dataset:
        assert [(r["key"], r["label"]) for r in dataset] == [("a7", 7), ("c9", 7)]
    reject = json.loads((tmp_path / "out" / "rejects.jsonl").read_text())
    assert (reject["path"], reject["reason"], reject["detail"]) == ("x.parquet", "bad-key", "row 1 (row group 0): the key is null")


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"image_column": "picture"}, "no image column 'picture'; the file's columns are image, label"),
        ({"label_column": "image"}, "label column 'image' holds struct"),
        ({"image_column": "label"}, "column 'label' holds string; an image column is binary"),
        ({"key_column": "missing"}, "no key column 'missing'"),
    ],
)
def test_wrong_columns_are_a_convert_error_naming_the_file(hub: Path, tmp_path: Path, columns: dict[str, str], message: str) -> None:
    with pytest.raises(ConvertError, match=message) as info:
        convert(hub / "train-00001-of-00002.parquet", tmp_path / "out", workers=1, **columns)
    assert info.value.path == str(hub / "train-00001-of-00002.parquet")


def test_a_file_that_is_not_parquet_is_a_reject(hub: Path, tmp_path: Path) -> None:
    result = convert([hub / "test-00000-of-00001.parquet", hub / "train-00001-of-00002.parquet"], tmp_path / "out", workers=1)
    assert (result.num_records, result.num_rejects) == (3, 1)
    reject = json.loads((tmp_path / "out" / "rejects.jsonl").read_text())
    assert (reject["path"], reject["reason"]) == ("test-00000-of-00001.parquet", "corrupt")
    assert reject["detail"].startswith("not a readable Parquet file: ")


def interrupted(source: str, out: Path, monkeypatch: pytest.MonkeyPatch, **options: Any) -> None:
    """Run a conversion of `source` that stops before its manifest, leaving plan and shards."""
    monkeypatch.setattr(convert_output.Output, "finish", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert(source, out, workers=1, **options)
    monkeypatch.undo()


def _interrupt(*args: Any, **kwargs: Any) -> Any:
    raise KeyboardInterrupt


def test_workers_do_not_change_a_byte_and_row_groups_are_the_chunks(hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = str(hub / "train-*.parquet")
    convert(source, tmp_path / "one", workers=1)
    convert(source, tmp_path / "two", workers=2)
    convert(source, tmp_path / "small", workers=2, shard_size=1)  # a shard per record: a row group in several shards
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    with open_dataset(tmp_path / "one") as one, open_dataset(tmp_path / "small") as small:
        assert [r["image"] for r in one] == [r["image"] for r in small]
    interrupted(source, tmp_path / "planned", monkeypatch)
    plan = ConversionPlan.from_dict(json.loads((tmp_path / "planned" / ".shardfmt-work" / "plan.json").read_bytes()))
    # row groups of 4 rows (one rejected while scanning: a null label), 2 rows and 3 rows
    assert [len(chunk.records) for chunk in _chunks(plan, 0)] == [4, 1, 3]
    assert [[r.files[0].row_group for _, r in chunk.records] for chunk in _chunks(plan, 0)] == [[0] * 4, [1], [0] * 3]


def test_resume_keeps_finished_shards_and_refuses_a_changed_file(hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = str(hub / "train-*.parquet")
    convert(source, tmp_path / "clean", workers=1, shard_size=1500)
    interrupted(source, tmp_path / "out", monkeypatch, shard_size=1500)
    work = tmp_path / "out" / ".shardfmt-work"
    assert sorted(p.name for p in work.glob("shard-*.json")) == [f"shard-{n:05d}.json" for n in range(6)]
    for n in (3, 4):  # as if the run had stopped after shard 2 and during shard 5
        (work / f"shard-{n:05d}.json").unlink()
    result = convert(source, tmp_path / "out", workers=2, shard_size=1500, resume=True)
    assert (result.reused_shards, len(result.manifest.shards)) == (4, 5)  # one shard's rows were all rejected: no file
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "clean")

    interrupted(source, tmp_path / "again", monkeypatch, shard_size=1500)
    changed = hub / "train-00001-of-00002.parquet"
    pq.write_table(pq.read_table(changed).slice(0, 2), changed)
    with pytest.raises(ConvertError, match=r"input files were added, removed or modified \(first: train-00001-of-00002.parquet"):
        convert(source, tmp_path / "again", workers=1, shard_size=1500, resume=True)


def test_parquet_files_by_url(hub: Path, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    for name in ("train-00000-of-00002.parquet", "train-00001-of-00002.parquet"):
        fs.pipe(f"/hub17/data/{name}", (hub / name).read_bytes())
    try:
        result = convert("memory://hub17/data/train-*.parquet", tmp_path / "out", workers=2)
        convert(str(hub / "train-*.parquet"), tmp_path / "local", workers=1)
    finally:
        fs.rm("/hub17", recursive=True)
    assert (result.num_records, result.num_rejects) == (6, 3)
    assert [p.name for p in sorted((tmp_path / "out").glob("*.shard"))] == [p.name for p in sorted((tmp_path / "local").glob("*.shard"))]
    for shard in (tmp_path / "out").glob("*.shard"):
        assert shard.read_bytes() == (tmp_path / "local" / shard.name).read_bytes()


def test_the_command_takes_files_a_shell_expanded_and_the_column_options(hub: Path, tmp_path: Path) -> None:
    files = [str(hub / "train-00000-of-00002.parquet"), str(hub / "train-00001-of-00002.parquet")]
    result = CliRunner().invoke(main, ["convert", *files, str(tmp_path / "out"), "--workers", "1", "--image-column", "image",
                                       "--label-column", "label"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("6 records in 1 shards, 3 rejected")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "nowhere"), str(tmp_path / "x"), "--key-column", "id"])
    assert result.exit_code == 1 and "--key-column, --drop-column) are for Parquet and Arrow sources" in result.output


def test_without_pyarrow_the_error_says_what_to_install(hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tablefiles, "pq", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # an import of it fails, as when not installed
    with pytest.raises(ConvertError) as info:
        convert(hub / "train-00001-of-00002.parquet", tmp_path / "out", workers=1)
    assert str(info.value) == "reading Parquet files needs pyarrow: pip install 'shardfmt[parquet]'"
