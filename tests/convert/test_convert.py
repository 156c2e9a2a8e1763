"""convert(): inputs, awkward files, rejects report, manifest, determinism, output-folder rules."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import simplejpeg
from conftest import jpeg_bytes, tree_bytes
from converting import convert

from shardfmt import ConvertError, WorkerError, open_dataset
from shardfmt._convert.plan import plan_shards
from shardfmt._synthetic import make_imagefolder
from shardfmt.format import ImageInfo
from shardfmt.format._layout import MAX_RECORDS_PER_SHARD

EXPECTED_REJECTS = [
    ("class_000/nested/loop", "symlink-loop"),
    ("class_001/.hidden.jpg", "hidden"),
    ("class_001/bomb.png", "too-large"),
    ("class_001/notes.txt", "not-an-image"),
    ("class_001/truncated.jpg", "corrupt"),
    ("class_001/zero.jpg", "empty"),
    ("class_002/.cache", "hidden"),
    ("class_002/broken.jpg", "unreadable"),
]


def read_rejects(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


def torchvision_order(root: Path) -> list[tuple[str, int]]:
    """The (path, label) list torchvision's ImageFolder builds, written out from its source."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    found = []
    for label, name in enumerate(classes):
        for folder, _, names in sorted(os.walk(root / name, followlinks=True)):
            found.extend((os.path.relpath(os.path.join(folder, f), root), label) for f in sorted(names))
    return found


def test_awkward_inputs_are_handled_as_documented(awkward_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = convert(awkward_tree, out, workers=1)
    rejects = read_rejects(out)
    assert [(r["path"], r["reason"]) for r in rejects] == EXPECTED_REJECTS
    assert all(r["detail"] for r in rejects)
    assert "No such file" in rejects[-1]["detail"]

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["classes"] == ["class_000", "class_001", "class_002", "empty_class"]
    assert manifest["rejects"] == {
        "count": 8,
        "report": "rejects.jsonl",
        "by_reason": {"corrupt": 1, "empty": 1, "hidden": 2, "not-an-image": 1, "symlink-loop": 1, "too-large": 1, "unreadable": 1},
    }
    stats = manifest["stats"]
    assert stats["reencoded"] == {"cmyk": 1, "exif-rotated": 1, "not-jpeg": 1, "progressive": 1, "resized": 0}
    assert stats["passthrough"] == 18 + 3  # generated, nested/deeper/inner, gray, café
    assert stats["empty_classes"] == 1
    assert manifest["converter"]["name"] == "shardfmt" and "workers" not in manifest["converter"]["options"]
    assert result.num_records == manifest["num_records"] == 25 and result.num_rejects == 8

    with open_dataset(out) as dataset:
        records = {record["key"]: record for record in dataset}
        for key, record in records.items():
            assert record["label"] == int(key[len("class_00")]), key
            simplejpeg.decode_jpeg(record["image"], strict=True)
        assert "class_002/caf\\xe9" in records
        assert records["class_001/rotated"].image_info() == ImageInfo(height=40, width=24, channels=3)
        assert records["class_001/gray"].image_info().channels == 1
        assert bytes(records["class_000/img_00000"]["image"]) == (awkward_tree / "class_000/img_00000.JPEG").read_bytes()
        assert "class_001/png_named" in records and "class_001/notes" not in records


def test_files_are_taken_in_torchvision_order(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for folder in ["b", "a", "a/x", "a b", "a/x/y", "A"]:
        (root / "c1" / folder).mkdir(parents=True, exist_ok=True)
        for name in ["2.jpg", "10.jpg", "B.jpg"]:
            (root / "c1" / folder / name).write_bytes(jpeg_bytes(8, 8))
    (root / "C0").mkdir()
    (root / "C0" / "z.jpg").write_bytes(jpeg_bytes(8, 8))
    convert(root, tmp_path / "out", workers=1)
    with open_dataset(tmp_path / "out") as dataset:
        got = [(record["key"], record["label"]) for record in dataset]
    assert got == [(os.path.splitext(path)[0], label) for path, label in torchvision_order(root)]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["classes"] == ["C0", "c1"]


def test_output_is_byte_identical_for_any_number_of_workers(awkward_tree: Path, tmp_path: Path) -> None:
    one = convert(awkward_tree, tmp_path / "one", workers=1, shard_size=2500)
    two = convert(awkward_tree, tmp_path / "two", workers=2, shard_size=2500)
    assert len(one.manifest.shards) > 4
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    assert two.num_records == one.num_records


def test_shards_follow_input_sizes_and_all_rejected_shards_are_not_written(tmp_path: Path) -> None:
    assert plan_shards([10, 10, 10, 10, 10], shard_size=20) == [(0, 2), (2, 4), (4, 5)]
    assert plan_shards([50, 1, 1], shard_size=20) == [(0, 1), (1, 3)]
    assert plan_shards([1] * 5, shard_size=100, max_records=2) == [(0, 2), (2, 4), (4, 5)]
    assert plan_shards([], shard_size=1) == []
    assert MAX_RECORDS_PER_SHARD == 1 << 24

    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "a" / "1.jpg").write_bytes(jpeg_bytes(8, 8))
    (root / "a" / "2.txt").write_bytes(b"x" * 100)
    (root / "a" / "3.jpg").write_bytes(jpeg_bytes(8, 8, seed=1))
    result = convert(root, tmp_path / "out", shard_size=50, workers=1)
    assert [s.path for s in result.manifest.shards] == ["shard-00000.shard", "shard-00002.shard"]
    assert not (tmp_path / "out" / "shard-00001.shard").exists()
    assert not (tmp_path / "out" / ".shardfmt-work").exists()


def test_listing_files_csv_with_class_names_and_jsonl_with_integers(tmp_path: Path) -> None:
    (tmp_path / "img" / "sub").mkdir(parents=True)
    for i in range(4):
        (tmp_path / "img" / "sub" / f"{i}.jpg").write_bytes(jpeg_bytes(10, 12, seed=i))
    (tmp_path / "list.csv").write_text("path,label\nimg/sub/2.jpg,dog\nimg/sub/0.jpg,cat\nimg/missing.jpg,cat\n./img/sub/1.jpg,dog\n")
    convert(tmp_path / "list.csv", tmp_path / "csv-out", workers=1)
    with open_dataset(tmp_path / "csv-out") as dataset:
        assert dataset.classes == ["cat", "dog"]
        assert [(r["key"], r["label"]) for r in dataset] == [("img/sub/2", 1), ("img/sub/0", 0), ("img/sub/1", 1)]
    assert [(r["path"], r["reason"]) for r in read_rejects(tmp_path / "csv-out")] == [("img/missing.jpg", "missing-file")]

    lines = [{"path": "img/sub/3.jpg", "label": 7}, {"path": "img/sub/0.jpg", "label": 0}]
    (tmp_path / "list.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    convert(tmp_path / "list.jsonl", tmp_path / "jsonl-out", workers=1)
    with open_dataset(tmp_path / "jsonl-out") as dataset:
        assert dataset.classes is None
        assert [(r["key"], r["label"]) for r in dataset] == [("img/sub/3", 7), ("img/sub/0", 0)]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "file,label\nx.jpg,1\n", "line 1: the columns are file, label; a listing names its images in a column 'path'"),
        ("b.jsonl", '{"path": "x.jpg", "label": 1}\n{"path": "y.jpg", "label": "cat"}\n', "line 2: labels must be all"),
        ("c.jsonl", '{"path": "", "label": 1}\n', "line 1: path '' must be a non-empty path relative"),
        ("d.csv", "path,label\nx.jpg,1\n,2\n", "line 3: path '' must be a non-empty path relative"),
        ("e.jsonl", "{not json\n", "line 1: not JSON"),
        ("f.jsonl", '{"path": "x.jpg", "label": true}\n', "line 1: label must be an integer or a string"),
    ],
)
def test_malformed_listings_name_the_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConvertError, match=message.replace("(", r"\(")) as caught:
        convert(tmp_path / name, tmp_path / "out", workers=1)
    assert caught.value.path == str(tmp_path / name)


def test_non_empty_output_needs_resume_or_overwrite_and_overwrite_touches_only_own_files(imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    with pytest.raises(ConvertError, match="resume=True.*overwrite=True"):
        convert(imagefolder, out, workers=1)
    convert(imagefolder, out, workers=1, overwrite=True)
    (out / "shard-00099.shard").write_bytes(b"stale")
    convert(imagefolder, out, workers=1, overwrite=True)
    assert (out / "notes.md").read_text() == "mine"
    assert not (out / "shard-00099.shard").exists()
    with pytest.raises(ConvertError, match="exclude each other"):
        convert(imagefolder, out, resume=True, overwrite=True)
    with pytest.raises(ConvertError, match="inside the source"):
        convert(imagefolder, imagefolder / "out")
    with pytest.raises(ConvertError, match="does not exist"):
        convert(tmp_path / "nowhere", tmp_path / "out2")
    with pytest.raises(ValueError, match="quality"):
        convert(imagefolder, tmp_path / "out3", quality=0)


def test_an_empty_source_is_an_error_that_names_it_unless_allowed(tmp_path: Path) -> None:
    (tmp_path / "src" / "cats").mkdir(parents=True)
    (tmp_path / "src" / ".hidden.JPEG").write_bytes(b"x")
    with pytest.raises(
        ConvertError, match=r"src: no image found: looked for image files in class sub-folders .*1 entries were set aside \(1 hidden\)"
    ) as caught:
        convert(tmp_path / "src", tmp_path / "out", workers=1)
    assert caught.value.path == str(tmp_path / "src")
    assert not (tmp_path / "out").exists()  # the folder this run created is not left behind
    result = convert(tmp_path / "src", tmp_path / "out", workers=1, allow_empty=True)
    assert result.num_records == 0 and result.manifest.shards == ()
    with open_dataset(tmp_path / "out") as dataset:
        assert len(dataset) == 0 and dataset.classes == ["cats"]


def test_an_empty_listing_is_an_error_too(tmp_path: Path) -> None:
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\n")
    with pytest.raises(ConvertError, match="no image found: looked for rows of path,label in the listing"):
        convert(listing, tmp_path / "out", workers=1)


def test_unreadable_file_is_rejected_with_the_os_error(imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = str(imagefolder / "class_001" / "img_00009.JPEG")
    real_open = os.open

    def refusing_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == victim:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    convert(imagefolder, tmp_path / "out", workers=1)
    assert read_rejects(tmp_path / "out") == [
        {"path": "class_001/img_00009.JPEG", "reason": "unreadable", "detail": "Permission denied (errno 13)"}
    ]


def test_strict_finishes_the_dataset_then_names_the_first_reject(awkward_tree: Path, tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="symlink-loop: .*the first of 8 rejects") as caught:
        convert(awkward_tree, tmp_path / "out", workers=1, strict=True)
    assert caught.value.path == str(awkward_tree / "class_000/nested/loop")
    assert len(read_rejects(tmp_path / "out")) == 8
    with open_dataset(tmp_path / "out") as dataset:
        assert len(dataset) == 25


def test_a_failing_task_names_shard_and_input_instead_of_hanging(
    imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardfmt._convert import records as convert_records

    real = convert_records.store_image

    def failing(data: bytes, **kwargs: Any) -> Any:
        if data == (imagefolder / "class_002" / "img_00020.JPEG").read_bytes():
            raise RuntimeError("simulated bug")
        return real(data, **kwargs)

    monkeypatch.setattr(convert_records, "store_image", failing)  # inherited by forked workers
    with pytest.raises(WorkerError, match=r"shard-\d{5}\.shard: input class_002/img_00020.JPEG: RuntimeError: simulated bug"):
        convert(imagefolder, tmp_path / "out", workers=2, shard_size=4000)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_dying_worker_is_reported_not_waited_for(imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfmt._convert import records as convert_records

    def dying(data: bytes, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(convert_records, "store_image", dying)
    with pytest.raises(WorkerError, match="worker process died"):
        convert(imagefolder, tmp_path / "out", workers=2, shard_size=4000)


def test_progress_bar_counts_every_image_from_worker_processes(
    imagefolder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    convert(imagefolder, tmp_path / "out", workers=2, shard_size=4000, progress=True)
    assert "24/24" in capsys.readouterr().err
    convert(imagefolder, tmp_path / "quiet", workers=2, shard_size=4000)
    assert capsys.readouterr().err == ""


def test_max_side_is_recorded_and_applied(tmp_path: Path) -> None:
    src = make_imagefolder(tmp_path / "src", num_classes=1, per_class=3, size=(80, 100), jitter=0, seed=4)
    result = convert(src, tmp_path / "out", workers=1, max_side=50, quality=80)
    assert result.manifest.stats["reencoded"]["resized"] == 3
    assert result.manifest.converter["options"] == {"max_side": 50, "quality": 80, "shard_size": 256 << 20}
    with open_dataset(tmp_path / "out") as dataset:
        assert {(r.image_info().height, r.image_info().width) for r in dataset} == {(40, 50)}
