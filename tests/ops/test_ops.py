"""Crop rules: torchvision's sampling, snapping to the DCT scale, and decode fidelity."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardfmt._sampling.keys import AUGMENT_STREAM, record_keys
from shardfmt._synthetic import make_image
from shardfmt.ops import CenterCrop, RandomResizedCrop, Resize
from shardfmt.ops._crop import dct_scale
from shardfmt.ops._decode import ImageDecoder, as_target


@settings(max_examples=60, deadline=None)
@given(
    height=st.integers(1, 3000),
    width=st.integers(1, 3000),
    size=st.integers(8, 300),
    seed=st.integers(0, 2**32),
)
def test_boxes_lie_inside_the_image_and_are_whole_scaled_pixels(height: int, width: int, size: int, seed: int) -> None:
    heights, widths = np.full(64, height), np.full(64, width)
    keys = record_keys(seed, AUGMENT_STREAM, 0, np.arange(64, dtype=np.uint64))
    for pipeline in (RandomResizedCrop((size, size)), CenterCrop((size, size), resize=size + size // 7), Resize((size, size))):
        plan = pipeline.plan(heights, widths, keys)
        assert (plan.top >= 0).all() and (plan.left >= 0).all()
        assert (plan.height >= 1).all() and (plan.width >= 1).all()
        assert (plan.top + plan.height <= height).all() and (plan.left + plan.width <= width).all()
        for k in range(64):
            scale = dct_scale(int(plan.height[k]), int(plan.width[k]), (size, size))
            assert plan.top[k] % scale == plan.left[k] % scale == plan.height[k] % scale == plan.width[k] % scale == 0


def torchvision_get_params(height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, written out independently with numpy draws."""
    area = height * width
    log_ratio = (np.log(3 / 4), np.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = np.exp(rng.uniform(*log_ratio))
        w = int(round(np.sqrt(target * aspect)))
        h = int(round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < 3 / 4:
        w, h = width, int(round(width / (3 / 4)))
    elif in_ratio > 4 / 3:
        h, w = height, int(round(height * (4 / 3)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@pytest.mark.parametrize("height, width", [(300, 300), (362, 416), (200, 600)])
def test_random_resized_crop_draws_like_torchvision(height: int, width: int) -> None:
    """Area fractions, aspect ratios and positions follow torchvision's distributions (quantiles
    of 20,000 boxes agree with an independent implementation of its rule)."""
    n = 20000
    plan = RandomResizedCrop((224, 224)).plan(
        np.full(n, height), np.full(n, width), record_keys(1, AUGMENT_STREAM, 0, np.arange(n, dtype=np.uint64))
    )
    rng = np.random.default_rng(0)
    reference = np.array([torchvision_get_params(height, width, rng) for _ in range(n)])
    quantiles = [0.05, 0.25, 0.5, 0.75, 0.95]
    ours_area = np.quantile(plan.height * plan.width / (height * width), quantiles)
    ref_area = np.quantile(reference[:, 2] * reference[:, 3] / (height * width), quantiles)
    assert np.abs(ours_area - ref_area).max() < 0.02
    ours_ratio = np.quantile(np.log(plan.width / plan.height), quantiles)
    ref_ratio = np.quantile(np.log(reference[:, 3] / reference[:, 2]), quantiles)
    assert np.abs(ours_ratio - ref_ratio).max() < 0.02
    ours_top = np.quantile(plan.top / height, quantiles)
    ref_top = np.quantile(reference[:, 0] / height, quantiles)
    assert np.abs(ours_top - ref_top).max() < 0.02
    assert abs(plan.flip.mean() - 0.5) < 0.02


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("pipeline", [RandomResizedCrop((32, 32)), CenterCrop((32, 32), resize=36), Resize((40, 24))])
def test_dct_scaled_crops_match_pil(pipeline: RandomResizedCrop | CenterCrop | Resize) -> None:
    """Large boxes are decoded at 1/2 to 1/8 scale; the crops still match PIL on the same boxes."""
    rng = np.random.default_rng(5)
    images = [
        simplejpeg.encode_jpeg(make_image(int(rng.integers(150, 400)), int(rng.integers(150, 400)), seed=i), quality=90) for i in range(24)
    ]
    heights = np.array([simplejpeg.decode_jpeg_header(d)[0] for d in images])
    widths = np.array([simplejpeg.decode_jpeg_header(d)[1] for d in images])
    plan = pipeline.plan(heights, widths, record_keys(2, AUGMENT_STREAM, 0, np.arange(len(images), dtype=np.uint64)))
    decoder = ImageDecoder(max_height=int(heights.max()), max_width=int(widths.max()), output_size=pipeline.size, fast=False)
    out = np.empty((1, *pipeline.size, 3), np.uint8)
    scores, scaled = [], 0
    for k, data in enumerate(images):
        box = (int(plan.left[k]), int(plan.top[k]), int(plan.left[k] + plan.width[k]), int(plan.top[k] + plan.height[k]))
        scaled += dct_scale(int(plan.height[k]), int(plan.width[k]), pipeline.size) > 1
        decoder.decode_box(
            data,
            height=int(heights[k]),
            width=int(widths[k]),
            top=box[1],
            left=box[0],
            box_height=box[3] - box[1],
            box_width=box[2] - box[0],
            flip=bool(plan.flip[k]),
            out=as_target(out),
        )
        reference = Image.open(io.BytesIO(data)).convert("RGB").resize(pipeline.size[::-1], Image.BILINEAR, box=box)
        if plan.flip[k]:
            reference = reference.transpose(Image.FLIP_LEFT_RIGHT)
        scores.append(psnr(out[0], np.asarray(reference)))
    assert scaled >= len(images) // 3, "the test must exercise DCT scaling"
    assert np.mean(scores) >= 40.0
    assert np.percentile(scores, 5) >= 30.0
