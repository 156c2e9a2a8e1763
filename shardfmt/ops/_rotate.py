"""Rotate one image about its centre with nearest-neighbour sampling, as torchvision's ``rotate``
does on tensors (``interpolation=NEAREST``, ``expand=False``, ``center=None``).

Output pixel (row i, column j) of an H x W image rotated by `angle` degrees counter-clockwise
takes the source pixel nearest to

    x = cos(a) (j - cx) - sin(a) (i - cy) + cx,    y = sin(a) (j - cx) + cos(a) (i - cy) + cy

with ``cx = (W - 1) / 2`` and ``cy = (H - 1) / 2``; where that pixel lies outside the image the
output is `fill`.

Every rotation here is OpenCV's ``warpAffine`` with nearest sampling, given that inverse map
(`Rotator.inverse_map`). OpenCV computes each coordinate in fixed point with 10 fractional bits
(the map's terms rounded to 1/1024, then a floor of the sum plus one half), so it picks the pixel
nearest to the exact coordinate except where that coordinate lies within 2^-10 of a half-way
point between two pixels: such a tie may round either way, as spec/pixels.md allows (within
2^-9), where torchvision rounds it to even. The coordinates do not depend on the pixels' type,
so uint8 pixels and float planes pick the same pixels (tested). About 60 us for a 224x224x3
uint8 image on one core of the build machine, and 100 for three float32 planes; the gather of
4-byte words over a padded plane that this replaced took 110 and 210.

OpenCV warps one float32 plane about twice as fast as interleaved uint8 pixels (33 us against 66
for 224x224 here). So `rotate_interleaved` widens the pixels to RGBX (X = 255), warps them as one
plane of float32 words, which a nearest warp copies bit for bit (half of such words are NaN
patterns; the copies keep them, tested), and packs them back: 44 us in all. The fill is the word
of (R, G, B, 255); where that word is not a finite float (B >= 128, which OpenCV's conversion of
the border value could change), the pixels are warped as they are.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

__all__ = ["Rotator"]

_NEAREST_INVERSE = cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP


class Rotator:
    """Rotate images of one size: (C, H, W) float32 planes, or H x W x 3 uint8 pixels.

    Args:
        channels, height, width: the shape of every image given to `rotate` (C, H, W).
    """

    def __init__(self, channels: int, height: int, width: int) -> None:
        self.shape = (channels, height, width)
        self._planes = np.empty((channels, height, width), np.float32)  # the source of `rotate`, copied
        self._pixels = np.empty((height, width, channels), np.uint8)  # for `rotate_to_pixels`
        # RGBX pixels and the same memory as float32 words, before and after a warp of words
        self._wide = np.empty((height, width, 4), np.uint8), np.empty((height, width, 4), np.uint8)
        self._words = tuple(wide.view(np.float32).reshape(height, width) for wide in self._wide)
        self._fill_words: dict[tuple[float, ...], float | None] = {}  # a step's fill, as the word of its RGBX

    def inverse_map(self, angle: float) -> np.ndarray:
        """The 2 x 3 matrix taking output pixel (column j, row i, 1) to its source coordinates
        (x, y) in a rotation by `angle` degrees counter-clockwise (the module docstring's formula)."""
        _, height, width = self.shape
        radians = math.radians(angle)
        cos, sin = math.cos(radians), math.sin(radians)
        cx, cy = (width - 1) / 2, (height - 1) / 2
        return np.array([[cos, -sin, cx - cos * cx + sin * cy], [sin, cos, cy - sin * cx - cos * cy]])

    def rotate(self, image: np.ndarray, angle: float, fill: tuple[float, ...]) -> None:
        """Rotate `image` ((C, H, W) float32 planes) by `angle` degrees counter-clockwise about its
        centre, in place, pixels from outside it taking `fill` (one value per channel)."""
        channels, height, width = self.shape
        source = self._planes
        np.copyto(source, image)
        matrix = self.inverse_map(angle)
        for channel in range(channels):
            _warp(source[channel], matrix, (width, height), image[channel], fill[channel])

    def rotate_to_pixels(self, image: np.ndarray, angle: float, fill: tuple[float, ...], out: np.ndarray) -> None:
        """Rotate `image` as `rotate` does and write the result as uint8 into `out`, a
        C-contiguous H x W x C array: the last step of a sample that ends with its rotation.
        `image`'s values must be whole numbers in [0, 255] (the result is then `rotate`'s, cast),
        and `image` is left as it was. The planes are cast into interleaved pixels, which are
        rotated straight into `out`."""
        channels, height, width = self.shape
        if out.shape != (height, width, channels) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {height}x{width}x{channels} uint8 array, got {out.shape} {out.dtype}")
        pixels = self._pixels
        for channel in range(channels):
            np.copyto(pixels[:, :, channel], image[channel], casting="unsafe")
        _warp(pixels, self.inverse_map(angle), (width, height), out, tuple(float(int(v)) for v in fill))

    def rotate_interleaved(self, image: np.ndarray, angle: float, fill: tuple[float, ...], out: np.ndarray) -> None:
        """Rotate `image`, an H x W x 3 uint8 array, as `rotate` does (the same source pixel for
        every output pixel), into `out` (H x W x 3 uint8, C-contiguous; `image` itself too)."""
        channels, height, width = self.shape
        if channels != 3 or image.shape != (height, width, 3) or out.shape != (height, width, 3) or not out.flags.c_contiguous:
            raise ValueError(f"image and out must be C-contiguous {height}x{width}x3 uint8 arrays, got {image.shape} and {out.shape}")
        # the fill of the float planes, cast as their pixels are
        word = self._fill_word(fill)
        if word is None:
            target = self._pixels if out is image else out  # OpenCV's warp reads its source while it writes
            _warp(image, self.inverse_map(angle), (width, height), target, tuple(float(int(v)) for v in fill))
            if target is not out:
                np.copyto(out, target)
            return
        wide, turned = self._wide
        cv2.cvtColor(image, cv2.COLOR_RGB2RGBA, dst=wide)
        source, target = self._words
        cv2.warpAffine(
            source,
            self.inverse_map(angle),
            (width, height),
            dst=target,
            flags=_NEAREST_INVERSE,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(word, 0.0, 0.0, 0.0),
        )
        cv2.cvtColor(turned, cv2.COLOR_RGBA2RGB, dst=out)

    def _fill_word(self, fill: tuple[float, ...]) -> float | None:
        """The float32 word of (R, G, B, 255) for `fill`, or None where it is not a finite float;
        worked out once for each fill a rotator is given."""
        if fill not in self._fill_words:
            value = np.array([*(int(v) for v in fill), 255], np.uint8).view(np.float32)[0]
            self._fill_words[fill] = float(value) if np.isfinite(value) else None
        return self._fill_words[fill]


def _warp(source: np.ndarray, matrix: np.ndarray, size: tuple[int, int], out: np.ndarray, fill: float | tuple[float, ...]) -> None:
    """Nearest-neighbour ``warpAffine`` of `source` into `out` by the inverse map `matrix`:
    straight into `out` where OpenCV can take it (C-contiguous), else through a copy."""
    border = (fill, fill, fill, fill) if isinstance(fill, float) else (*fill, 0.0)
    if out.flags.c_contiguous and out.flags.writeable:
        result = cv2.warpAffine(source, matrix, size, dst=out, flags=_NEAREST_INVERSE, borderMode=cv2.BORDER_CONSTANT, borderValue=border)
        if result is out:
            return
    np.copyto(out, cv2.warpAffine(source, matrix, size, flags=_NEAREST_INVERSE, borderMode=cv2.BORDER_CONSTANT, borderValue=border))
