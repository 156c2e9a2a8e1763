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
- hue h: the hue of HSV (V = max, C = max - min, H by the sector of the largest channel) moved
  by h turns; V and C stay, and channel n (R: 5, G: 3, B: 1) becomes
  ``V - C * clamp(min(k, 4 - k), 0, 1)`` with ``k = (n + 6 H') mod 6``; the result, as a
  fraction of 255, is scaled by 255.999 and truncated, as torchvision converts float images to
  uint8. The order of float operations differs from torchvision's, so a hue-shifted value may
  differ from its by one level (the other adjustments are the same float32 arithmetic).

Measured on one core of the shared build machine for 224x224 images (CPU time, best of 3):
brightness about 75 us, contrast and saturation about 140, hue about 520 (some 50 passes over
the planes); PIL's versions, what torchvision runs on PIL images, take about 120, 260, 200 and
2,100 (its hue converts to and from 8-bit HSV). ``tools/bench_loader.py --only augment`` prints
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

    Args:
        height, width: the size of every image given to the methods.
    """

    def __init__(self, height: int, width: int) -> None:
        shape = (height, width)
        self._gray = np.empty(shape, np.float32)
        self._term = np.empty(shape, np.float32)
        self._v, self._m, self._c, self._h, self._k, self._w = (np.empty(shape, np.float32) for _ in range(6))
        self._mask = np.empty(shape, np.float32)

    def gray(self, x: np.ndarray) -> np.ndarray:
        """trunc(0.2989 R + 0.587 G + 0.114 B) of `x`, in a scratch plane (valid until the next call)."""
        out, term = self._gray, self._term
        np.multiply(x[0], _R, out=out)
        np.add(out, np.multiply(x[1], _G, out=term), out=out)
        np.add(out, np.multiply(x[2], _B, out=term), out=out)
        return np.floor(out, out=out)

    def brightness(self, x: np.ndarray, factor: float) -> None:
        """Multiply by `factor` (>= 0), clamped and truncated."""
        np.multiply(x, np.float32(factor), out=x)
        np.minimum(x, np.float32(255), out=x)
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
            np.maximum(x, np.float32(0), out=x)
            np.minimum(x, np.float32(255), out=x)
        np.floor(x, out=x)

    def grayscale(self, x: np.ndarray) -> None:
        """Replace every channel with the gray image."""
        gray = self.gray(x)
        for channel in x:
            np.copyto(channel, gray)

    def hue(self, x: np.ndarray, shift: float) -> None:
        """Move the hue of every pixel by `shift` turns (in [-0.5, 0.5])."""
        r, g, b = x[0], x[1], x[2]
        v, m, c, h, k, w, mask = self._v, self._m, self._c, self._h, self._k, self._w, self._mask
        np.maximum(r, g, out=v)
        np.maximum(v, b, out=v)
        np.minimum(r, g, out=m)
        np.minimum(m, b, out=m)
        np.subtract(v, m, out=c)
        # Which channel is largest, as 0/1 planes without branches: values are whole numbers,
        # so min(v - r, 1) is 0 exactly where r is the largest. R wins ties, then G (as
        # torchvision's rgb2hsv picks the sector).
        np.subtract(v, r, out=w)
        np.minimum(w, np.float32(1), out=w)
        np.subtract(np.float32(1), w, out=w)  # w: R is largest
        np.subtract(v, g, out=mask)
        np.minimum(mask, np.float32(1), out=mask)
        np.subtract(np.float32(1), mask, out=mask)
        np.subtract(mask, np.multiply(mask, w, out=k), out=mask)  # mask: G is largest, R is not
        # 6 H * C: R: G - B; G: 2 C + B - R; B: 4 C + R - G; the B form, then the others mixed in.
        np.multiply(c, np.float32(2), out=k)
        np.subtract(r, g, out=h)
        np.add(h, k, out=h)
        np.add(h, k, out=h)
        np.subtract(b, r, out=k)
        np.add(k, c, out=k)
        np.add(k, c, out=k)
        np.subtract(k, h, out=k)
        np.multiply(k, mask, out=k)
        np.add(h, k, out=h)  # G largest: 2 C + B - R
        np.subtract(g, b, out=k)
        np.subtract(k, h, out=k)
        np.multiply(k, w, out=k)
        np.add(h, k, out=h)  # R largest: G - B
        np.maximum(c, np.float32(1), out=w)  # gray pixels (C = 0) have hue 0 and keep it
        np.divide(h, w, out=h)  # 6 H, in [-1, 5)
        # 6 H' mod 6, in [0, 6): the shifted hue, wrapped once for all three channels
        np.add(h, np.float32(6.0 * shift + 6.0), out=h)  # in [2, 14]
        np.multiply(h, np.float32(1.0 / 6.0), out=w)
        np.floor(w, out=w)
        np.multiply(w, np.float32(6.0), out=w)
        np.subtract(h, w, out=h)
        # Channel n (R 5, G 3, B 1) is V - C clamp(min(k, 4 - k), 0, 1) with k = (n + 6 H') mod 6,
        # a function of period 6 that is 1 on [1, 3] and 0 on [4, 6]: for k in [0, 12) it is
        # clamp(2 - min(|k - 2|, |k - 8|), 0, 1), so k = n + 6 H' needs no second wrap. The
        # scale to 255.999 (torchvision's float-to-uint8 conversion) is folded into V and C.
        np.multiply(v, _TO_UINT8, out=v)
        np.multiply(c, _TO_UINT8, out=c)
        for channel, offset in ((r, 5.0), (g, 3.0), (b, 1.0)):
            np.subtract(h, np.float32(2.0 - offset), out=k)
            np.abs(k, out=k)
            np.subtract(h, np.float32(8.0 - offset), out=w)
            np.abs(w, out=w)
            np.minimum(k, w, out=k)
            np.subtract(np.float32(2.0), k, out=k)
            np.maximum(k, np.float32(0), out=k)
            np.minimum(k, np.float32(1), out=k)
            np.multiply(k, c, out=k)
            np.subtract(v, k, out=channel)
        np.floor(x, out=x)
