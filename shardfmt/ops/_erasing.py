"""`RandomErasing`: torchvision's random erasing as a step in the workers, with a fill that can
be the normalisation mean.

torchvision erases after the normalisation, so its default value 0 is the mean colour; here
the step runs before it, on the sample's float planes, so ``value="mean"`` fills the box with
the loader's mean (0-255 scale): after ``(x - mean) / std`` the box is exactly 0, as
torchvision's. A number or one value per channel fills with those values instead (0-255
scale, as the uint8 sample holds them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np

from .._arguments import check_pair
from ._crop import MAX_ASPECT, MIN_ASPECT
from ._imageops import ImageOps
from ._pixelops import PixelOps

__all__ = ["RandomErasing", "erasing_boxes"]

_ATTEMPTS = 10


def erasing_boxes(
    u: np.ndarray, *, p: float, scale: tuple[float, float], ratio: tuple[float, float], height: int, width: int
) -> np.ndarray:
    """The boxes of `RandomErasing` for images of `height` x `width`, from each record's 23
    uniforms: an (n, 4) int64 array of (top, left, box height, box width), all 0 where nothing is
    erased.

    torchvision's rule: erase if ``u[0] < p``; then up to 10 attempts a (from 0) draw the area
    ``H W (scale_lo + (scale_hi - scale_lo) u[1 + 2a])`` and the aspect ``exp(log(ratio_lo) +
    (log(ratio_hi) - log(ratio_lo)) u[2 + 2a])``, ``h = round_half_even(sqrt(area aspect))``,
    ``w = round_half_even(sqrt(area / aspect))``; the first with ``h < H`` and ``w < W`` is
    placed at ``top = floor(u[21] (H - h + 1))``, ``left = floor(u[22] (W - w + 1))``; if none
    fits (or the box has no pixel), nothing is erased.
    """
    n = len(u)
    area = float(height * width)
    target = area * (scale[0] + (scale[1] - scale[0]) * u[:, 1 : 1 + 2 * _ATTEMPTS : 2])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, 2 : 2 + 2 * _ATTEMPTS : 2])
    h = np.round(np.sqrt(target * aspect)).astype(np.int64)
    w = np.round(np.sqrt(target / aspect)).astype(np.int64)
    fits = (h < height) & (w < width)
    first = np.argmax(fits, axis=1)
    rows = np.arange(n)
    found = fits[rows, first] & (u[:, 0] < p)
    h_pick, w_pick = h[rows, first], w[rows, first]
    top = np.floor(u[:, 21] * (height - h_pick + 1)).astype(np.int64)
    left = np.floor(u[:, 22] * (width - w_pick + 1)).astype(np.int64)
    boxes = np.stack([top, left, h_pick, w_pick], axis=1)
    boxes[~found | (h_pick == 0) | (w_pick == 0)] = 0
    return boxes


def _value_triple(value: Any) -> tuple[float, ...]:
    """Check a `value` other than a string (one value or three, each in [0, 255]); return three floats."""
    values = (value,) * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else tuple(value)
    if len(values) == 1:
        values = values * 3
    if len(values) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 255 for v in values):
        raise ValueError(f"value must be 'mean', or one value or three, each in [0, 255], got {value!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class RandomErasing:
    """torchvision's RandomErasing: with probability `p`, a box of area fraction drawn from
    `scale` and aspect (height over width) log-uniform in `ratio` is set to `value`.

    Args:
        p: probability of erasing.
        scale: (low, high) fractions of the image's area, 0 < low <= high <= 1.
        ratio: (low, high) aspect ratios, 0 < low <= high.
        value: "mean" (the loader's normalisation mean: 0 after normalising, as torchvision's
            default on normalised tensors), or one number or three (0-255 scale).

    Draws: 23 per record (`erasing_boxes`).
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: str | float | tuple[float, ...] = "mean"
    draws: ClassVar[int] = 1 + 2 * _ATTEMPTS + 2

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float)) or not 0 <= self.p <= 1:
            raise ValueError(f"p is a probability in [0, 1], got {self.p!r}")
        scale = check_pair("scale", self.scale, 0, 1, low_open=True)
        ratio = check_pair("ratio", self.ratio, MIN_ASPECT, MAX_ASPECT)
        value = self.value
        if isinstance(value, str):
            if value != "mean":
                raise ValueError(f"value must be 'mean', a number or three numbers, got {value!r}")
        else:
            value = _value_triple(value)
        object.__setattr__(self, "p", float(self.p))
        object.__setattr__(self, "scale", (float(scale[0]), float(scale[1])))
        object.__setattr__(self, "ratio", (float(ratio[0]), float(ratio[1])))
        object.__setattr__(self, "value", value)

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: its uniforms; the box depends on the sample's size (`boxes`)."""
        return u

    def boxes(self, u: np.ndarray, *, height: int, width: int) -> np.ndarray:
        """(top, left, height, width) per record, all 0 where nothing is erased."""
        return erasing_boxes(u, p=self.p, scale=self.scale, ratio=self.ratio, height=height, width=width)

    def fill_values(self, mean: Sequence[float] | None) -> tuple[float, float, float]:
        """The values written into the box, given the loader's mean (0-255 scale).

        Raises:
            ValueError: value is "mean" and there is no mean.
        """
        if self.value == "mean":
            if mean is None:
                raise ValueError(
                    "RandomErasing(value='mean') fills with the normalisation mean; give the loader mean= (and std=), or a value"
                )
            return (float(mean[0]), float(mean[1]), float(mean[2]))
        return cast("tuple[float, float, float]", self.value)  # not "mean": the three floats __post_init__ stored

    def run(self, ops: ImageOps | PixelOps, image: np.ndarray, box: np.ndarray, mean: Sequence[float] | None = None) -> np.ndarray:
        """Erase `box` (top, left, height, width: a row of `boxes`) of `image`; return it."""
        top, left, box_h, box_w = (int(v) for v in box.tolist())
        if box_h and box_w:
            ops.erase(image, top, left, box_h, box_w, self.fill_values(mean))
        return image

    def to_config(self) -> dict[str, Any]:
        value = self.value if isinstance(self.value, str) else list(cast("tuple[float, float, float]", self.value))
        return {"op": "random_erasing", "p": self.p, "scale": list(self.scale), "ratio": list(self.ratio), "value": value}
