"""Batch steps: `MixUp`, `CutMix` and `RandomChoice` over a whole batch (images and integer
labels in, images and soft labels out), with torchvision v2's semantics, drawn from (seed,
epoch, batch) so that a resumed run mixes the same batches the same way.

torchvision v2 (``torchvision.transforms.v2.MixUp``, ``CutMix``, ``RandomChoice``), for a batch of N images
and labels, with ``lam`` drawn from Beta(alpha, alpha) once a batch:

- labels become one-hot float rows ``y`` (``num_classes`` wide), then
  ``lam y + (1 - lam) roll(y, 1)``: each sample is mixed with the one before it (the first with
  the last);
- MixUp: images ``lam x + (1 - lam) roll(x, 1)``;
- CutMix: a box centred at a uniform pixel ``(r_x, r_y)`` with half sides
  ``trunc(W sqrt(1 - lam) / 2)`` and ``trunc(H sqrt(1 - lam) / 2)``, clipped to the image,
  takes ``roll(x, 1)``'s pixels; the labels are mixed with ``lam' = 1 - box area / (H W)``;
- RandomChoice: one of its steps, chosen with probabilities `p` (equal by default).

Randomness: batch step j of a list draws from ``key(seed, BATCH + j, epoch, batch)``
(`sampling.keys.BATCH_STREAM`; spec/sampling.md): ``u[k]`` is draw k + 1 as a float. ``lam`` is
the ``u[0]``-quantile of Beta(alpha, alpha) (`beta_quantile`), and CutMix takes
``r_x = floor(W u[1])``, ``r_y = floor(H u[2])``; RandomChoice picks its step with ``u[0]`` and
hands it ``u[1:]``.

Images are float (any float dtype, normalised or not: mixing is linear, so it commutes with
the normalisation) or uint8, which becomes float32 on the 0-255 scale. Layout "NCHW" or "NHWC".
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch

from .._arguments import check_int, check_number
from .._sampling.keys import BATCH_STREAM, record_keys, uniforms
from ..format._layout import MAX_CLASSES
from ._augment import describe_steps

__all__ = [
    "MAX_ALPHA",
    "MIN_ALPHA",
    "BatchStep",
    "CutMix",
    "MixUp",
    "RandomChoice",
    "apply_batch_steps",
    "beta_quantile",
    "check_batch_step",
    "check_dataset_classes",
    "step_classes",
]

MIN_ALPHA = 0.001
"""The smallest alpha of MixUp and CutMix: Beta(0.001, 0.001) is already 0 or 1 all but 0.2% of
the time, and below it the quantile's bisection returns 0 for every draw."""
MAX_ALPHA = 1000.0
"""The largest alpha: Beta(1000, 1000) stays within 0.03 of 0.5 in 99% of batches; beyond it a
quantile costs more bisection work for a lam that is 0.5 anyway (1e30 ran without end)."""

_LAYOUTS = ("NCHW", "NHWC")


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _beta_cdf(x: float, a: float) -> float:
    """The CDF of Beta(a, a) at x."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > 0.5:
        return 1.0 - _beta_cdf(1.0 - x, a)
    log_front = math.lgamma(2 * a) - 2 * math.lgamma(a) + a * math.log(x) + a * math.log1p(-x)
    return math.exp(log_front) * _beta_continued_fraction(a, a, x) / a


def beta_quantile(u: float, alpha: float) -> float:
    """The `u`-quantile of Beta(alpha, alpha), by 60 bisections of its CDF (the regularized
    incomplete beta function): within 2^-60 of the exact quantile, up to the CDF's rounding."""
    if alpha == 1.0:
        return u
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = 0.5 * (low + high)
        if _beta_cdf(middle, alpha) < u:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _check_alpha(alpha: Any) -> float:
    return check_number("alpha", alpha, MIN_ALPHA, MAX_ALPHA)


def _check_classes(num_classes: Any) -> int:
    note = " (a one-hot row of num_classes floats per sample; MAX_CLASSES of the format)"
    return check_int("num_classes", num_classes, 1, MAX_CLASSES, note=note)


def _prepare(images: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    if images.ndim != 4:
        raise ValueError(f"a batch step takes a 4-dimensional batch of images, got shape {tuple(images.shape)}")
    if labels.ndim == 1:
        if labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise ValueError(f"labels must be integer class indices (or soft labels, N x {num_classes}), got {labels.dtype}")
        if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
            raise ValueError(f"labels must lie in [0, {num_classes}), got values from {int(labels.min())} to {int(labels.max())}")
        soft = torch.nn.functional.one_hot(labels.long(), num_classes).to(torch.float32)
    elif labels.ndim == 2 and labels.shape[1] == num_classes and labels.dtype.is_floating_point:
        soft = labels  # an earlier batch step's soft labels
    else:
        raise ValueError(f"labels must be N class indices or N x {num_classes} soft labels, got shape {tuple(labels.shape)} {labels.dtype}")
    if len(soft) != len(images):
        raise ValueError(f"{len(images)} images but {len(soft)} labels")
    return (images if images.dtype.is_floating_point else images.to(torch.float32)), soft.to(device=images.device)


def _mix(tensor: torch.Tensor, lam: float) -> torch.Tensor:
    """lam x + (1 - lam) roll(x, 1), as torchvision computes it."""
    return tensor.roll(1, 0).mul_(1.0 - lam).add_(tensor.mul(lam))


@dataclass(frozen=True)
class MixUp:
    """torchvision v2's MixUp: every image blended with the one before it, by ``lam`` from
    Beta(alpha, alpha) (one a batch), the labels likewise. Draws: 1. `alpha` lies in [0.001,
    1000] (`MIN_ALPHA`, `MAX_ALPHA`), `num_classes` in [1, 2**20]; TypeError or ValueError
    otherwise."""

    alpha: float = 1.0
    num_classes: int | None = None
    draws = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_alpha(self.alpha))
        object.__setattr__(self, "num_classes", _check_classes(self.num_classes))

    def lam(self, u: np.ndarray) -> float:
        return beta_quantile(float(u[0]), self.alpha)

    def to_config(self) -> dict[str, Any]:
        return {"op": "mixup", "alpha": self.alpha, "num_classes": self.num_classes}

    def apply(
        self, images: torch.Tensor, labels: torch.Tensor, u: np.ndarray, *, layout: str = "NCHW"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix a batch with its draws `u`; return (images, soft labels)."""
        images, soft = _prepare(images, labels, cast(int, self.num_classes))  # __post_init__ refused None
        lam = self.lam(u)
        return _mix(images, lam), _mix(soft, lam)


@dataclass(frozen=True)
class CutMix:
    """torchvision v2's CutMix: a box of every image replaced by the same box of the image before
    it, its area about ``1 - lam`` of the image (``lam`` from Beta(alpha, alpha)), the labels mixed
    by the area kept. Draws: 3. `alpha` and `num_classes` as MixUp's."""

    alpha: float = 1.0
    num_classes: int | None = None
    draws = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", _check_alpha(self.alpha))
        object.__setattr__(self, "num_classes", _check_classes(self.num_classes))

    def to_config(self) -> dict[str, Any]:
        return {"op": "cutmix", "alpha": self.alpha, "num_classes": self.num_classes}

    def box(self, u: np.ndarray, *, height: int, width: int) -> tuple[int, int, int, int, float]:
        """(x1, y1, x2, y2, lam'): the box [y1, y2) x [x1, x2) and the label weight of the image itself."""
        lam = beta_quantile(float(u[0]), self.alpha)
        centre_x, centre_y = math.floor(width * float(u[1])), math.floor(height * float(u[2]))
        ratio = 0.5 * math.sqrt(1.0 - lam)
        half_w, half_h = int(ratio * width), int(ratio * height)
        x1, y1 = max(centre_x - half_w, 0), max(centre_y - half_h, 0)
        x2, y2 = min(centre_x + half_w, width), min(centre_y + half_h, height)
        return x1, y1, x2, y2, 1.0 - (x2 - x1) * (y2 - y1) / (width * height)

    def apply(
        self, images: torch.Tensor, labels: torch.Tensor, u: np.ndarray, *, layout: str = "NCHW"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cut and mix a batch with its draws `u`; return (images, soft labels)."""
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
        images, soft = _prepare(images, labels, cast(int, self.num_classes))  # __post_init__ refused None
        height, width = (images.shape[2], images.shape[3]) if layout == "NCHW" else (images.shape[1], images.shape[2])
        x1, y1, x2, y2, lam = self.box(u, height=height, width=width)
        output = images.clone()
        rolled = images.roll(1, 0)
        if layout == "NCHW":
            output[:, :, y1:y2, x1:x2] = rolled[:, :, y1:y2, x1:x2]
        else:
            output[:, y1:y2, x1:x2] = rolled[:, y1:y2, x1:x2]
        return output, _mix(soft, lam)


@dataclass(frozen=True)
class RandomChoice:
    """torchvision v2's RandomChoice over batch steps: one of `steps`, with probabilities `p`
    (equal by default; normalised to sum 1): the first i with ``u[0] < (p_0 + ... + p_i) /
    sum(p)``, run with the draws ``u[1:]``. Draws: 1 + the most of its steps'."""

    steps: Sequence[Any]
    p: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.steps, (list, tuple)):
            raise TypeError(f"RandomChoice takes a list of batch steps (MixUp, CutMix, RandomChoice), got {self.steps!r}")
        steps = tuple(self.steps)
        if not steps:
            raise ValueError(f"RandomChoice takes a non-empty list of batch steps, got {self.steps!r}")
        for step in steps:
            check_batch_step(step)
        if self.p is not None and (not isinstance(self.p, (list, tuple, np.ndarray)) or len(self.p) != len(steps)):
            raise TypeError(f"p must be a list of one weight per step ({len(steps)}), got {self.p!r}")
        weights = (
            tuple(check_number("p", v, 0.0, sys.float_info.max, note=" (a weight, finite)") for v in self.p)
            if self.p is not None
            else (1.0,) * len(steps)
        )
        if not any(weights):
            raise ValueError(f"p must hold one non-negative weight per step, not all 0, got {self.p!r}")
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "p", weights)

    @property
    def draws(self) -> int:
        return 1 + max(int(step.draws) for step in self.steps)

    def to_config(self) -> dict[str, Any]:
        return {"op": "random_choice", "steps": describe_steps(self.steps), "p": list(cast(Sequence[float], self.p))}

    def choose(self, u: np.ndarray) -> int:
        stored = cast(Sequence[float], self.p)  # __post_init__ stored a weight per step
        weights = np.array(stored)
        if not math.isfinite(sum(stored)):
            weights /= weights.max()  # weights of 1e308 sum to infinity: the same proportions, scaled
        bounds = np.cumsum(weights) / weights.sum()
        return min(int(np.searchsorted(bounds, float(u[0]), side="right")), len(self.steps) - 1)

    def apply(
        self, images: torch.Tensor, labels: torch.Tensor, u: np.ndarray, *, layout: str = "NCHW"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.steps[self.choose(u)]
        result: tuple[torch.Tensor, torch.Tensor] = step.apply(images, labels, u[1:], layout=layout)
        return result


class BatchStep(Protocol):
    """What ``Loader(batch_augment=[...])`` and `apply_batch_steps` take: the built-ins
    (`MixUp`, `CutMix`, `RandomChoice`) or an object of your own with these members
    (docs/augmentation.md, "A batch step of your own"), checked when a loader is made
    (`check_batch_step`). Batch steps run in the loader's own process: they need not pickle.
    """

    @property
    def draws(self) -> int:
        """How many uniform draws in [0, 1) the step takes a batch."""
        ...

    def apply(
        self, images: torch.Tensor, labels: torch.Tensor, u: np.ndarray, *, layout: str = "NCHW"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch after the step: `images` (N images in `layout`, uint8 or float), `labels`
        (N class indices, or N x num_classes soft labels from an earlier step) and `u`, the
        step's `draws` floats of this batch (a pure function of (seed, epoch, batch, the step's
        place in the list)). Returns (images, labels)."""
        ...


BATCH_STEP_MEMBERS = ("draws", "apply")
"""The members of `BatchStep` a loader calls; `num_classes` (an int), where a step has it, is
checked against the dataset's classes, and `to_config()`, where it has it, fingerprints it
(`ops._augment.describe_steps`)."""


def check_batch_step(step: Any) -> None:
    """Refuse an object that is not a `BatchStep`: one lacking a member, or whose `draws` is not
    an int in [0, 2**16].

    Raises:
        TypeError: naming what is missing or malformed.
    """
    missing = [name for name in BATCH_STEP_MEMBERS if not hasattr(step, name) or (name == "apply" and not callable(step.apply))]
    if missing:
        raise TypeError(
            f"batch_augment takes batch steps of shardfmt.ops (MixUp, CutMix, RandomChoice) or objects with draws and "
            f"apply(images, labels, u, *, layout), got {step!r}, which lacks {' and '.join(missing)}"
        )
    draws = step.draws
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or not 0 <= draws <= MAX_DRAWS:
        raise TypeError(f"batch step {step!r}: draws must be an int in [0, {MAX_DRAWS}], got {draws!r}")


MAX_DRAWS = 2**16
"""The most uniform draws one batch step may take a batch."""


def step_classes(steps: Sequence[BatchStep]) -> list[int]:
    """The `num_classes` of every step of `steps` that has one, those inside a RandomChoice too."""
    found: list[int] = []
    for step in steps:
        if isinstance(step, RandomChoice):
            found += step_classes(step.steps)
        elif isinstance(getattr(step, "num_classes", None), int):
            found.append(cast(Any, step).num_classes)
    return found


def check_dataset_classes(steps: Sequence[BatchStep], classes: Sequence[str] | None) -> None:
    """Raise ValueError if a MixUp or CutMix of `steps` has fewer classes than a dataset whose
    manifest names `classes` (None: a label out of range is refused batch by batch)."""
    if classes is None:
        return
    for num_classes in step_classes(steps):
        if num_classes < len(classes):
            raise ValueError(
                f"num_classes of a batch step must be in [{len(classes)}, {MAX_CLASSES}] for this dataset, which has "
                f"{len(classes)} classes, got {num_classes}"
            )


def apply_batch_steps(
    steps: Sequence[BatchStep], images: torch.Tensor, labels: torch.Tensor, *, seed: int, epoch: int, batch: int, layout: str = "NCHW"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `steps` in turn on one batch: step j with the draws of ``key(seed, BATCH + j, epoch,
    batch)``. Returns (images, soft labels); with no steps, the batch as it came."""
    for position, step in enumerate(steps):
        key = record_keys(seed, BATCH_STREAM + position, epoch, np.array([batch], np.uint64))
        images, labels = step.apply(images, labels, uniforms(key, step.draws)[0], layout=layout)
    return images, labels
