"""Tars with any members, as other tools write them: img2dataset's layout (KEY.jpg, KEY.txt,
KEY.json, no label) written with webdataset's ShardWriter, indexed in place and read back field by
field; members that not every sample has are counted, not dropped silently; tar shards written
with further fields read back by webdataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import jpeg_bytes, webdataset_leaves_files_open

from shardfmt import DatasetWriter, ManifestError, open_dataset
from shardfmt._cli import main
from shardfmt._dataset.tars import index_tars
from shardfmt.format._schema import tar_schema
from shardfmt.tar._keys import member_field

wds = pytest.importorskip("webdataset")


def image_text_samples(count: int, *, start: int = 0) -> list[dict[str, Any]]:
    """Samples as img2dataset writes them: a JPEG, a caption and a JSON of metadata per key."""
    return [
        {
            "__key__": f"{i:09d}",
            "jpg": jpeg_bytes(16 + i % 3, 20, seed=i),
            "txt": f"a photo number {i}, caf\u00e9 \u2603",
            "json": {"url": f"https://example.com/{i}.jpg", "width": 20, "similarity": i / 7, "tags": ["a", i]},
        }
        for i in range(start, start + count)
    ]


def write_with_webdataset(folder: Path, samples: list[dict[str, Any]], *, per_tar: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "%05d.tar"), maxcount=per_tar, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    return sorted(folder.glob("*.tar"))


def test_image_text_tars_index_in_place_with_captions_and_metadata(tmp_path: Path) -> None:
    samples = image_text_samples(12)
    write_with_webdataset(tmp_path / "i2d", samples, per_tar=5)
    manifest = index_tars([tmp_path / "i2d"])
    assert manifest.schema == tar_schema(labelled=False, members=(("json", "json"), ("txt", "str")))
    assert manifest.classes is None and manifest.num_records == 12 and manifest.rejects["count"] == 0
    assert manifest.stats["members_not_stored"] == {}
    for dataset in (open_dataset(tmp_path / "i2d"), open_dataset(str(tmp_path / "i2d" / "{00000..00002}.tar"))):
        with dataset:
            assert len(dataset) == 12
            for record, sample in zip(dataset, samples, strict=True):
                assert record["key"] == sample["__key__"]
                assert bytes(record["image"]) == sample["jpg"]
                assert record["txt"] == sample["txt"]
                assert record["json"] == sample["json"]
                assert "label" not in record


def test_the_cli_indexes_image_text_tars_and_info_shows_their_fields(tmp_path: Path) -> None:
    write_with_webdataset(tmp_path / "i2d", image_text_samples(4), per_tar=2)
    result = CliRunner().invoke(main, ["index", str(tmp_path / "i2d")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "4 records in 2 tars, 0 samples rejected",
        "fields: image (jpeg), key (str), json (json), txt (str)",
    ]
    info = CliRunner().invoke(main, ["info", str(tmp_path / "i2d")])
    assert "fields          image (jpeg), key (str), json (json), txt (str)" in info.output
    assert "classes         none (no labels)" in info.output


def test_a_declared_field_type_and_a_member_that_not_every_sample_has(tmp_path: Path) -> None:
    samples = image_text_samples(6)
    for sample in samples[:2]:
        sample["seg.png"] = b"\x89PNG-ish"  # a member only two samples have
    write_with_webdataset(tmp_path / "t", samples, per_tar=3)
    manifest = index_tars([tmp_path / "t"], fields={"json": "bytes"})
    assert manifest.schema == tar_schema(labelled=False, members=(("json", "bytes"), ("txt", "str")))
    assert manifest.stats["members_not_stored"] == {"seg.png": 2}
    with open_dataset(tmp_path / "t") as dataset:
        assert json.loads(bytes(dataset[4]["json"])) == samples[4]["json"]
    info = CliRunner().invoke(main, ["info", str(tmp_path / "t")])
    assert "not stored      .seg.png: 2 (members not in every sample)" in info.output
    with pytest.raises(Exception, match="field 'seg' was declared, but not every sample has a member .seg"):
        index_tars([tmp_path / "t"], fields={"seg": "bytes"}, overwrite=True)


def test_labels_are_optional_but_one_tar_without_them_among_labelled_ones_is_rejected(tmp_path: Path) -> None:
    labelled = [dict(s, cls=str(i % 3)) for i, s in enumerate(image_text_samples(4))]
    write_with_webdataset(tmp_path / "a", labelled, per_tar=4)
    write_with_webdataset(tmp_path / "b", image_text_samples(2, start=10), per_tar=4)
    (tmp_path / "b" / "00000.tar").rename(tmp_path / "a" / "00001.tar")
    manifest = index_tars([tmp_path / "a"])
    assert manifest.schema.names[:3] == ("image", "label", "key") and manifest.classes == ["0", "1", "2"]
    assert manifest.num_records == 4 and manifest.rejects["by_reason"] == {"no-label": 2}
    with open_dataset(tmp_path / "a") as dataset:
        assert [r["label"] for r in dataset] == [0, 1, 2, 0]
        assert [r["txt"] for r in dataset] == [s["txt"] for s in labelled]


def test_a_png_sample_is_not_served_in_place_and_says_to_convert(tmp_path: Path) -> None:
    write_with_webdataset(tmp_path / "p", [{"__key__": "k", "png": b"\x89PNG", "txt": "x"}], per_tar=5)
    manifest = index_tars([tmp_path / "p"])
    report = json.loads((tmp_path / "p" / "rejects.jsonl").read_text())
    assert manifest.rejects["by_reason"] == {"not-a-jpeg": 1}
    assert report["detail"] == "the image member is .png: a tar read in place serves JPEGs; convert the tars (shardfmt convert) to store it"


@webdataset_leaves_files_open
def test_tar_shards_with_fields_are_read_by_webdataset_and_by_shardfmt(tmp_path: Path) -> None:
    schema = tar_schema(labelled=False, members=(("json", "json"), ("txt", "str"), ("raw", "bytes")))
    records = [
        {"image": jpeg_bytes(8, 8, seed=i), "key": f"k{i}", "json": {"i": i, "n": None}, "txt": f"t{i}\u00e9", "raw": bytes([i]) * 3}
        for i in range(5)
    ]
    with DatasetWriter(tmp_path / "out", schema=schema, shard_format="tar", shard_size=3000) as writer:
        for record in records:
            writer.write(record)
    tars = sorted(str(p) for p in (tmp_path / "out").glob("*.tar"))
    seen = [s for s in wds.WebDataset(tars, shardshuffle=False, empty_check=False)]
    assert [s["__key__"] for s in seen] == [r["key"] for r in records]
    for sample, record in zip(seen, records, strict=True):
        assert set(sample) - {"__key__", "__url__", "__local_path__"} == {"jpg", "json", "txt", "raw"}
        assert json.loads(sample["json"]) == record["json"] and sample["txt"].decode() == record["txt"] and sample["raw"] == record["raw"]
    with open_dataset(tmp_path / "out") as dataset:
        assert [dict(r) | {"image": bytes(r["image"]), "raw": bytes(r["raw"])} for r in dataset] == records


def test_a_tar_manifest_refuses_a_member_field_of_another_type(tmp_path: Path) -> None:
    write_with_webdataset(tmp_path / "m", image_text_samples(2), per_tar=5)
    index_tars([tmp_path / "m"])
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    manifest["schema"]["fields"][2]["type"] = "int64"
    (tmp_path / "m" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="field 'json' is int64: a member of a tar shard is str, json, bytes"):
        open_dataset(tmp_path / "m")


@pytest.mark.parametrize(("extension", "name"), [("txt", "txt"), ("seg.png", "seg_png"), ("0.jpg", "_0_jpg"), ("key", None), ("a b", None)])
def test_member_field_names(extension: str, name: str | None) -> None:
    assert member_field(extension) == name


@pytest.mark.parametrize("shard_format", ["binary", "tar"])
@webdataset_leaves_files_open
def test_image_text_tars_convert_with_every_caption_and_json_value(tmp_path: Path, shard_format: str) -> None:
    from converting import convert

    samples = image_text_samples(9)
    samples[4]["txt"] = b"\xff not UTF-8"  # a caption that cannot be text
    write_with_webdataset(tmp_path / "i2d", samples, per_tar=4)
    result = convert(tmp_path / "i2d", tmp_path / "out", workers=2, shard_format=shard_format)
    assert result.manifest.schema == tar_schema(labelled=False, members=(("json", "json"), ("txt", "str")))
    assert result.num_records == 8 and result.manifest.rejects["by_reason"] == {"bad-member": 1}
    kept = samples[:4] + samples[5:]
    with open_dataset(tmp_path / "out") as dataset:
        assert [(r["key"], bytes(r["image"]), r["txt"], r["json"]) for r in dataset] == [
            (s["__key__"], s["jpg"], s["txt"], s["json"]) for s in kept
        ]
    if shard_format == "tar":
        tars = sorted(str(p) for p in (tmp_path / "out").glob("*.tar"))
        again = [s for s in wds.WebDataset(tars, shardshuffle=False, empty_check=False)]
        assert [(s["__key__"], s["txt"].decode(), json.loads(s["json"])) for s in again] == [
            (s["__key__"], s["txt"], s["json"]) for s in kept
        ]


def test_the_cli_converts_tars_with_a_declared_member_kind_and_counts_the_rest(tmp_path: Path) -> None:
    samples = [dict(s, cls=str(i % 2)) for i, s in enumerate(image_text_samples(4))]
    samples[0]["extra"] = b"only here"
    write_with_webdataset(tmp_path / "src", samples, per_tar=4)
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--field", "json=bytes", "-q"])
    assert result.exit_code == 0, result.output
    with open_dataset(tmp_path / "out") as dataset:
        assert dataset.manifest.schema == tar_schema(members=(("json", "bytes"), ("txt", "str")))
        assert dataset.manifest.stats["members_not_stored"] == {"extra": 1}
        assert [(r["label"], json.loads(bytes(r["json"]))) for r in dataset] == [(i % 2, s["json"]) for i, s in enumerate(samples)]


def test_compressed_tars_convert_and_index_says_to_convert_them(tmp_path: Path) -> None:
    import shardfmt

    samples = [dict(s, cls=str(i % 2)) for i, s in enumerate(image_text_samples(7))]
    (tmp_path / "gz").mkdir()
    with wds.ShardWriter(str(tmp_path / "gz" / "%05d.tar.gz"), maxcount=3, verbose=0) as sink:  # webdataset compresses .tar.gz
        for sample in samples:
            sink.write(sample)
    (tmp_path / "gz" / "00002.tar.gz").rename(tmp_path / "gz" / "00002.tgz")
    summary = shardfmt.convert(tmp_path / "gz", tmp_path / "out", workers=2)
    assert (summary.records, summary.rejects) == (7, {})
    assert not (tmp_path / "out" / ".shardfmt-work").exists()
    with open_dataset(tmp_path / "out") as dataset:
        assert [(r["key"], r["label"], r["txt"], r["json"]) for r in dataset] == [
            (s["__key__"], i % 2, s["txt"], s["json"]) for i, s in enumerate(samples)
        ]
    for source in (tmp_path / "gz", tmp_path / "gz" / "00000.tar.gz"):
        result = CliRunner().invoke(main, ["index", str(source)])
        assert result.exit_code == 1 and "a compressed tar (.tar.gz, .tgz) cannot be read in place" in result.output
        assert "convert it (shardfmt convert SRC OUT, which streams it) or decompress it first (gunzip)" in result.output
    with pytest.raises(ValueError, match="a compressed tar"):
        open_dataset(str(tmp_path / "gz" / "00000.tar.gz"))
    (tmp_path / "gz" / "00001.tar.gz").write_bytes((tmp_path / "gz" / "00001.tar.gz").read_bytes()[:200])  # cut short
    summary = shardfmt.convert(tmp_path / "gz", tmp_path / "out2", workers=1)
    assert summary.records == 4 and summary.rejects == {"corrupt": 1}


def test_tars_opened_directly_decide_labels_over_all_of_them_and_cache_it(tmp_path: Path) -> None:
    labelled = [dict(s, cls="1") for s in image_text_samples(2)]
    write_with_webdataset(tmp_path / "a", labelled, per_tar=5)
    write_with_webdataset(tmp_path / "b", image_text_samples(3, start=5), per_tar=5)
    (tmp_path / "a" / "00000.tar").rename(tmp_path / "x.tar")
    (tmp_path / "b" / "00000.tar").rename(tmp_path / "y.tar")
    with open_dataset(str(tmp_path / "y.tar")) as alone:  # no .cls: no labels
        assert alone.manifest.schema.names == ("image", "key", "json", "txt") and len(alone) == 3
    with pytest.warns(UserWarning, match=r"3 samples left out of the index \({'no-label': 3}\)"):
        both = open_dataset([str(tmp_path / "x.tar"), str(tmp_path / "y.tar")])
    with both:
        assert both.manifest.schema.names[:3] == ("image", "label", "key") and [r["label"] for r in both] == [1, 1]
    with open_dataset(str(tmp_path / "y.tar")) as again:  # the cached labelled index is made again
        assert again.manifest.schema.names[:2] == ("image", "key") and len(again) == 3


def test_of_two_extensions_with_one_field_name_the_index_reads_the_first_in_code_point_order(tmp_path: Path) -> None:
    """`seg-png` and `seg.png` are both field `seg_png`: the indexer declares the field from the
    first in code-point order (`seg-png`), so reading the tar in place gives that member's bytes,
    as converting it does, not the other's."""
    import io
    import tarfile

    folder = tmp_path / "tars"
    folder.mkdir()
    with tarfile.open(folder / "a.tar", "w", format=tarfile.PAX_FORMAT) as archive:
        for key in ("s0", "s1"):
            for ext, data in (("jpg", jpeg_bytes()), ("seg-png", f"dash {key}".encode()), ("seg.png", f"dot {key}".encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    index_tars([folder])
    with open_dataset(folder) as reader:
        assert [bytes(record["seg_png"]) for record in reader] == [b"dash s0", b"dash s1"]
