"""Every Hugging Face layout, built with the `datasets` library itself: Parquet whose images are
file paths (``Dataset.to_parquet()`` of a dataset made from paths), a ``save_to_disk`` folder, a
``datasets.Dataset`` object; and the public ``shardfmt._convert`` with records held in memory. Each
conversion is compared record by record with the source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import jpeg_bytes

import shardfmt
from shardfmt import ConvertError, open_dataset
from shardfmt._cli import main

datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")


@pytest.fixture
def image_files(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "images"
    folder.mkdir()
    paths = []
    for i in range(6):
        path = folder / f"{i}.jpg"
        path.write_bytes(jpeg_bytes(10 + i, 12, seed=i))
        paths.append(path)
    return paths


def from_paths(paths: list[Path | str]) -> Any:
    table = {"image": [str(p) for p in paths], "label": [i % 2 for i in range(len(paths))]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])})
    return datasets.Dataset.from_dict(table, features=features)


def assert_same(out: Path, paths: list[Path]) -> None:
    with open_dataset(out) as dataset:
        assert dataset.manifest.classes == ["cat", "dog"]
        assert [(bytes(r["image"]), r["label"]) for r in dataset] == [(p.read_bytes(), i % 2) for i, p in enumerate(paths)]


def test_parquet_of_image_paths_resolves_them_against_the_image_root(image_files: list[Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # datasets stores the paths as given: relative to this folder
    from_paths([Path("images") / p.name for p in image_files]).to_parquet(str(tmp_path / "hub" / "train.parquet"))
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "hub" / "train.parquet"), str(tmp_path / "no-root"), "-q"])
    assert result.exit_code == 1
    assert "no record was written: all 6 inputs were rejected (6 missing-file; see rejects.jsonl)" in result.output
    first = json.loads((tmp_path / "no-root" / "rejects.jsonl").read_text().splitlines()[0])
    assert first["reason"] == "missing-file" and f"the image file {tmp_path / 'hub' / 'images' / '0.jpg'} does not exist" in first["detail"]
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "hub" / "train.parquet"), str(tmp_path / "out"), "-q",
                                       "--image-root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert_same(tmp_path / "out", image_files)


def test_parquet_of_paths_beside_the_file_and_allow_empty(image_files: list[Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path / "images")
    from_paths([p.name for p in image_files]).to_parquet(str(tmp_path / "images" / "train.parquet"))
    summary = shardfmt.convert(tmp_path / "images" / "train.parquet", tmp_path / "out", workers=1)
    assert summary.records == 6 and summary.rejects == {}
    assert_same(tmp_path / "out", image_files)
    (image_files[0]).unlink()
    summary = shardfmt.convert(tmp_path / "images" / "train.parquet", tmp_path / "out2", workers=1)
    assert summary.records == 5 and summary.rejects == {"missing-file": 1}
    for path in image_files[1:]:
        path.unlink()
    summary = shardfmt.convert(tmp_path / "images" / "train.parquet", tmp_path / "empty", workers=1, allow_empty=True)
    assert summary.records == 0 and summary.rejects == {"missing-file": 6}


def test_a_save_to_disk_folder_is_read_with_pyarrow(image_files: list[Path], tmp_path: Path) -> None:
    from_paths(list(image_files)).save_to_disk(str(tmp_path / "saved"))
    for path in image_files:
        path.rename(path.with_suffix(".gone"))  # save_to_disk embedded the bytes: the files are not needed
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "saved"), str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    assert_same(tmp_path / "out", [p.with_suffix(".gone") for p in image_files])
    with open_dataset(tmp_path / "out") as dataset:
        assert [r["key"] for r in dataset] == [f"data-00000-of-00001/{i}" for i in range(6)]


def test_a_saved_dataset_dict_names_its_splits(image_files: list[Path], tmp_path: Path) -> None:
    datasets.DatasetDict({"train": from_paths(list(image_files)), "test": from_paths(list(image_files[:2]))}).save_to_disk(
        str(tmp_path / "dd")
    )
    with pytest.raises(ConvertError, match=r"a saved DatasetDict: convert one split's folder \(test, train\)"):
        shardfmt.convert(tmp_path / "dd", tmp_path / "out")


def test_a_dataset_object_converts_from_python(image_files: list[Path], tmp_path: Path) -> None:
    summary = shardfmt.convert(from_paths(list(image_files)), tmp_path / "out", workers=2, shard_format="tar")
    assert (summary.records, summary.rejects, summary.input_bytes > 0) == (6, {}, True)
    assert_same(tmp_path / "out", image_files)


def test_records_in_memory_with_captions_and_no_labels(tmp_path: Path) -> None:
    pixels = np.zeros((6, 8, 3), np.uint8)
    records = [
        {"image": jpeg_bytes(8, 8, seed=1), "key": "a/one", "caption": "one", "score": 0.5},
        {"image": pixels, "key": "a/two", "caption": "two", "score": 1.5},
        {"image": b"not an image", "key": "b/three", "caption": "three", "score": 2.0},
    ]
    summary = shardfmt.convert(iter(records), tmp_path / "out", workers=1)
    assert summary.records == 2 and summary.rejects == {"not-an-image": 1}
    with open_dataset(tmp_path / "out") as dataset:
        assert dataset.manifest.schema.names == ("image", "caption", "score", "key")
        rows = [dict(r) for r in dataset]
    assert [(r["key"], r["caption"], r["score"]) for r in rows] == [("a/one", "one", 0.5), ("a/two", "two", 1.5)]
    assert bytes(rows[0]["image"]) == records[0]["image"]


def test_records_in_memory_with_class_names(tmp_path: Path) -> None:
    records = [{"image": jpeg_bytes(8, 8, seed=i), "label": name} for i, name in enumerate(["dog", "cat", "dog"])]
    summary = shardfmt.convert(records, tmp_path / "out", workers=1)
    assert summary.records == 3 and summary.bytes == sum(s.size for s in summary.result.manifest.shards)
    with open_dataset(tmp_path / "out") as dataset:
        assert dataset.manifest.classes == ["cat", "dog"] and [r["label"] for r in dataset] == [1, 0, 1]


def test_an_unknown_source_lists_every_kind(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"?")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "x.bin"), str(tmp_path / "out")])
    assert result.exit_code == 1
    for kind in ("ImageFolder", ".csv", ".tar.gz", ".parquet", ".arrow", "save_to_disk", "datasets.Dataset", "iterable of records"):
        assert kind in result.output
