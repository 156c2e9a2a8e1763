"""Loader(fields=...): several fields per batch, one crop for every image field, per-field sizes,
channels and interpolation, raw pixels straight from the memory map."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling, SchemaError, Workers, open_dataset
from shardfmt._sampling.keys import window_order
from shardfmt.format import Schema
from shardfmt.ops import CropPlan, ImageOutput, RandomCrop, RandomResizedCrop
from shardfmt.ops._crop import dct_scale, scale_plan

SCALE = 4
NUM = 24


def smooth_image(height: int, width: int, *, seed: int, channels: int = 3) -> np.ndarray:
    """A smooth uint8 image (low-frequency sines), so that downscaling loses little."""
    rng = np.random.default_rng(seed)
    y = np.arange(height)[:, None, None] / height
    x = np.arange(width)[None, :, None] / width
    f = rng.uniform(0.5, 2.0, (4, channels))
    image = 127 + 60 * np.sin(2 * np.pi * (f[0] * x + f[1] * y) + f[2]) + 50 * np.cos(2 * np.pi * f[3] * (x - y))
    return np.clip(image, 0, 255).astype(np.uint8)


def downscale(image: np.ndarray, factor: int) -> np.ndarray:
    """PIL's BOX filter: each output pixel the mean of a factor x factor block."""
    h, w = image.shape[:2]
    squeeze = image.shape[2] == 1
    pil = Image.fromarray(image[..., 0] if squeeze else image)
    out = np.asarray(pil.resize((w // factor, h // factor), Image.Resampling.BOX))
    return out[..., None] if squeeze else out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Super-resolution records: hr (raw and jpeg), lr = hr downscaled 4x by BOX (raw and jpeg),
    a 4-class mask at hr size, a 4-channel image, an ndarray and a label."""
    out = tmp_path_factory.mktemp("pairs") / "ds"
    schema = Schema.of(lr="raw", hr="raw", lr_jpeg="jpeg", hr_jpeg="jpeg", mask="raw", rgba="raw", box="ndarray:float32:2x2", label="int64")
    with DatasetWriter(out, schema=schema, shard_size=100_000) as writer:
        for i in range(NUM):
            h, w = 16 * (4 + i % 3), 16 * (5 + i % 4)  # lr 16..24 x 20..32: every size divisible
            hr = smooth_image(h, w, seed=i)
            lr = downscale(hr, SCALE)
            mask = ((np.arange(h)[:, None] // 7 + np.arange(w)[None, :] // 5) % 4 * 60).astype(np.uint8)
            rgba = np.concatenate([hr, mask[..., None]], axis=2)
            writer.write(
                {
                    "lr": lr,
                    "hr": hr,
                    "lr_jpeg": simplejpeg.encode_jpeg(lr, quality=95),
                    "hr_jpeg": simplejpeg.encode_jpeg(hr, quality=95),
                    "mask": mask,
                    "rgba": rgba,
                    "box": np.array([[i, i + 1], [i + 2, i + 3]], np.float32),
                    "label": i,
                }
            )
    return out


def first_batches(loader: Loader, count: int = 2) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in batch.items()} for batch in itertools.islice(loader, count)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_raw_pairs_crop_at_the_same_place_exactly(pairs: Path, num_workers: int) -> None:
    """RandomCrop copies pixels: the hr crop downscaled 4x by BOX is the lr crop, to the byte."""
    with Loader(
        pairs,
        batch_size=8,
        num_workers=num_workers,
        fields=["lr", "hr", "label"],
        seed=1,
        transform=RandomCrop(12),
        output=Output(layout="NHWC"),
    ) as loader:
        assert [spec.shape for spec in loader.outputs[:2]] == [(12, 12, 3), (48, 48, 3)]  # hr size from the 4x ratio
        flips = 0
        for batch in loader:
            for lr, hr in zip(batch["lr"].numpy(), batch["hr"].numpy(), strict=True):
                assert np.array_equal(downscale(hr, SCALE), lr)
                flips += not np.array_equal(hr, hr[:, ::-1])
    assert flips > 0


def test_jpeg_pairs_with_resampling_crops_agree_within_30_db(pairs: Path) -> None:
    """RandomResizedCrop resamples both (lr to 16, hr to 64, antialiased bilinear) from JPEGs at
    quality 95. Tolerance: the hr output downscaled 4x by BOX matches the lr output with a mean
    PSNR of at least 30 dB (and every crop at least 25 dB) on these smooth images; a crop one
    lr pixel off, or flipped differently, scores far lower."""
    fields = {"lr_jpeg": 16, "hr_jpeg": 64}
    with Loader(
        pairs,
        batch_size=8,
        num_workers=0,
        fields=fields,
        seed=2,
        transform=ImageTransform(crop="train", fast_decode=False),
        output=Output(layout="NHWC"),
    ) as loader:
        scores, shifted = [], []
        for batch in loader:
            for lr, hr in zip(batch["lr_jpeg"].numpy(), batch["hr_jpeg"].numpy(), strict=True):
                scores.append(psnr(downscale(hr, SCALE), lr))
                shifted.append(psnr(downscale(hr, SCALE)[:, ::-1], lr))
    assert np.mean(scores) >= 30.0 and min(scores) >= 25.0, scores
    assert np.mean(shifted) < np.mean(scores) - 8


def test_masks_keep_their_values_with_nearest_interpolation(pairs: Path) -> None:
    stored = {0, 60, 120, 180}
    request = {"hr": 40, "mask": ImageOutput(size=40, channels=1, interpolation="nearest"), "bilinear": None}
    request.pop("bilinear")
    with Loader(
        pairs, batch_size=12, num_workers=0, fields=request, seed=3, transform=RandomResizedCrop(40), output=Output(layout="NHWC")
    ) as loader:
        for batch in loader:
            assert batch["mask"].shape == (12, 40, 40, 1)
            assert set(batch["mask"].unique().tolist()) <= stored
    with Loader(
        pairs,
        batch_size=12,
        num_workers=0,
        fields={"hr": 40, "mask": 40},
        seed=3,
        transform=RandomResizedCrop(40),
        output=Output(layout="NHWC"),
    ) as loader:
        values = set().union(*(set(batch["mask"].unique().tolist()) for batch in loader))
    assert not values <= stored, "bilinear interpolation blends label values, nearest does not"


def test_channels_one_three_and_four(pairs: Path) -> None:
    fields = {
        "hr": ImageOutput(size=32, channels=1),
        "hr_jpeg": ImageOutput(size=32, channels=1),
        "rgba": ImageOutput(size=32),  # 4 stored, 4 delivered
        "mask": ImageOutput(size=32, channels=3, interpolation="nearest"),
        "lr_jpeg": ImageOutput(size=8, channels=4),
    }
    with Loader(
        pairs, batch_size=8, num_workers=0, fields=fields, shuffle=False, transform=RandomCrop(32), output=Output(layout="NCHW")
    ) as loader:
        batch = next(iter(loader))
    assert batch["hr"].shape == batch["hr_jpeg"].shape == (8, 1, 32, 32)
    assert batch["rgba"].shape == (8, 4, 32, 32) and batch["mask"].shape == (8, 3, 32, 32)
    assert batch["lr_jpeg"].shape == (8, 4, 8, 8) and bool((batch["lr_jpeg"][:, 3] == 255).all())
    assert batch["hr"].is_contiguous(memory_format=torch.channels_last)
    gray_raw, gray_jpeg = batch["hr"].float(), batch["hr_jpeg"].float()
    assert float((gray_raw - gray_jpeg).abs().mean()) < 3  # Pillow's luma and libjpeg's Y agree
    assert torch.equal(batch["mask"][:, 0], batch["mask"][:, 2])  # gray replicated into RGB
    assert torch.equal(batch["rgba"][:, 3:], batch["rgba"][:, 3:].clamp(0, 180))  # the mask is the alpha


def test_arrays_and_numbers_arrive_as_stored(pairs: Path) -> None:
    with Loader(pairs, batch_size=5, num_workers=2, fields=["box", "label"], shuffle=True, seed=4) as loader:
        seen = []
        for batch in loader:
            assert batch["box"].dtype == torch.float32 and batch["label"].dtype == torch.int64
            for box, label in zip(batch["box"], batch["label"].tolist(), strict=True):
                assert box.tolist() == [[label, label + 1], [label + 2, label + 3]]
                seen.append(label)
    assert sorted(seen) == list(range(NUM))


def test_resume_continues_the_same_dict_stream(pairs: Path) -> None:
    settings: dict[str, Any] = dict(
        batch_size=4, num_workers=2, fields={"lr": 8, "hr": 32, "label": None}, seed=5, transform=RandomResizedCrop(8)
    )
    with Loader(pairs, **settings) as reference:
        expected = first_batches(reference, 6)
    with Loader(pairs, **settings) as first:
        iterator = iter(first)
        for _ in range(2):
            next(iterator)
        state = first.state_dict()
    with Loader(pairs, **settings) as resumed:
        resumed.load_state_dict(state)
        rest = first_batches(resumed, 4)
    for got, want in zip(rest, expected[2:], strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)
    with Loader(pairs, **dict(settings, fields={"lr": 8, "hr": 16, "label": None})) as other:
        with pytest.raises(ValueError, match="fields"):
            other.load_state_dict(state)


def test_a_windowed_order_delivers_every_field(pairs: Path) -> None:
    """The block shuffle is shared sampling: with fields it is the same order of records, crops
    still agree across fields, and a resumed loader continues it."""
    sizes = [shard.num_records for shard in open_dataset(pairs).manifest.shards]
    assert len(sizes) >= 4
    settings: dict[str, Any] = dict(
        batch_size=4,
        num_workers=2,
        fields=["lr", "hr", "label"],
        seed=6,
        transform=RandomCrop(12),
        sampling=Sampling(window=2),
        output=Output(layout="NHWC"),
    )
    with Loader(pairs, **settings) as loader:
        labels = []
        for batch in loader:
            labels += batch["label"].tolist()
            for lr, hr in zip(batch["lr"].numpy(), batch["hr"].numpy(), strict=True):
                assert np.array_equal(downscale(hr, SCALE), lr)
        state_after_epoch = loader.state_dict()
    assert labels == window_order(sizes, seed=6, epoch=0, window=2).tolist() != list(range(NUM))
    assert state_after_epoch["settings"]["window"] == 2
    with Loader(pairs, **settings) as first:
        expected = first_batches(first, 4)
    with Loader(pairs, **settings) as stopped:
        iterator = iter(stopped)
        next(iterator)
        state = stopped.state_dict()
    with Loader(pairs, **settings) as resumed:
        resumed.load_state_dict(state)
        for got, want in zip(first_batches(resumed, 3), expected[1:], strict=True):
            assert all(torch.equal(got[k], want[k]) for k in want)


def test_the_single_image_form_reads_raw_images(pairs: Path) -> None:
    with Loader(
        pairs, batch_size=8, num_workers=0, shuffle=False, transform=ImageTransform(size=24), output=Output(image_field="hr")
    ) as loader:
        images, labels = next(iter(loader))
    assert images.shape == (8, 3, 24, 24) and labels.tolist() == list(range(8))
    assert loader.shared_memory_bytes == 3 * (-(-8 * 24 * 24 * 3 // 4096) * 4096 + 4096)


def test_shared_memory_holds_every_field(pairs: Path) -> None:
    fields = {"lr": 8, "hr": 32, "mask": ImageOutput(32, 1, "nearest"), "box": None, "label": None}
    with Loader(pairs, batch_size=4, num_workers=0, fields=fields, transform=RandomCrop(8), workers=Workers(prefetch=1)) as loader:
        sample = [8 * 8 * 3, 32 * 32 * 3, 32 * 32, 16, 8]
        assert loader.shared_memory_bytes == 2 * sum(-(-4 * b // 4096) * 4096 for b in sample)


def test_raw_pixels_are_cut_from_the_memory_map(pairs: Path) -> None:
    from shardfmt._loader.chunk import ChunkProcessor
    from shardfmt._loader.fillers import _RawFiller
    from shardfmt._loader.shm import SlotRing

    with Loader(pairs, batch_size=4, num_workers=0, fields=["lr"], transform=RandomCrop(8)) as loader:
        layout = loader.layout_spec
        ring = SlotRing.in_process(layout)
        processor = ChunkProcessor(loader.scheduler.config, lambda slot, serial: ring.arrays[slot])
        processor.process(0, 0, 0, 0, np.arange(4, dtype=np.int64))
        filler = processor.fillers[0]
        assert isinstance(filler, _RawFiller)
        reader = processor.dataset.shard(0)
        mapped = np.frombuffer(reader.source.read(0, reader.source.size), np.uint8)
        whole = filler._files[reader.path]
        assert whole.data_ptr() == mapped.ctypes.data, "a view of the shard's memory map, not a copy"
        processor.close()


def test_scale_plan_multiplies_boxes_by_an_integer_ratio() -> None:
    rng = np.random.default_rng(0)
    ref_h, ref_w = rng.integers(5, 50, 100), rng.integers(5, 50, 100)
    height = rng.integers(1, 6, 100)
    width = rng.integers(1, 6, 100)
    top, left = (rng.random(100) * (ref_h - height)).astype(np.int64), (rng.random(100) * (ref_w - width)).astype(np.int64)
    plan = CropPlan(top, left, height, width, rng.random(100) < 0.5)
    for s in (1, 2, 3, 4):
        scaled = scale_plan(plan, ref_h * s, ref_w * s, ref_h, ref_w)
        assert np.array_equal(scaled.top, top * s) and np.array_equal(scaled.height, height * s)
        assert np.array_equal(scaled.left, left * s) and np.array_equal(scaled.width, width * s)
        assert np.array_equal(scaled.flip, plan.flip)
    odd = scale_plan(plan, ref_h * 3 // 2 + 1, ref_w // 3 + 1, ref_h, ref_w)
    assert (odd.height >= 1).all() and (odd.top + odd.height <= ref_h * 3 // 2 + 1).all()
    assert (odd.width >= 1).all() and (odd.left + odd.width <= ref_w // 3 + 1).all()


@pytest.mark.parametrize(
    ("fields", "error", "says"),
    [
        (["label", "missing"], SchemaError, "no field 'missing'"),
        ({"lr": 8, "label": 4}, ValueError, "delivered as stored"),
        ({"lr": 8, "hr": "big"}, ValueError, "must be an ImageOutput"),
        ("lr", ValueError, "not one string"),
        ({}, ValueError, "names no field"),
    ],
)
def test_bad_requests_are_refused(pairs: Path, fields: Any, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        Loader(pairs, batch_size=4, num_workers=0, fields=fields)


def test_a_text_field_comes_as_a_list_beside_the_images(tmp_path: Path) -> None:
    with DatasetWriter(tmp_path / "ds", schema=Schema.of(image="raw", key="str", blob="bytes")) as writer:
        writer.write({"image": np.zeros((4, 4, 3), np.uint8), "key": "a", "blob": b"\x00\x01"})
    with Loader(tmp_path / "ds", batch_size=1, num_workers=0, fields=["image", "key", "blob"], shuffle=False) as loader:
        (batch,) = list(loader)
    assert batch["key"] == ["a"] and batch["blob"] == [b"\x00\x01"] and batch["image"].shape == (1, 3, 224, 224)
    with pytest.raises(ValueError, match="'key' is 'str': it takes no options"):
        Loader(tmp_path / "ds", batch_size=1, num_workers=0, fields={"image": None, "key": 4})
    with pytest.raises(ValueError, match="ask for an image or a number too"):
        Loader(tmp_path / "ds", batch_size=1, num_workers=0, fields=["key"])


def test_the_reference_size_must_be_the_pipelines(pairs: Path) -> None:
    with pytest.raises(ValueError, match="give the pipeline that size"):
        Loader(pairs, batch_size=4, num_workers=0, fields={"lr": 10, "hr": 40}, transform=RandomCrop(8))
    with Loader(pairs, batch_size=4, num_workers=0, fields={"lr": 10, "hr": 40}, transform="eval") as loader:
        assert loader.pipeline.size == (10, 10)  # a named pipeline takes the reference's size


def test_records_read_back_as_written(pairs: Path) -> None:
    with open_dataset(pairs) as reader:
        record = reader[3]
        assert record["hr"].shape[0] == SCALE * record["lr"].shape[0]
        assert np.array_equal(downscale(np.array(record["hr"]), SCALE), record["lr"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_delivery_of_every_field(pairs: Path) -> None:
    fields = {"lr": 8, "hr": 32, "mask": ImageOutput(32, 1, "nearest"), "box": None, "label": None}
    settings: dict[str, Any] = dict(batch_size=8, num_workers=2, fields=fields, shuffle=False, transform=RandomCrop(8))
    with Loader(pairs, **settings) as cpu:
        expected = first_batches(cpu, 3)
    with Loader(pairs, **settings, device="cuda") as gpu:
        for batch, want in zip(gpu, expected, strict=True):
            for name, tensor in want.items():
                assert batch[name].device.type == "cuda" and batch[name].shape == tensor.shape
                assert torch.equal(batch[name].cpu(), tensor)
    with pytest.raises(ValueError, match=r"mean/std apply to one 3-channel image, but the loader delivers 3 image fields \(lr: 3"):
        Loader(pairs, **dict(settings, transform=ImageTransform(crop=RandomCrop(8), mean=(0.0,) * 3, std=(1.0,) * 3)), device="cuda")
    normalised = dict(settings, fields=["lr", "box", "label"], transform=ImageTransform(crop=RandomCrop(8), mean=MEAN, std=STD))
    with Loader(pairs, **normalised) as cpu:
        expected = first_batches(cpu, 3)
    with Loader(pairs, **normalised, device="cuda") as gpu:
        for batch, want in zip(gpu, expected, strict=True):
            assert batch["lr"].device.type == "cuda" and batch["lr"].dtype == torch.float32
            torch.testing.assert_close(batch["lr"].cpu(), want["lr"])
            assert torch.equal(batch["box"].cpu(), want["box"]) and torch.equal(batch["label"].cpu(), want["label"])


MEAN, STD = (120.0, 110.0, 100.0), (60.0, 55.0, 50.0)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_one_image_of_fields_is_normalised_as_the_images_of_the_tuple_form(pairs: Path, num_workers: int) -> None:
    settings: dict[str, Any] = dict(batch_size=8, num_workers=num_workers, shuffle=False, output=Output(layout="NHWC"))
    normalise = ImageTransform(crop=RandomCrop(12), mean=MEAN, std=STD)
    with Loader(pairs, **settings, transform=RandomCrop(12), fields=["lr", "box", "label"]) as plain:
        expected = first_batches(plain)
    with Loader(pairs, **settings, transform=normalise, fields=["lr", "box", "label"]) as loader:
        batches = first_batches(loader)
    for batch, want in zip(batches, expected, strict=True):
        assert batch["lr"].dtype == torch.float32
        torch.testing.assert_close(batch["lr"], (want["lr"].float() - torch.tensor(MEAN)) / torch.tensor(STD))
        assert torch.equal(batch["box"], want["box"]) and torch.equal(batch["label"], want["label"])
    two_images = r"mean/std apply to one 3-channel image, but the loader delivers 2 image fields \(lr: 3 channels, mask: 1"
    with pytest.raises(ValueError, match=two_images):
        Loader(pairs, **settings, transform=normalise, fields={"lr": None, "mask": ImageOutput(48, 1, "nearest")})


def test_the_map_style_dataset_names_what_it_cannot_decode(pairs: Path) -> None:
    from shardfmt import Dataset

    with pytest.raises(SchemaError, match="'lr' is 'raw': Dataset decodes jpeg fields"):
        Dataset(pairs, image_field="lr")
    image, label = Dataset(pairs, image_field="hr_jpeg", transform=ImageTransform(size=16))[3]
    assert image.shape == (3, 16, 16) and label == 3


def chunk_boxes(
    pairs: Path, fields: Any, pipeline: Any, *, epochs: int = 3
) -> tuple[Any, dict[str, list[CropPlan]], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The boxes a worker draws for every record in a few epochs, per image field, and each
    field's stored sizes."""
    from shardfmt._loader.chunk import ChunkProcessor
    from shardfmt._loader.shm import SlotRing
    from shardfmt.format._layout import column_name

    with Loader(pairs, batch_size=NUM, num_workers=0, fields=fields, transform=pipeline, output=Output(layout="NHWC")) as loader:
        layout = loader.layout_spec
        processor = ChunkProcessor(loader.scheduler.config, lambda slot, serial: SlotRing.in_process(layout).arrays[slot])
        indices = np.arange(NUM, dtype=np.int64)
        rows = [processor.dataset.shard(shard).table[local] for shard, local in map(processor.dataset.locate, range(NUM))]
        boxes: dict[str, list[CropPlan]] = {}
        for epoch in range(epochs):
            for name, plan in processor._boxes(rows, epoch, indices).items():
                boxes.setdefault(name, []).append(plan)
        sizes = {
            spec.name: (
                np.array([r[column_name(spec.name, "height")] for r in rows]),
                np.array([r[column_name(spec.name, "width")] for r in rows]),
            )
            for spec in processor.images
        }
        specs = {spec.name: spec for spec in processor.images}
        processor.close()
    return specs, boxes, sizes


def aligned_scales(plan: CropPlan, size: tuple[int, int]) -> list[int]:
    """The DCT scale of each box; asserts that its edges are multiples of it."""
    scales = []
    for k in range(len(plan.top)):
        s = dct_scale(int(plan.height[k]), int(plan.width[k]), size)
        assert plan.top[k] % s == plan.left[k] % s == plan.height[k] % s == plan.width[k] % s == 0
        scales.append(s)
    return scales


def test_carried_boxes_stay_exact_for_an_integer_ratio_at_the_dct_scale(pairs: Path) -> None:
    """lr boxes of up to 24 px for a 4 px output are decoded at 1/2 to 1/4 scale and snapped to it;
    hr (4x) at 16 px takes exactly 4 times each box, which lies on the same scale's grid."""
    _, boxes, _ = chunk_boxes(pairs, {"lr_jpeg": 4, "hr_jpeg": 16}, RandomResizedCrop(4))
    scales = []
    for lr, hr in zip(boxes["lr_jpeg"], boxes["hr_jpeg"], strict=True):
        for edge in ("top", "left", "height", "width"):
            assert np.array_equal(getattr(hr, edge), 4 * getattr(lr, edge))
        assert np.array_equal(hr.flip, lr.flip)
        scales += aligned_scales(lr, (4, 4))
        assert aligned_scales(hr, (16, 16)) == aligned_scales(lr, (4, 4))
    assert max(scales) >= 4 and min(scales) <= 2, "the test must exercise several DCT scales"


def test_each_jpeg_field_snaps_to_its_own_dct_scale(pairs: Path) -> None:
    """hr at the lr output size is decoded at a larger scale than lr: its carried box is snapped
    to that scale (each edge within s/2 of 4x the lr box); a raw field keeps the carried box."""
    _, boxes, sizes = chunk_boxes(pairs, {"lr_jpeg": 4, "hr_jpeg": 4, "hr": 4}, RandomResizedCrop(4))
    hr_h, hr_w = sizes["hr_jpeg"]
    assert (hr_h % 8 == 0).all() and (hr_w % 8 == 0).all()
    larger = 0
    for lr, hr, raw in zip(boxes["lr_jpeg"], boxes["hr_jpeg"], boxes["hr"], strict=True):
        for edge in ("top", "left", "height", "width"):
            assert np.array_equal(getattr(raw, edge), 4 * getattr(lr, edge))
        hr_scales = aligned_scales(hr, (4, 4))
        larger += sum(h > r for h, r in zip(hr_scales, aligned_scales(lr, (4, 4)), strict=True))
        half = np.array(hr_scales) // 2
        assert (np.abs(hr.top - 4 * lr.top) <= half).all() and (np.abs(hr.left - 4 * lr.left) <= half).all()
        bottom, right = hr.top + hr.height, hr.left + hr.width  # sides are multiples of 8: never clipped
        assert (np.abs(bottom - 4 * (lr.top + lr.height)) <= half).all() and (np.abs(right - 4 * (lr.left + lr.width)) <= half).all()
        assert (hr.height >= 1).all() and (bottom <= hr_h).all() and (right <= hr_w).all()
    assert larger > 0, "the test must decode hr at a larger scale than lr"


def test_dct_scaled_fields_decode_like_pil(pairs: Path) -> None:
    """Every field's output (RGB lr, grayscale hr at 1/8 scale) matches PIL's resize of the same
    box of the same JPEG: the strided view of the decode buffer handles 1 and 3 channels."""
    import io

    from shardfmt._loader.chunk import ChunkProcessor
    from shardfmt._loader.shm import SlotRing

    fields = {"lr_jpeg": ImageOutput(8), "hr_jpeg": ImageOutput(8, channels=1)}
    with Loader(
        pairs,
        batch_size=NUM,
        num_workers=0,
        fields=fields,
        transform=ImageTransform(crop=RandomResizedCrop(8), fast_decode=False),
        output=Output(layout="NHWC"),
    ) as loader:
        layout = loader.layout_spec
        ring = SlotRing.in_process(layout)
        processor = ChunkProcessor(loader.scheduler.config, lambda slot, serial: ring.arrays[slot])
        indices = np.arange(NUM, dtype=np.int64)
        processor.process(0, 0, 0, 1, indices)
        rows = [processor.dataset.shard(shard).table[local] for shard, local in map(processor.dataset.locate, range(NUM))]
        boxes = processor._boxes(rows, 1, indices)
        scores, scaled = [], 0
        with open_dataset(pairs) as reader:
            for name, mode in (("lr_jpeg", "RGB"), ("hr_jpeg", "L")):
                plan = boxes[name]
                for k in range(NUM):
                    box = (int(plan.left[k]), int(plan.top[k]), int(plan.left[k] + plan.width[k]), int(plan.top[k] + plan.height[k]))
                    scaled += dct_scale(int(plan.height[k]), int(plan.width[k]), (8, 8)) > 1
                    reference = (
                        Image.open(io.BytesIO(bytes(reader[k][name]))).convert(mode).resize((8, 8), Image.Resampling.BILINEAR, box=box)
                    )
                    if plan.flip[k]:
                        reference = reference.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                    expected = np.asarray(reference).reshape(8, 8, -1)
                    scores.append(psnr(ring.arrays[0][name][k], expected))
        processor.close()
    assert scaled >= NUM, "the test must exercise DCT scaling"
    assert np.mean(scores) >= 35.0 and np.percentile(scores, 5) >= 28.0, scores
