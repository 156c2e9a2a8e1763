"""Batch steps (MixUp, CutMix, RandomChoice): torchvision v2's formulas written here as
references, lam's distribution, the draws of (seed, epoch, batch), and both layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from shardfmt._sampling.keys import BATCH_STREAM, record_keys, uniforms
from shardfmt.ops import CutMix, MixUp, RandomChoice
from shardfmt.ops._batch import apply_batch_steps, beta_quantile


def batch(n: int = 6, height: int = 10, width: int = 14, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn((n, 3, height, width), generator=generator)
    labels = torch.arange(n) % classes
    return images, labels


def ref_labels(labels: torch.Tensor, classes: int, lam: float) -> torch.Tensor:
    one_hot = torch.zeros((len(labels), classes))
    one_hot[torch.arange(len(labels)), labels] = 1.0
    return lam * one_hot + (1 - lam) * one_hot.roll(1, 0)


def test_mixup_blends_each_sample_with_the_one_before() -> None:
    images, labels = batch()
    u = np.array([0.3])
    lam = beta_quantile(0.3, 0.2)
    mixed, soft = MixUp(alpha=0.2, num_classes=5).apply(images.clone(), labels, u)
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images.roll(1, 0))
    torch.testing.assert_close(soft, ref_labels(labels, 5, lam))
    torch.testing.assert_close(soft.sum(1), torch.ones(6))


@pytest.mark.parametrize("u", [(0.5, 0.0, 0.0), (0.9, 0.99, 0.5), (0.05, 0.31, 0.77)])
def test_cutmix_pastes_torchvisions_box_in_both_layouts(u: tuple[float, float, float]) -> None:
    images, labels = batch()
    height, width = 10, 14
    lam = beta_quantile(u[0], 1.0)
    r_x, r_y = math.floor(width * u[1]), math.floor(height * u[2])
    r = 0.5 * math.sqrt(1 - lam)
    x1, y1 = max(r_x - int(r * width), 0), max(r_y - int(r * height), 0)
    x2, y2 = min(r_x + int(r * width), width), min(r_y + int(r * height), height)
    want = images.clone()
    want[:, :, y1:y2, x1:x2] = images.roll(1, 0)[:, :, y1:y2, x1:x2]
    kept = 1 - (x2 - x1) * (y2 - y1) / (height * width)
    step = CutMix(alpha=1.0, num_classes=5)
    got, soft = step.apply(images, labels, np.array(u))
    assert torch.equal(got, want)
    torch.testing.assert_close(soft, ref_labels(labels, 5, kept))
    nhwc, soft_nhwc = step.apply(images.permute(0, 2, 3, 1), labels, np.array(u), layout="NHWC")
    assert torch.equal(nhwc.permute(0, 3, 1, 2), want) and torch.equal(soft_nhwc, soft)


def test_lam_follows_beta_alpha_alpha() -> None:
    u = uniforms(record_keys(0, BATCH_STREAM, 0, np.arange(4000, dtype=np.uint64)), 1)[:, 0]
    for alpha in (0.2, 1.0, 2.0):
        lam = np.array([beta_quantile(float(v), alpha) for v in u])
        assert lam.min() >= 0 and lam.max() <= 1
        assert abs(lam.mean() - 0.5) < 0.02
        assert abs(lam.var() - 1 / (4 * (2 * alpha + 1))) < 0.01  # Beta(a, a): variance 1 / (4 (2a + 1))
        assert np.all(np.diff(lam[np.argsort(u)]) >= 0)  # a quantile function: monotone in u
    assert beta_quantile(0.25, 1.0) == 0.25
    assert abs(beta_quantile(0.5, 0.3) - 0.5) < 1e-12


def test_random_choice_picks_by_its_weights_and_passes_on_the_rest_of_the_draws() -> None:
    choice = RandomChoice([MixUp(0.8, 5), CutMix(1.0, 5)], p=[3, 1])
    assert choice.draws == 4
    assert [choice.choose(np.array([v])) for v in (0.0, 0.74, 0.75, 0.99)] == [0, 0, 1, 1]
    images, labels = batch()
    u = np.array([0.9, 0.5, 0.2, 0.7])
    got, soft = choice.apply(images, labels, u)
    want, want_soft = CutMix(1.0, 5).apply(images, labels, u[1:])
    assert torch.equal(got, want) and torch.equal(soft, want_soft)
    picks = [RandomChoice([MixUp(1.0, 5), CutMix(1.0, 5)]).choose(np.array([v])) for v in np.linspace(0, 0.999, 1000)]
    assert picks.count(0) == 500


def test_batch_steps_draw_from_seed_epoch_and_batch() -> None:
    images, labels = batch()
    steps = [RandomChoice([MixUp(0.2, 5), CutMix(1.0, 5)])]
    first = apply_batch_steps(steps, images, labels, seed=3, epoch=1, batch=7)
    again = apply_batch_steps(steps, images, labels, seed=3, epoch=1, batch=7)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    others = [apply_batch_steps(steps, images, labels, seed=3, epoch=e, batch=b)[1] for e, b in ((1, 8), (2, 7))]
    assert all(not torch.equal(first[1], other) for other in others)
    key = record_keys(3, BATCH_STREAM, 1, np.array([7], np.uint64))
    want = steps[0].apply(images, labels, uniforms(key, steps[0].draws)[0])
    assert torch.equal(first[0], want[0])
    chained = apply_batch_steps([MixUp(1.0, 5), CutMix(1.0, 5)], images, labels, seed=0, epoch=0, batch=0)
    torch.testing.assert_close(chained[1].sum(1), torch.ones(6))


def test_uint8_images_become_float_and_bad_input_is_refused() -> None:
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    mixed, _ = MixUp(1.0, 3).apply(images, torch.tensor([0, 1, 2, 0]), np.array([0.25]))
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, 0.25 * images.float() + 0.75 * images.float().roll(1, 0))
    with pytest.raises(ValueError, match="labels must lie"):
        MixUp(1.0, 3).apply(images, torch.tensor([0, 1, 2, 3]), np.array([0.5]))
    with pytest.raises(ValueError, match="labels"):
        MixUp(1.0, 3).apply(images, torch.zeros(4), np.array([0.5]))
    for bad in (
        lambda: MixUp(0, 3),
        lambda: MixUp(1.0, 0),
        lambda: CutMix(-1, 3),
        lambda: RandomChoice([]),
        lambda: RandomChoice([MixUp(1.0, 3)], p=[0]),
    ):
        with pytest.raises(ValueError):
            bad()
