"""Augmentation in the workers (shardfmt.ops augment steps, a user's step, normalisation):
each step against a reference written here from torchvision's documented formulas, draws that
depend only on (seed, epoch, record), and the same batches under 0 and 2 workers and after a
resume.

Tolerances: brightness, contrast, saturation and grayscale are torchvision's float32 formulas
for uint8 images, done in the same float32 order, so on the float planes (and on the uint8
pixels with ``exact=True``) they must match the reference exactly; on the pixels OpenCV's
uint8 kernels keep contrast, saturation and sharpness within one level of it (spec/pixels.md),
and grayscale at its value or one more.
Hue is computed in another order of float operations than the HSV round trip of the reference
(Python's colorsys): every value within 1 of it, at least 99% of them equal. Rotation picks the
nearest source pixel, so a coordinate exactly half-way between two pixels may round either way:
at least 99.5% of pixels equal to the reference (and to PIL's ``rotate``, what torchvision runs
on PIL images), on images whose sides have the same parity (so that a right angle has no ties).
"""

from __future__ import annotations

import colorsys
import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from conftest import jpeg_bytes
from fuzz_loader import loader_arguments
from PIL import Image

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, WorkerError, Workers
from shardfmt._sampling.keys import STEP_STREAM, record_keys, uniforms
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import (
    ColorJitter,
    RandomGrayscale,
    RandomRotation,
    RandomVerticalFlip,
)
from shardfmt.ops._augment import SampleTransform
from shardfmt.ops._colour import ColourKernels
from shardfmt.ops._pixelops import _TO_UINT8, _TRUNCATE, PixelOps
from shardfmt.ops._rotate import Rotator

F32 = np.float32


# -- references, from torchvision's documented formulas for uint8 tensors ------------------------


def ref_blend(image: np.ndarray, other: Any, ratio: float) -> np.ndarray:
    """_blend: (ratio * img1 + (1 - ratio) * img2).clamp(0, 255) then to uint8 (truncation), in float32."""
    mixed = F32(ratio) * image.astype(F32) + F32(1.0 - ratio) * np.asarray(other, F32)
    return np.trunc(np.clip(mixed, 0, 255)).astype(F32)


def ref_gray(image: np.ndarray) -> np.ndarray:
    """rgb_to_grayscale: (0.2989 r + 0.587 g + 0.114 b) to uint8."""
    r, g, b = image.astype(F32)
    return np.trunc(F32(0.2989) * r + F32(0.587) * g + F32(0.114) * b)


def ref_brightness(image: np.ndarray, factor: float) -> np.ndarray:
    return ref_blend(image, 0.0, factor)


def ref_contrast(image: np.ndarray, factor: float) -> np.ndarray:
    return ref_blend(image, F32(ref_gray(image).mean(dtype=np.float64)), factor)


def ref_saturation(image: np.ndarray, factor: float) -> np.ndarray:
    return ref_blend(image, ref_gray(image)[None], factor)


def ref_grayscale(image: np.ndarray) -> np.ndarray:
    return np.repeat(ref_gray(image)[None], 3, axis=0)


def ref_hue(image: np.ndarray, shift: float) -> np.ndarray:
    """adjust_hue: to [0, 1], to HSV, h = (h + shift) mod 1, back to RGB, times 255.999, truncated."""
    out = np.empty(image.shape, F32)
    for i in range(image.shape[1]):
        for j in range(image.shape[2]):
            h, s, v = colorsys.rgb_to_hsv(*(image[:, i, j].astype(np.float64) / 255))
            out[:, i, j] = np.trunc(np.array(colorsys.hsv_to_rgb((h + shift) % 1.0, s, v)) * 255.999)
    return out


def ref_rotate(image: np.ndarray, angle: float, fill: tuple[float, ...]) -> np.ndarray:
    """rotate(NEAREST, expand=False, center=None): output (i, j) takes the source pixel nearest to
    the point turned back by `angle` about the centre ((W - 1) / 2, (H - 1) / 2), else fill."""
    _, height, width = image.shape
    cx, cy = (width - 1) / 2, (height - 1) / 2
    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    out = np.empty(image.shape, F32)
    for i in range(height):
        for j in range(width):
            x = round(cos * (j - cx) - sin * (i - cy) + cx)
            y = round(sin * (j - cx) + cos * (i - cy) + cy)
            out[:, i, j] = image[:, y, x] if 0 <= x < width and 0 <= y < height else fill
    return out


def ref_jitter(image: np.ndarray, step: ColorJitter, u: np.ndarray) -> np.ndarray:
    """ColorJitter.forward: the four adjustments in the order of the draws, each factor uniform in its range."""
    adjust = (ref_brightness, ref_contrast, ref_saturation, ref_hue)
    for n in np.argsort(u[:4], kind="stable"):
        span = step.ranges[n]
        if span is not None:
            image = adjust[n](image, span[0] + (span[1] - span[0]) * u[4 + n])
    return image


def sample_image(height: int = 26, width: int = 34, seed: int = 0) -> np.ndarray:
    """Random pixels, with gray pixels and every ordering of channels among them."""
    image = np.random.default_rng(seed).integers(0, 256, (3, height, width)).astype(F32)
    image[:, :4, :4] = 77
    image[0, 4:8, :] = image[1, 4:8, :]  # R = G: ties for the largest channel
    return image


# -- the kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "factor", "reference"),
    [
        ("brightness", 1.3, ref_brightness),
        ("brightness", 0.55, ref_brightness),
        ("contrast", 1.6, ref_contrast),
        ("contrast", 0.4, ref_contrast),
        ("saturation", 1.9, ref_saturation),
        ("saturation", 0.0, ref_saturation),
    ],
)
def test_blends_equal_the_reference(name: str, factor: float, reference: Any) -> None:
    image = sample_image()
    kernels = ColourKernels(*image.shape[1:])
    got = image.copy()
    getattr(kernels, name)(got, factor)
    np.testing.assert_array_equal(got, reference(image, factor))


def test_grayscale_equals_the_reference() -> None:
    image = sample_image()
    got = image.copy()
    ColourKernels(*image.shape[1:]).grayscale(got)
    np.testing.assert_array_equal(got, ref_grayscale(image))


@pytest.mark.parametrize("shift", [0.0, 0.1, -0.25, 0.5, -0.5, 0.37])
def test_hue_is_within_one_level_of_the_reference(shift: float) -> None:
    image = sample_image()
    got = image.copy()
    ColourKernels(*image.shape[1:]).hue(got, shift)
    expected = ref_hue(image, shift)
    difference = np.abs(got - expected)
    assert difference.max() <= 1
    assert np.mean(difference == 0) >= 0.99


@pytest.mark.parametrize("angle", [0.0, 7.5, -33.3, 90.0, 180.0, 271.0])
def test_rotation_matches_the_reference_and_pil(angle: float) -> None:
    image = sample_image(26, 34)
    fill = (10.0, 200.0, 33.0)
    got = image.copy()
    Rotator(3, 26, 34).rotate(got, angle, fill)
    same = np.all(got == ref_rotate(image, angle, fill), axis=0)
    assert same.mean() >= 0.995
    pil = Image.fromarray(image.transpose(1, 2, 0).astype(np.uint8)).rotate(angle, Image.Resampling.NEAREST, fillcolor=(10, 200, 33))
    assert np.all(got == np.asarray(pil).transpose(2, 0, 1), axis=0).mean() >= 0.995


@pytest.mark.parametrize("shape", [(26, 34), (33, 17), (224, 224), (1, 5)])
def test_a_rotation_picks_the_nearest_pixel_except_within_the_tie_band_of_the_spec(shape: tuple[int, int]) -> None:
    """spec/pixels.md: the nearest source pixel exactly, except that a coordinate within 2^-9 of
    a half-way point may round either way; on random and special angles, for both layouts."""
    height, width = shape
    ids = np.arange(1, height * width + 1).reshape(height, width)
    pixels = np.stack([ids & 255, (ids >> 8) & 255, np.zeros_like(ids)], axis=-1).astype(np.uint8)
    rotator = Rotator(3, height, width)
    rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    cx, cy = (width - 1) / 2, (height - 1) / 2
    angles = [0.0, 45.0, 90.0, -90.0, 180.0, 270.0, 7.5, *np.random.default_rng(3).uniform(-360, 360, 40).tolist()]
    for angle in angles:
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        x = cos * (columns - cx) - sin * (rows - cy) + cx
        y = sin * (columns - cx) + cos * (rows - cy) + cy
        near_x, near_y = np.rint(x).astype(np.int64), np.rint(y).astype(np.int64)
        inside = (near_x >= 0) & (near_x < width) & (near_y >= 0) & (near_y < height)
        expected = np.where(inside, ids[near_y.clip(0, height - 1), near_x.clip(0, width - 1)], 0)
        tie = (np.abs(np.abs(x - np.floor(x)) - 0.5) < 2**-9) | (np.abs(np.abs(y - np.floor(y)) - 0.5) < 2**-9)
        got = np.empty_like(pixels)
        rotator.rotate_interleaved(pixels, angle, (0.0, 0.0, 0.0), got)
        picked = got[:, :, 0].astype(np.int64) | (got[:, :, 1].astype(np.int64) << 8)
        assert np.array_equal(picked[~tie], expected[~tie]), angle
        planes = pixels.transpose(2, 0, 1).astype(F32)
        rotator.rotate(planes, angle, (0.0, 0.0, 0.0))
        assert np.array_equal(planes.transpose(1, 2, 0).astype(np.uint8), got), angle  # the same pixels in both layouts


@pytest.mark.parametrize("shape", [(26, 34), (33, 17), (224, 224)])
def test_a_rotation_into_pixels_is_the_rotation_cast(shape: tuple[int, int]) -> None:
    rotator = Rotator(3, *shape)
    fill = (10.0, 200.0, 33.0)
    for angle in (0.0, 7.5, -33.3, 90.0, 180.0, 271.0, 12.345):
        image = sample_image(*shape)
        expected = image.copy()
        rotator.rotate(expected, angle, fill)
        got = np.empty((*shape, 3), np.uint8)
        before = image.copy()
        rotator.rotate_to_pixels(image, angle, fill, got)
        assert np.array_equal(image, before)  # the float image is left as it was
        assert np.array_equal(got, expected.transpose(1, 2, 0).astype(np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        rotator.rotate_to_pixels(image, 5.0, fill, np.empty((shape[1], shape[0], 3), np.uint8).transpose(1, 0, 2))


def test_a_sample_ending_with_its_rotation_is_written_as_by_the_general_path() -> None:
    """A rotation that ends the steps writes the sample straight into its uint8 row; into a row
    it cannot write that way (not contiguous), the steps run as for any other order."""
    transform = SampleTransform([ColorJitter(0.4, 0.4, 0.4, 0.1), RandomRotation(20, fill=(5, 50, 250))], height=40, width=30)
    draws = transform.draw(3, 1, np.arange(8))
    rotator = transform._rotator
    assert rotator is not None
    targets: list[np.ndarray] = []
    rotate_interleaved = rotator.rotate_interleaved
    rotator.rotate_interleaved = lambda *args: targets.append(args[-1]) or rotate_interleaved(*args)  # type: ignore[method-assign]
    rng = np.random.default_rng(8)
    direct_calls = 0
    for row in range(8):
        source = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
        direct = np.empty((40, 30, 3), np.uint8)
        transform.apply(source, draws, row, direct)
        direct_calls += sum(target is direct for target in targets)
        wide = np.full((40, 30, 4), 99, np.uint8)
        transform.apply(source, draws, row, wide[:, :, :3])
        assert np.array_equal(direct, wide[:, :, :3])
        assert np.all(wide[:, :, 3] == 99)
    assert len(targets) == 16 and direct_calls == 8  # into the row once per contiguous row, never for the strided one


# -- the same steps on uint8 pixels (PixelOps) ---------------------------------------------------


def every_level(height: int = 26, width: int = 34) -> np.ndarray:
    """sample_image with all 256 levels in every channel (rows 8 to 15), so that a lookup table
    is checked on every input."""
    image = sample_image(height, width)
    levels = np.arange(8 * width) % 256
    for channel in range(3):
        image[channel, 8:16] = np.roll(levels, 37 * channel).reshape(8, width)
    return image


def to_pixels(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image.transpose(1, 2, 0).astype(np.uint8))


@pytest.mark.parametrize(
    ("name", "factor", "reference"),
    [
        ("brightness", 1.3, ref_brightness),
        ("brightness", 0.55, ref_brightness),
        ("brightness", 1.99, ref_brightness),
        ("contrast", 1.6, ref_contrast),
        ("contrast", 0.4, ref_contrast),
        ("contrast", 1.0, ref_contrast),
        ("saturation", 1.9, ref_saturation),
        ("saturation", 0.0, ref_saturation),
    ],
)
def test_lookup_tables_on_pixels_equal_the_float_formula_on_every_level(name: str, factor: float, reference: Any) -> None:
    """Brightness and contrast are one uint8 lookup table built from the float32 formula:
    every one of the 256 inputs maps exactly as the formula does (saturation blends per pixel)."""
    image = every_level(32, 40)
    got = to_pixels(image)
    getattr(PixelOps(32, 40, exact=True), name)(got, factor)
    assert np.array_equal(got.transpose(2, 0, 1).astype(F32), reference(image, factor))


def test_a_lookup_maps_every_level_alike_with_or_without_stringzilla(monkeypatch: pytest.MonkeyPatch) -> None:
    """stringzilla's byte translation, used where it is installed, and cv2.LUT give the same bytes."""
    from shardfmt.ops import _pixelops

    image = to_pixels(every_level(32, 40))
    table = np.random.default_rng(3).permutation(256).astype(np.uint8)
    per_channel = np.stack([np.random.default_rng(c).permutation(256) for c in range(3)], axis=1).astype(np.uint8)
    expected = np.stack([per_channel[image[:, :, c], c] for c in range(3)], axis=2)
    for translate in (_pixelops._TRANSLATE, None):
        monkeypatch.setattr(_pixelops, "_TRANSLATE", translate)
        got = image.copy()
        PixelOps(32, 40)._lut(got, table)
        assert np.array_equal(got, table[image])
        got = image.copy()
        PixelOps(32, 40)._lut(got, per_channel)
        assert np.array_equal(got, expected)
        source, target = image.copy(), np.zeros_like(image)
        PixelOps(32, 40)._lut(source, table, target)
        assert np.array_equal(target, table[image]) and np.array_equal(source, image)
        for bits in (1, 4, 7):
            got = image.copy()
            PixelOps.posterize(got, bits)
            assert np.array_equal(got, image & np.uint8(256 - (1 << (8 - bits))))
        got = image.copy()
        PixelOps(32, 40).invert(got)
        assert np.array_equal(got, 255 - image)


@pytest.mark.parametrize("threshold", [-1.0, 0.0, 1e-9, 0.5, 100.0, 127.5, 254.5, 255.0, 256.0, *np.linspace(255, 0, 31).tolist()])
def test_solarize_and_posterize_on_pixels_are_the_formula_on_every_level(threshold: float) -> None:
    """Solarize is a threshold and an exclusive or, posterize a bitwise and: 255 - x where
    x >= threshold (a float32 comparison), and x & -(2^(8 - bits)), on all 256 levels."""
    image = to_pixels(every_level(32, 40))
    ops = PixelOps(32, 40)
    got = image.copy()
    ops.solarize(got, threshold)
    assert np.array_equal(got, np.where(image.astype(F32) >= F32(threshold), 255 - image, image))
    for bits in range(1, 9):
        got = image.copy()
        ops.posterize(got, bits)
        assert np.array_equal(got, image & np.uint8(256 - (1 << (8 - bits))))


@pytest.mark.parametrize("factor", [0.0, 0.01, 0.5, 1.0, 1.5, 1.99])
def test_sharpness_on_pixels_equals_the_float_plane_kernel(factor: float) -> None:
    """The box sum in float32 rounds (sum + 4 x) / 13 as filter2D does, on an image large
    enough for OpenCV's vector paths, with flat and alternating regions."""
    from shardfmt.ops._imageops import ImageOps

    image = every_level(224, 224)
    image[:, 100:140] = 255.0
    image[:, 150:160:2] = 0.0
    planes = image.copy()
    ImageOps(224, 224).sharpness(planes, factor)
    got = to_pixels(image)
    PixelOps(224, 224, exact=True).sharpness(got, factor)
    assert np.array_equal(got.transpose(2, 0, 1).astype(F32), planes)


def test_grayscale_and_flip_on_pixels_equal_the_reference() -> None:
    image = every_level()
    ops = PixelOps(*image.shape[1:], exact=True)
    got = to_pixels(image)
    ops.grayscale(got)
    assert np.array_equal(got.transpose(2, 0, 1).astype(F32), ref_grayscale(image))
    flipped = ops.flip_vertically(to_pixels(image))
    assert np.array_equal(flipped, to_pixels(image)[::-1])


def ref_sharpness(image: np.ndarray, factor: float) -> np.ndarray:
    """The float-plane kernel, which equals its reference (tests/ops/test_autoaugment.py)."""
    from shardfmt.ops._imageops import ImageOps

    planes = image.copy()
    ImageOps(*image.shape[1:]).sharpness(planes, factor)
    return planes


@pytest.mark.parametrize("shape", [(26, 34), (33, 17), (3, 3), (2, 5), (224, 224)])
@pytest.mark.parametrize("factor", [0.0, 0.01, 0.6, 1.0, 1.4, 1.99, 2.0, 2.5, 40.0])
@pytest.mark.parametrize(("name", "reference"), [("contrast", ref_contrast), ("saturation", ref_saturation), ("sharpness", ref_sharpness)])
def test_opencv_kernels_on_pixels_are_within_one_level_of_the_formula(
    name: str, reference: Any, shape: tuple[int, int], factor: float
) -> None:
    """OpenCV's uint8 kernels (the default on the pixels) keep every value within the one level
    spec/pixels.md allows of the float32 formula, on odd sizes and at the ends of the factors'
    range; a factor of 1 keeps the sample, and contrast and saturation beyond [0, 2] (where the
    gray's rounding could weigh more than a level) take the formula itself."""
    image = every_level(*shape) if shape[0] >= 16 else sample_image(*shape)
    got = to_pixels(image)
    getattr(PixelOps(*shape), name)(got, factor)
    want = reference(image, factor)
    difference = np.abs(got.transpose(2, 0, 1).astype(F32) - want)
    assert difference.max() <= 1
    if factor == 1.0 or (factor > 2.0 and name != "sharpness"):
        assert np.array_equal(got.transpose(2, 0, 1).astype(F32), want)


def test_saturation_on_pixels_is_within_one_level_on_random_colours_over_its_range() -> None:
    """One cv2.transform: within one level of the formula for 2^16 random colours and factors
    across [0, 2], equal to it at most of them."""
    image = np.random.default_rng(5).integers(0, 256, (3, 256, 256)).astype(F32)
    ops = PixelOps(256, 256)
    for factor in np.linspace(0.0, 2.0, 21).tolist():
        got = to_pixels(image)
        ops.saturation(got, factor)
        difference = np.abs(got.transpose(2, 0, 1).astype(F32) - ref_saturation(image, factor))
        assert difference.max() <= 1, factor
        assert np.mean(difference == 0) >= 0.5, factor


@pytest.mark.parametrize("shape", [(26, 34), (33, 17), (1, 1)])
def test_grayscale_on_pixels_is_the_formula_or_one_level_above(shape: tuple[int, int]) -> None:
    """OpenCV's fixed-point gray rounds 0.299 R + 0.587 G + 0.114 B: the formula's truncated
    value or one more, in every channel; written into a target, the image is left as it was."""
    image = every_level(*shape) if shape[0] >= 16 else sample_image(*shape)
    ops = PixelOps(*shape)
    got = to_pixels(image)
    ops.grayscale(got)
    difference = got.transpose(2, 0, 1).astype(F32) - ref_grayscale(image)
    assert set(np.unique(difference).tolist()) <= {0.0, 1.0}
    source, target = to_pixels(image), np.zeros((*shape, 3), np.uint8)
    ops.grayscale(source, target=target)
    assert np.array_equal(target, got) and np.array_equal(source, to_pixels(image))


@pytest.mark.parametrize(
    ("name", "factor"), [("brightness", 1.3), ("contrast", 0.7), ("saturation", 1.5), ("saturation", 3.0), ("hue", -0.2)]
)
def test_an_adjustment_into_a_target_leaves_its_image_and_equals_the_one_in_place(
    name: str, factor: float
) -> None:
    """The first adjustment of a ColorJitter reads the sample's source and writes its copy."""
    image = to_pixels(every_level(33, 40))
    ops = PixelOps(33, 40)
    in_place = image.copy()
    getattr(ops, name)(in_place, factor)
    source, target = image.copy(), np.zeros_like(image)
    getattr(ops, name)(source, factor, target)
    assert np.array_equal(target, in_place)
    assert np.array_equal(source, image)


def test_a_non_contiguous_or_read_only_source_gives_the_sample_of_its_copy() -> None:
    """The pixel path reads the source until a step changes pixels in place, and never writes
    it: a strided, read-only source gives the sample its contiguous copy gives."""
    from shardfmt.ops import RandomErasing, TrivialAugmentWide

    for steps in (
        [ColorJitter(0.4, 0.4, 0.4, 0.1)],
        [ColorJitter(brightness=(1.0, 1.0), hue=0.2)],
        [RandomVerticalFlip(1.0)],
        [RandomGrayscale(1.0), RandomVerticalFlip(1.0)],
        [RandomVerticalFlip(0.5), ColorJitter(saturation=0.5), RandomRotation(15), RandomVerticalFlip(0.5)],
        [ColorJitter(0.4, 0.4, 0.4), RandomVerticalFlip(0.5), RandomRotation(15), RandomGrayscale(0.5)],
        [TrivialAugmentWide(), RandomErasing(p=1.0, value=0)],
    ):
        transform = SampleTransform(steps, height=33, width=17)
        draws = transform.draw(3, 0, np.arange(8))
        for row in range(8):
            wide = np.random.default_rng(row).integers(0, 256, (33, 34, 3)).astype(np.uint8)
            source = wide[:, ::2]
            source.flags.writeable = False
            copy = np.ascontiguousarray(source)
            copy.flags.writeable = False
            a, b = np.empty((33, 17, 3), np.uint8), np.empty((33, 17, 3), np.uint8)
            transform.apply(source, draws, row, a)
            transform.apply(copy, draws, row, b)
            assert np.array_equal(a, b), (steps, row)
            assert np.array_equal(source, copy)


def test_augmix_keeps_the_float_formulas_and_gives_the_opencv_kernels_back() -> None:
    """AugMix's chains run the float formulas (a level off before a posterize could move a value
    further than its tolerance); the next step has OpenCV's kernels again."""
    from shardfmt.ops import AugMix

    transform = SampleTransform([AugMix(severity=10), ColorJitter(saturation=0.5)], height=28, width=33)
    ops = transform._pixel_ops
    assert ops is not None and not ops.exact
    seen: list[bool] = []
    saturation = ops.saturation
    ops.saturation = lambda image, factor, target=None: (seen.append(ops.exact), saturation(image, factor, target))[1]  # type: ignore[method-assign]
    source = np.random.default_rng(0).integers(0, 256, (28, 33, 3)).astype(np.uint8)
    draws = transform.draw(1, 0, np.arange(4))
    for row in range(4):
        transform.apply(source, draws, row, np.empty_like(source))
    assert seen and seen.count(False) == 4 and not ops.exact  # the jitter's four saturations


@pytest.mark.parametrize("shift", [0.0, 0.1, -0.1, -0.25, 0.5, -0.5, 0.37, -0.0474])
def test_hue_on_pixels_is_within_one_level_of_the_reference(shift: float) -> None:
    """OpenCV's float32 HSV round trip: torchvision's formula in another order of float
    operations. A negative shift is checked on an image wide enough for OpenCV's vector path,
    which does not wrap a negative hue."""
    image = sample_image(64, 96)
    got = to_pixels(image)
    PixelOps(64, 96).hue(got, shift)
    difference = np.abs(got.transpose(2, 0, 1).astype(F32) - ref_hue(image, shift))
    assert difference.max() <= 1
    assert np.mean(difference == 0) >= 0.99
    # the conversions run in place: the values of the round trip through a second buffer
    hsv = cv2.cvtColor(to_pixels(image).astype(F32), cv2.COLOR_RGB2HSV)
    hsv[:, :, 0] += np.float32((360.0 * shift) % 360.0)
    expected = cv2.convertScaleAbs(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB), alpha=float(_TO_UINT8), beta=_TRUNCATE)
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("shape", [(26, 34), (33, 17), (224, 224)])
def test_a_rotation_of_interleaved_pixels_picks_the_pixels_of_the_float_rotation(shape: tuple[int, int]) -> None:
    rotator = Rotator(3, *shape)
    for fill in ((10.0, 200.0, 33.0), (0.0, 0.0, 0.0)):
        for angle in (0.0, 7.5, -33.3, 90.0, 180.0, 271.0, 12.345):
            image = sample_image(*shape)
            expected = image.copy()
            rotator.rotate(expected, angle, fill)
            pixels = to_pixels(image)
            got = np.empty_like(pixels)
            rotator.rotate_interleaved(pixels, angle, fill, got)
            assert np.array_equal(pixels, to_pixels(image))  # the source is left as it was
            assert np.array_equal(got, to_pixels(expected))


def test_a_rotation_of_pixels_whose_words_are_not_numbers_copies_them_bit_for_bit() -> None:
    """`rotate_interleaved` warps RGBX pixels as float32 words: with blue at 128 or more a word
    is a NaN or an infinity, which the warp must copy unchanged; a fill whose word is one takes
    the warp of the pixels as they are. Both pick the float rotation's pixels, into another
    array or in place."""
    rng = np.random.default_rng(12)
    pixels = rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)
    pixels[::2, :, 2] = rng.integers(128, 256, (32, 48), dtype=np.uint8)  # words that are NaN or infinite
    pixels[1, :4] = [(0, 0, 128), (0, 0, 255), (255, 255, 255), (1, 0, 192)]  # infinity, NaNs quiet and signalling
    words = np.concatenate([pixels, np.full((64, 48, 1), 255, np.uint8)], axis=2).view(np.float32)
    assert np.isnan(words).mean() > 0.4 and np.isinf(words).any()
    rotator = Rotator(3, 64, 48)
    for fill in ((10.0, 200.0, 33.0), (0.0, 0.0, 200.0)):  # a finite word, and one that is not
        for angle in (7.5, -33.3, 90.0, 180.0):
            expected = pixels.transpose(2, 0, 1).astype(F32)
            rotator.rotate(expected, angle, fill)
            got = np.empty_like(pixels)
            rotator.rotate_interleaved(pixels, angle, fill, got)
            assert np.array_equal(got, expected.transpose(1, 2, 0).astype(np.uint8)), (fill, angle)
            in_place = pixels.copy()
            rotator.rotate_interleaved(in_place, angle, fill, in_place)  # its own target, as a sample's row
            assert np.array_equal(in_place, got), (fill, angle)


def keep(sample: torch.Tensor) -> torch.Tensor:
    """A user's step that changes nothing: it keeps a sample on the float planes."""
    return sample


@pytest.mark.parametrize("normalise", [False, True])
def test_built_in_steps_run_on_pixels_with_the_draws_and_values_of_the_float_planes(normalise: bool) -> None:
    """Built-in steps run on the uint8 pixels, drawing exactly as on the float planes; every
    value is the same without hue, and within one level per hue step with it."""
    options: dict[str, Any] = {"mean": (123.675, 116.28, 103.53), "std": (58.395, 57.12, 57.375)} if normalise else {}
    for steps, tolerance in (
        ([ColorJitter(0.4, 0.4, 0.4), RandomVerticalFlip(0.5), RandomRotation(15, fill=(1, 2, 3)), RandomGrayscale(0.3)], 0),
        ([ColorJitter(hue=0.4), RandomRotation(15)], 1),
    ):
        pixels = SampleTransform(steps, height=40, width=36, **options)
        planes = SampleTransform([*steps, keep], height=40, width=36, **options)
        assert pixels._pixel_ops is not None and planes._pixel_ops is None
        pixels._pixel_ops.exact = True  # the float formulas (OpenCV's kernels: the tests below)
        indices = np.arange(40)
        draws_pixels, draws_planes = pixels.draw(5, 1, indices), planes.draw(5, 1, indices)
        for mine, theirs in zip(draws_pixels, draws_planes, strict=False):
            assert np.array_equal(mine, theirs, equal_nan=True)
        dtype = np.float32 if normalise else np.uint8
        a, b = np.empty((40, 36, 3), dtype), np.empty((40, 36, 3), dtype)
        for row in indices:
            source = np.random.default_rng(int(row)).integers(0, 256, (40, 36, 3)).astype(np.uint8)
            pixels.apply(source, draws_pixels, row, a)
            planes.apply(source, draws_planes, row, b)
            scale = np.float32(57.0) if normalise else 1  # a level, after the division by std
            assert np.abs(a.astype(np.float64) - b).max() * scale <= tolerance + 1e-3, row


def test_steps_follow_torchvisions_parameter_rules() -> None:
    assert ColorJitter(0.4, 0.4, 0.4, 0.1).ranges == ((0.6, 1.4), (0.6, 1.4), (0.6, 1.4), (-0.1, 0.1))
    assert ColorJitter(brightness=1.5).ranges == ((0.0, 2.5), None, None, None)
    assert ColorJitter(contrast=(0.5, 0.9)).ranges == (None, (0.5, 0.9), None, None)
    assert RandomRotation(30).degrees == (-30.0, 30.0)
    assert RandomRotation((5, 10), fill=127.9).fill == (127.0, 127.0, 127.0)
    for bad in (lambda: ColorJitter(hue=0.6), lambda: ColorJitter(brightness=-1), lambda: ColorJitter(saturation=(2, 1))):
        with pytest.raises(ValueError):
            bad()
    for bad in (
        lambda: RandomRotation(-5),
        lambda: RandomRotation((10, 5)),
        lambda: RandomRotation(5, fill=300),
        lambda: RandomVerticalFlip(1.5),
    ):
        with pytest.raises(ValueError):
            bad()
    u = np.array([[0.9, 0.1, 0.5, 0.3, 0.0, 0.5, 1.0, 0.75]])
    params = ColorJitter(0.4, 0.4, 0.4, 0.1).parameters(u)
    np.testing.assert_allclose(params, [[1, 3, 2, 0, 0.6, 1.0, 1.4, 0.05]])
    assert RandomRotation((10, 20)).parameters(np.array([[0.25]])).tolist() == [[12.5]]
    assert RandomVerticalFlip(0.5).parameters(np.array([[0.49], [0.5]])).tolist() == [[1.0], [0.0]]


# -- in the loader ------------------------------------------------------------------------------

NUM_RECORDS = 20
SIZE = 30


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("augment") / "ds"
    rng = np.random.default_rng(21)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=20_000) as writer:
        for i in range(NUM_RECORDS):
            h, w = int(rng.integers(40, 80)), int(rng.integers(40, 80))
            writer.write({"image": jpeg_bytes(h, w, seed=200 + i), "label": i, "key": f"a{i}"})
    return out


STEPS = [ColorJitter(0.4, 0.4, 0.4, 0.1), RandomRotation(25, fill=(5, 50, 250)), RandomVerticalFlip(0.5), RandomGrayscale(0.3)]


def add_noise(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A user's step: noise from the generator it is given."""
    noise = torch.randint(-20, 21, sample.shape, generator=generator, dtype=torch.int16)
    return (sample.to(torch.int16) + noise).clamp(0, 255).to(torch.uint8)


def batches(dataset: Path, **options: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two epochs of (images, indices) of a loader made with `options` (each named by its field,
    put into its option object by `fuzz_loader.loader_arguments`) over these defaults."""
    settings: dict[str, Any] = dict(batch_size=6, num_workers=0, size=SIZE, seed=11, copy=True, return_indices=True)
    with Loader(dataset, **loader_arguments(settings | options)) as loader:
        return [(images, indices) for _ in range(2) for images, _, indices in loader]


def reference_chain(image: np.ndarray, steps: list[Any], seed: int, epoch: int, index: int) -> np.ndarray:
    """Apply `steps` to one (3, H, W) crop with the draws spec/sampling.md gives for it."""
    for j, step in enumerate(steps):
        key = record_keys(seed, STEP_STREAM + j, epoch, np.array([index], np.uint64))
        if not isinstance(step, (ColorJitter, RandomRotation, RandomVerticalFlip, RandomGrayscale)):
            generator = torch.Generator()
            generator.manual_seed(int(key[0]))
            image = step(torch.from_numpy(image.astype(np.uint8)), generator).numpy().astype(F32)
            continue
        u = uniforms(key, step.draws)[0]
        if isinstance(step, ColorJitter):
            image = ref_jitter(image, step, u)
        elif isinstance(step, RandomRotation):
            low, high = step.degrees  # type: ignore[misc]
            image = ref_rotate(image, low + (high - low) * u[0], step.fill)  # type: ignore[arg-type]
        elif isinstance(step, RandomVerticalFlip):
            image = image[:, ::-1] if u[0] < step.p else image
        elif u[0] < step.p:
            image = ref_grayscale(image)
    return image


def test_augmented_batches_are_the_reference_steps_on_the_plain_crops(dataset: Path) -> None:
    steps = STEPS + [add_noise]
    plain = batches(dataset)
    augmented = batches(dataset, augment=steps)
    close = total = 0
    for epoch in range(2):
        for (images, indices), (want, want_indices) in zip(
            augmented[epoch * 4 : epoch * 4 + 4], plain[epoch * 4 : epoch * 4 + 4], strict=True
        ):
            assert torch.equal(indices, want_indices)
            for k, index in enumerate(indices.tolist()):
                expected = reference_chain(want[k].numpy().astype(F32), steps, 11, epoch, index)
                difference = np.abs(images[k].numpy().astype(F32) - expected)
                close += int(np.sum(difference <= 1))
                total += difference.size
    assert close / total >= 0.99  # hue's one level, and rotation ties, move a few values


@pytest.mark.parametrize("start_method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_the_same_draws_under_0_and_2_workers_and_after_resume(dataset: Path, start_method: str) -> None:
    steps = STEPS + [add_noise]
    inline = batches(dataset, augment=steps)
    workers = batches(dataset, augment=steps, num_workers=2, start_method=start_method)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(inline, workers, strict=True))
    settings: dict[str, Any] = dict(
        batch_size=6,
        num_workers=2,
        seed=11,
        transform=ImageTransform(size=SIZE, augment=steps),
        workers=Workers(start_method=start_method),
        output=Output(copy=True),
    )
    with Loader(dataset, **settings) as first:
        epoch_zero = iter(first)
        next(epoch_zero)
        next(epoch_zero)
        state = first.state_dict()
    with Loader(dataset, **settings) as resumed:
        resumed.load_state_dict(state)
        rest = [images for images, _ in resumed] + [images for images, _ in resumed]
    assert all(torch.equal(a, b[0]) for a, b in zip(rest, inline[2:], strict=True))
    assert len(rest) == len(inline) - 2


def test_a_users_step_gets_a_generator_seeded_from_seed_epoch_and_record(dataset: Path) -> None:
    seen: list[int] = []

    def record_seed(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        seen.append(generator.initial_seed())
        return sample

    with Loader(
        dataset,
        batch_size=5,
        num_workers=0,
        seed=3,
        shuffle=False,
        transform=ImageTransform(size=SIZE, augment=[RandomVerticalFlip(), record_seed]),
        output=Output(return_indices=True),
    ) as loader:
        loader.set_epoch(7)
        indices = [i for _, _, batch in loader for i in batch.tolist()]
    # in decoding order, which is batch order in this process (then epoch 8 begins, ahead)
    assert seen[: len(indices)] == record_keys(3, STEP_STREAM + 1, 7, np.array(indices, np.uint64)).tolist()


def test_a_step_that_changes_the_shape_is_refused(dataset: Path) -> None:
    def shrink(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return sample[:, :10]

    with pytest.raises(TypeError, match=r"must return a \(3, 30, 30\) uint8 tensor") as info:
        with Loader(dataset, batch_size=5, num_workers=0, transform=ImageTransform(size=SIZE, augment=[shrink])) as loader:
            next(iter(loader))
    assert isinstance(info.value, WorkerError)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mean_and_std_without_a_device_normalise_in_the_workers(dataset: Path, num_workers: int) -> None:
    mean, std = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)
    plain = batches(dataset, num_workers=num_workers, augment=[RandomVerticalFlip()])
    with Loader(
        dataset,
        batch_size=6,
        num_workers=num_workers,
        seed=11,
        transform=ImageTransform(size=SIZE, mean=mean, std=std, augment=[RandomVerticalFlip()]),
    ) as loader:
        for (images, _), (want, _) in zip(loader, plain[: len(loader)], strict=True):  # plain holds two epochs
            assert images.dtype == torch.float32 and images.shape[1:] == (3, SIZE, SIZE)
            assert images.is_contiguous(memory_format=torch.channels_last)
            expected = (want.float() - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
            torch.testing.assert_close(images, expected)
        assert loader.shared_memory_bytes == 3 * (-(-6 * SIZE * SIZE * 3 * 4 // 4096) * 4096 + 4096)


def test_augment_and_normalisation_are_checked_against_the_fields(dataset: Path) -> None:
    with pytest.raises(TypeError, match="augment step"):
        Loader(dataset, batch_size=4, num_workers=0, transform=ImageTransform(augment=["flip"]))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="both mean and std"):
        Loader(dataset, batch_size=4, num_workers=0, transform=ImageTransform(mean=(1.0, 2.0, 3.0)))
    with pytest.raises(ValueError, match="one value per channel"):
        Loader(dataset, batch_size=4, num_workers=0, transform=ImageTransform(mean=(1.0,), std=(1.0,)))
    with Loader(
        dataset,
        batch_size=4,
        num_workers=0,
        fields={"image": 16, "label": None},
        shuffle=False,
        transform=ImageTransform(augment=[RandomVerticalFlip(1.0)]),
        output=Output(copy=True),
    ) as loader:
        flipped = next(iter(loader))["image"]
    with Loader(
        dataset, batch_size=4, num_workers=0, fields={"image": 16, "label": None}, shuffle=False, output=Output(copy=True)
    ) as loader:
        assert torch.equal(flipped, next(iter(loader))["image"].flip(2))
