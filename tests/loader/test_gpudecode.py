"""Loader(decode="gpu"/"hybrid") without a GPU: the bytes-in-slot path, the crop boxes, the order,
resume and the errors, with a CPU `BatchDecoder` standing in for nvJPEG (tests/loader/
test_cuda.py runs the real one where there is a CUDA device)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, DecodeError, ImageTransform, Loader, Output
from shardfmt._loader import gpudecode
from shardfmt._loader.gpudecode import Split, resize_boxes
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops._augment import ColorJitter
from shardfmt.ops._decode import as_target
from shardfmt.ops._resize import Resizer

NUM_RECORDS = 61


class CpuDecoder:
    """Decodes like the CPU path with fast_decode=False (libjpeg-turbo's exact IDCT), on the CPU."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls: list[int] = []

    def decode(self, data: list[torch.Tensor]) -> list[torch.Tensor]:
        self.calls.append(len(data))
        out = []
        for blob in data:
            pixels = simplejpeg.decode_jpeg(blob.numpy().tobytes(), colorspace="RGB", fastdct=False, fastupsample=False)
            out.append(torch.from_numpy(pixels).permute(2, 0, 1))
        return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """61 records whose label is their index, 40 to 89 px a side, in several shards."""
    out = tmp_path_factory.mktemp("gpudecode") / "ds"
    rng = np.random.default_rng(5)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=40_000) as writer:
        for i in range(NUM_RECORDS):
            h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
            writer.write({"image": jpeg_bytes(h, w, seed=i), "label": i, "key": f"r{i}"})
    return out


@pytest.fixture
def decoder(monkeypatch: pytest.MonkeyPatch) -> CpuDecoder:
    stand_in = CpuDecoder()
    monkeypatch.setattr(gpudecode, "open_decoder", lambda device: stand_in)
    return stand_in


def batches(loader: Loader, limit: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in itertools.islice(loader, limit)]


SETTINGS = {"batch_size": 16, "num_workers": 2, "seed": 3, "output": Output(layout="NHWC")}
"""With each loader's `ImageTransform(..., fast_decode=False)`: PIL's exact pixels on the CPU path."""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("mode", ["gpu", "hybrid"])
def test_gpu_decode_without_cuda_says_what_is_missing(dataset: Path, mode: str) -> None:
    with pytest.raises(ValueError, match=r"need CUDA, but torch.cuda.is_available\(\) is False.*decode='cpu'"):
        Loader(dataset, batch_size=8, transform=ImageTransform(decode=mode))


def test_decode_requests_that_cannot_be_served(dataset: Path, decoder: CpuDecoder) -> None:
    with pytest.raises(ValueError, match="decode must be one of 'cpu', 'gpu', 'hybrid', got 'tpu'"):
        Loader(dataset, batch_size=8, transform=ImageTransform(decode="tpu"))
    with pytest.raises(ValueError, match="with fields=..., use decode='cpu'"):
        Loader(dataset, batch_size=8, fields=["image", "label"], transform=ImageTransform(decode="gpu"))
    with pytest.raises(ValueError, match="cannot run augment= steps"):
        Loader(dataset, batch_size=8, transform=ImageTransform(decode="hybrid", augment=[ColorJitter(0.4)]))
    with pytest.raises(ValueError, match="decode on a CUDA device, but device='cpu'"):
        _real_open_decoder(torch.device("cpu"))


_real_open_decoder = gpudecode.open_decoder
"""The opener itself: the `decoder` fixture replaces the module's."""


@pytest.mark.parametrize("mode", ["gpu", "hybrid"])
def test_gpu_rows_take_the_cpu_paths_boxes_order_and_labels(dataset: Path, decoder: CpuDecoder, mode: str) -> None:
    """48 px outputs of 40 to 89 px images: every box decodes at full scale on both paths, so the
    only difference is the resize's rounding (torch's uint8 kernel rounds after each pass)."""
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=48, fast_decode=False)) as cpu:
        expected = batches(cpu)
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=48, fast_decode=False, decode=mode)) as gpu:
        got = batches(gpu)
        shares = gpu._gpu.split.gpu_share  # type: ignore[union-attr]
    if mode == "gpu":
        assert sum(decoder.calls) == NUM_RECORDS
    else:
        assert sum(decoder.calls) < NUM_RECORDS and 0 < shares < 1
    assert len(got) == len(expected) == 4
    for (images, labels), (cpu_images, cpu_labels) in zip(got, expected, strict=True):
        assert torch.equal(labels, cpu_labels)
        assert images.shape == cpu_images.shape == (len(labels), 48, 48, 3) and images.dtype == torch.uint8
        difference = (images.int() - cpu_images.int()).abs()
        assert int(difference.max()) <= 1


def test_boxes_decoded_at_a_reduced_scale_on_the_cpu_stay_close(dataset: Path, decoder: CpuDecoder) -> None:
    """At 16 px most boxes are decoded at 1/2 or 1/4 scale on the CPU path and resized from full
    scale on the GPU path: the same box, a different filter, so a looser tolerance."""
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=16, fast_decode=False)) as cpu:
        expected = batches(cpu)
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=16, fast_decode=False, decode="gpu")) as gpu:
        got = batches(gpu)
    for (images, labels), (cpu_images, cpu_labels) in zip(got, expected, strict=True):
        assert torch.equal(labels, cpu_labels)
        difference = (images.float() - cpu_images.float()).abs()
        assert float(difference.mean()) < 4.0


def test_gpu_decode_resumes_mid_epoch(dataset: Path, decoder: CpuDecoder) -> None:
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=24, fast_decode=False, decode="gpu")) as loader:
        whole = [labels.tolist() for _, labels in loader]
        iterator = iter(loader)
        first = [next(iterator)[1].tolist() for _ in range(2)]
        state = loader.state_dict()
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=24, fast_decode=False, decode="gpu")) as resumed:
        resumed.load_state_dict(state)
        rest = [labels.tolist() for _, labels in resumed]
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=24, fast_decode=False)) as cpu:
        cpu.set_epoch(1)
        second_epoch = [labels.tolist() for _, labels in cpu]
    assert first + rest == second_epoch
    assert sorted(itertools.chain(*whole)) == list(range(NUM_RECORDS))


def test_gpu_decode_in_process_and_return_indices(dataset: Path, decoder: CpuDecoder) -> None:
    settings = SETTINGS | {"num_workers": 0, "output": Output(layout="NHWC", return_indices=True)}
    with Loader(dataset, **settings, transform=ImageTransform(size=24, fast_decode=False, decode="gpu")) as loader:
        for images, labels, indices in loader:
            assert torch.equal(labels, indices)
            assert images.shape == (len(labels), 24, 24, 3)


def test_a_jpeg_that_does_not_decode_is_named(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing(CpuDecoder):
        def decode(self, data: list[torch.Tensor]) -> list[torch.Tensor]:
            if any(int(blob[-1]) != 0xD9 for blob in data):
                raise RuntimeError("Error while decoding JPEG images")
            return super().decode(data)

    failing = Failing()
    monkeypatch.setattr(gpudecode, "open_decoder", lambda device: failing)
    unseeded = {k: v for k, v in SETTINGS.items() if k != "seed"}
    with Loader(dataset, shuffle=False, **unseeded, transform=ImageTransform(size=24, fast_decode=False, decode="gpu")) as loader:
        monkeypatch.setattr(gpudecode.GpuDecodeStage, "_decode", _truncating(gpudecode.GpuDecodeStage._decode, row=3))
        with pytest.raises(DecodeError, match="dataset record 3: the JPEG does not decode on cpu"):
            next(iter(loader))


def _truncating(decode, *, row: int):  # type: ignore[no-untyped-def]
    """Wrap GpuDecodeStage._decode so that row `row`'s JPEG loses its last byte (EOI)."""

    def wrapped(self, tensors, arrays):  # type: ignore[no-untyped-def]
        arrays[".jpeg_size"][row] -= 1
        return decode(self, tensors, arrays)

    return wrapped


def test_resize_boxes_is_torchs_antialiased_kernel() -> None:
    rng = np.random.default_rng(0)
    images, boxes = [], []
    for _ in range(12):
        h, w = int(rng.integers(20, 300)), int(rng.integers(20, 300))
        images.append(torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)))
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw, int(rng.integers(0, 2)), h, w))
    table = np.array(boxes, np.int64)
    for size in ((32, 32), (40, 56), (224, 224)):
        out = torch.empty((len(images), *size, 3), dtype=torch.uint8)
        resize_boxes(images, table, size, out)
        target = torch.empty((len(images), *size, 3), dtype=torch.uint8)
        resizer = Resizer(output_size=size, channels=3)
        rows = as_target(target.numpy())
        for k, (top, left, bh, bw, flip, _, _) in enumerate(boxes):
            source = images[k][:, top : top + bh, left : left + bw].unsqueeze(0)
            resizer.resize(source, flip=bool(flip), out=rows[k : k + 1])
            exact = torch.nn.functional.interpolate(source.float(), size=size, mode="bilinear", antialias=True, align_corners=False)
            exact = exact.flip(3) if flip else exact
            assert float((out[k].permute(2, 0, 1).float() - exact[0]).abs().max()) <= 0.5 + 1e-3  # the float kernel, rounded once
        assert int((out.int() - target.int()).abs().max()) <= 1  # torch's uint8 kernel rounds twice


def test_resize_boxes_in_groups_gives_the_same_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    images = [torch.from_numpy(rng.integers(0, 256, (3, 64, 80), dtype=np.uint8)) for _ in range(5)]
    table = np.array([(2, 3, 50, 60, k % 2, 64, 80) for k in range(5)], np.int64)
    whole = torch.empty((5, 24, 24, 3), dtype=torch.uint8)
    resize_boxes(images, table, (24, 24), whole)
    monkeypatch.setattr(gpudecode, "GROUP_BYTES", 2 * 50 * 60 * 3 * 12)  # two boxes a group
    grouped = torch.zeros_like(whole)
    resize_boxes(images, table, (24, 24), grouped)
    assert torch.equal(whole, grouped)


def test_split_follows_the_measured_rates() -> None:
    split = Split("hybrid", workers=4)
    assert split.gpu_rows(100) == 50  # nothing measured yet
    split.observe(cpu_rows=50, cpu_seconds=50 * 0.004, gpu_rows=50, gpu_seconds=50 * 0.0005)
    # CPU: 4 workers / 4 ms = 1,000 rows/s; GPU: 2,000 rows/s: two thirds to the GPU
    assert split.gpu_rows(99) == 66
    assert Split("gpu", workers=4).gpu_rows(7) == 7


def test_gpu_decode_follows_set_size(dataset: Path, decoder: CpuDecoder) -> None:
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=24, fast_decode=False, decode="hybrid")) as loader:
        first = next(iter(loader))[0]
        loader.set_size(40)
        images, labels = next(iter(loader))
    assert first.shape == (16, 24, 24, 3) and images.shape == (16, 40, 40, 3)
    with Loader(dataset, **SETTINGS, transform=ImageTransform(size=40, fast_decode=False)) as cpu:
        cpu.set_epoch(1)
        cpu_images, cpu_labels = next(iter(cpu))
    assert torch.equal(labels, cpu_labels)
    assert int((images.int() - cpu_images.int()).abs().max()) <= 1
