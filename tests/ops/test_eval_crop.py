"""The evaluation crop against torchvision's ``Resize(resize, antialias=True)`` + ``CenterCrop(size)``,
restated in ``tools/eval_parity.py`` (`torchvision_eval`, which names the torchvision functions it
restates), on photo-like JPEGs (`photo_jpeg`).

Before the fix the loader resized a box of source pixels whose edges were rounded, so the crop
sat up to 0.6 output pixels off: about 4-6/255 mean |diff|, 27-32 dB PSNR on these images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from eval_parity import photo_jpeg, psnr, torchvision_eval

from shardfmt import DatasetWriter, ImageTransform, Loader
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CenterCrop
from shardfmt.ops._crop import center_offsets, field_resize, resized_size
from shardfmt.ops._decode import ImageDecoder, as_target

SIZES = [(300, 400), (375, 500), (333, 1001), (480, 319), (257, 256), (417, 555)]


def test_resized_size_and_offsets_are_torchvisions() -> None:
    assert resized_size(375, 500, 256) == (256, 341)  # int(341.33)
    assert resized_size(1001, 333, 256) == (769, 256)  # int(769.51): truncated, not rounded
    assert resized_size(64, 64, 73) == (73, 73)
    assert resized_size(256, 257, 256) == (256, 257)
    assert center_offsets(256, 341, (224, 224)) == (16, 58)  # round(58.5) = 58, half to even
    assert center_offsets(769, 256, (224, 224)) == (272, 16)  # round(272.5) = 272
    assert center_offsets(75, 75, (64, 64)) == (6, 6)  # round(5.5) = 6
    assert CenterCrop(224, resize=256).resized_crop(375, 500) == (256, 341, 16, 58)
    assert CenterCrop(224, resize=256).resized_crop(375, 500, size=(112, 112)) == (128, 170, 8, 29)
    assert field_resize(256, (224, 224), (112, 112)) == 128
    assert field_resize(40, (32, 32), (33, 33)) == 41  # round(41.25)


def decoder_crop(data: bytes, pipeline: CenterCrop, interpolation: str, *, fast: bool) -> torch.Tensor:
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    decoder = ImageDecoder(max_height=height, max_width=width, output_size=pipeline.size, interpolation=interpolation, fast=fast)
    out = np.empty((1, *pipeline.size, 3), np.uint8)
    resized_h, resized_w, top, left = pipeline.resized_crop(height, width)
    decoder.decode_resized_crop(
        data, height=height, width=width, resized=(resized_h, resized_w), top=top, left=left, flip=False, out=as_target(out)
    )
    return torch.from_numpy(out[0]).permute(2, 0, 1)


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize(("resize", "size"), [(256, 224), (73, 64)])
def test_the_eval_crop_is_torchvisions_pixels(resize: int, size: int, interpolation: str) -> None:
    pipeline = CenterCrop(size, resize=resize)
    for k, (height, width) in enumerate(SIZES):
        data = photo_jpeg(height, width, k)
        want = torchvision_eval(data, resize=resize, size=size, interpolation=interpolation)
        for fast in (False, True):  # the eval crop decodes exactly whatever fast_decode says
            got = decoder_crop(data, pipeline, interpolation, fast=fast)
            diff = (got.int() - want.int()).abs()
            assert float(diff.float().mean()) < 0.5 and int(diff.max()) <= 1, (height, width)
            assert psnr(got, want) >= 45, (height, width)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    out = tmp_path_factory.mktemp("photos") / "ds"
    payloads = [photo_jpeg(height, width, k) for k, (height, width) in enumerate(SIZES)]
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, classes=["a"]) as writer:
        for k, data in enumerate(payloads):
            writer.write({"image": data, "label": 0, "key": f"photo{k}"})
    return out, payloads


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_a_loaders_eval_batches_are_torchvisions_pixels(photos: tuple[Path, list[bytes]], interpolation: str) -> None:
    path, payloads = photos
    settings = dict(
        batch_size=len(SIZES), num_workers=0, shuffle=False, transform=ImageTransform(crop="eval", size=224, interpolation=interpolation)
    )
    with Loader(path, **settings) as loader:
        assert loader.pipeline == CenterCrop(224, resize=256)
        images = next(iter(loader))[0]
    for image, data in zip(images, payloads, strict=True):
        want = torchvision_eval(data, resize=256, size=224, interpolation=interpolation)
        diff = (image.int() - want.int()).abs()
        assert float(diff.float().mean()) < 0.5 and int(diff.max()) <= 1
        assert psnr(image, want) >= 45


def test_the_map_style_dataset_gives_the_same_eval_pixels(photos: tuple[Path, list[bytes]]) -> None:
    from shardfmt import Dataset

    path, payloads = photos
    dataset = Dataset(path, transform=CenterCrop(64, resize=73))
    for k, data in enumerate(payloads):
        want = torchvision_eval(data, resize=73, size=64, interpolation="bilinear")
        assert int((dataset[k][0].int() - want.int()).abs().max()) <= 1
