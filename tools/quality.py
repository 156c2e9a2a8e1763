"""How close shardfmt's crops are to PIL's: PSNR against ``Image.resize(BILINEAR, box=...)``.

For each image, the crop box and flip are drawn exactly as `shardfmt.Loader` draws them; the
reference decodes the JPEG with PIL (libjpeg-turbo, exact IDCT, fancy upsampling), resizes the
same box with ``Image.resize((w, h), Image.BILINEAR, box=...)`` (antialiased, as torchvision's
resize on PIL images) and mirrors it; shardfmt's `ImageDecoder.decode_box` produces its crop.
It prints the mean, 5th percentile and minimum PSNR per pipeline, decode mode and image set:

- ImageNet-like images (416x362 mean): boxes are never 2x the output, so no DCT scaling;
- large images (500 to 1400 px a side): DCT scaling at 1/2, 1/4 or 1/8 happens often.

The loader's target: mean >= 40 dB and 5th percentile >= 30 dB.

    python tools/quality.py --images 300
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardfmt._sampling.keys import AUGMENT_STREAM, record_keys  # noqa: E402
from shardfmt._synthetic import make_image  # noqa: E402
from shardfmt.ops import CenterCrop, RandomResizedCrop  # noqa: E402
from shardfmt.ops._decode import ImageDecoder, as_target  # noqa: E402


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def scores(images: Sequence[bytes], pipeline: RandomResizedCrop | CenterCrop, *, fast: bool) -> np.ndarray:
    headers = [simplejpeg.decode_jpeg_header(data) for data in images]
    heights = np.array([h for h, _w, _c, _s in headers])
    widths = np.array([w for _h, w, _c, _s in headers])
    plan = pipeline.plan(heights, widths, record_keys(0, AUGMENT_STREAM, 0, np.arange(len(images), dtype=np.uint64)))
    decoder = ImageDecoder(max_height=int(heights.max()), max_width=int(widths.max()), output_size=pipeline.size, fast=fast)
    out = np.empty((1, *pipeline.size, 3), np.uint8)
    target = as_target(out)
    result = []
    for k, data in enumerate(images):
        top, left, height, width = int(plan.top[k]), int(plan.left[k]), int(plan.height[k]), int(plan.width[k])
        decoder.decode_box(
            data,
            height=int(heights[k]),
            width=int(widths[k]),
            top=top,
            left=left,
            box_height=height,
            box_width=width,
            flip=bool(plan.flip[k]),
            out=target,
        )
        reference = (
            Image.open(io.BytesIO(data))
            .convert("RGB")
            .resize(pipeline.size[::-1], Image.BILINEAR, box=(left, top, left + width, top + height))
        )
        if plan.flip[k]:
            reference = reference.transpose(Image.FLIP_LEFT_RIGHT)
        result.append(psnr(out[0], np.asarray(reference)))
    return np.array(result)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--images", type=int, default=300, help="ImageNet-like images (a fifth as many large ones)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    sets = {
        "ImageNet-like 416x362": [
            simplejpeg.encode_jpeg(
                make_image(int(rng.integers(290, 435)), int(rng.integers(333, 500)), seed=i), quality=95, colorsubsampling="420"
            )
            for i in range(args.images)
        ],
        "large, DCT-scaled": [
            simplejpeg.encode_jpeg(
                make_image(int(rng.integers(500, 1400)), int(rng.integers(500, 1400)), seed=10_000 + i), quality=90, colorsubsampling="420"
            )
            for i in range(max(1, args.images // 5))
        ],
    }
    print(f"{'images':<24} {'pipeline':<18} {'decode':<6} {'mean dB':>8} {'p5 dB':>7} {'min dB':>7}")
    for name, images in sets.items():
        for pipeline in (RandomResizedCrop((224, 224)), CenterCrop((224, 224), resize=256)):
            for fast in (True, False):
                values = scores(images, pipeline, fast=fast)
                print(
                    f"{name:<24} {type(pipeline).__name__:<18} {'fast' if fast else 'exact':<6} "
                    f"{values.mean():>8.1f} {np.percentile(values, 5):>7.1f} {values.min():>7.1f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
