"""The auto-augment family of steps: `TrivialAugmentWide`, `RandAugment` and `AutoAugment` (the
ImageNet, CIFAR-10 and SVHN policies), with torchvision's operation sets, magnitude bins and
sampling rules.

Each step draws which operations run, their magnitude bins and signs from its uniforms ``u``
(``u[0]`` is draw 1 of the step's key; spec/sampling.md), as a row of (operation, bin, sign)
triples per record; the operation runs on the sample's float planes (`imageops`, `colour`).
An operation's magnitude is bin ``b`` of its table (below), negated when the sign is 1:

| operation | TrivialAugmentWide (31 bins) | RandAugment, AutoAugment (31 / 10 bins) | result |
|---|---|---|---|
| Identity | - | - | unchanged |
| ShearX, ShearY | 0 to 0.99, signed | 0 to 0.3, signed | shear by `m`, about the top-left corner |
| TranslateX, TranslateY | 0 to 32, signed | 0 to 150/331 of the width (height), signed | shift by `trunc(m)` pixels |
| Rotate | 0 to 135, signed | 0 to 30, signed | `m` degrees counter-clockwise about the centre |
| Brightness, Color, Contrast, Sharpness | 0 to 0.99, signed | 0 to 0.9, signed | factor `1 + m` |
| Posterize | ``8 - round(b / ((n - 1) / 6))`` bits | ``8 - round(b / ((n - 1) / 4))`` bits | keep the top bits |
| Solarize | 255 to 0 | 255 to 0 | invert values `>= m` |
| AutoContrast, Equalize, Invert | - | - | as in `imageops` |

"0 to 0.99" is torch's float32 ``linspace`` of n bins (n = `num_magnitude_bins`). Geometric
operations use nearest pixels and `fill` outside the image (torchvision's defaults), or, with
``interpolation="bilinear"`` or ``"bicubic"`` (what torchvision's reference recipe passes from
its ``--interpolation``), that kernel (`imageops.resample_affine`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch

from .._arguments import check_int
from ._imageops import WARP_INTERPOLATIONS, ImageOps
from ._pixelops import PixelOps

__all__ = [
    "MAX_MAGNITUDE_BINS",
    "MAX_OPS",
    "POLICIES",
    "AutoAugment",
    "RandAugment",
    "TrivialAugmentWide",
    "apply_operation",
    "check_interpolation",
    "magnitude_table",
]

MAX_MAGNITUDE_BINS = 1024
"""The most magnitude bins a step takes (torchvision's default is 31): each worker builds a table
of 15 operations x bins per image size, and more bins than a float32 magnitude can tell apart
only cost memory (10**9 bins took 23.5 GB)."""
MAX_OPS = 64
"""The most operations a RandAugment runs on one sample (torchvision's default is 2)."""

OPERATIONS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Invert",
)
"""Every operation, numbered as the steps' parameters name them; TrivialAugmentWide and
RandAugment choose among the first 14 (all but Invert), in this order, as torchvision does."""

SIGNED_OPERATIONS = frozenset(("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"))
"""The operations whose magnitude takes a random sign."""

IMAGENET_POLICY: tuple[tuple[tuple[str, float, int | None], tuple[str, float, int | None]], ...] = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)
"""AutoAugment's ImageNet policy: 25 sub-policies of two (operation, probability, bin) each."""

CIFAR10_POLICY: tuple[tuple[tuple[str, float, int | None], tuple[str, float, int | None]], ...] = (
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
    (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
    (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
    (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
    (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
    (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
    (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
    (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
    (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
    (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
    (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
    (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
    (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
)
"""AutoAugment's CIFAR-10 policy (torchvision's table): 25 sub-policies."""

SVHN_POLICY: tuple[tuple[tuple[str, float, int | None], tuple[str, float, int | None]], ...] = (
    (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
    (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
    (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
    (("Invert", 0.9, None), ("Equalize", 0.6, None)),
    (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
    (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
    (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
    (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
    (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
    (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
    (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
    (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
    (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
    (("Invert", 0.9, None), ("Equalize", 0.6, None)),
    (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
    (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
    (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
    (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
    (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
    (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
    (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
    (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
    (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
    (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
    (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
)
"""AutoAugment's SVHN policy (torchvision's table): 25 sub-policies."""

POLICIES = {"imagenet": IMAGENET_POLICY, "cifar10": CIFAR10_POLICY, "svhn": SVHN_POLICY}
"""AutoAugment's policies by the names torchvision's ``AutoAugmentPolicy`` gives them."""


def _linspace(start: float, end: float, count: int) -> list[float]:
    return [float(v) for v in torch.linspace(start, end, count).tolist()]


def magnitude_table(family: str, operation: str, num_bins: int, *, height: int, width: int) -> list[float]:
    """The magnitudes of `operation`'s bins in `family` ("wide" for TrivialAugmentWide, "standard"
    for RandAugment and AutoAugment, "augmix" for AugMix) for an image of `height` x `width`;
    [0.0] for an operation without magnitude."""
    if family == "augmix":
        return _augmix_table(operation, num_bins, height=height, width=width)
    wide = family == "wide"
    if operation in ("ShearX", "ShearY"):
        return _linspace(0.0, 0.99 if wide else 0.3, num_bins)
    if operation == "TranslateX":
        return _linspace(0.0, 32.0 if wide else 150.0 / 331.0 * width, num_bins)
    if operation == "TranslateY":
        return _linspace(0.0, 32.0 if wide else 150.0 / 331.0 * height, num_bins)
    if operation == "Rotate":
        return _linspace(0.0, 135.0 if wide else 30.0, num_bins)
    if operation in ("Brightness", "Color", "Contrast", "Sharpness"):
        return _linspace(0.0, 0.99 if wide else 0.9, num_bins)
    if operation == "Posterize":
        levels = 6 if wide else 4
        return [float(8 - int(np.round(b / ((num_bins - 1) / levels)))) for b in range(num_bins)]
    if operation == "Solarize":
        return _linspace(255.0, 0.0, num_bins)
    return [0.0]


def _augmix_table(operation: str, num_bins: int, *, height: int, width: int) -> list[float]:
    """AugMix's magnitudes: the standard ones but translations up to a third of the side and
    posterize from 4 bits down to 0."""
    if operation == "TranslateX":
        return _linspace(0.0, width / 3.0, num_bins)
    if operation == "TranslateY":
        return _linspace(0.0, height / 3.0, num_bins)
    if operation == "Posterize":
        return [float(4 - int(np.round(b / ((num_bins - 1) / 4)))) for b in range(num_bins)]
    return magnitude_table("standard", operation, num_bins, height=height, width=width)


def fill_triple(fill: Any) -> tuple[float, float, float]:
    """Check a step's `fill` (one value or three, each in [0, 255]); return three whole numbers as floats.

    Raises:
        TypeError: `fill` is neither a number nor a list or tuple.
        ValueError: it does not hold one or three numbers in [0, 255].
    """
    if isinstance(fill, (int, float)) and not isinstance(fill, bool):
        values: tuple[Any, ...] = (fill,) * 3
    elif isinstance(fill, (list, tuple)):
        values = tuple(fill)
    else:
        raise TypeError(f"fill must be one value or three, each in [0, 255], got {fill!r}")
    if len(values) == 1:
        values = values * 3
    if len(values) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 255 for v in values):
        raise ValueError(f"fill must be one value or three, each in [0, 255], got {fill!r}")
    return (float(int(values[0])), float(int(values[1])), float(int(values[2])))


def stored_fill(fill: float | tuple[float, ...]) -> tuple[float, float, float]:
    """A step's `fill` as its __post_init__ stored it (`fill_triple`'s three floats); the field's type is what callers may pass."""
    return cast("tuple[float, float, float]", fill)


def check_interpolation(interpolation: Any) -> str:
    """Check a step's `interpolation` (of `imageops.WARP_INTERPOLATIONS`)."""
    if interpolation not in WARP_INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {', '.join(WARP_INTERPOLATIONS)}, got {interpolation!r}")
    return str(interpolation)


def _with_interpolation(config: dict[str, Any], interpolation: str) -> dict[str, Any]:
    """A step's config, naming its interpolation where it is not the default "nearest"."""
    return config if interpolation == "nearest" else {**config, "interpolation": interpolation}


def _check_bins(num_bins: Any) -> int:
    return check_int("num_magnitude_bins", num_bins, 2, MAX_MAGNITUDE_BINS)


class _Tables:
    """The magnitude tables of one family for one image size, built on first use."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int, int], list[list[float]]] = {}

    def get(self, family: str, num_bins: int, height: int, width: int) -> list[list[float]]:
        key = (family, num_bins, height, width)
        tables = self._cache.get(key)
        if tables is None:
            tables = [magnitude_table(family, name, num_bins, height=height, width=width) for name in OPERATIONS]
            self._cache[key] = tables
        return tables


_TABLES = _Tables()


_GEOMETRIC = frozenset(("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"))
"""The operations that warp the image (into a new array, `fill` outside it)."""


def apply_operation(
    ops: ImageOps | PixelOps,
    image: np.ndarray,
    operation: int,
    magnitude: float,
    fill: tuple[float, float, float],
    interpolation: str = "nearest",
) -> np.ndarray:
    """Run operation number `operation` (of `OPERATIONS`) with `magnitude` on `image` (float
    planes with `ImageOps`, uint8 pixels with `PixelOps`), a geometric one with `interpolation`;
    return the array now holding the sample."""
    name = OPERATIONS[operation]
    if name == "Identity":
        return image
    if name in _GEOMETRIC:
        return ops.warp(image, _affine(name, magnitude, ops.size), fill, interpolation)
    _adjust(ops, image, name, magnitude)
    return image


def _affine(name: str, magnitude: float, size: tuple[int, int]) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """The 2 x 3 matrix of a geometric operation: a shear, a shift, or a rotation about the centre."""
    if name == "ShearX":
        return ((1.0, magnitude, 0.5 * magnitude), (0.0, 1.0, 0.0))
    if name == "ShearY":
        return ((1.0, 0.0, 0.0), (magnitude, 1.0, 0.5 * magnitude))
    if name == "TranslateX":
        return ((1.0, 0.0, -float(int(magnitude))), (0.0, 1.0, 0.0))
    if name == "TranslateY":
        return ((1.0, 0.0, 0.0), (0.0, 1.0, -float(int(magnitude))))
    height, width = size
    radians = math.radians(magnitude)
    cos, sin = math.cos(radians), math.sin(radians)
    cx, cy = (width - 1) / 2, (height - 1) / 2
    return ((cos, -sin, cx - cos * cx + sin * cy), (sin, cos, cy - sin * cx - cos * cy))


def _adjust(ops: ImageOps | PixelOps, image: np.ndarray, name: str, magnitude: float) -> None:
    """Run a colour or pixel operation on `image`, in place."""
    colour = ops.colour
    if name == "Brightness":
        colour.brightness(image, 1.0 + magnitude)
    elif name == "Color":
        colour.saturation(image, 1.0 + magnitude)
    elif name == "Contrast":
        colour.contrast(image, 1.0 + magnitude)
    elif name == "Sharpness":
        ops.sharpness(image, 1.0 + magnitude)
    elif name == "Posterize":
        ops.posterize(image, int(magnitude))
    elif name == "Solarize":
        ops.solarize(image, magnitude)
    elif name == "AutoContrast":
        ops.autocontrast(image)
    elif name == "Equalize":
        ops.equalize(image)
    else:
        ops.invert(image)


def _run_triples(
    ops: ImageOps | PixelOps,
    image: np.ndarray,
    params: np.ndarray,
    family: str,
    num_bins: int,
    fill: tuple[float, float, float],
    interpolation: str = "nearest",
) -> np.ndarray:
    """Apply the (operation, bin, sign) triples of one record's row; an operation of -1 is skipped."""
    height, width = ops.size
    tables = _TABLES.get(family, num_bins, height, width)
    for slot in range(len(params) // 3):
        operation, bin_index, sign = (int(v) for v in params[3 * slot : 3 * slot + 3])
        if operation < 0:
            continue
        table = tables[operation]
        magnitude = table[bin_index] if len(table) > 1 else 0.0
        if sign and OPERATIONS[operation] in SIGNED_OPERATIONS:
            magnitude = -magnitude
        image = apply_operation(ops, image, operation, magnitude, fill, interpolation)
    return image


@dataclass(frozen=True)
class TrivialAugmentWide:
    """torchvision's TrivialAugmentWide: one operation of 14, chosen uniformly, with a uniform
    magnitude bin of `num_magnitude_bins` and a random sign.

    Draws: operation ``floor(14 u[0])``, bin ``floor(n u[1])``, negative if ``u[2] < 0.5`` (for
    the signed operations); three draws whatever the operation. `interpolation`: the geometric
    operations' kernel, "nearest" (torchvision's default), "bilinear" or "bicubic".

    Raises:
        TypeError, ValueError: `num_magnitude_bins` is not an int in [2, 1024] (`MAX_MAGNITUDE_BINS`),
            or `fill` not one value or three in [0, 255].
    """

    num_magnitude_bins: int = 31
    fill: float | tuple[float, ...] = 0
    interpolation: str = "nearest"
    draws: ClassVar[int] = 3

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_magnitude_bins", _check_bins(self.num_magnitude_bins))
        object.__setattr__(self, "fill", fill_triple(self.fill))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: (operation, bin, sign)."""
        operation = np.floor(u[:, 0] * 14)
        bin_index = np.floor(u[:, 1] * self.num_magnitude_bins)
        return np.stack([operation, bin_index, (u[:, 2] < 0.5).astype(np.float64)], axis=1)

    def run(self, ops: ImageOps | PixelOps, image: np.ndarray, params: np.ndarray) -> np.ndarray:
        return _run_triples(ops, image, params, "wide", self.num_magnitude_bins, stored_fill(self.fill), self.interpolation)

    def to_config(self) -> dict[str, Any]:
        config = {"op": "trivial_augment_wide", "num_magnitude_bins": self.num_magnitude_bins, "fill": list(stored_fill(self.fill))}
        return _with_interpolation(config, self.interpolation)


@dataclass(frozen=True)
class RandAugment:
    """torchvision's RandAugment: `num_ops` operations in turn, each one of 14 chosen uniformly
    (repeats allowed), all at bin `magnitude` of `num_magnitude_bins`, each with a random sign.

    Draws: for op k (from 0), operation ``floor(14 u[2k])``, negative if ``u[2k + 1] < 0.5``.
    `interpolation` as `TrivialAugmentWide`'s.

    Raises:
        TypeError, ValueError: `num_ops` is not an int in [0, 64] (`MAX_OPS`),
            `num_magnitude_bins` in [2, 1024], `magnitude` a bin of them, or `fill` one value or
            three in [0, 255].
    """

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    fill: float | tuple[float, ...] = 0
    interpolation: str = "nearest"

    def __post_init__(self) -> None:
        bins = _check_bins(self.num_magnitude_bins)
        object.__setattr__(self, "num_magnitude_bins", bins)
        object.__setattr__(self, "num_ops", check_int("num_ops", self.num_ops, 0, MAX_OPS))
        object.__setattr__(self, "magnitude", check_int("magnitude", self.magnitude, 0, bins - 1, note=" (a bin of num_magnitude_bins)"))
        object.__setattr__(self, "fill", fill_triple(self.fill))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))

    @property
    def draws(self) -> int:
        return 2 * self.num_ops

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: (operation, bin, sign) for each of the `num_ops` operations."""
        columns = []
        for k in range(self.num_ops):
            columns += [np.floor(u[:, 2 * k] * 14), np.full(len(u), float(self.magnitude)), (u[:, 2 * k + 1] < 0.5).astype(np.float64)]
        return np.stack(columns, axis=1) if columns else np.zeros((len(u), 0))

    def run(self, ops: ImageOps | PixelOps, image: np.ndarray, params: np.ndarray) -> np.ndarray:
        return _run_triples(ops, image, params, "standard", self.num_magnitude_bins, stored_fill(self.fill), self.interpolation)

    def to_config(self) -> dict[str, Any]:
        config = {
            "op": "rand_augment",
            "num_ops": self.num_ops,
            "magnitude": self.magnitude,
            "num_magnitude_bins": self.num_magnitude_bins,
            "fill": list(stored_fill(self.fill)),
        }
        return _with_interpolation(config, self.interpolation)


@dataclass(frozen=True)
class AutoAugment:
    """torchvision's AutoAugment with one of its policies, "imagenet" (default), "cifar10" or
    "svhn" (`POLICIES`): one of the policy's 25 sub-policies chosen uniformly; each of its two
    operations runs with its probability, at its bin of 10, with a random sign.

    Draws: sub-policy ``floor(25 u[0])``; operation i (0, 1) runs if ``u[1 + i] <= p_i`` and is
    negative if ``u[3 + i] < 0.5``. `interpolation` as `TrivialAugmentWide`'s.
    """

    policy: str = "imagenet"
    fill: float | tuple[float, ...] = 0
    interpolation: str = "nearest"
    draws: ClassVar[int] = 5

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(repr(name) for name in POLICIES)}, got {self.policy!r}")
        object.__setattr__(self, "fill", fill_triple(self.fill))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: (operation, bin, sign) for the two operations; operation -1 where one does not run."""
        policy = POLICIES[self.policy]
        chosen = np.floor(u[:, 0] * len(policy)).astype(np.int64)
        rows = np.zeros((len(u), 6))
        for i in range(2):
            operation = np.array([OPERATIONS.index(policy[c][i][0]) for c in chosen], np.float64)
            probability = np.array([policy[c][i][1] for c in chosen])
            bins = np.array([policy[c][i][2] or 0 for c in chosen], np.float64)
            rows[:, 3 * i] = np.where(u[:, 1 + i] <= probability, operation, -1.0)
            rows[:, 3 * i + 1] = bins
            rows[:, 3 * i + 2] = u[:, 3 + i] < 0.5
        return rows

    def run(self, ops: ImageOps | PixelOps, image: np.ndarray, params: np.ndarray) -> np.ndarray:
        return _run_triples(ops, image, params, "standard", 10, stored_fill(self.fill), self.interpolation)

    def to_config(self) -> dict[str, Any]:
        config = {"op": "auto_augment", "policy": self.policy, "fill": list(stored_fill(self.fill))}
        return _with_interpolation(config, self.interpolation)
