"""The auto-augment family and random erasing: each operation against a reference written here
from torchvision's documented formulas for uint8 tensors, the magnitude tables and sampling
rules, and the steps in the loader.

Tolerances: posterize, solarize, invert, equalize (integers), autocontrast, sharpness and the
blends (float32, in torchvision's order) match the reference exactly on the float planes and
on the uint8 pixels with ``exact=True``; OpenCV's uint8 kernels for Color, Contrast and
Sharpness (the default on the pixels) are within one level of them, as spec/pixels.md allows. The geometric operations
pick the nearest source pixel; OpenCV computes the source coordinate in fixed point with 10
fractional bits, so a pixel whose coordinate lies within 2^-9 of a half-way point may take the
other neighbour: every other pixel equals the reference, and those are at least 98% of the
image. With bilinear or bicubic interpolation they equal torchvision's grid and grid_sample
(restated in `torchvision_affine`) exactly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Workers
from shardfmt._sampling.keys import STEP_STREAM, record_keys, uniforms
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import AutoAugment, RandAugment, RandomErasing, TrivialAugmentWide
from shardfmt.ops._augment import SampleTransform
from shardfmt.ops._autoaugment import IMAGENET_POLICY, OPERATIONS, POLICIES, apply_operation, magnitude_table
from shardfmt.ops._erasing import erasing_boxes
from shardfmt.ops._imageops import ImageOps
from shardfmt.ops._pixelops import PixelOps

F32 = np.float32
TIE = 2.0**-9


def sample_image(height: int = 26, width: int = 34, seed: int = 0) -> np.ndarray:
    image = np.random.default_rng(seed).integers(0, 256, (3, height, width)).astype(F32)
    image[:, :3, :3] = 77
    image[2, 5:9, :] = 4  # a narrow channel, for autocontrast and equalize
    return image


# -- references, from torchvision's documented formulas ------------------------------------------


def ref_blend(image: np.ndarray, other: Any, ratio: float) -> np.ndarray:
    mixed = F32(ratio) * image.astype(F32) + F32(1.0 - ratio) * np.asarray(other, F32)
    return np.trunc(np.clip(mixed, 0, 255)).astype(F32)


def ref_gray(image: np.ndarray) -> np.ndarray:
    r, g, b = image.astype(F32)
    return np.trunc(F32(0.2989) * r + F32(0.587) * g + F32(0.114) * b)


def ref_affine(image: np.ndarray, matrix: tuple[tuple[float, float, float], ...], fill: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Nearest source pixel of (a j + b i + c, d j + e i + f), ties to even, fill outside; and a
    mask of the pixels whose coordinate is within TIE of a half-way point."""
    _, height, width = image.shape
    (a, b, c), (d, e, f) = matrix
    out = np.empty(image.shape, F32)
    near = np.zeros((height, width), bool)
    for i in range(height):
        for j in range(width):
            x, y = a * j + b * i + c, d * j + e * i + f
            near[i, j] = abs(x - math.floor(x) - 0.5) < TIE or abs(y - math.floor(y) - 0.5) < TIE
            xi, yi = round(x), round(y)
            out[:, i, j] = image[:, yi, xi] if 0 <= xi < width and 0 <= yi < height else fill
    return out, near


def ref_shear_x(image: np.ndarray, m: float, fill: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """affine(shear=(degrees(atan(m)), 0), center=(0, 0)): source x = j + m (i + 0.5)."""
    return ref_affine(image, ((1.0, m, m / 2), (0.0, 1.0, 0.0)), fill)


def ref_shear_y(image: np.ndarray, m: float, fill: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    return ref_affine(image, ((1.0, 0.0, 0.0), (m, 1.0, m / 2)), fill)


def ref_rotate(image: np.ndarray, angle: float, fill: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    _, height, width = image.shape
    cx, cy = (width - 1) / 2, (height - 1) / 2
    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    return ref_affine(image, ((cos, -sin, cx - cos * cx + sin * cy), (sin, cos, cy - sin * cx - cos * cy)), fill)


def ref_equalize(image: np.ndarray) -> np.ndarray:
    out = image.copy()
    for c in range(3):
        levels = image[c].astype(np.int64)
        hist = np.bincount(levels.ravel(), minlength=256)
        nonzero = hist[hist != 0]
        step = nonzero[:-1].sum() // 255
        if step == 0:
            continue
        lut = (np.cumsum(hist) + step // 2) // step
        lut = np.concatenate([[0], lut[:-1]]).clip(0, 255)
        out[c] = lut[levels]
    return out


def ref_autocontrast(image: np.ndarray) -> np.ndarray:
    out = image.copy()
    for c in range(3):
        low, high = F32(image[c].min()), F32(image[c].max())
        if low != high:
            out[c] = np.trunc(np.clip((image[c] - low) * (F32(255) / (high - low)), 0, 255))
    return out


def ref_sharpness(image: np.ndarray, factor: float) -> np.ndarray:
    """blend(x, blurred, f); blurred: inner pixels round(conv(x, [[1,1,1],[1,5,1],[1,1,1]] / 13))."""
    blurred = image.copy()
    pixels = image.astype(np.int64)
    height, width = image.shape[1:]
    for i in range(1, height - 1):
        for j in range(1, width - 1):
            total = pixels[:, i - 1 : i + 2, j - 1 : j + 2].sum(axis=(1, 2)) + 4 * pixels[:, i, j]
            blurred[:, i, j] = (2 * total + 13) // 26  # round(total / 13): never a tie
    return ref_blend(image, blurred, factor)


def ref_operation(image: np.ndarray, name: str, m: float, fill: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    if name == "ShearX":
        return ref_shear_x(image, m, fill)
    if name == "ShearY":
        return ref_shear_y(image, m, fill)
    if name == "TranslateX":
        return ref_affine(image, ((1.0, 0.0, -float(int(m))), (0.0, 1.0, 0.0)), fill)
    if name == "TranslateY":
        return ref_affine(image, ((1.0, 0.0, 0.0), (0.0, 1.0, -float(int(m)))), fill)
    if name == "Rotate":
        return ref_rotate(image, m, fill)
    plain = {
        "Identity": lambda x: x,
        "Brightness": lambda x: ref_blend(x, 0.0, 1 + m),
        "Color": lambda x: ref_blend(x, ref_gray(x)[None], 1 + m),
        "Contrast": lambda x: ref_blend(x, F32(ref_gray(x).mean(dtype=np.float64)), 1 + m),
        "Sharpness": lambda x: ref_sharpness(x, 1 + m),
        "Posterize": lambda x: (x.astype(np.int64) & -(2 ** (8 - int(m)))).astype(F32),
        "Solarize": lambda x: np.where(x >= m, 255 - x, x).astype(F32),
        "AutoContrast": ref_autocontrast,
        "Equalize": ref_equalize,
        "Invert": lambda x: (255 - x).astype(F32),
    }
    return plain[name](image), None


def assert_matches(got: np.ndarray, want: np.ndarray, near: np.ndarray | None) -> None:
    if near is None:
        assert np.array_equal(got, want)
        return
    far = ~near
    assert far.mean() >= 0.98
    assert np.array_equal(got[:, far], want[:, far])


# -- the operations ------------------------------------------------------------------------------

CASES = [
    ("ShearX", 0.3),
    ("ShearX", -0.99),
    ("ShearY", 0.23),
    ("ShearY", -0.5),
    ("TranslateX", 7.9),
    ("TranslateX", -12.4),
    ("TranslateY", 5.0),
    ("TranslateY", -3.7),
    ("Rotate", 30.0),
    ("Rotate", -131.7),
    ("Brightness", 0.6),
    ("Brightness", -0.99),
    ("Color", 0.9),
    ("Color", -0.5),
    ("Contrast", 0.9),
    ("Contrast", -0.7),
    ("Sharpness", 0.99),
    ("Sharpness", -0.9),
    ("Posterize", 4.0),
    ("Posterize", 2.0),
    ("Posterize", 8.0),
    ("Solarize", 127.5),
    ("Solarize", 0.0),
    ("AutoContrast", 0.0),
    ("Equalize", 0.0),
    ("Invert", 0.0),
    ("Identity", 0.0),
]


@pytest.mark.parametrize(("name", "magnitude"), CASES)
def test_each_operation_equals_the_reference(name: str, magnitude: float) -> None:
    image = sample_image()
    ops = ImageOps(*image.shape[1:])
    fill = (3.0, 100.0, 250.0)
    got = apply_operation(ops, image.copy(), OPERATIONS.index(name), magnitude, fill)
    want, near = ref_operation(image, name, magnitude, fill)
    assert_matches(got, want, near)


def test_equalize_and_autocontrast_leave_a_flat_channel_as_it_is() -> None:
    image = np.full((3, 9, 11), 40, F32)
    image[0, 0, 0] = 41
    ops = ImageOps(9, 11)
    flat = image.copy()
    ops.equalize(flat)
    assert np.array_equal(flat, ref_equalize(image))
    assert np.array_equal(flat[1:], image[1:])
    ops.autocontrast(flat := image.copy())
    assert np.array_equal(flat[1:], image[1:]) and flat[0].max() == 255 and flat[0].min() == 0


# -- tables and draws ----------------------------------------------------------------------------


def test_magnitude_tables_are_torchvisions() -> None:
    wide = magnitude_table("wide", "ShearX", 31, height=224, width=224)
    assert wide[0] == 0.0 and wide[-1] == float(np.float32(0.99)) and len(wide) == 31
    assert magnitude_table("wide", "TranslateY", 31, height=224, width=224)[-1] == 32.0
    assert magnitude_table("wide", "Rotate", 31, height=1, width=1)[-1] == 135.0
    assert magnitude_table("standard", "TranslateX", 31, height=100, width=331)[-1] == 150.0
    assert magnitude_table("standard", "TranslateY", 31, height=662, width=5)[-1] == 300.0
    assert magnitude_table("wide", "Posterize", 31, height=1, width=1) == [8 - round(b / 5) for b in range(31)]
    assert magnitude_table("standard", "Posterize", 10, height=1, width=1) == [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]
    assert magnitude_table("standard", "Solarize", 10, height=1, width=1)[::9] == [255.0, 0.0]
    assert magnitude_table("standard", "Equalize", 10, height=1, width=1) == [0.0]
    assert len(IMAGENET_POLICY) == 25


def test_draws_follow_the_stated_rules() -> None:
    u = uniforms(record_keys(3, STEP_STREAM, 0, np.arange(20_000, dtype=np.uint64)), 5)
    wide = TrivialAugmentWide().parameters(u[:, :3])
    assert np.array_equal(wide[:, 0], np.floor(14 * u[:, 0])) and set(wide[:, 0].tolist()) == set(range(14))
    assert set(wide[:, 1].tolist()) == set(range(31))
    assert np.array_equal(wide[:, 2], u[:, 2] < 0.5)
    rand = RandAugment(num_ops=2, magnitude=9).parameters(u[:, :4])
    assert rand.shape == (20_000, 6) and set(rand[:, 3].tolist()) == set(range(14)) and set(rand[:, 1].tolist()) == {9.0}
    auto = AutoAugment().parameters(u)
    chosen = np.floor(25 * u[:, 0]).astype(int)
    for row in range(50):
        for i in range(2):
            name, p, bin_index = IMAGENET_POLICY[chosen[row]][i]
            runs = u[row, 1 + i] <= p
            assert auto[row, 3 * i] == (OPERATIONS.index(name) if runs else -1)
            assert auto[row, 3 * i + 1] == (bin_index or 0)
    assert set(chosen.tolist()) == set(range(25))
    for bad in (
        lambda: RandAugment(magnitude=31),
        lambda: RandAugment(num_ops=-1),
        lambda: AutoAugment("mnist"),
        lambda: TrivialAugmentWide(fill=300),
    ):
        with pytest.raises(ValueError):
            bad()


def test_a_step_runs_its_drawn_operations_in_turn() -> None:
    image = sample_image(30, 30, seed=4)
    source = np.ascontiguousarray(image.transpose(1, 2, 0).astype(np.uint8))
    for step in (TrivialAugmentWide(), RandAugment(num_ops=3, magnitude=20), AutoAugment()):
        transform = SampleTransform([step], height=30, width=30)
        assert transform._pixel_ops is not None
        transform._pixel_ops.exact = True  # the float formulas: the references' values, operation after operation
        indices = np.arange(40)
        draws = transform.draw(7, 2, indices)
        out = np.empty((30, 30, 3), np.uint8)
        family, bins = ("wide", 31) if isinstance(step, TrivialAugmentWide) else ("standard", 10 if isinstance(step, AutoAugment) else 31)
        for row in range(len(indices)):
            transform.apply(source, draws, row, out)
            want, near = image.copy(), np.zeros((30, 30), bool)
            params = draws[0][row]
            for slot in range(len(params) // 3):
                operation, bin_index, sign = (int(v) for v in params[3 * slot : 3 * slot + 3])
                if operation < 0:
                    continue
                name = OPERATIONS[operation]
                table = magnitude_table(family, name, bins, height=30, width=30)
                m = table[bin_index] if len(table) > 1 else 0.0
                want, this_near = ref_operation(
                    want,
                    name,
                    -m
                    if sign
                    and name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness")
                    else m,
                    (0.0, 0.0, 0.0),
                )
                if this_near is not None:
                    near |= this_near
            got = out.transpose(2, 0, 1).astype(F32)
            if slot > 0 and near.any():
                continue  # a pixel moved at a tie changes what later operations see
            assert_matches(got, want, near if near.any() else None)


# -- random erasing ------------------------------------------------------------------------------


def test_erasing_boxes_follow_torchvisions_rule() -> None:
    u = uniforms(record_keys(0, STEP_STREAM, 0, np.arange(5000, dtype=np.uint64)), 23)
    boxes = erasing_boxes(u, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), height=40, width=50)
    for row in range(300):
        want = (0, 0, 0, 0)
        if u[row, 0] < 0.5:
            for a in range(10):
                area = 2000 * (0.02 + 0.31 * u[row, 1 + 2 * a])
                aspect = math.exp(math.log(0.3) + (math.log(3.3) - math.log(0.3)) * u[row, 2 + 2 * a])
                h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
                if h < 40 and w < 50:
                    if h and w:
                        want = (math.floor(u[row, 21] * (40 - h + 1)), math.floor(u[row, 22] * (50 - w + 1)), h, w)
                    break
        assert tuple(boxes[row].tolist()) == want
    erased = boxes[:, 2] > 0
    assert abs(erased.mean() - 0.5) < 0.03
    area = (boxes[erased, 2] * boxes[erased, 3]) / 2000
    assert area.min() >= 0.015 and area.max() <= 0.36


def test_erasing_with_the_mean_is_zero_after_normalisation() -> None:
    mean, std = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)
    transform = SampleTransform([RandomErasing(p=1.0)], height=32, width=32, mean=mean, std=std)
    source = np.random.default_rng(1).integers(0, 256, (32, 32, 3)).astype(np.uint8)
    draws = transform.draw(0, 0, np.arange(10))
    boxes = draws[0]  # the boxes, drawn for the sample's size
    assert np.array_equal(
        boxes, RandomErasing(p=1.0).boxes(uniforms(record_keys(0, STEP_STREAM, 0, np.arange(10, dtype=np.uint64)), 23), height=32, width=32)
    )
    out = np.empty((32, 32, 3), np.float32)
    for row in range(10):
        transform.apply(source, draws, row, out)
        top, left, h, w = boxes[row]
        inside = np.zeros((32, 32), bool)
        inside[top : top + h, left : left + w] = True
        assert inside.sum() > 0
        assert np.all(out[inside] == 0)
        plain = (source.astype(F32) - np.array(mean, F32)) / np.array(std, F32)
        np.testing.assert_allclose(out[~inside], plain[~inside], rtol=1e-6)
    with pytest.raises(ValueError, match="mean"):
        SampleTransform([RandomErasing()], height=8, width=8)
    uint8 = SampleTransform([RandomErasing(p=1.0, value=(1, 2, 3))], height=32, width=32)
    pixels = np.empty((32, 32, 3), np.uint8)
    uint8.apply(source, uint8.draw(0, 0, np.arange(1)), 0, pixels)
    assert np.all(pixels[boxes[0][0] : boxes[0][0] + boxes[0][2], boxes[0][1] : boxes[0][1] + boxes[0][3]] == (1, 2, 3))
    for bad in (
        lambda: RandomErasing(p=2),
        lambda: RandomErasing(value="random"),
        lambda: RandomErasing(scale=(0.5, 0.1)),
        lambda: RandomErasing(value=(1, 2)),
    ):
        with pytest.raises(ValueError):
            bad()


# -- in the loader -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("autoaugment") / "ds"
    rng = np.random.default_rng(5)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=20_000) as writer:
        for i in range(16):
            h, w = int(rng.integers(40, 70)), int(rng.integers(40, 70))
            writer.write({"image": jpeg_bytes(h, w, seed=400 + i), "label": i, "key": f"a{i}"})
    return out


@pytest.mark.slow
def test_the_steps_give_the_same_batches_under_0_and_2_workers_and_spawn(dataset: Path) -> None:
    steps = [TrivialAugmentWide(), RandAugment(2, 9), AutoAugment(), RandomErasing(p=0.7)]
    settings: dict[str, Any] = dict(
        batch_size=4,
        seed=3,
        transform=ImageTransform(size=24, augment=steps, mean=(120.0, 110.0, 100.0), std=(60.0, 60.0, 60.0)),
        output=Output(copy=True),
    )
    runs = []
    for options in ({"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "workers": Workers(start_method="spawn")}):
        with Loader(dataset, **(settings | options)) as loader:
            runs.append([images for _ in range(2) for images, _ in loader])
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))
    assert not torch.equal(runs[0][0], runs[0][4])  # the next epoch draws anew


@pytest.mark.parametrize(("name", "magnitude"), CASES)
def test_the_uint8_path_gives_the_values_of_the_float_planes(name: str, magnitude: float) -> None:
    from shardfmt.ops._pixelops import PixelOps

    for seed in range(3):
        image = sample_image(seed=seed)
        fill = (3.0, 100.0, 250.0)
        planes = apply_operation(ImageOps(*image.shape[1:]), image.copy(), OPERATIONS.index(name), magnitude, fill)
        pixels = np.ascontiguousarray(image.transpose(1, 2, 0).astype(np.uint8))
        got = apply_operation(PixelOps(*image.shape[1:], exact=True), pixels.copy(), OPERATIONS.index(name), magnitude, fill)
        assert np.array_equal(got.transpose(2, 0, 1).astype(F32), planes)
        # OpenCV's uint8 kernels: Color, Contrast and Sharpness within the one level spec/pixels.md
        # states, every other operation the same values
        fast = apply_operation(PixelOps(*image.shape[1:]), pixels.copy(), OPERATIONS.index(name), magnitude, fill)
        difference = np.abs(fast.transpose(2, 0, 1).astype(F32) - planes)
        assert difference.max() <= (1 if name in ("Color", "Contrast", "Sharpness") else 0), name


@pytest.mark.parametrize("normalise", [False, True])
def test_a_sample_on_uint8_pixels_equals_the_same_sample_through_float_planes(normalise: bool) -> None:
    from shardfmt.ops import RandomVerticalFlip

    steps = [
        TrivialAugmentWide(fill=(9, 8, 7)),
        RandAugment(3, 17),
        AutoAugment(),
        RandomErasing(p=0.8, value="mean" if normalise else (1, 2, 3)),
    ]
    options: dict[str, Any] = {"mean": (123.675, 116.28, 103.53), "std": (58.395, 57.12, 57.375)} if normalise else {}
    pixels = SampleTransform(steps, height=40, width=36, **options)
    planes = SampleTransform([*steps, RandomVerticalFlip(0.0)], height=40, width=36, **options)  # a flip step keeps the float planes
    assert pixels._pixel_ops is not None and planes._pixel_ops is None
    pixels._pixel_ops.exact = True  # the float formulas (OpenCV's kernels are checked operation by operation)
    indices = np.arange(60)
    draws_pixels, draws_planes = pixels.draw(5, 1, indices), planes.draw(5, 1, indices)
    dtype = np.float32 if normalise else np.uint8
    a, b = np.empty((40, 36, 3), dtype), np.empty((40, 36, 3), dtype)
    for row in indices:
        source = np.random.default_rng(int(row)).integers(0, 256, (40, 36, 3)).astype(np.uint8)
        pixels.apply(source, draws_pixels, row, a)
        planes.apply(source, draws_planes, row, b)
        assert np.array_equal(a, b), row


def test_draws_take_one_epoch_per_record_for_repeated_copies() -> None:
    transform = SampleTransform([TrivialAugmentWide(), RandomErasing(p=1.0, value=0)], height=16, width=16)
    indices = np.arange(6)
    epochs = np.array([6, 7, 8, 6, 7, 8], np.uint64)  # copies 0, 1, 2 of epoch 2 with 3 repeats
    mixed = transform.draw(9, epochs, indices)
    for epoch in (6, 7, 8):
        alone = transform.draw(9, epoch, indices)
        chosen = epochs == epoch
        for step in range(2):
            assert np.array_equal(mixed[step][chosen], alone[step][chosen])


# -- interpolation of the geometric operations ------------------------------------------------------


def torchvision_affine(image: np.ndarray, name: str, magnitude: float, fill: tuple[float, ...] | None, mode: str) -> np.ndarray:
    """torchvision's ``_apply_op`` for a geometric operation on a uint8 tensor, restated from
    ``transforms.v2.functional._geometry``: ``_get_inverse_affine_matrix``, ``_affine_grid`` (in
    float32), ``_apply_grid_transform`` (``grid_sample`` with zeros padding, the fill blended by
    the mask channel when one is given, then rounded)."""
    _, height, width = image.shape
    if name == "ShearX":
        center, angle, translate, shear = [-width * 0.5, -height * 0.5], 0.0, [0.0, 0.0], [math.degrees(math.atan(magnitude)), 0.0]
    elif name == "TranslateY":
        center, angle, translate, shear = [0.0, 0.0], 0.0, [0.0, float(int(magnitude))], [0.0, 0.0]
    else:  # Rotate: rotate_image's -angle
        center, angle, translate, shear = [0.0, 0.0], -magnitude, [0.0, 0.0], [0.0, 0.0]
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    matrix = [d, -b, 0.0, -c, a, 0.0]
    cx, cy = center
    tx, ty = translate
    matrix[2] += matrix[0] * (-cx - tx) + matrix[1] * (-cy - ty) + cx
    matrix[5] += matrix[3] * (-cx - tx) + matrix[4] * (-cy - ty) + cy
    theta = torch.tensor(matrix, dtype=torch.float32).reshape(1, 2, 3)
    base = torch.empty(1, height, width, 3)
    base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width))
    base[..., 1].copy_(torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height).unsqueeze_(-1))
    base[..., 2].fill_(1)
    grid = base.view(1, height * width, 3).bmm(theta.transpose(1, 2).div_(torch.tensor([0.5 * width, 0.5 * height])))
    source = torch.from_numpy(image)[None]
    if fill is not None:
        source = torch.cat([source, torch.ones(1, 1, height, width)], dim=1)
    out = torch.nn.functional.grid_sample(source, grid.view(1, height, width, 2), mode=mode, padding_mode="zeros", align_corners=False)
    if fill is not None:
        out, mask = out[:, :3], out[:, 3:]
        fills = torch.tensor(fill).view(1, 3, 1, 1)
        out = (out - fills) * mask + fills
    return out[0].round().clamp(0, 255).numpy()


GEOMETRIC_CASES = [("ShearX", 0.27), ("ShearX", -0.6), ("Rotate", 23.0), ("Rotate", -131.0), ("TranslateY", -9.7)]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize(("name", "magnitude"), GEOMETRIC_CASES)
def test_geometric_operations_take_torchvisions_interpolation(name: str, magnitude: float, mode: str) -> None:
    image = sample_image(40, 52, seed=3)
    for fill, torchvision_fill in (((0.0, 0.0, 0.0), None), ((3.0, 100.0, 250.0), (3.0, 100.0, 250.0))):
        want = torchvision_affine(image, name, magnitude, torchvision_fill, mode)
        planes = apply_operation(ImageOps(40, 52), image.copy(), OPERATIONS.index(name), magnitude, fill, mode)
        pixels = np.ascontiguousarray(image.transpose(1, 2, 0)).astype(np.uint8)
        from_pixels = apply_operation(PixelOps(40, 52), pixels, OPERATIONS.index(name), magnitude, fill, mode)
        assert np.array_equal(from_pixels.transpose(2, 0, 1), planes)
        assert np.array_equal(planes, want), fill  # the same float32 grid and kernel: exact
        nearest = apply_operation(ImageOps(40, 52), image.copy(), OPERATIONS.index(name), magnitude, fill)
        assert np.array_equal(nearest, planes) == (name == "TranslateY")  # a whole-pixel shift is the same either way


def test_the_steps_take_and_name_their_interpolation() -> None:
    for step in (TrivialAugmentWide(interpolation="bilinear"), RandAugment(interpolation="bicubic"), AutoAugment(interpolation="bilinear")):
        assert step.to_config()["interpolation"] == step.interpolation
    assert "interpolation" not in TrivialAugmentWide().to_config()  # the default, nearest, as before
    with pytest.raises(ValueError, match="interpolation"):
        RandAugment(interpolation="lanczos")
    rows = np.array([[OPERATIONS.index("Rotate"), 30.0, 0.0]])
    image = sample_image(32, 32, seed=5)
    ops = ImageOps(32, 32)
    bilinear = TrivialAugmentWide(interpolation="bilinear").run(ops, image.copy(), rows[0]).copy()
    magnitude = magnitude_table("wide", "Rotate", 31, height=32, width=32)[30]
    assert np.array_equal(bilinear, torchvision_affine(image, "Rotate", magnitude, None, "bilinear"))
    assert not np.array_equal(bilinear, TrivialAugmentWide().run(ops, image.copy(), rows[0]))


@pytest.mark.parametrize("policy", ["cifar10", "svhn"])
def test_autoaugment_offers_torchvisions_cifar10_and_svhn_policies(policy: str) -> None:
    table = POLICIES[policy]
    assert len(table) == 25 and all(len(pair) == 2 and name in OPERATIONS for pair in table for name, _, _ in pair)
    # spot checks against torchvision's AutoAugmentPolicy tables
    if policy == "cifar10":
        assert table[0] == (("Invert", 0.1, None), ("Contrast", 0.2, 6))
        assert table[21] == (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9))
        assert table[24] == (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None))
    else:
        assert table[0] == (("ShearX", 0.9, 4), ("Invert", 0.2, None))
        assert table[15] == (("Invert", 0.8, None), ("TranslateY", 0.0, 2))
        assert table[24] == (("ShearX", 0.7, 2), ("Invert", 0.1, None))
    u = uniforms(record_keys(4, STEP_STREAM, 0, np.arange(2000, dtype=np.uint64)), 5)
    rows = AutoAugment(policy).parameters(u)
    chosen = np.floor(25 * u[:, 0]).astype(int)
    for row in range(200):
        for i in range(2):
            name, p, bin_index = table[chosen[row]][i]
            assert rows[row, 3 * i] == (OPERATIONS.index(name) if u[row, 1 + i] <= p else -1)
            assert rows[row, 3 * i + 1] == (bin_index or 0)
            assert rows[row, 3 * i + 2] == (u[row, 3 + i] < 0.5)
    assert AutoAugment(policy).to_config()["policy"] == policy
    assert not np.array_equal(rows, AutoAugment().parameters(u))
