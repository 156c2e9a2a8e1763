"""`AugMix`: torchvision's AugMix step (Hendrycks et al.), with its draws made from the step's
uniforms so that they are a pure function of (seed, epoch, record) like every other step's.

torchvision draws the weights from Dirichlet distributions with torch's generator. Here every
Gamma(alpha) variate the Dirichlets are made of is the ``u``-quantile of Gamma(alpha)
(`gamma_quantiles`) of one uniform: ``m = (g_0, g_1) / (g_0 + g_1)`` is the weight of the
original image and of the mixture, and the mixture's weights are ``m_1 g_(2+i) / sum_j
g_(2+j)`` (Dirichlet(alpha, ..., alpha) times ``m_1``, as torchvision's ``combined_weights``).
The chains' depths, operations, bins and signs take one uniform each (spec/sampling.md gives
the layout). The sample is ``trunc(m_0 x + sum_i w_i chain_i(x))`` in float32, as torchvision's
uint8 result of its float mix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._arguments import check_int
from ._autoaugment import _TABLES, OPERATIONS, SIGNED_OPERATIONS, apply_operation, check_interpolation, fill_triple, stored_fill
from ._imageops import ImageOps
from ._pixelops import PixelOps

__all__ = ["AUGMIX_OPERATIONS", "AugMix", "gamma_quantiles"]

AUGMIX_OPERATIONS = (
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
)
"""AugMix's operations in torchvision's order; ``all_ops=False`` keeps the first 9."""

_BINS = 10
"""torchvision's ``_PARAMETER_MAX``: the bins of AugMix's magnitude tables."""
_MAX_WIDTH = 32
_MAX_DEPTH = 16
_MAX_ALPHA = 100.0
_BISECTIONS = 64


def gamma_quantiles(u: np.ndarray, alpha: float) -> np.ndarray:
    """The `u`-quantiles of Gamma(alpha, 1), elementwise: 64 bisections of ``log x`` between
    ``log(1e-300)`` and ``log(64 (alpha + 10))`` (where P(alpha, x) rounds to 1 for every
    alpha up to 100) on the regularized lower incomplete gamma function P(alpha, x)
    (``torch.special.gammainc`` in float64)."""
    target = torch.from_numpy(np.asarray(u, np.float64))
    shape = torch.full_like(target, float(alpha))
    low = torch.full_like(target, math.log(1e-300))
    high = torch.full_like(target, math.log(64.0 * (alpha + 10.0)))
    for _ in range(_BISECTIONS):
        middle = 0.5 * (low + high)
        below = torch.special.gammainc(shape, middle.exp()) < target
        low = torch.where(below, middle, low)
        high = torch.where(below, high, middle)
    result: np.ndarray = (0.5 * (low + high)).exp().numpy()
    return result


@dataclass(frozen=True)
class AugMix:
    """torchvision's AugMix: `mixture_width` chains of `chain_depth` operations each (1 to 3,
    drawn per chain, when it is not positive) of AugMix's 13 operations (9 without
    `all_ops`), each at a bin below `severity` (of 10), mixed with Dirichlet(`alpha`) weights
    and then with the original image by Beta(`alpha`, `alpha`); geometric operations with
    `interpolation` (torchvision's default "bilinear") and `fill` outside.

    Draws (with ``D = chain_depth`` if positive, else 3; ``n`` = 13 or 9): ``g_k`` the
    ``u[k]``-quantile of Gamma(alpha) for k < 2 + W; then chain i (from 0) starts at ``s = 2 + W
    + i (1 + 3 D)``: depth ``1 + floor(3 u[s])`` (unless fixed), and its slot d runs operation
    ``floor(n u[s + 1 + 3d])`` at bin ``floor(severity u[s + 2 + 3d])``, negative if
    ``u[s + 3 + 3d] < 0.5``; slots past the depth are drawn and skipped.
    """

    severity: int = 3
    mixture_width: int = 3
    chain_depth: int = -1
    alpha: float = 1.0
    all_ops: bool = True
    interpolation: str = "bilinear"
    fill: float | tuple[float, ...] = 0

    def __post_init__(self) -> None:
        check_int("severity", self.severity, 1, _BINS)
        check_int("mixture_width", self.mixture_width, 1, _MAX_WIDTH)
        check_int("chain_depth", self.chain_depth, -1, _MAX_DEPTH)
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= _MAX_ALPHA:
            raise ValueError(f"alpha must be a number in (0, {_MAX_ALPHA:g}], got {alpha!r}")
        if not isinstance(self.all_ops, (bool, np.bool_)):
            raise TypeError(f"all_ops must be True or False, got {self.all_ops!r}")
        object.__setattr__(self, "alpha", float(alpha))
        object.__setattr__(self, "interpolation", check_interpolation(self.interpolation))
        object.__setattr__(self, "fill", fill_triple(self.fill))

    @property
    def depth(self) -> int:
        """The operation slots of a chain: `chain_depth` if positive, else 3."""
        return self.chain_depth if self.chain_depth > 0 else 3

    @property
    def draws(self) -> int:
        return 2 + self.mixture_width * (2 + 3 * self.depth)

    @property
    def operations(self) -> tuple[str, ...]:
        return AUGMIX_OPERATIONS if self.all_ops else AUGMIX_OPERATIONS[:9]

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: the original's weight m_0, each chain's weight, then (operation, bin,
        sign) for each slot of each chain, operation -1 where a slot is past its chain's depth."""
        width, depth, count = self.mixture_width, self.depth, len(self.operations)
        gammas = gamma_quantiles(u[:, : 2 + width], self.alpha)
        m = gammas[:, :2] / gammas[:, :2].sum(axis=1, keepdims=True)
        chains = gammas[:, 2:] / gammas[:, 2:].sum(axis=1, keepdims=True)
        combined = (chains.astype(np.float32) * m[:, 1:2].astype(np.float32)).astype(np.float64)
        columns = [m[:, 0].astype(np.float32).astype(np.float64), *combined.T]
        for i in range(width):
            start = 2 + width + i * (1 + 3 * depth)
            drawn_depth = np.full(len(u), depth) if self.chain_depth > 0 else 1 + np.floor(3 * u[:, start]).astype(np.int64)
            for d in range(depth):
                slot = start + 1 + 3 * d
                operation = np.array([OPERATIONS.index(self.operations[k]) for k in np.floor(count * u[:, slot]).astype(np.int64)])
                columns += [
                    np.where(d < drawn_depth, operation, -1).astype(np.float64),
                    np.floor(self.severity * u[:, slot + 1]),
                    (u[:, slot + 2] < 0.5).astype(np.float64),
                ]
        return np.stack(columns, axis=1)

    def run(self, ops: ImageOps | PixelOps, image: np.ndarray, params: np.ndarray) -> np.ndarray:
        if isinstance(ops, PixelOps) and not ops.exact:
            # the chains keep the float formulas value for value: a level off before a posterize
            # or a solarize could move a value by more than the tolerance spec/pixels.md states
            ops.exact = True
            try:
                return self._mix(ops, image, params)
            finally:
                ops.exact = False
        return self._mix(ops, image, params)

    def _mix(self, ops: ImageOps | PixelOps, image: np.ndarray, params: np.ndarray) -> np.ndarray:
        height, width = ops.size
        fill = stored_fill(self.fill)
        original = image.copy()  # the operations may write into the ops' buffers, `image` among them
        mix = np.multiply(original, np.float32(params[0]), dtype=np.float32)
        slots = params[1 + self.mixture_width :]
        tables = _TABLES.get("augmix", _BINS, height, width)
        for i in range(self.mixture_width):
            chain = original.copy()
            for d in range(self.depth):
                operation, bin_index, sign = (int(v) for v in slots[3 * (i * self.depth + d) : 3 * (i * self.depth + d) + 3])
                if operation < 0:
                    continue
                name, table = OPERATIONS[operation], tables[operation]
                magnitude = table[bin_index] if len(table) > 1 else 0.0
                if sign and name in SIGNED_OPERATIONS:
                    magnitude = -magnitude
                chain = apply_operation(ops, chain, operation, magnitude, fill, self.interpolation)
            mix += np.multiply(chain, np.float32(params[1 + i]), dtype=np.float32)
        np.clip(np.floor(mix, out=mix), 0, 255, out=mix)
        np.copyto(image, mix, casting="unsafe")
        return image

    def to_config(self) -> dict[str, Any]:
        return {
            "op": "augmix",
            "severity": self.severity,
            "mixture_width": self.mixture_width,
            "chain_depth": self.chain_depth,
            "alpha": self.alpha,
            "all_ops": bool(self.all_ops),
            "interpolation": self.interpolation,
            "fill": list(stored_fill(self.fill)),
        }
