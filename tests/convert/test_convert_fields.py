"""convert() and `shardfmt convert` with several fields: parallel folders, multi-column
listings, raw pixel storage, patches; rejects, determinism and resume as for convert()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import tree_bytes
from converting import convert
from PIL import Image

from shardfmt import ConvertError, ImageTransform, Loader, Output, WorkerError, open_dataset
from shardfmt._cli import main
from shardfmt._convert import loop as convert_pipeline
from shardfmt._convert import records as convert_records
from shardfmt._convert.options import RecordRequest
from shardfmt._convert.route import choose_route
from shardfmt._synthetic import make_image
from shardfmt.ops import ImageOutput, RandomCrop

SCALE = 4


def smooth(height: int, width: int, *, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    planes = [127 + 100 * np.sin(2 * np.pi * (rng.uniform(0.5, 2) * x + rng.uniform(0.5, 2) * y) + rng.uniform(0, 6)) for _ in range(3)]
    return np.clip(np.stack(planes, axis=2), 0, 255).astype(np.uint8)


def box_down(image: np.ndarray, factor: int) -> np.ndarray:
    h, w = image.shape[:2]
    return np.asarray(Image.fromarray(image).resize((w // factor, h // factor), Image.Resampling.BOX))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture
def sr_folders(tmp_path: Path) -> Path:
    """div2k-like LR/ and HR/ folders: HR PNGs (and one JPEG), LR = HR downscaled 4x by BOX, in a
    sub-folder too; one HR without LR, one LR without HR, one pair of the wrong sizes."""
    root = tmp_path / "sr"
    for sub in ("LR/part", "HR/part"):
        (root / sub).mkdir(parents=True)
    for i in range(10):
        hr = smooth(32 * (3 + i % 3), 32 * (4 + i % 2), seed=i)
        folder = "part/" if i >= 7 else ""
        Image.fromarray(hr).save(root / "HR" / f"{folder}{i:04d}.png")
        Image.fromarray(box_down(hr, SCALE)).save(root / "LR" / f"{folder}{i:04d}.png")
    (root / "LR" / "0002.png").unlink()  # HR 0002 has no partner
    Image.fromarray(smooth(8, 8, seed=99)).save(root / "LR" / "0099.png")  # nor has LR 0099
    Image.fromarray(smooth(10, 12, seed=5)).save(root / "LR" / "0005.png")  # 0005: 48x40 expected, HR is 160x160
    return root


def read_rejects(out: Path) -> list[tuple[str, str]]:
    return [(r["path"], r["reason"]) for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())]


def test_super_resolution_pairs_convert_and_load_with_aligned_crops(sr_folders: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = CliRunner().invoke(
        main, ["convert", str(sr_folders / "LR"), str(sr_folders / "HR"), str(out), "--scale", "4", "--store", "raw", "--workers", "1"]
    )
    assert code.exit_code == 0, code.output
    assert read_rejects(out) == [("LR/0005.png", "size-mismatch"), ("LR/0099.png", "no-partner"), ("HR/0002.png", "no-partner")]
    detail = json.loads((out / "rejects.jsonl").read_text().splitlines()[0])["detail"]
    assert detail == "field 'hr' (HR/0005.png) is 160x160, not 4 x 12x10 = 48x40 (--scale)"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"]["fields"] == [{"name": "lr", "type": "raw"}, {"name": "hr", "type": "raw"}, {"name": "key", "type": "str"}]
    assert manifest["converter"]["input"] == "folders" and manifest["converter"]["options"]["scale"] == [1, 4]
    with open_dataset(out) as dataset:
        assert [r["key"] for r in dataset] == ["0000", "0001", "0003", "0004", "0006", "part/0007", "part/0008", "part/0009"]
        for record in dataset:
            assert record["hr"].shape == (4 * record["lr"].shape[0], 4 * record["lr"].shape[1], 3)
    # Tolerance: none. Raw pixels and a RandomCrop (no resampling) give the exact relation the
    # files have: the hr crop downscaled 4x by BOX is the lr crop, byte for byte.
    with Loader(
        out, batch_size=4, num_workers=0, fields=["lr", "hr"], seed=7, transform=RandomCrop(8), output=Output(layout="NHWC")
    ) as loader:
        count = 0
        for batch in loader:
            for lr, hr in zip(batch["lr"].numpy(), batch["hr"].numpy(), strict=True):
                assert hr.shape == (32, 32, 3) and np.array_equal(box_down(hr, SCALE), lr)
                count += 1
    assert count == 8


def test_jpeg_pairs_load_within_30_db(sr_folders: Path, tmp_path: Path) -> None:
    """Stored as JPEG (re-encoded at quality 95) and cropped with resampling (RandomResizedCrop,
    lr to 16 and hr to 64, antialiased bilinear), the hr crop downscaled 4x by BOX matches the
    lr crop with a mean PSNR of at least 30 dB and at least 25 dB for every crop (about 36 and
    32 dB here; the same crops mirrored score about 9 dB, so a misplaced box cannot pass)."""
    out = tmp_path / "out"
    convert([sr_folders / "LR", sr_folders / "HR"], out, scale=SCALE, quality=95, workers=1)
    with Loader(
        out,
        batch_size=4,
        num_workers=0,
        fields={"lr": 16, "hr": 64},
        seed=8,
        transform=ImageTransform(crop="train", fast_decode=False),
        output=Output(layout="NHWC"),
    ) as loader:
        pairs = [
            (lr.copy(), box_down(hr, SCALE)) for batch in loader for lr, hr in zip(batch["lr"].numpy(), batch["hr"].numpy(), strict=True)
        ]
    scores = [psnr(down, lr) for lr, down in pairs]
    assert len(scores) == 8 and np.mean(scores) >= 30.0 and min(scores) >= 25.0, scores
    assert max(psnr(down[:, ::-1], lr) for lr, down in pairs) < 20.0


def test_patches_keep_the_scale_exact(sr_folders: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert([sr_folders / "LR", sr_folders / "HR"], out, fields=[("low", "raw"), ("high", "raw")], scale=SCALE, patch=6, workers=1)
    with open_dataset(out) as dataset:
        for record in dataset:
            assert record["low"].shape == (6, 6, 3) and record["high"].shape == (24, 24, 3)


def test_ambiguous_keys_and_overlapping_folders(sr_folders: Path, tmp_path: Path) -> None:
    (sr_folders / "HR" / "0001.jpg").write_bytes((sr_folders / "HR" / "0001.png").read_bytes())
    out = tmp_path / "out"
    convert([sr_folders / "LR", sr_folders / "HR"], out, scale=SCALE, workers=1)
    assert ("LR/0001.png", "ambiguous") in read_rejects(out)
    with pytest.raises(ConvertError, match="overlap"):
        convert([sr_folders, sr_folders / "HR"], tmp_path / "other")
    with pytest.raises(ConvertError, match="2 folders but 1 --field names"):
        convert([sr_folders / "LR", sr_folders / "HR"], tmp_path / "other2", fields=[("lr", None)])


@pytest.fixture
def segmentation_listing(tmp_path: Path) -> Path:
    """image,mask,label,weight rows: RGB JPEGs, palette PNG masks, class names, weights."""
    root = tmp_path / "seg"
    (root / "img").mkdir(parents=True)
    (root / "ann").mkdir()
    lines = ["image,mask,label,weight"]
    for i in range(6):
        Image.fromarray(make_image(20, 30, seed=i)).save(root / "img" / f"{i}.jpg", quality=90)
        mask = Image.fromarray(((np.arange(20)[:, None] + np.arange(30)[None, :] + i) % 3).astype(np.uint8), "P")
        mask.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * 759)
        if i != 4:
            mask.save(root / "ann" / f"{i}.png")
        lines.append(f"img/{i}.jpg,ann/{i}.png,{'cat' if i % 2 else 'dog'},{i / 4}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root / "list.csv"


def test_listing_with_image_mask_label_and_weight(segmentation_listing: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert reader_of([segmentation_listing]) == "fields"
    result = convert(segmentation_listing, out, fields={"mask": "mask"}, workers=1)
    assert result.num_records == 5 and read_rejects(out) == [("img/4.jpg", "no-partner")]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(f["name"], f["type"]) for f in manifest["schema"]["fields"]] == [
        ("image", "jpeg"),
        ("mask", "raw"),
        ("label", "int64"),
        ("weight", "float64"),
        ("key", "str"),
    ]
    assert manifest["classes"] == ["cat", "dog"]
    with open_dataset(out) as dataset:
        for record, i in zip(dataset, [0, 1, 2, 3, 5], strict=True):
            assert record["mask"].shape == (20, 30, 1) and set(np.unique(record["mask"])) <= {0, 1, 2}  # indices, not colours
            assert (record["label"], record["weight"], record["key"]) == (0 if i % 2 else 1, i / 4, f"img/{i}")
    with Loader(
        out,
        batch_size=5,
        num_workers=0,
        fields={"image": 16, "mask": ImageOutput(16, 1, "nearest"), "label": None, "weight": None},
        transform="train",
    ) as loader:
        batch = next(iter(loader))
        assert batch["image"].shape == (5, 3, 16, 16) and set(batch["mask"].unique().tolist()) <= {0, 1, 2}
        assert batch["weight"].dtype.is_floating_point


def test_jsonl_listing_and_declared_kinds(tmp_path: Path) -> None:
    root = tmp_path / "list"
    root.mkdir()
    rows = []
    for i in range(3):
        Image.fromarray(make_image(12, 16, seed=i)).convert("L").save(root / f"g{i}.png")
        Image.fromarray(make_image(12, 16, seed=i + 9)).convert("RGBA").save(root / f"c{i}.png")
        rows.append(json.dumps({"gray": f"g{i}.png", "color": f"c{i}.png", "score": i, "note": f"n{i}"}))
    (root / "data.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    convert(root / "data.jsonl", out, fields={"gray": "gray", "color": "rgba", "score": "float64", "note": "str"}, workers=1)
    with open_dataset(out) as dataset:
        record = dataset[2]
        assert record["gray"].shape == (12, 16, 1) and record["color"].shape == (12, 16, 4)
        assert (record["score"], record["note"]) == (2.0, "n2")


def test_a_colour_mask_is_rejected(tmp_path: Path) -> None:
    root = tmp_path / "list"
    root.mkdir()
    Image.fromarray(make_image(8, 8, seed=1)).save(root / "a.png")
    (root / "data.csv").write_text("image,mask\na.png,a.png\n")
    convert(root / "data.csv", tmp_path / "out", fields={"mask": "mask"}, workers=1, allow_empty=True)  # its one record is rejected
    (reject,) = map(json.loads, (tmp_path / "out" / "rejects.jsonl").read_text().splitlines())
    assert reject["reason"] == "unsupported" and reject["detail"].startswith("field 'mask' (a.png): a RGB image is not a mask")


def test_store_raw_patches_from_an_imagefolder(imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = CliRunner().invoke(main, ["convert", str(imagefolder), str(out), "--store", "raw", "--patch", "32", "--workers", "1"])
    assert code.exit_code == 0, code.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema"]["fields"][0] == {"name": "image", "type": "raw"} and manifest["classes"] == [
        "class_000",
        "class_001",
        "class_002",
    ]
    with open_dataset(out) as dataset:
        assert len(dataset) == 24 and all(record["image"].shape == (32, 32, 3) for record in dataset)
    with Loader(out, batch_size=8, num_workers=0, transform=ImageTransform(size=32, crop="resize")) as loader:  # the (images, labels) form
        images, labels = next(iter(loader))
        assert images.shape == (8, 3, 32, 32)


def test_output_is_byte_identical_for_any_number_of_workers_and_after_resume(
    sr_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options: dict[str, Any] = dict(scale=SCALE, store="raw", shard_size=4000)
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    convert([sr_folders / "LR", sr_folders / "HR"], one, workers=1, **options)
    convert([sr_folders / "LR", sr_folders / "HR"], two, workers=2, **options)
    assert len(json.loads((one / "manifest.json").read_text())["shards"]) > 2
    assert tree_bytes(one) == tree_bytes(two)

    original = convert_pipeline._write_shard

    def crash_on_shard_2(plan: Any, output: Any, index: int, *args: Any) -> Any:
        if index == 2:
            raise KeyboardInterrupt  # the run stops, as on Ctrl-C, with shards 0 and 1 done
        return original(plan, output, index, *args)

    monkeypatch.setattr(convert_pipeline, "_write_shard", crash_on_shard_2)
    with pytest.raises(KeyboardInterrupt):
        convert([sr_folders / "LR", sr_folders / "HR"], resumed, workers=1, **options)
    assert not (resumed / "manifest.json").exists() and (resumed / "shard-00001.shard").exists()
    monkeypatch.undo()
    with pytest.raises(ConvertError, match="options changed"):
        convert([sr_folders / "LR", sr_folders / "HR"], resumed, workers=1, resume=True, **dict(options, store="jpeg"))
    result = convert([sr_folders / "LR", sr_folders / "HR"], resumed, workers=1, resume=True, **options)
    assert result.reused_shards == 2
    assert tree_bytes(resumed) == tree_bytes(one)


def test_a_failing_task_is_named(sr_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(convert_records, "store_image", failing)
    with pytest.raises(WorkerError, match="input LR/0000.png: RuntimeError: disk on fire"):
        convert([sr_folders / "LR", sr_folders / "HR"], tmp_path / "out", scale=SCALE, workers=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scale", "x"], "not a whole number"),
        (["--scale", "2,4"], "2 scales for 1 image fields"),
        (["--patch", "8", "--max-side", "9"], "exclude each other"),
        (["--patch", "8", "--scale", "any"], "need a stated --scale"),
        (["--field", "lr=webp", "--field", "hr"], "kind 'webp' is none of"),
    ],
)
def test_cli_refuses_what_does_not_fit(sr_folders: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["convert", str(sr_folders / "LR"), str(sr_folders / "HR"), str(tmp_path / "out"), *args])
    assert result.exit_code in (1, 2) and message in result.output, result.output


def reader_of(sources: list[Path], **request: Any) -> str:
    """The reader the one entry chooses for `sources` and the request's keywords."""
    return choose_route([str(s) for s in sources], RecordRequest.of(**request), shard_format="binary", remote=None).reader


def test_plain_conversions_still_take_the_jpeg_path(imagefolder: Path, tmp_path: Path) -> None:
    assert reader_of([imagefolder]) == "images"
    listing = tmp_path / "l.csv"
    listing.write_text("path,label\n")
    assert reader_of([listing]) == "images"
    assert reader_of([imagefolder], store="raw") == reader_of([imagefolder, imagefolder]) == "fields"
    assert reader_of([imagefolder], scale=2) == reader_of([imagefolder], fields=[("image", "raw")]) == "fields"


def test_a_path_label_listing_with_more_columns_keeps_its_field_names(tmp_path: Path) -> None:
    root = tmp_path / "list"
    root.mkdir()
    for i in range(3):
        Image.fromarray(make_image(10, 12, seed=i)).save(root / f"{i}.jpg")
    (root / "data.csv").write_text("path,label,weight\n" + "".join(f"{i}.jpg,{i % 2},{i}.5\n" for i in range(3)))
    result = CliRunner().invoke(main, ["convert", str(root / "data.csv"), str(tmp_path / "out"), "--workers", "1"])
    assert result.exit_code == 0, result.output
    with open_dataset(tmp_path / "out") as dataset:
        assert dataset.schema.names == ("image", "label", "weight", "key")
        assert [(r["label"], r["weight"], r["key"]) for r in dataset] == [(0, 0.5, "0"), (1, 1.5, "1"), (0, 2.5, "2")]
    with Loader(
        tmp_path / "out", batch_size=3, num_workers=0, transform=ImageTransform(size=8)
    ) as loader:  # the (images, labels) form works as before
        images, labels = next(iter(loader))
        assert images.shape == (3, 3, 8, 8)
