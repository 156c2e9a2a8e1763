"""Trusted first reads: a dataset whose manifest says the converter strictly decoded every JPEG
("strict_jpeg") has its records decoded partially from their first read, once their checksum
matches; other datasets only from a record's second read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from converting import convert

from shardfmt import DatasetWriter, ImageTransform, Loader, ManifestError, Workers
from shardfmt._loader.chunk import ChunkProcessor
from shardfmt._loader.shm import SlotRing
from shardfmt._sampling.keys import AUGMENT_STREAM, record_keys
from shardfmt._synthetic import make_imagefolder
from shardfmt.format import IMAGE_CLASSIFICATION, Manifest
from shardfmt.ops._crop import dct_scale
from shardfmt.ops._jpegcrop import CropDecoder

SIZE = 24


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_imagefolder(tmp_path_factory.mktemp("trusted") / "src", num_classes=2, per_class=12, size=(60, 84), seed=4)


@pytest.fixture(scope="module")
def converted(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("converted") / "ds"
    convert(folder, out, workers=1)
    return out


@pytest.fixture(scope="module")
def written(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same JPEG bytes written by DatasetWriter, which does not decode them."""
    out = tmp_path_factory.mktemp("written") / "ds"
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION) as writer:
        for i, path in enumerate(files):
            writer.write({"image": path.read_bytes(), "label": i % 2, "key": path.stem})
    return out


def test_the_converter_records_the_strict_decode_and_other_writers_do_not(converted: Path, written: Path) -> None:
    assert json.loads((converted / "manifest.json").read_text())["strict_jpeg"] is True
    assert Manifest.load(converted).strict_jpeg
    assert "strict_jpeg" not in json.loads((written / "manifest.json").read_text())
    assert not Manifest.load(written).strict_jpeg


def test_a_strict_jpeg_that_is_not_a_boolean_is_refused(converted: Path) -> None:
    value = json.loads((converted / "manifest.json").read_text())
    value["strict_jpeg"] = "yes"
    with pytest.raises(ManifestError, match="strict_jpeg"):
        Manifest.from_bytes(json.dumps(value).encode())


def partial_decodes(dataset: Path, monkeypatch: pytest.MonkeyPatch, *, reads: int) -> tuple[list[int], int]:
    """Read every record `reads` times through a worker's ChunkProcessor (in this process);
    return the partial decodes of each read and the boxes that are decoded at full scale."""
    calls = [0]
    original = CropDecoder.decode

    def counting(self: CropDecoder, data: object, **box: int) -> int:
        calls[0] += 1
        return original(self, data, **box)

    monkeypatch.setattr(CropDecoder, "decode", counting)
    with Loader(dataset, batch_size=24, num_workers=0, seed=1, transform=ImageTransform(size=SIZE)) as loader:
        layout = loader.layout_spec
        processor = ChunkProcessor(loader.scheduler.config, lambda slot, serial: SlotRing.in_process(layout).arrays[slot], in_worker=True)
        indices = np.arange(24, dtype=np.int64)
        counts = []
        for _ in range(reads):
            before = calls[0]
            processor.process(0, 0, 0, 0, indices)
            counts.append(calls[0] - before)
        reader = processor.dataset
        sizes = [reader[int(i)].image_info() for i in indices]
        plan = loader.pipeline.plan(
            np.array([s.height for s in sizes]),
            np.array([s.width for s in sizes]),
            record_keys(1, AUGMENT_STREAM, 0, indices.astype(np.uint64)),
        )
        processor.close()
    full_scale = sum(dct_scale(int(h), int(w), (SIZE, SIZE)) == 1 for h, w in zip(plan.height, plan.width, strict=True))
    return counts, full_scale


@pytest.mark.skipif(not CropDecoder.available(), reason="libjpeg-turbo's partial decoding is not available here")
def test_a_strictly_decoded_dataset_is_decoded_partially_from_the_first_read(
    converted: Path, written: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts, full_scale = partial_decodes(converted, monkeypatch, reads=2)
    assert full_scale == 17  # of 24 boxes; the others are decoded at a reduced DCT scale, whole
    assert counts == [full_scale, full_scale]
    counts, full_scale = partial_decodes(written, monkeypatch, reads=2)
    assert counts == [0, full_scale]  # untrusted bytes: whole decodes first


@pytest.mark.skipif(not CropDecoder.available(), reason="libjpeg-turbo's partial decoding is not available here")
def test_first_reads_give_the_pixels_of_whole_decodes(converted: Path) -> None:
    def first_epoch(num_workers: int) -> list[bytes]:
        with Loader(
            converted,
            batch_size=8,
            num_workers=num_workers,
            seed=6,
            transform=ImageTransform(size=SIZE),
            workers=Workers(start_method="fork"),
        ) as loader:
            return [images.numpy().tobytes() for images, _ in loader]

    assert first_epoch(2) == first_epoch(0)


def test_without_verification_nothing_is_trusted_on_its_first_read(converted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]
    original = CropDecoder.decode

    def counting(self: CropDecoder, data: object, **box: int) -> int:
        calls[0] += 1
        return original(self, data, **box)

    monkeypatch.setattr(CropDecoder, "decode", counting)
    with Loader(converted, batch_size=24, num_workers=0, seed=1, verify=False, transform=ImageTransform(size=SIZE)) as loader:
        layout = loader.layout_spec
        processor = ChunkProcessor(loader.scheduler.config, lambda slot, serial: SlotRing.in_process(layout).arrays[slot], in_worker=True)
        processor.process(0, 0, 0, 0, np.arange(24, dtype=np.int64))
        processor.close()
    assert calls[0] == 0  # no checksum checked: the bytes may not be the converter's
