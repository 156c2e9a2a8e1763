"""Colour adjustments of one image in place, with torchvision's formulas for uint8 tensors.

The image is a (3, H, W) float32 array whose values are whole numbers in [0, 255]: the uint8
pixels of a sample, kept in float between steps so that each step costs a few passes over
contiguous planes instead of conversions. Every adjustment ends as torchvision's does on a uint8
tensor, clamped to [0, 255] and truncated to a whole number, so that the values stay those of
the uint8 image torchvision would hold after the same step:

- blend(a, b, r) = trunc(clamp(r * a + (1 - r) * b, 0, 255)), computed in float32;
- gray(x) = trunc(0.2989 R + 0.587 G + 0.114 B) (torchvision's ``rgb_to_grayscale``);
- brightness f: blend(x, 0, f); contrast f: blend(x, mean(gray(x)), f); saturation f:
  blend(x, gray(x), f); grayscale: gray(x) in every channel;
- hue h: the hue of HSV (V = max, C = max - min, t = 6 H in [-1, 5] by the sector of the largest
  channel, R winning ties, then G) moved by h turns; V and C stay, and channel n becomes
  ``V - C * clamp(d - 1, 0, 1)``, d being the distance from t + 6 h to the nearest peak of the
  channel (R at 0, G at 2, B at 4, modulo 6); the result, as a fraction of 255, is scaled by
  255.999 and truncated, as torchvision converts float images to uint8. The order of float
  operations differs from torchvision's, so a hue-shifted value may differ from its by one level
  (the other adjustments are the same float32 arithmetic).

Measured on one core of the build machine for 224x224 images (best of 15 rounds of 50):
brightness about 45 us, contrast and saturation 110 to 120, hue 290 to 330 (some 35 passes
over the planes; 530 before the formula above replaced a wrap and a ten-pass triangle per
channel, 350 to 365 before the working set shrank and the clamps became `np.clip`);
PIL's versions, what torchvision runs on PIL images, take about 150, 260 to 350, 220 to 260 and
2,200 to 2,900 (its hue converts to and from 8-bit HSV). ``tools/bench_loader.py --only augment`` prints
both.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ColourKernels"]

_R, _G, _B = np.float32(0.2989), np.float32(0.587), np.float32(0.114)
_TO_UINT8 = np.float32(255.999 / 255.0)
"""torchvision's float-to-uint8 conversion multiplies by 255.999 (255 + 1 - 1e-3), on the 0-1
scale; on the 0-255 scale used here, by 255.999 / 255."""


class ColourKernels:
    """Scratch planes for images of one size, and the adjustments that use them.

    A minimum or maximum against a plane of constants runs vectorised where numpy's against a
    scalar does not (about 6 us a 224x224 plane against 11), so a one-sided bound is kept as a
    plane; a two-sided one is `np.clip` against two scalars, one pass (25 us over three 224x224
    planes, where a maximum and a minimum against planes take 33).

    Args:
        height, width: the size of every image given to the methods.
    """

    def __init__(self, height: int, width: int) -> None:
        shape = (height, width)
        # Four scratch planes serve every adjustment, so that a sample's steps touch few distinct
        # planes: in a profile of the hue, a pass that wrote a plane not yet touched took 11 to
        # 18 us, one over planes just used 5 to 7.
        self._v, self._c, self._t, self._w = (np.empty(shape, np.float32) for _ in range(4))
        self._one = np.ones(shape, np.float32)
        self._top = np.full(shape, 255, np.float32)
        self._centres = np.empty((3, 1, 1), np.float32)

    def gray(self, x: np.ndarray) -> np.ndarray:
        """trunc(0.2989 R + 0.587 G + 0.114 B) of `x`, in a scratch plane (valid until the next call)."""
        out, term = self._t, self._w
        np.multiply(x[0], _R, out=out)
        np.add(out, np.multiply(x[1], _G, out=term), out=out)
        np.add(out, np.multiply(x[2], _B, out=term), out=out)
        return np.floor(out, out=out)

    def brightness(self, x: np.ndarray, factor: float) -> None:
        """Multiply by `factor` (>= 0), clamped and truncated."""
        np.multiply(x, np.float32(factor), out=x)
        np.minimum(x, self._top, out=x)
        np.floor(x, out=x)

    def contrast(self, x: np.ndarray, factor: float) -> None:
        """Blend with the mean of the gray image, by `factor` (>= 0)."""
        gray = self.gray(x)
        mean = np.float32(np.add.reduce(gray, axis=None, dtype=np.float32) / np.float32(gray.size))  # float32, as torch.mean
        self._blend(x, np.float32(np.float32(1.0 - factor) * mean), factor)

    def saturation(self, x: np.ndarray, factor: float) -> None:
        """Blend with the gray image, by `factor` (>= 0)."""
        gray = self.gray(x)
        np.multiply(gray, np.float32(1.0 - factor), out=gray)
        self._blend(x, gray, factor)

    def _blend(self, x: np.ndarray, other: np.ndarray | np.float32, factor: float) -> None:
        """x = trunc(clamp(factor * x + other, 0, 255)), `other` being (1 - factor) times the
        second image, already multiplied."""
        np.multiply(x, np.float32(factor), out=x)
        np.add(x, other, out=x)
        if factor > 1.0:  # a blend with factor in [0, 1] stays in [0, 255]
            np.clip(x, np.float32(0), np.float32(255), out=x)
        np.floor(x, out=x)

    def grayscale(self, x: np.ndarray) -> None:
        """Replace every channel with the gray image."""
        gray = self.gray(x)
        for channel in x:
            np.copyto(channel, gray)

    def hue(self, x: np.ndarray, shift: float) -> None:
        """Move the hue of every pixel by `shift` turns (in [-0.5, 0.5])."""
        r, g, b = x[0], x[1], x[2]
        v, c, t, w = self._v, self._c, self._t, self._w
        np.maximum(r, g, out=v)
        np.maximum(v, b, out=v)
        np.minimum(r, g, out=c)
        np.minimum(c, b, out=c)
        np.subtract(v, c, out=c)  # C
        # t C = 6 H C by the sector of the largest channel, as torchvision's rgb2hsv: R: D_R with
        # D_R = G - B; G: 2 C + D_G with D_G = B - R; B: 4 C - D_R - D_G. Without branches, that is
        # D_R + notR (A + D_G + notG (A - 2 D_G)) with A = 2 C - D_R, where notX = min(V - X, 1)
        # is 0 exactly where X is the largest (the values are whole numbers): R wins ties, then G.
        # The image's own planes hold the terms once their channel is no longer needed, so that
        # the working set (seven planes) stays in a core's cache.
        np.subtract(v, g, out=w)
        np.minimum(w, self._one, out=w)  # notG
        np.subtract(g, b, out=t)  # D_R
        np.subtract(b, r, out=g)  # D_G
        np.subtract(v, r, out=b)
        np.minimum(b, self._one, out=b)  # notR
        np.add(c, c, out=r)
        np.subtract(r, t, out=r)
        np.add(r, g, out=r)  # A + D_G
        np.multiply(g, np.float32(-3), out=g)
        np.add(g, r, out=g)  # A - 2 D_G
        np.multiply(g, w, out=g)
        np.add(g, r, out=g)
        np.multiply(g, b, out=g)
        np.add(g, t, out=g)  # t C
        np.maximum(c, self._one, out=w)  # gray pixels (C = 0) have t = 0
        np.divide(g, w, out=t)  # t in [-1, 5]
        # Channel n is V where t + 6 h lies within 1 of a peak of n (R 0, G 2, B 4, modulo 6),
        # V - C from distance 2 on, linear between: V + C - C clamp(d, 1, 2), d the distance to
        # the nearest peak. With k midway between two peaks (p - 6 h + 3 modulo 6, taken in
        # [-1, 5)), d = ||t - k| - 3| wherever |t - k| <= 7, as here, both lying in [-1, 5]. The
        # scale to 255.999 (torchvision's float-to-uint8 conversion) is folded into V + C and C.
        np.add(v, c, out=v)
        np.multiply(v, _TO_UINT8, out=v)
        np.multiply(c, _TO_UINT8, out=c)
        centres, turn = self._centres, 6.0 * shift
        for channel, peak in enumerate((0.0, 2.0, 4.0)):
            centres[channel, 0, 0] = (peak - turn + 4.0) % 6.0 - 1.0
        np.subtract(t, centres, out=x)
        np.abs(x, out=x)
        np.subtract(x, np.float32(3), out=x)
        np.abs(x, out=x)
        np.clip(x, np.float32(1), np.float32(2), out=x)
        np.multiply(x, c, out=x)
        np.subtract(v, x, out=x)
        np.floor(x, out=x)
