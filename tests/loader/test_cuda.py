"""The CUDA path on a real device: pinned slots, the side-stream copy, normalisation on the GPU,
dict batches, and nvJPEG decoding (``decode="gpu"``/``"hybrid"``) against the CPU path's pixels.
Everything here skips on a machine without CUDA (tests/loader/test_gpudecode.py covers the
plumbing there)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch

from shardfmt import DatasetWriter, ImageTransform, Loader, Output
from shardfmt._synthetic import make_image
from shardfmt.format import IMAGE_CLASSIFICATION

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NUM_RECORDS = 70
MEAN, STD = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)


def has_nvjpeg() -> bool:
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except ImportError:
        return False
    return True


needs_nvjpeg = pytest.mark.skipif(not has_nvjpeg(), reason="needs torchvision (its nvJPEG decode)")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """70 textured JPEGs of 100 to 260 px a side (4:2:0, quality 90), label = index."""
    out = tmp_path_factory.mktemp("cuda") / "ds"
    rng = np.random.default_rng(7)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=500_000) as writer:
        for i in range(NUM_RECORDS):
            h, w = int(rng.integers(100, 260)), int(rng.integers(100, 260))
            data = simplejpeg.encode_jpeg(make_image(h, w, seed=i), quality=90, colorsubsampling="420")
            writer.write({"image": data, "label": i, "key": f"r{i}"})
    return out


SETTINGS = {"batch_size": 16, "num_workers": 2, "seed": 9, "transform": ImageTransform(size=96)}


def stage_and_ring(loader: Loader) -> tuple[Any, Any]:
    """The loader's device stage and slot ring, wherever the loader keeps them."""
    scheduler = getattr(loader, "scheduler", None)
    if scheduler is not None:
        return scheduler.stage, scheduler.ring
    return loader._stage, loader._ring


def cpu_batches(path: Path, **options: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with Loader(path, **(SETTINGS | options)) as loader:  # type: ignore[arg-type]
        return [(images.clone(), labels.clone()) for images, labels in loader]


def test_slots_are_page_locked_and_batches_equal_the_cpu_path(photos: Path) -> None:
    expected = cpu_batches(photos, layout="NHWC")
    with Loader(photos, **SETTINGS, device="cuda", output=Output(layout="NHWC")) as loader:
        got = [(images.cpu(), labels.cpu()) for images, labels in loader]
        stage, ring = stage_and_ring(loader)
        assert stage._staging is None and stage._registered  # cudaHostRegister took every slot
        assert all(torch.from_numpy(array).is_pinned() for slot in ring.arrays for array in slot.values())
    assert not stage._registered  # closing unregistered every slot: a later mapping there registers afresh
    assert len(got) == len(expected)
    for (images, labels), (cpu_images, cpu_labels) in zip(got, expected, strict=True):
        assert torch.equal(images, cpu_images) and torch.equal(labels, cpu_labels)


def test_the_copy_runs_on_a_side_stream_that_the_consumer_waits_for(photos: Path) -> None:
    expected = cpu_batches(photos, layout="NHWC")
    consumer = torch.cuda.current_stream()
    with Loader(photos, **SETTINGS, device="cuda", output=Output(layout="NHWC")) as loader:
        assert stage_and_ring(loader)[0].stream != consumer
        sums = []
        for images, _labels in loader:
            assert images.device.type == "cuda" and images.dtype == torch.uint8
            sums.append(images.sum(dtype=torch.int64))  # on the consumer's stream, with no synchronize
        totals = [int(value) for value in sums]
    assert totals == [int(images.sum(dtype=torch.int64)) for images, _ in expected]


def test_normalising_on_the_gpu_matches_the_workers(photos: Path) -> None:
    expected = cpu_batches(photos, layout="NCHW", mean=MEAN, std=STD)
    with Loader(photos, **SETTINGS, device="cuda", transform=ImageTransform(mean=MEAN, std=STD), output=Output(layout="NCHW")) as loader:
        for (images, labels), (cpu_images, cpu_labels) in zip(loader, expected, strict=True):
            assert images.dtype == torch.float32 and images.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(images.cpu(), cpu_images)
            assert torch.equal(labels.cpu(), cpu_labels)


def test_dict_batches_with_fields_and_indices(photos: Path) -> None:
    options = {"fields": ["image", "label"], "return_indices": True, "shuffle": False}
    with Loader(photos, **SETTINGS, **options) as cpu:
        expected = [{name: tensor.clone() for name, tensor in batch.items()} for batch in cpu]
    with Loader(photos, **SETTINGS, **options, device="cuda") as loader:
        for batch, reference in zip(loader, expected, strict=True):
            assert set(batch) == {"image", "label", "index"}
            for name, tensor in batch.items():
                assert tensor.device.type == "cuda"
                assert torch.equal(tensor.cpu(), reference[name])


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


# The stated tolerance of decode="gpu" against the CPU path (docs/gpu.md): nvJPEG's IDCT and
# chroma upsampling are not libjpeg-turbo's, and a box the CPU decodes at a reduced DCT scale is
# resized from full scale on the GPU.
MEAN_ABS_TOLERANCE = 3.0
PSNR_TOLERANCE = 30.0


@needs_nvjpeg
@pytest.mark.parametrize("mode", ["gpu", "hybrid"])
def test_nvjpeg_decoding_matches_the_cpu_path(photos: Path, mode: str) -> None:
    expected = cpu_batches(photos, layout="NHWC", fast_decode=False)
    with Loader(photos, **SETTINGS, transform=ImageTransform(decode=mode), output=Output(layout="NHWC")) as loader:
        got = [(images.cpu(), labels.cpu()) for images, labels in loader]
        share = loader._gpu.split.gpu_share
    assert len(got) == len(expected)
    for (images, labels), (cpu_images, cpu_labels) in zip(got, expected, strict=True):
        assert torch.equal(labels, cpu_labels)
        assert images.shape == cpu_images.shape and images.dtype == torch.uint8
        assert float((images.float() - cpu_images.float()).abs().mean()) < MEAN_ABS_TOLERANCE
        assert psnr(images, cpu_images) > PSNR_TOLERANCE
    if mode == "hybrid":
        assert 0 < share < 1


@needs_nvjpeg
def test_nvjpeg_decoding_normalises_and_resumes(photos: Path) -> None:
    with Loader(photos, **SETTINGS, transform=ImageTransform(decode="gpu", mean=MEAN, std=STD)) as loader:
        iterator = iter(loader)
        first = [next(iterator) for _ in range(2)]
        assert first[0][0].dtype == torch.float32 and first[0][0].device.type == "cuda"
        assert first[0][0].is_contiguous(memory_format=torch.channels_last)
        state = loader.state_dict()
        rest = [labels.tolist() for _, labels in iterator]
    with Loader(photos, **SETTINGS, transform=ImageTransform(decode="gpu")) as resumed:
        resumed.load_state_dict(state)
        assert [labels.tolist() for _, labels in resumed] == rest
    with Loader(photos, **SETTINGS) as cpu:
        whole = [labels.tolist() for _, labels in itertools.islice(cpu, None)]
    assert [labels.tolist() for _, labels in first] + rest == whole
