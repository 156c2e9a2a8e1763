"""The converter with WebDataset tars: tar shards as output (--format tar), tars as input, both
through the library and the CLI, deterministic whatever the number of workers."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import jpeg_bytes, tree_bytes, webdataset_leaves_files_open
from converting import convert
from PIL import Image

from shardfmt import ConvertError, ImageTransform, Loader, open_dataset
from shardfmt._cli import main
from shardfmt._convert import destination as convert_output
from shardfmt._dataset.verify import verify_dataset
from shardfmt._synthetic import make_image
from shardfmt.tar._reader import TarShardReader

wds = pytest.importorskip("webdataset")


def read_rejects(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


def run(*args: Any) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


@webdataset_leaves_files_open
def test_tar_output_is_deterministic_and_read_by_everyone(imagefolder: Path, tmp_path: Path) -> None:
    dotted = imagefolder / "class_001" / "img.v2.00008.JPEG"
    (imagefolder / "class_001" / "img_00008.JPEG").rename(dotted)
    one = convert(imagefolder, tmp_path / "one", workers=1, shard_size=12_000, shard_format="tar")
    two = convert(imagefolder, tmp_path / "two", workers=2, shard_size=12_000, shard_format="tar")
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    manifest = one.manifest
    assert manifest.shard_format == "tar" and len(manifest.shards) > 1 and manifest.num_records == 24
    assert [s.path for s in manifest.shards] == [f"shard-{i:05d}.tar" for i in range(len(manifest.shards))]
    assert all(s.index is not None and s.index.path == s.path + ".idx" for s in manifest.shards)
    assert two.manifest == manifest and verify_dataset(tmp_path / "one").ok

    binary = convert(imagefolder, tmp_path / "bin", workers=1, shard_size=12_000)
    with open_dataset(tmp_path / "bin") as reader:
        expected = [(r["key"].replace("img.v2.", "img_v2_"), r["label"], bytes(r["image"])) for r in reader]
    with open_dataset(tmp_path / "one") as reader:
        assert [(r["key"], r["label"], bytes(r["image"])) for r in reader] == expected
    assert ("class_001/img_v2_00008", 1) in [(k, label) for k, label, _ in expected]
    urls = [str(tmp_path / "one" / s.path) for s in manifest.shards]
    theirs = [(s["__key__"], int(s["cls"]), s["jpg"]) for s in wds.WebDataset(urls, shardshuffle=False)]
    assert theirs == expected
    assert binary.manifest.classes == manifest.classes

    options: dict[str, Any] = dict(batch_size=5, seed=2, num_workers=0, transform=ImageTransform(size=16))
    with Loader(tmp_path / "bin", **options) as a, Loader(tmp_path / "one", **options) as b:
        for (images_a, labels_a), (images_b, labels_b) in zip(a, b, strict=True):
            assert labels_a.tolist() == labels_b.tolist() and bytes(images_a.numpy()) == bytes(images_b.numpy())


def write_wds(path: Path, samples: list[dict[str, Any]]) -> Path:
    with wds.TarWriter(str(path)) as writer:
        for sample in samples:
            writer.write(sample)
    return path


def awkward_tars(folder: Path) -> list[tuple[str, int, bytes]]:
    """Two webdataset tars with samples the converter keeps, re-encodes and rejects; returns
    (key, label, image bytes) of the JPEGs it keeps byte for byte."""
    folder.mkdir()
    good = [(f"a/{i:03d}", i, jpeg_bytes(20, 24, seed=i)) for i in range(4)]
    png = io.BytesIO()
    Image.fromarray(make_image(10, 12, seed=9)).save(png, "PNG")
    write_wds(folder / "part-0.tar", [{"__key__": k, "jpg": image, "cls": label} for k, label, image in good[:2]] + [
        {"__key__": "a/png", "png": png.getvalue(), "cls": 5},
        {"__key__": "a/nolabel", "jpg": good[0][2]},
        {"__key__": "a/text", "txt": "no image", "cls": 1},
    ])
    write_wds(folder / "part-1.tar", [{"__key__": k, "jpg": image, "cls": label} for k, label, image in good[2:]] + [
        {"__key__": "a/cut", "jpg": good[0][2][:100], "cls": 0},
        {"__key__": "a/badlabel", "jpg": good[0][2], "cls": "x"},
    ])
    (folder / "part-2.tar").write_bytes(b"not a tar" * 100)
    return good


def test_webdataset_tars_as_input(tmp_path: Path) -> None:
    good = awkward_tars(tmp_path / "wds")
    result = convert(tmp_path / "wds", tmp_path / "out", workers=1)
    assert result.manifest.converter["input"] == "webdataset" and result.manifest.classes == [str(i) for i in range(6)]
    with open_dataset(tmp_path / "out") as reader:
        records = [(r["key"], r["label"], bytes(r["image"])) for r in reader]
    assert records[:2] == good[:2] and records[3:] == good[2:]
    assert records[2][:2] == ("a/png", 5)
    assert result.manifest.stats["reencoded"]["not-jpeg"] == 1 and result.manifest.stats["passthrough"] == 4
    assert [(r["path"], r.get("key"), r["reason"]) for r in read_rejects(tmp_path / "out")] == [
        ("part-0.tar", "a/nolabel", "no-label"),
        ("part-0.tar", "a/text", "no-image"),
        ("part-1.tar", "a/cut", "corrupt"),
        ("part-1.tar", "a/badlabel", "bad-label"),
        ("part-2.tar", None, "corrupt"),
    ]
    again = convert(str(tmp_path / "wds" / "part-{0,1}.tar"), tmp_path / "tars", workers=2, shard_format="tar")
    with open_dataset(tmp_path / "tars") as reader:
        assert [(r["key"], r["label"], bytes(r["image"])) for r in reader] == records
    assert again.num_rejects == 4


def test_tar_to_tar_keeps_keys_that_are_not_utf8(tmp_path: Path) -> None:
    image = jpeg_bytes(8, 8)
    path = tmp_path / "in.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as archive:
        for name, data in [("caf\udce9.jpg", image), ("caf\udce9.cls", b"3"), ("x/.jpg", image), ("x/.cls", b"1")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    convert(path, tmp_path / "tar", workers=1, shard_format="tar")
    with TarShardReader(tmp_path / "tar" / "shard-00000.tar") as reader:
        assert [(r["key"], r["label"]) for r in reader] == [("caf\udce9", 3)]
    assert [(r["key"], r["reason"]) for r in read_rejects(tmp_path / "tar")] == [("x/", "bad-key")]
    convert(path, tmp_path / "bin", workers=1)
    with open_dataset(tmp_path / "bin") as reader:  # "x/" breaks the key rule of every output
        assert [r["key"] for r in reader] == ["caf\\xe9"]
    assert [(r["key"], r["reason"]) for r in read_rejects(tmp_path / "bin")] == [("x/", "bad-key")]


def test_resume_and_overwrite_know_tar_shards(imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(convert_output.Output, "finish", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        convert(imagefolder, out, workers=1, shard_size=12_000, shard_format="tar")
    monkeypatch.undo()
    tars = sorted(p.name for p in out.glob("shard-*.tar"))
    assert len(tars) > 2 and sorted(p.name for p in out.glob("shard-*.idx")) == [name + ".idx" for name in tars]
    with pytest.raises(ConvertError, match="shard_format changed from \"tar\" to \"binary\""):
        convert(imagefolder, out, workers=1, shard_size=12_000, resume=True)
    (out / "shard-00001.tar.idx").write_bytes(b"damaged")  # redone: the index no longer matches its sidecar
    result = convert(imagefolder, out, workers=1, shard_size=12_000, shard_format="tar", resume=True)
    assert result.reused_shards == len(result.manifest.shards) - 1 and verify_dataset(out).ok
    convert(imagefolder, out, workers=1, shard_size=6_000, overwrite=True)
    assert not list(out.glob("*.tar*")) and verify_dataset(out).ok


def test_cli_index_and_convert_format_tar(imagefolder: Path, tmp_path: Path) -> None:
    code, output = run("convert", imagefolder, tmp_path / "tars", "--format", "tar", "--workers", "1", "--shard-size", "8KiB", "-q")
    assert code == 0 and output == ""
    (tmp_path / "tars" / "manifest.json").unlink()
    code, output = run("index", tmp_path / "tars")
    assert code == 0 and output.startswith("24 records in ") and "0 samples rejected" in output
    code, output = run("verify", tmp_path / "tars")
    assert code == 0 and output.startswith("ok: ")
    code, output = run("info", tmp_path / "tars")
    assert code == 0 and "channels        3: 24" in output
    code, output = run("index", tmp_path / "tars")
    assert code == 1 and "already holds manifest.json" in output
    code, output = run("index", tmp_path / "nothing-{0..1}.tar")
    assert code == 1 and "does not exist" in output


def test_webdataset_tars_stored_as_raw_pixels(tmp_path: Path) -> None:
    """A multi-field conversion reads tar samples where they lie too, keeps their keys and names
    them in its rejects."""
    good = awkward_tars(tmp_path / "wds")
    result = convert(tmp_path / "wds", tmp_path / "raw", store="raw", workers=1)
    assert result.manifest.schema.field("image").type == "raw" and result.manifest.converter["input"] == "webdataset"
    with open_dataset(tmp_path / "raw") as reader:
        records = [(r["key"], r["label"], np.asarray(r["image"])) for r in reader]
    assert [(key, label) for key, label, _ in records] == [(k, label) for k, label, _ in good[:2]] + [("a/png", 5)] + [
        (k, label) for k, label, _ in good[2:]
    ]
    for (_, _, pixels), (_, _, data) in zip(records[:2] + records[3:], good, strict=True):
        assert np.array_equal(pixels, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    assert [(r["path"], r.get("key"), r["reason"]) for r in read_rejects(tmp_path / "raw")] == [
        ("part-0.tar", "a/nolabel", "no-label"),
        ("part-0.tar", "a/text", "no-image"),
        ("part-1.tar", "a/cut", "corrupt"),
        ("part-1.tar", "a/badlabel", "bad-label"),
        ("part-2.tar", None, "corrupt"),
    ]


def test_loader_fields_over_tar_shards(imagefolder: Path, tmp_path: Path) -> None:
    convert(imagefolder, tmp_path / "bin", workers=1)
    convert(imagefolder, tmp_path / "tar", workers=1, shard_format="tar")
    options: dict[str, Any] = dict(batch_size=6, seed=3, num_workers=0, fields={"image": 16, "label": None}, transform="train")
    with Loader(tmp_path / "bin", **options) as a, Loader(tmp_path / "tar", **options) as b:
        for batch_a, batch_b in zip(a, b, strict=True):
            assert torch.equal(batch_a["label"], batch_b["label"]) and torch.equal(batch_a["image"], batch_b["image"])


def test_cli_format_tar_takes_classification_records_only(imagefolder: Path, tmp_path: Path) -> None:
    code, output = run("convert", imagefolder, tmp_path / "out", "--format", "tar", "--store", "raw")
    assert code == 1 and "--format tar writes image classification records" in output
    assert not (tmp_path / "out").exists()
    awkward_tars(tmp_path / "wds")
    code, output = run("convert", tmp_path / "wds" / "part-0.tar", tmp_path / "wds" / "part-1.tar", tmp_path / "two", "-q")
    assert code == 0 and output == ""  # several tars are several SRCs, as one pattern of them
    with open_dataset(tmp_path / "two") as reader:
        assert len(reader) == 5
    code, output = run("convert", tmp_path / "wds" / "part-{0,1}.tar", tmp_path / "raw", "--store", "raw", "--workers", "1", "-q")
    assert code == 0 and output == ""
    with open_dataset(tmp_path / "raw") as reader:
        assert len(reader) == 5 and reader.schema.field("image").type == "raw"


def test_both_outputs_apply_one_key_rule(tmp_path: Path) -> None:
    image = jpeg_bytes(8, 8)
    path = tmp_path / "in.tar"
    names = ["ok", "../up", "/etc/abs", "line\nbreak", "tab\there", "n/ok2"]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for key in names:
            for extension, data in (("jpg", image), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    expected = [
        ("../up", "bad-key", "key '../up' must be a relative path without empty, '.' or '..' parts"),
        ("/etc/abs", "bad-key", "key '/etc/abs' must be a relative path without empty, '.' or '..' parts"),
        ("line\nbreak", "bad-key", "key 'line\\nbreak' holds the control character U+000A at position 4"),
        ("tab\there", "bad-key", "key 'tab\\there' holds the control character U+0009 at position 3"),
    ]
    for shard_format in ("binary", "tar"):
        out = tmp_path / shard_format
        convert(path, out, workers=1, shard_format=shard_format)
        with open_dataset(out) as reader:
            assert [r["key"] for r in reader] == ["ok", "n/ok2"]
        assert [(r["key"], r["reason"], r["detail"]) for r in read_rejects(out)] == expected
    with tarfile.open(tmp_path / "tar" / "shard-00000.tar") as written:
        assert written.getnames() == ["ok.cls", "ok.jpg", "n/ok2.cls", "n/ok2.jpg"]
