"""AugMix: its draws against the written rule (spec/sampling.md), its mix against torchvision's
formula restated, its two paths (uint8 pixels, float planes) against each other, and the loader
giving the same batches whatever the workers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Output
from shardfmt._sampling.keys import STEP_STREAM, record_keys, uniforms
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import AugMix
from shardfmt.ops._augment import SampleTransform
from shardfmt.ops._augmix import AUGMIX_OPERATIONS, gamma_quantiles
from shardfmt.ops._autoaugment import OPERATIONS, SIGNED_OPERATIONS, apply_operation, magnitude_table
from shardfmt.ops._imageops import ImageOps

F32 = np.float32


def draws(step: AugMix, count: int, seed: int = 2) -> np.ndarray:
    return uniforms(record_keys(seed, STEP_STREAM, 0, np.arange(count, dtype=np.uint64)), step.draws)


def test_gamma_quantiles_are_exact_where_a_closed_form_exists() -> None:
    u = np.random.default_rng(0).random(500)
    assert np.allclose(gamma_quantiles(u, 1.0), -np.log1p(-u), rtol=1e-12, atol=0)  # Gamma(1): exponential
    half = torch.erfinv(torch.from_numpy(u)).numpy() ** 2  # Gamma(1/2) = chi-square(1) / 2
    assert np.allclose(gamma_quantiles(u, 0.5), half, rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize(
    "step", [AugMix(), AugMix(severity=7, mixture_width=2, chain_depth=2, all_ops=False), AugMix(mixture_width=4, alpha=1.0)]
)
def test_the_draws_follow_the_written_rule(step: AugMix) -> None:
    u = draws(step, 300)
    rows = step.parameters(u)
    width, depth = step.mixture_width, step.depth
    assert step.draws == 2 + width * (2 + 3 * depth) and rows.shape == (300, 1 + width + 3 * width * depth)
    g = -np.log1p(-u[:, : 2 + width])  # alpha 1: Gamma(1) quantiles in closed form
    m0 = g[:, 0] / (g[:, 0] + g[:, 1])
    chains = g[:, 2:] / g[:, 2:].sum(axis=1, keepdims=True) * (1 - m0)[:, None]
    assert np.allclose(rows[:, 0], m0, atol=1e-6) and np.allclose(rows[:, 1 : 1 + width], chains, atol=1e-6)
    assert np.allclose(rows[:, : 1 + width].sum(axis=1), 1.0, atol=1e-6)
    names = AUGMIX_OPERATIONS if step.all_ops else AUGMIX_OPERATIONS[:9]
    for i in range(width):
        start = 2 + width + i * (1 + 3 * depth)
        chain_depth = depth if step.chain_depth > 0 else 1 + np.floor(3 * u[:, start])
        for d in range(depth):
            slot, column = start + 1 + 3 * d, 1 + width + 3 * (i * depth + d)
            operation = [OPERATIONS.index(names[int(k)]) for k in np.floor(len(names) * u[:, slot])]
            assert np.array_equal(rows[:, column], np.where(d < chain_depth, operation, -1))
            assert np.array_equal(rows[:, column + 1], np.floor(step.severity * u[:, slot + 1]))
            assert np.array_equal(rows[:, column + 2], u[:, slot + 2] < 0.5)


def test_the_weights_are_beta_and_dirichlet_distributed() -> None:
    step = AugMix(alpha=1.0, mixture_width=3)
    rows = step.parameters(draws(step, 6000, seed=9))
    assert abs(rows[:, 0].mean() - 0.5) < 0.015 and abs(rows[:, 0].var() - 1 / 12) < 0.005  # Beta(1, 1)
    shares = rows[:, 1:4] / (1 - rows[:, :1])
    assert np.allclose(shares.mean(axis=0), 1 / 3, atol=0.015)  # Dirichlet(1, 1, 1)
    small = AugMix(alpha=0.2)
    extreme = small.parameters(draws(small, 6000, seed=9))[:, 0]
    assert ((extreme < 0.05) | (extreme > 0.95)).mean() > 0.5  # Beta(0.2, 0.2) sits near 0 and 1


def torchvision_mix(image: np.ndarray, step: AugMix, row: np.ndarray) -> np.ndarray:
    """torchvision's AugMix.forward for one uint8 image with these draws: mix = m0 x, then for
    each chain mix += w_i chain(x) in float32; ``.to(uint8)`` truncates."""
    _, height, width = image.shape
    mix = F32(row[0]) * image.astype(F32)
    for i in range(step.mixture_width):
        chain = image.astype(F32)
        for d in range(step.depth):
            operation, bin_index, sign = (int(v) for v in row[1 + step.mixture_width + 3 * (i * step.depth + d) :][:3])
            if operation < 0:
                continue
            name = OPERATIONS[operation]
            table = magnitude_table("augmix", name, 10, height=height, width=width)
            magnitude = table[bin_index] if len(table) > 1 else 0.0
            magnitude = -magnitude if sign and name in SIGNED_OPERATIONS else magnitude
            chain = apply_operation(ImageOps(height, width), chain.copy(), operation, magnitude, (0.0, 0.0, 0.0), step.interpolation).copy()
        mix = mix + F32(row[1 + i]) * chain
    return np.trunc(mix)


def test_augmix_posterizes_from_four_bits_and_translates_by_a_third() -> None:
    assert magnitude_table("augmix", "Posterize", 10, height=30, width=60) == [4.0, 4.0, 3.0, 3.0, 2.0, 2.0, 1.0, 1.0, 0.0, 0.0]
    assert magnitude_table("augmix", "TranslateX", 10, height=30, width=60)[-1] == pytest.approx(20.0)
    assert magnitude_table("augmix", "TranslateY", 10, height=30, width=60)[-1] == pytest.approx(10.0)
    assert magnitude_table("augmix", "Rotate", 10, height=30, width=60)[-1] == pytest.approx(30.0)


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
def test_the_mix_is_torchvisions_and_both_paths_agree(interpolation: str) -> None:
    step = AugMix(severity=10, interpolation=interpolation)
    rows = step.parameters(draws(step, 12, seed=4))
    pixels_path = SampleTransform([step], height=28, width=33)
    planes_path = SampleTransform([step], height=28, width=33)
    planes_path._pixel_ops = None  # every built-in step list runs on the pixels: force the float planes
    assert pixels_path._pixel_ops is not None
    for k, row in enumerate(rows):
        source = np.random.default_rng(k).integers(0, 256, (28, 33, 3)).astype(np.uint8)
        want = torchvision_mix(source.transpose(2, 0, 1), step, row)
        a, b = np.empty_like(source), np.empty_like(source)
        pixels_path.apply(source, [rows], k, a)
        planes_path.apply(source, [rows], k, b)
        assert np.array_equal(a, b), k
        assert np.array_equal(a.transpose(2, 0, 1).astype(F32), want), k
        assert not np.array_equal(a, source)


def test_arguments_are_checked_and_named_in_the_config() -> None:
    for bad in (
        {"severity": 0},
        {"severity": 11},
        {"mixture_width": 0},
        {"chain_depth": 17},
        {"alpha": 0.0},
        {"alpha": True},
        {"interpolation": "lanczos"},
        {"fill": 300},
    ):
        with pytest.raises(ValueError):
            AugMix(**bad)
    with pytest.raises(TypeError):
        AugMix(all_ops=1)  # type: ignore[arg-type]
    assert AugMix().to_config() == {
        "op": "augmix", "severity": 3, "mixture_width": 3, "chain_depth": -1, "alpha": 1.0, "all_ops": True,
        "interpolation": "bilinear", "fill": [0.0, 0.0, 0.0],
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("augmix") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=20_000) as writer:
        for i in range(12):
            writer.write({"image": jpeg_bytes(40 + i, 50, seed=700 + i), "label": i, "key": f"m{i}"})
    return out


def test_the_loader_gives_the_same_augmix_batches_under_0_and_2_workers(dataset: Path) -> None:
    settings: dict[str, Any] = dict(batch_size=4, seed=3, transform=ImageTransform(size=24, augment=[AugMix()]), output=Output(copy=True))
    runs = []
    for workers in (0, 2):
        with Loader(dataset, num_workers=workers, **settings) as loader:
            runs.append([images for _ in range(2) for images, _ in loader])
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1], strict=True))
    assert not torch.equal(runs[0][0], runs[0][3])  # the next epoch draws anew
    with Loader(dataset, num_workers=0, **(settings | {"transform": ImageTransform(size=24)})) as plain:
        assert not torch.equal(next(iter(plain))[0], runs[0][0])
    assert math.isfinite(float(runs[0][0].float().mean()))
