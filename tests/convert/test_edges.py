"""Edges of the sources: listings with an image root, listings whose columns say nothing of
images, several tars as several sources, a folder of Parquet files, ``~`` from Python, in-memory
records naming missing files, one reject name per cause, keyword wording from Python, and
Parquet rows sized by the files they name. Inputs are made with the real tools (csv, json,
pyarrow, webdataset's TarWriter)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from conftest import jpeg_bytes, webdataset_leaves_files_open

import shardfmt
from shardfmt import ConvertError, open_dataset


def read_rejects(out: Path) -> list[tuple[str, str, str]]:
    return [(r["path"], r["reason"], r["detail"]) for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())]


def write_csv(path: Path, rows: list[list[str]]) -> Path:
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows(rows)
    return path


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """``images/a.jpg``, ``images/b.jpg`` (the image root) and ``outside/c.jpg`` beside it."""
    root = tmp_path / "images"
    root.mkdir()
    (root / "a.jpg").write_bytes(jpeg_bytes(16, 24, seed=1))
    (root / "b.jpg").write_bytes(jpeg_bytes(16, 24, seed=2))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "c.jpg").write_bytes(jpeg_bytes(16, 24, seed=3))
    return root


def test_listing_absolute_paths_without_image_root_name_the_option(tmp_path: Path, images: Path) -> None:
    (tmp_path / "lists").mkdir()
    listing = write_csv(tmp_path / "lists" / "train.csv", [["path", "label"], [str(images / "a.jpg"), "0"], [str(images / "b.jpg"), "1"]])
    with pytest.raises(ConvertError, match=r"2 entries were set aside \(2 outside-root\); a listing reads files outside its "
                       "folder only inside the folder image_root= names"):
        shardfmt.convert(listing, tmp_path / "out")
    write_csv(listing, [["path", "label"], ["../images/a.jpg", "0"], [str(images / "b.jpg"), "1"]])
    summary = shardfmt.convert(listing, tmp_path / "out", allow_empty=True, overwrite=True)
    rejects = read_rejects(tmp_path / "out")
    assert (summary.records, [(path, reason) for path, reason, _ in rejects]) == (
        0, [("../images/a.jpg", "outside-root"), (str(images / "b.jpg"), "outside-root")])
    assert all(detail.endswith("a listing reads only inside it, or inside the folder --image-root (image_root=) names")
               for _, _, detail in rejects)


@pytest.mark.parametrize("absolute", [True, False])
def test_listing_image_root_accepts_paths_inside_it(tmp_path: Path, images: Path, absolute: bool) -> None:
    (tmp_path / "lists").mkdir()
    base = f"{images}{os.sep}" if absolute else ""
    rows = [["path", "label"], [f"{base}a.jpg", "cat"], [f"{base}b.jpg", "dog"], [str(tmp_path / "outside" / "c.jpg"), "dog"],
            ["../outside/c.jpg", "cat"]]
    listing = write_csv(tmp_path / "lists" / "train.csv", rows)
    summary = shardfmt.convert(listing, tmp_path / "out", image_root=images)
    assert (summary.records, summary.rejects) == (2, {"outside-root": 2})
    dataset = open_dataset(tmp_path / "out")
    assert [dataset[i]["key"] for i in range(2)] == ["a", "b"]
    assert [dataset[i]["label"] for i in range(2)] == [0, 1]
    assert [r[1] for r in read_rejects(tmp_path / "out")] == ["outside-root", "outside-root"]
    assert all("--image-root (image_root=)" in r[2] or "leaves the image root" in r[2] for r in read_rejects(tmp_path / "out"))


def test_listing_image_root_refuses_a_link_out_of_it(tmp_path: Path, images: Path) -> None:
    os.symlink(tmp_path / "outside" / "c.jpg", images / "link.jpg")
    listing = write_csv(tmp_path / "train.csv", [["path", "label"], ["a.jpg", "0"], [str(images / "link.jpg"), "0"]])
    summary = shardfmt.convert(listing, tmp_path / "out", image_root=images)
    assert (summary.records, summary.rejects) == (1, {"outside-root": 1})


def test_listing_image_root_from_the_command_line(tmp_path: Path, images: Path) -> None:
    from click.testing import CliRunner

    from shardfmt._cli import main

    listing = write_csv(tmp_path / "train.csv", [["path", "label", "weight"], [str(images / "a.jpg"), "0", "0.5"],
                                                  [str(images / "b.jpg"), "1", "2"]])
    result = CliRunner().invoke(main, ["convert", str(listing), str(tmp_path / "out"), "--image-root", str(images), "-q"])
    assert result.exit_code == 0, result.output
    dataset = open_dataset(tmp_path / "out")
    assert [dataset[i]["weight"] for i in range(2)] == [0.5, 2.0]


def test_listing_text_column_undeclared_is_an_error_naming_it(tmp_path: Path, images: Path) -> None:
    listing = write_csv(images / "train.csv", [["path", "label", "caption"], ["a.jpg", "0", "a cat"], ["b.jpg", "1", "a dog"]])
    with pytest.raises(ConvertError, match=r"column 'caption' was taken for image files .* none of its first 2 values names a file "
                       r"\(the first: 'a cat'\); if it is text, declare it: fields=\{'caption': 'str'\}$"):
        shardfmt.convert(listing, tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()
    from click.testing import CliRunner

    from shardfmt._cli import main

    result = CliRunner().invoke(main, ["convert", str(listing), str(tmp_path / "cli")])
    assert result.exit_code == 1 and result.output.endswith("if it is text, declare it: --field caption=str\n")
    summary = shardfmt.convert(listing, tmp_path / "out", fields={"caption": "str"}, overwrite=True)
    assert summary.records == 2
    assert [open_dataset(tmp_path / "out")[i]["caption"] for i in range(2)] == ["a cat", "a dog"]


def test_listing_header_without_image_column_is_an_error(tmp_path: Path, images: Path) -> None:
    listing = write_csv(images / "train.csv", [["filename", "class"], ["a.jpg", "cat"], ["b.jpg", "dog"]])
    with pytest.raises(ConvertError, match=r"line 1: the columns are filename, class; a listing names its images in a column "
                       "'path' or 'image'"):
        shardfmt.convert(listing, tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not list((tmp_path / "out").glob("*.shard")) if (tmp_path / "out").exists() else True


def test_listing_two_image_columns_stay_images(tmp_path: Path, images: Path) -> None:
    listing = write_csv(images / "pairs.csv", [["image", "other"], ["a.jpg", "b.jpg"], ["b.jpg", "a.jpg"]])
    summary = shardfmt.convert(listing, tmp_path / "out")
    assert summary.records == 2
    assert sorted(open_dataset(tmp_path / "out").schema.names) == ["image", "key", "other"]


def write_tar(path: Path, keys: list[str], *, label: int) -> Path:
    import webdataset as wds

    with wds.TarWriter(str(path)) as writer:
        for number, key in enumerate(keys):
            writer.write({"__key__": key, "jpg": jpeg_bytes(16, 24, seed=number), "cls": label})
    return path


@webdataset_leaves_files_open
def test_several_tars_as_several_sources(tmp_path: Path) -> None:
    a = write_tar(tmp_path / "a.tar", ["a0", "a1"], label=0)
    b = write_tar(tmp_path / "b.tar", ["b0", "b1", "b2"], label=1)
    summary = shardfmt.convert([a, b], tmp_path / "out")
    assert (summary.records, summary.rejects) == (5, {})
    dataset = open_dataset(tmp_path / "out")
    direct = open_dataset([str(a), str(b)])
    assert [dataset[i]["key"] for i in range(5)] == [direct[i]["key"] for i in range(5)] == ["a0", "a1", "b0", "b1", "b2"]
    assert [dataset[i]["label"] for i in range(5)] == [0, 0, 1, 1, 1]

    from click.testing import CliRunner

    from shardfmt._cli import main

    result = CliRunner().invoke(main, ["convert", str(a), str(b), str(tmp_path / "cli"), "-q"])
    assert result.exit_code == 0, result.output
    assert len(open_dataset(tmp_path / "cli")) == 5


def test_a_folder_of_parquet_files_is_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "data"
    folder.mkdir()
    for part, labels in enumerate([[0, 1], [1, 0, 1]]):
        table = pa.table({"image": [jpeg_bytes(16, 24, seed=part * 10 + i) for i in range(len(labels))], "label": labels})
        pq.write_table(table, folder / f"train-{part:05d}.parquet")
    summary = shardfmt.convert(folder, tmp_path / "out")
    assert (summary.records, summary.rejects) == (5, {})
    assert [open_dataset(tmp_path / "out")[i]["label"] for i in range(5)] == [0, 1, 1, 0, 1]


def test_tilde_is_expanded_from_python(tmp_path: Path, images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write_csv(images / "train.csv", [["path", "label"], ["a.jpg", "0"], ["b.jpg", "1"]])
    summary = shardfmt.convert("~/images/train.csv", "~/out")
    assert (summary.records, summary.path) == (2, tmp_path / "out")
    assert len(open_dataset("~/out")) == 2
    with shardfmt.Loader("~/out", batch_size=2, shuffle=False, num_workers=0, transform=shardfmt.ImageTransform(size=16)) as loader:
        assert loader.path == tmp_path / "out"


def test_a_missing_file_among_records_is_a_reject(tmp_path: Path, images: Path) -> None:
    records = [{"image": str(images / "a.jpg"), "label": 0}, {"image": str(images / "gone.jpg"), "label": 1},
               {"image": {"bytes": None, "path": str(images / "gone2.jpg")}, "label": 1}, {"image": images / "b.jpg", "label": 1}]
    summary = shardfmt.convert(records, tmp_path / "out")
    assert (summary.records, summary.rejects) == (2, {"missing-file": 2})
    assert [(path, reason) for path, reason, _ in read_rejects(tmp_path / "out")] == [
        ("000000001.img", "missing-file"), ("000000002.img", "missing-file")]
    assert [open_dataset(tmp_path / "out")[i]["key"] for i in range(2)] == ["000000000", "000000003"]


def test_a_missing_file_is_missing_file_in_listings_as_in_parquet(tmp_path: Path, images: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_csv(images / "train.csv", [["path", "label"], ["a.jpg", "0"], ["gone.jpg", "1"]])
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": None, "path": "a.jpg"}, {"bytes": None, "path": "gone.jpg"}], type=image),
                      "label": [0, 1]})
    pq.write_table(table, images / "train.parquet")
    from_listing = shardfmt.convert(images / "train.csv", tmp_path / "csv")
    from_parquet = shardfmt.convert(images / "train.parquet", tmp_path / "parquet")
    assert from_listing.rejects == from_parquet.rejects == {"missing-file": 1}


def test_errors_from_python_name_keywords_and_the_command_its_flags(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardfmt._cli import main

    (tmp_path / "empty").mkdir()
    with pytest.raises(ConvertError, match=r"check the path, or pass allow_empty=True to write an empty dataset$"):
        shardfmt.convert(tmp_path / "empty", tmp_path / "out")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "empty"), str(tmp_path / "out")])
    assert result.exit_code == 1 and result.output.endswith("check the path, or pass --allow-empty to write an empty dataset\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ConvertError, match=r"use resume=True to finish an interrupted conversion, or overwrite=True to replace"):
        shardfmt.convert(tmp_path / "empty", tmp_path / "full", allow_empty=True)
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "empty"), str(tmp_path / "full"), "--allow-empty"])
    assert result.exit_code == 1 and "use --resume to finish an interrupted conversion, or --overwrite to replace" in result.output


@pytest.mark.parametrize("root_option", [False, True])
def test_path_rows_of_parquet_are_sized_by_their_files(tmp_path: Path, images: Path, root_option: bool) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = []
    for i in range(6):
        (images / f"p{i}.jpg").write_bytes(jpeg_bytes(48, 64, seed=40 + i))
        names.append(f"p{i}.jpg")
    sizes = [(images / name).stat().st_size for name in names]
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": None, "path": name} for name in names], type=image), "label": [0, 1] * 3})
    folder = tmp_path / "table" if root_option else images
    folder.mkdir(exist_ok=True)
    pq.write_table(table, folder / "train.parquet")
    summary = shardfmt.convert(folder / "train.parquet", tmp_path / "out", shard_size=sum(sizes[:3]),
                               image_root=images if root_option else None)
    assert (summary.records, summary.input_bytes) == (6, sum(sizes))
    assert [shard.num_records for shard in summary.manifest.shards] == [3, 3]
