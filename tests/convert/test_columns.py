"""Every member and column of a source is kept, or said to be left out: tars whose samples lack a
declared member, and Parquet, Arrow and ``datasets`` sources with label and further columns."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import jpeg_bytes

import shardfmt
from shardfmt import ConvertError, open_dataset
from shardfmt._cli import main
from shardfmt._convert.plan import PlannedRecord

wds = pytest.importorskip("webdataset")


def run(*args: Any) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def read_rejects(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


def captioned_tar(path: Path, *, count: int, uncaptioned: set[int]) -> Path:
    """A tar written by webdataset: samples with a JPEG and a caption, but some without caption."""
    with wds.TarWriter(str(path)) as writer:
        for n in range(count):
            sample: dict[str, Any] = {"__key__": f"s{n:03d}", "jpg": jpeg_bytes(16, 16, seed=n)}
            if n not in uncaptioned:
                sample["txt"] = f"caption {n}"
            writer.write(sample)
    return path


def test_tar_declared_member_is_kept_and_samples_without_it_rejected(tmp_path: Path) -> None:
    tar = captioned_tar(tmp_path / "part.tar", count=10, uncaptioned={3, 7})
    code, output = run("convert", tar, tmp_path / "out", "--field", "txt=str", "--workers", "1")
    assert code == 0, output
    assert "8 records" in output and "2 rejected" in output
    with open_dataset(tmp_path / "out") as reader:
        assert reader.schema.names == ("image", "key", "txt")
        assert [(r["key"], r["txt"]) for r in reader] == [(f"s{n:03d}", f"caption {n}") for n in range(10) if n not in (3, 7)]
    rejects = read_rejects(tmp_path / "out")
    assert [(r["key"], r["reason"]) for r in rejects] == [("s003", "missing-member"), ("s007", "missing-member")]
    assert "txt" in rejects[0]["detail"]


def test_tar_member_not_in_every_sample_is_reported_by_convert(tmp_path: Path) -> None:
    tar = captioned_tar(tmp_path / "part.tar", count=10, uncaptioned={3, 7})
    code, output = run("convert", tar, tmp_path / "out", "--workers", "1")
    assert code == 0, output
    assert "10 records" in output
    assert "members not stored (not in every sample; --field NAME=KIND keeps one): .txt: 8" in output
    with open_dataset(tmp_path / "out") as reader:
        assert "txt" not in reader.schema.names


def test_tar_declared_member_that_no_sample_has_is_an_error(tmp_path: Path) -> None:
    tar = captioned_tar(tmp_path / "part.tar", count=3, uncaptioned=set())
    code, output = run("convert", tar, tmp_path / "out", "--field", "json=json")
    assert code == 1 and "field 'json' was declared, but no sample of the tars has a member .json" in output


datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def cifar100_like(count: int = 4) -> Any:
    """A ``datasets.Dataset`` laid out as CIFAR-100 on the Hub: ``img``, ``fine_label`` and
    ``coarse_label`` (both ClassLabel), here with a caption column too."""
    features = datasets.Features({
        "img": datasets.Image(),
        "fine_label": datasets.ClassLabel(names=["apple", "bee", "cat"]),
        "coarse_label": datasets.ClassLabel(names=["fruit", "animal"]),
        "caption": datasets.Value("string"),
    })
    table = {"img": [{"bytes": jpeg_bytes(16, 16, seed=n), "path": None} for n in range(count)],
             "fine_label": [n % 3 for n in range(count)], "coarse_label": [min(n % 3, 1) for n in range(count)],
             "caption": [f"picture {n}" for n in range(count)]}
    return datasets.Dataset.from_dict(table, features=features)


def records(out: Path) -> list[dict[str, Any]]:
    with open_dataset(out) as reader:
        return [{name: (bytes(value) if isinstance(value, memoryview) else value) for name, value in record.items()}
                for record in reader]


def test_several_classlabel_columns_and_none_chosen_is_an_error_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match=r"the features name 2 ClassLabel columns \(fine_label, coarse_label\): which is the label\? "
                                           r"pass --label-column NAME \(label_column='NAME'\)"):
        shardfmt.convert(cifar100_like(), tmp_path / "out", image_column="img", workers=1)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_chosen_label_column_and_every_other_column_kept(tmp_path: Path) -> None:
    summary = shardfmt.convert(cifar100_like(), tmp_path / "out", image_column="img", label_column="fine_label", workers=1)
    assert summary.records == 4 and summary.rejects == {}
    assert summary.manifest.classes == ["apple", "bee", "cat"]
    assert summary.manifest.stats["columns_kept"] == ["coarse_label", "caption"]
    with open_dataset(tmp_path / "out") as reader:
        assert [(f.name, f.type) for f in reader.schema.fields] == [
            ("image", "jpeg"), ("label", "int64"), ("coarse_label", "int64"), ("caption", "str"), ("key", "str")]
    got = records(tmp_path / "out")
    assert [(r["label"], r["coarse_label"], r["caption"]) for r in got] == [(0, 0, "picture 0"), (1, 1, "picture 1"),
                                                                             (2, 1, "picture 2"), (0, 0, "picture 3")]
    assert [r["image"] for r in got] == [jpeg_bytes(16, 16, seed=n) for n in range(4)]


def test_the_one_classlabel_column_is_the_label_whatever_its_name(tmp_path: Path) -> None:
    dataset = cifar100_like().remove_columns("coarse_label").rename_column("img", "image")
    summary = shardfmt.convert(dataset, tmp_path / "out", workers=1)
    assert summary.manifest.classes == ["apple", "bee", "cat"]
    assert [(r["label"], r["caption"]) for r in records(tmp_path / "out")] == [
        (0, "picture 0"), (1, "picture 1"), (2, "picture 2"), (0, "picture 3")]


def test_without_a_label_column_records_have_no_label_not_zeros(tmp_path: Path) -> None:
    dataset = cifar100_like().remove_columns(["fine_label", "coarse_label"]).rename_column("img", "image")
    summary = shardfmt.convert(dataset, tmp_path / "out", workers=1)
    assert summary.manifest.classes is None
    got = records(tmp_path / "out")
    assert [sorted(r) for r in got][0] == ["caption", "image", "key"]
    assert [r["caption"] for r in got] == [f"picture {n}" for n in range(4)]


def test_integer_columns_without_a_chosen_label_are_an_error_and_none_is_a_choice(tmp_path: Path) -> None:
    table = pa.table({"image": pa.array([jpeg_bytes(16, 16, seed=n) for n in range(3)], pa.binary()),
                      "fine_label": pa.array([4, 7, 9], pa.int64()), "width": pa.array([16, 16, 16], pa.int32())})
    pq.write_table(table, tmp_path / "plain.parquet")
    code, output = run("convert", tmp_path / "plain.parquet", tmp_path / "out", "--workers", "1")
    assert code == 1
    assert "no label column chosen, and integer columns could be one (fine_label, width): pass --label-column NAME" in output
    code, output = run("convert", tmp_path / "plain.parquet", tmp_path / "out", "--workers", "1", "--label-column", "none")
    assert code == 0, output
    assert [(r["fine_label"], r["width"]) for r in records(tmp_path / "out")] == [(4, 16), (7, 16), (9, 16)]
    assert "label" not in records(tmp_path / "out")[0]
    code, output = run("convert", tmp_path / "plain.parquet", tmp_path / "lab", "--workers", "1", "--label-column", "fine_label",
                       "--drop-column", "width")
    assert code == 0, output
    assert "columns kept: none" in output and "columns dropped: width" in output
    assert [sorted(r) for r in records(tmp_path / "lab")][0] == ["image", "key", "label"]
    assert [r["label"] for r in records(tmp_path / "lab")] == [4, 7, 9]


def test_a_hub_test_split_of_minus_one_labels_is_rejected_or_converted_without_labels(tmp_path: Path) -> None:
    dataset = cifar100_like(3).remove_columns(["coarse_label", "caption"]).rename_column("img", "image")
    dataset = dataset.map(lambda row: {"fine_label": -1})
    with pytest.raises(ConvertError, match=r"no image found: looked for rows in the Parquet files; 3 entries were set aside "
                                           r"\(3 no-label\)"):
        shardfmt.convert(dataset, tmp_path / "out", workers=1)
    summary = shardfmt.convert(dataset, tmp_path / "out", workers=1, allow_empty=True, overwrite=True)
    assert summary.records == 0 and summary.rejects == {"no-label": 3}
    summary = shardfmt.convert(dataset, tmp_path / "none", label_column="none", workers=1)
    assert summary.records == 3 and summary.manifest.classes is None
    assert [(sorted(r), r["fine_label"]) for r in records(tmp_path / "none")] == [(["fine_label", "image", "key"], -1)] * 3


def test_parquet_columns_of_every_kind_are_kept_and_declared(tmp_path: Path) -> None:
    table = pa.table({
        "image": pa.array([jpeg_bytes(16, 16, seed=n) for n in range(3)], pa.binary()),
        "label": pa.array([1, 0, 1], pa.int64()),
        "caption": pa.array(["a dog", "a cat", "two dogs"]),
        "count": pa.array([3, -2, 1 << 40], pa.int64()),
        "score": pa.array([0.5, 1.25, -3.0], pa.float32()),
        "tags": pa.array([["x"], [], ["y", "z"]], pa.list_(pa.string())),
        "box": pa.array([{"w": 1, "h": 2}, {"w": 3, "h": 4}, {"w": 5, "h": 6}]),
        "blob": pa.array([b"\x00\x01", b"", b"\xff"], pa.binary()),
        "width": pa.array([16, 16, 16], pa.int16()),
    })
    pq.write_table(table, tmp_path / "rich.parquet")
    code, output = run("convert", tmp_path / "rich.parquet", tmp_path / "out", "--workers", "1", "--field", "width=float64")
    assert code == 0, output
    assert "columns kept: caption, count, score, tags, box, blob, width\ncolumns dropped: none" in output
    with open_dataset(tmp_path / "out") as reader:
        assert [(f.name, f.type) for f in reader.schema.fields] == [
            ("image", "jpeg"), ("label", "int64"), ("caption", "str"), ("count", "int64"), ("score", "float64"),
            ("tags", "json"), ("box", "json"), ("blob", "bytes"), ("width", "float64"), ("key", "str")]
    got = records(tmp_path / "out")
    assert [(r["label"], r["caption"], r["count"], r["score"], r["tags"], r["box"], r["blob"], r["width"]) for r in got] == [
        (1, "a dog", 3, 0.5, ["x"], {"w": 1, "h": 2}, b"\x00\x01", 16.0),
        (0, "a cat", -2, 1.25, [], {"w": 3, "h": 4}, b"", 16.0),
        (1, "two dogs", 1 << 40, -3.0, ["y", "z"], {"w": 5, "h": 6}, b"\xff", 16.0),
    ]
    code, output = run("info", tmp_path / "out")
    assert code == 0 and "columns kept    caption, count, score, tags, box, blob, width\ncolumns dropped none" in output


def img2dataset_parquet(path: Path, count: int) -> None:
    """Parquet as img2dataset writes it with ``output_format=parquet``: the image bytes in ``jpg``
    beside its metadata columns, some of them null."""
    table = pa.table({
        "jpg": pa.array([jpeg_bytes(16, 20, seed=n) for n in range(count)], pa.binary()),
        "url": pa.array([f"http://127.0.0.1/{n}.jpg" for n in range(count)]),
        "caption": pa.array([f"caption {n}" for n in range(count)]),
        "key": pa.array([f"{n:09d}" for n in range(count)]),
        "status": pa.array(["success"] * count),
        "error_message": pa.array([None] * count, pa.string()),
        "width": pa.array([20] * count, pa.int64()),
        "height": pa.array([16] * count, pa.int64()),
        "original_width": pa.array([40] * count, pa.int64()),
        "original_height": pa.array([32] * count, pa.int64()),
        "exif": pa.array(["{}" if n % 2 else None for n in range(count)], pa.string()),
        "sha256": pa.array([f"{n:064x}" for n in range(count)]),
    })
    pq.write_table(table, path)


def test_img2dataset_parquet_keeps_captions_and_metadata_without_a_label(tmp_path: Path) -> None:
    img2dataset_parquet(tmp_path / "00000.parquet", 3)
    code, output = run("convert", tmp_path / "00000.parquet", tmp_path / "out", "--workers", "1", "--image-column", "jpg",
                       "--key-column", "key", "--label-column", "none", "--drop-column", "sha256")
    assert code == 0, output
    assert "columns dropped: sha256" in output
    got = records(tmp_path / "out")
    assert [r["key"] for r in got] == ["000000000", "000000001", "000000002"]
    assert [(r["caption"], r["url"], r["width"], r["height"], r["error_message"], r["exif"]) for r in got] == [
        ("caption 0", "http://127.0.0.1/0.jpg", 20, 16, None, None),
        ("caption 1", "http://127.0.0.1/1.jpg", 20, 16, None, "{}"),
        ("caption 2", "http://127.0.0.1/2.jpg", 20, 16, None, None),
    ]
    assert "label" not in got[0] and "sha256" not in got[0]
    with open_dataset(tmp_path / "out") as reader:
        kinds = {f.name: f.type for f in reader.schema.fields}
    assert (kinds["caption"], kinds["error_message"], kinds["exif"], kinds["original_width"]) == ("str", "json", "json", "int64")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["converter"]["options"]["drop_columns"] == ["sha256"]
    assert manifest["stats"]["columns_dropped"] == ["sha256"]


def test_a_declared_kind_that_a_value_does_not_fit_rejects_its_record(tmp_path: Path) -> None:
    img2dataset_parquet(tmp_path / "00000.parquet", 3)
    code, output = run("convert", tmp_path / "00000.parquet", tmp_path / "out", "--workers", "1", "--image-column", "jpg",
                       "--key-column", "key", "--label-column", "none", "--field", "exif=str")
    assert code == 0, output
    assert [r["key"] for r in records(tmp_path / "out")] == ["000000001"]
    assert [(r["key"], r["reason"], r["detail"]) for r in read_rejects(tmp_path / "out")] == [
        ("000000000", "null-value", "column 'exif' is null, and is stored as str"),
        ("000000002", "null-value", "column 'exif' is null, and is stored as str"),
    ]


def test_a_datasetdict_object_gets_the_message_of_a_saved_one(tmp_path: Path) -> None:
    splits = datasets.DatasetDict(train=cifar100_like(2), test=cifar100_like(1))
    with pytest.raises(ConvertError, match=r"a DatasetDict: convert one split \(src\['train'\]; its splits: train, test\)"):
        shardfmt.convert(splits, tmp_path / "out")


def test_a_second_image_dates_and_nested_bytes(tmp_path: Path) -> None:
    features = datasets.Features({"image": datasets.Image(), "mask": datasets.Image(), "taken": datasets.Value("date32")})
    table = {"image": [{"bytes": jpeg_bytes(16, 16, seed=n), "path": None} for n in range(2)],
             "mask": [{"bytes": jpeg_bytes(8, 8, seed=10 + n), "path": None} for n in range(2)],
             "taken": [datetime.date(2024, 1, 1 + n) for n in range(2)]}
    summary = shardfmt.convert(datasets.Dataset.from_dict(table, features=features), tmp_path / "out", workers=1)
    assert summary.manifest.classes is None
    assert [(r["mask"], r["taken"]) for r in records(tmp_path / "out")] == [
        (jpeg_bytes(8, 8, seed=10), "2024-01-01"), (jpeg_bytes(8, 8, seed=11), "2024-01-02")]
    nested = pa.table({"image": pa.array([jpeg_bytes(16, 16, seed=0)], pa.binary()), "parts": pa.array([[b"a"]], pa.list_(pa.binary()))})
    pq.write_table(nested, tmp_path / "nested.parquet")
    with pytest.raises(ConvertError, match=r"column 'parts' holds list<element: binary>, bytes inside a list or struct, which no "
                                           r"field kind holds: leave it out with --drop-column parts"):
        shardfmt.convert(tmp_path / "nested.parquet", tmp_path / "nested", workers=1)


def test_a_plan_of_further_columns_reads_back_as_written() -> None:
    record = PlannedRecord((), "k", (b"\x00\xff", None, ["x", {"float": 1}], {"json": 2}, 1.5, "t", 3))
    assert PlannedRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_declared_tar_member_from_python(tmp_path: Path) -> None:
    tar = captioned_tar(tmp_path / "part.tar", count=4, uncaptioned={0})
    summary = shardfmt.convert(tar, tmp_path / "out", fields={"txt": "str"}, workers=1)
    assert summary.records == 3 and summary.rejects == {"missing-member": 1}
    assert [r["txt"] for r in records(tmp_path / "out")] == ["caption 1", "caption 2", "caption 3"]


def test_a_key_column_not_chosen_as_the_keys_says_how_to_take_it(tmp_path: Path) -> None:
    img2dataset_parquet(tmp_path / "00000.parquet", 2)
    code, output = run("convert", tmp_path / "00000.parquet", tmp_path / "out", "--image-column", "jpg", "--label-column", "none")
    assert code == 1
    assert ("column 'key' cannot be a field (a name taken by the record, or not an identifier of 1 to 64 characters): take it as "
            "the keys with --key-column key (key_column=), or leave it out with --drop-column key (drop_columns=)") in output


def test_tar_output_of_a_source_with_further_columns_is_refused_with_the_fix(tmp_path: Path) -> None:
    table = pa.table({"image": pa.array([jpeg_bytes(16, 16, seed=0)], pa.binary()), "caption": pa.array(["a"])})
    pq.write_table(table, tmp_path / "one.parquet")
    code, output = run("convert", tmp_path / "one.parquet", tmp_path / "out", "--format", "tar")
    assert code == 1
    assert "this source has further columns (caption): convert to binary shards, or leave them out with --drop-column" in output
    code, output = run("convert", tmp_path / "one.parquet", tmp_path / "out", "--format", "tar", "--drop-column", "caption")
    assert code == 0, output
    with open_dataset(tmp_path / "out") as reader:
        assert reader.schema.names == ("image", "key")


def test_no_label_chosen_with_a_column_named_label_asks_to_drop_it(tmp_path: Path) -> None:
    table = pa.table({"image": pa.array([jpeg_bytes(16, 16, seed=0)], pa.binary()), "label": pa.array([3]), "caption": pa.array(["a"])})
    pq.write_table(table, tmp_path / "one.parquet")
    code, output = run("convert", tmp_path / "one.parquet", tmp_path / "out", "--label-column", "none")
    assert code == 1 and "column 'label' cannot be a field" in output and "--drop-column label" in output
    code, output = run("convert", tmp_path / "one.parquet", tmp_path / "out", "--label-column", "none", "--drop-column", "label")
    assert code == 0, output
    assert records(tmp_path / "out")[0]["caption"] == "a" and "label" not in records(tmp_path / "out")[0]
