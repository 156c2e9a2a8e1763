"""The image operations of the auto-augment family and of random erasing, on one image in place,
with torchvision's formulas for uint8 tensors.

Images are (3, H, W) float32 arrays holding whole numbers in [0, 255], as in `colour`; every
operation ends, as torchvision's does on uint8, clamped and truncated to whole numbers (or exact
in integers), so the values stay those of the uint8 image torchvision would hold:

- ``warp``: the affine maps of ShearX, ShearY, TranslateX, TranslateY and Rotate with nearest
  source pixels and a constant fill outside the image. Output pixel (row i, column j) takes the
  source pixel nearest to ``(x, y) = (a j + b i + c, d j + e i + f)``; OpenCV's ``warpAffine``
  computes the coordinates in fixed point with 10 fractional bits and rounds halves up, where
  torchvision's ``grid_sample`` rounds float32 coordinates half to even, so a pixel whose source
  coordinate lies within 2^-9 of a half-way point may take the other neighbour.
- ``warp(..., interpolation="bilinear" | "bicubic")``: torchvision's ``affine`` on a uint8
  tensor with that mode: ``grid_sample(mode, padding_mode="zeros", align_corners=False)`` at
  the same source coordinates, in float32, then rounded (and clamped to [0, 255], which only
  bicubic's overshoot needs). A `fill` other than 0 blends in as torchvision's does with a fill:
  ``mask * (x - fill) + fill``, ``mask`` being the sampled weight that fell inside the image; a
  fill of 0 is torchvision's default (no fill: zeros outside). torchvision's tensor ``affine``
  takes no bicubic; this bicubic is torch's ``grid_sample`` one (PIL's bicubic affine is what
  torchvision runs on PIL images).
- ``posterize(bits)``: ``x & -(2^(8 - bits))``; ``solarize(t)``: ``255 - x`` where ``x >= t``;
  ``invert``: ``255 - x``.
- ``autocontrast``: per channel, ``trunc(clamp((x - lo) * (255 / (hi - lo)), 0, 255))`` in
  float32 with the channel's minimum and maximum (unchanged where they are equal).
- ``equalize``: per channel, torchvision's histogram rule in integers: with ``hist`` the counts
  of the 256 levels and ``step = (sum of the non-zero counts but the last) // 255``, level v
  becomes ``min((cumsum(hist)[v - 1] + step // 2) // step, 255)`` (0 for v = 0); unchanged
  when ``step`` is 0.
- ``sharpness(f)``: blend(x, blurred, f), where the blurred image is x with its inner pixels
  replaced by ``round(sum(3x3 neighbourhood + 4 x centre) / 13)`` (a whole number over 13 is never
  a tie); the border rows and columns are kept.
- ``erase``: a box set to one value per channel.

The warps run OpenCV's ``warpAffine`` on each plane (about 130 us for three 224x224 planes on
one core of the build machine, where a torch gather over a padded plane took about 210); the
lookups (equalize) run numpy's ``take`` on a uint8 copy of the plane.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
import torch

from ._colour import ColourKernels

__all__ = ["WARP_INTERPOLATIONS", "ImageOps", "resample_affine"]

WARP_INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
"""The kernels of the geometric operations (torchvision's ``InterpolationMode`` values)."""

_SHARPEN = np.full((3, 3), 1, np.float32)
_SHARPEN[1, 1] = 5
_SHARPEN /= np.float32(13)
_WARP_FLAGS = cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP


class ImageOps:
    """Scratch arrays for images of one size, and the operations that use them.

    Args:
        height, width: the size of every image given to the methods.
        colour: the colour kernels of the same size (brightness, contrast, saturation).
    """

    def __init__(self, height: int, width: int, colour: ColourKernels | None = None) -> None:
        self.shape = (3, height, width)
        self.size = (height, width)
        self.colour = colour if colour is not None else ColourKernels(height, width)
        self._buffers = (np.empty(self.shape, np.float32), np.empty(self.shape, np.float32))
        self._plane = np.empty((height, width), np.float32)
        self._levels = np.empty((height, width), np.uint8)

    def spare(self, image: np.ndarray) -> np.ndarray:
        """A (3, H, W) buffer that is not `image`."""
        first, second = self._buffers
        return second if image is first else first

    def warp(
        self, image: np.ndarray, matrix: Sequence[Sequence[float]], fill: Sequence[float], interpolation: str = "nearest"
    ) -> np.ndarray:
        """Resample `image` through the 2x3 `matrix` (output pixel to source coordinates), nearest
        pixel (or `interpolation`), `fill` (one value per channel) outside; return the array
        holding the result."""
        height, width = self.shape[1:]
        target = self.spare(image)
        if interpolation != "nearest":
            np.copyto(target, resample_affine(image, matrix, fill, interpolation))
            return target
        transform = np.asarray(matrix, np.float64)
        for channel in range(3):
            cv2.warpAffine(
                image[channel],
                transform,
                (width, height),
                dst=target[channel],
                flags=_WARP_FLAGS,
                borderMode=cv2.BORDER_CONSTANT,
                borderValue=float(fill[channel]),
            )
        return target

    @staticmethod
    def posterize(image: np.ndarray, bits: int) -> None:
        """Keep the top `bits` bits (1 to 8) of every value."""
        if bits >= 8:
            return
        quantum = np.float32(1 << (8 - bits))
        np.multiply(image, np.float32(1.0) / quantum, out=image)
        np.floor(image, out=image)
        np.multiply(image, quantum, out=image)

    def solarize(self, image: np.ndarray, threshold: float) -> None:
        """Invert every value at or above `threshold`."""
        inverted = self.spare(image)
        np.subtract(np.float32(255), image, out=inverted)
        np.copyto(image, inverted, where=image >= np.float32(threshold))

    @staticmethod
    def invert(image: np.ndarray) -> None:
        """255 - x."""
        np.subtract(np.float32(255), image, out=image)

    @staticmethod
    def autocontrast(image: np.ndarray) -> None:
        """Stretch each channel to [0, 255]."""
        for plane in image:
            low, high = np.float32(plane.min()), np.float32(plane.max())
            if high == low:
                continue
            scale = np.float32(255) / np.float32(high - low)
            np.subtract(plane, low, out=plane)
            np.multiply(plane, scale, out=plane)
            np.clip(plane, np.float32(0), np.float32(255), out=plane)
            np.floor(plane, out=plane)

    def equalize(self, image: np.ndarray) -> None:
        """Equalize the histogram of each channel."""
        levels = self._levels
        for plane in image:
            np.copyto(levels, plane, casting="unsafe")
            hist = np.bincount(levels.reshape(-1), minlength=256)
            nonzero = hist[hist != 0]
            step = int(nonzero[:-1].sum()) // 255
            if step == 0:
                continue
            lut = np.empty(256, np.float32)
            lut[0] = 0
            lut[1:] = np.minimum((np.cumsum(hist)[:-1] + step // 2) // step, 255)
            np.take(lut, levels, out=plane)

    def sharpness(self, image: np.ndarray, factor: float) -> None:
        """Blend with the 3x3 smoothed image by `factor` (>= 0); images under 3 pixels a side are kept."""
        height, width = self.shape[1:]
        if height <= 2 or width <= 2:
            return
        blurred = self.spare(image)
        plane = self._plane
        for channel in range(3):
            cv2.filter2D(image[channel], -1, _SHARPEN, dst=plane, borderType=cv2.BORDER_REPLICATE)
            np.copyto(blurred[channel], image[channel])
            np.rint(plane[1:-1, 1:-1], out=blurred[channel, 1:-1, 1:-1])
        np.multiply(blurred, np.float32(1.0 - factor), out=blurred)
        np.multiply(image, np.float32(factor), out=image)
        np.add(image, blurred, out=image)
        np.clip(image, np.float32(0), np.float32(255), out=image)
        np.floor(image, out=image)

    @staticmethod
    def erase(image: np.ndarray, top: int, left: int, height: int, width: int, values: Sequence[float]) -> None:
        """Set the box (top, left, height, width) of every channel to that channel's value."""
        for channel, value in enumerate(values):
            image[channel, top : top + height, left : left + width] = value


def resample_affine(planes: np.ndarray, matrix: Sequence[Sequence[float]], fill: Sequence[float], interpolation: str) -> np.ndarray:
    """torchvision's ``affine`` of (3, H, W) whole-number planes with "bilinear" or "bicubic"
    ``grid_sample`` (see the module docstring): output pixel (i, j) samples the source at
    ``(a j + b i + c, d j + e i + f)``; a new (3, H, W) float32 array of whole numbers."""
    height, width = planes.shape[1:]
    (a, b, c), (d, e, f) = matrix
    # The matrix about the image's centre, applied in float32 to centred pixel coordinates and
    # divided by half the size (align_corners=False), as torchvision's _affine_grid does.
    half_w, half_h = (width - 1) / 2, (height - 1) / 2
    centred = [[a, b, a * half_w + b * half_h + c - half_w], [d, e, d * half_w + e * half_h + f - half_h]]
    theta = torch.tensor(centred, dtype=torch.float32).reshape(1, 2, 3)
    base = torch.empty(1, height, width, 3)
    base[..., 0].copy_(torch.linspace(-half_w, half_w, steps=width))
    base[..., 1].copy_(torch.linspace(-half_h, half_h, steps=height).unsqueeze_(-1))
    base[..., 2].fill_(1)
    scaled = theta.transpose(1, 2).div_(torch.tensor([0.5 * width, 0.5 * height]))
    grid = base.view(1, height * width, 3).bmm(scaled).view(1, height, width, 2)
    source = torch.from_numpy(np.ascontiguousarray(planes, dtype=np.float32))[None]
    filled = any(value != 0 for value in fill)
    if filled:
        source = torch.cat([source, torch.ones((1, 1, height, width))], dim=1)
    out = torch.nn.functional.grid_sample(source, grid, mode=interpolation, padding_mode="zeros", align_corners=False)
    if filled:
        out, mask = out[:, :3], out[:, 3:]
        fill_values = torch.tensor([float(v) for v in fill], dtype=torch.float32).view(1, 3, 1, 1)
        out = (out - fill_values) * mask + fill_values
    return out[0].round_().clamp_(0, 255).numpy()
