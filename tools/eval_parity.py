"""The evaluation crop against torchvision's ``Resize(resize, antialias=True)`` + ``CenterCrop(size)``.

torchvision has no CPU build installable here, so `torchvision_eval` restates its tensor path:
``transforms.v2.functional._geometry._compute_resized_output_size`` (one int: the shorter side
becomes `resize`, the longer ``int(resize * long / short)``), ``resize_image`` (an unchanged
size returns the image; else ``torch.nn.functional.interpolate`` on the uint8 tensor, which
torchvision hands to that kernel as it is on CPU for bilinear and bicubic, with
``antialias=True, align_corners=False``) and ``center_crop`` (its anchor
``int(round((h - crop_h) / 2.0))``, likewise left). The JPEGs are decoded as torchvision's
``decode_jpeg`` and PIL decode them: libjpeg's exact IDCT and fancy upsampling.

It prints mean |diff| (0-255 scale) and the minimum and median PSNR of the loader's eval crop
(`ImageDecoder.decode_resized_crop` at `CenterCrop.resized_crop`) and of a resize of the
pipeline's source box (`decode_box`, what the loader did before), for photo-like JPEGs
(`photo_jpeg`) and, where matplotlib is installed, its sample photograph:

    python tools/eval_parity.py --images 40
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardfmt.ops import CenterCrop  # noqa: E402
from shardfmt.ops._decode import ImageDecoder, as_target  # noqa: E402


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
    """PSNR in dB of two uint8 images (inf when equal)."""
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def sample_photos() -> list[bytes]:
    """matplotlib's sample photograph (Grace Hopper, 512x600), where matplotlib is installed."""
    try:
        import matplotlib.cbook
    except ImportError:
        return []
    path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    return [Path(str(path)).read_bytes()]


def loader_crops(data: bytes, pipeline: CenterCrop, interpolation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The loader's eval crop, and the resize of the pipeline's source box (the crop before)."""
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    decoder = ImageDecoder(max_height=height, max_width=width, output_size=pipeline.size, interpolation=interpolation, fast=False)
    now, box = np.empty((1, *pipeline.size, 3), np.uint8), np.empty((1, *pipeline.size, 3), np.uint8)
    resized_h, resized_w, top, left = pipeline.resized_crop(height, width)
    decoder.decode_resized_crop(
        data, height=height, width=width, resized=(resized_h, resized_w), top=top, left=left, flip=False, out=as_target(now)
    )
    plan = pipeline.plan(np.array([height]), np.array([width]), np.zeros(1, np.uint64))
    decoder.decode_box(
        data, height=height, width=width, top=int(plan.top[0]), left=int(plan.left[0]), box_height=int(plan.height[0]),
        box_width=int(plan.width[0]), flip=False, out=as_target(box),
    )
    return torch.from_numpy(now[0]).permute(2, 0, 1), torch.from_numpy(box[0]).permute(2, 0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--images", type=int, default=40, help="photo-like JPEGs (sizes from 256 to 640 a side)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    photos = [photo_jpeg(int(rng.integers(256, 641)), int(rng.integers(256, 641)), k) for k in range(args.images)]
    photos += sample_photos()
    print(f"{len(photos)} images; mean |diff| (0-255) and PSNR (dB) against torchvision's Resize + CenterCrop, restated")
    for interpolation in ("bilinear", "bicubic"):
        for resize, size in ((256, 224), (73, 64)):
            pipeline = CenterCrop(size, resize=resize)
            rows: dict[str, list[tuple[float, float]]] = {"eval crop": [], "box resize (before)": []}
            for data in photos:
                want = torchvision_eval(data, resize=resize, size=size, interpolation=interpolation)
                for name, got in zip(rows, loader_crops(data, pipeline, interpolation), strict=True):
                    rows[name].append((float((got.int() - want.int()).abs().float().mean()), psnr(got, want)))
            for name, values in rows.items():
                diffs, scores = np.array([v[0] for v in values]), np.array([v[1] for v in values])
                print(
                    f"{interpolation:8} {resize}/{size:<3} {name:20} mean|diff| {diffs.mean():.3f}  PSNR min {scores.min():5.1f}  "
                    f"median {np.median(scores):5.1f}  identical {int(np.isinf(scores).sum())}/{len(scores)}"
                )


if __name__ == "__main__":
    main()
