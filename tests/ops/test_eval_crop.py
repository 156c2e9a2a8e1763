"""The evaluation crop against torchvision's ``Resize(resize, antialias=True)`` + ``CenterCrop(size)``.

torchvision has no CPU build installable here, so `torchvision_eval` restates its tensor path:
``transforms.v2.functional._geometry._compute_resized_output_size`` (one int: the shorter side
becomes `resize`, the longer ``int(resize * long / short)``), ``resize_image`` (an unchanged
size returns the image; else ``torch.nn.functional.interpolate`` on the uint8 tensor, which
torchvision hands to that kernel as it is on CPU for bilinear and bicubic, with
``antialias=True, align_corners=False``) and ``center_crop`` (its anchor
``int(round((h - crop_h) / 2.0))``, likewise left). The JPEGs are decoded as torchvision's
``decode_jpeg`` and PIL decode them: libjpeg's exact IDCT and fancy upsampling.

Before the fix the loader resized a box of source pixels whose edges were rounded, so the crop
sat up to 0.6 output pixels off: about 4-6/255 mean |diff|, 27-32 dB PSNR on these images.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from shardfmt import DatasetWriter, Loader
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CenterCrop
from shardfmt.ops._crop import center_offsets, field_resize, resized_size
from shardfmt.ops._decode import ImageDecoder, as_target

SIZES = [(300, 400), (375, 500), (333, 1001), (480, 319), (257, 256), (417, 555)]


def photo_jpeg(height: int, width: int, seed: int) -> bytes:
    """A photo-like JPEG: smooth colour gradients, sharp-edged shapes, blotchy texture and
    sensor-like noise, saved by Pillow at quality 90 with 4:2:0 chroma."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    image = np.zeros((height, width, 3))
    for c in range(3):
        angle, frequency = rng.uniform(0, 2 * np.pi), rng.uniform(0.002, 0.02)
        image[..., c] = 128 + 80 * np.sin(frequency * (x * np.cos(angle) + y * np.sin(angle)) + rng.uniform(0, 6))
    for _ in range(12):
        cy, cx, radius = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(5, min(height, width) / 4)
        disc = (y - cy) ** 2 + (x - cx) ** 2 < radius * radius
        shape = disc if rng.random() < 0.5 else (abs(y - cy) < radius) & (abs(x - cx) < radius * 0.6)
        image[shape] = rng.uniform(0, 255, 3)
    blotches = rng.normal(0, 20, (height // 4 + 1, width // 4 + 1, 3))
    image += np.kron(blotches, np.ones((4, 4, 1)))[:height, :width]
    image += rng.normal(0, 6, image.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def torchvision_eval(data: bytes, *, resize: int, size: int, interpolation: str) -> torch.Tensor:
    """torchvision's ``CenterCrop(size)(Resize(resize, interpolation, antialias=True)(decode_jpeg(data)))``,
    restated (see the module docstring): a (3, size, size) uint8 tensor."""
    image = torch.from_numpy(simplejpeg.decode_jpeg(data, fastdct=False, fastupsample=False)).permute(2, 0, 1)
    height, width = image.shape[1:]
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = resize, int(resize * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    if (new_h, new_w) != (height, width):
        image = image.reshape(-1, 3, height, width)  # as resize_image does: contiguous, not channels_last
        image = torch.nn.functional.interpolate(image, size=[new_h, new_w], mode=interpolation, align_corners=False, antialias=True)[0]
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return image[:, top : top + size, left : left + size]


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


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
    settings = dict(batch_size=len(SIZES), num_workers=0, shuffle=False, pipeline="eval", size=224, interpolation=interpolation)
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
    dataset = Dataset(path, pipeline=CenterCrop(64, resize=73))
    for k, data in enumerate(payloads):
        want = torchvision_eval(data, resize=73, size=64, interpolation="bilinear")
        assert int((dataset[k][0].int() - want.int()).abs().max()) <= 1
