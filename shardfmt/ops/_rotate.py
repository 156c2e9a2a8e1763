"""Rotate one image about its centre with nearest-neighbour sampling, as torchvision's ``rotate``
does on tensors (``interpolation=NEAREST``, ``expand=False``, ``center=None``).

Output pixel (row i, column j) of an H x W image rotated by `angle` degrees counter-clockwise
takes the source pixel nearest to

    x = cos(a) (j - cx) - sin(a) (i - cy) + cx,    y = sin(a) (j - cx) + cos(a) (i - cy) + cy

with ``cx = (W - 1) / 2``, ``cy = (H - 1) / 2`` and ties rounded to even (``nearbyint``, as
``grid_sample`` rounds); where that pixel lies outside the image the output is `fill`. The
coordinates are computed in float32 as two outer sums, so at a tie (a coordinate exactly
half-way between two pixels, which needs a special angle) the pick may differ from
torchvision's.

The image is copied into the middle of a buffer of `fill` wide enough that every rotated
coordinate lands in it (a margin of half the diagonal less half the shorter side), so the
rotation is one gather, with no clamping and no mask: about 210 us for a 224x224 image on one
core of the build machine (the coordinates 55, the gather 90, the rest copies; 285 with numpy's
coordinates and a gather per plane), where PIL's ``rotate`` (C code on 4-byte pixels) takes
about 100. A rotation that ends a sample's steps (`rotate_to_pixels`) gathers uint8 pixels
straight into the interleaved output row instead, which also saves the sample's move back out
of float planes: about 190 us where rotating and then moving back take 300.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch

__all__ = ["Rotator"]


class Rotator:
    """Rotate (C, H, W) float32 images of one size in place.

    Args:
        channels, height, width: the shape of every image given to `rotate`.
    """

    def __init__(self, channels: int, height: int, width: int) -> None:
        self.shape = (channels, height, width)
        # Rotated coordinates stay within half the diagonal of the centre; +1 for rounding.
        self.margin = margin = math.ceil((math.hypot(height, width) - min(height, width)) / 2) + 1
        self._padded = np.empty((channels, height + 2 * margin, width + 2 * margin), np.float32)
        self._fill: tuple[float, ...] | None = None
        self._columns = np.arange(width, dtype=np.float64) - (width - 1) / 2
        self._rows = np.arange(height, dtype=np.float64) - (height - 1) / 2
        # x then y: (2, 1, W) terms along a row plus (2, H, 1) terms down a column, summed by
        # torch, whose broadcast add takes about 7 us where numpy's takes 45
        self._along = np.empty((2, 1, width), np.float32)
        self._down = np.empty((2, height, 1), np.float32)
        self._xy = torch.empty((2, height, width), dtype=torch.float32)
        self._index = torch.empty(height * width, dtype=torch.int32)  # converted from float32 in 15 us, int64 in 40
        self._padded_pixels = np.empty(self._padded.shape, np.uint8)  # for `rotate_to_pixels`
        self._pixels_fill: tuple[float, ...] | None = None
        # for `rotate_interleaved`: the padded image as one 4-byte word a pixel (RGB and a zero byte)
        self._packed: np.ndarray | None = None
        self._packed_fill: tuple[float, ...] | None = None
        self._words = np.empty((height, width, 4), np.uint8)

    def rotate(self, image: np.ndarray, angle: float, fill: tuple[float, ...]) -> None:
        """Rotate `image` by `angle` degrees counter-clockwise about its centre, pixels from
        outside it taking `fill` (one value per channel)."""
        channels, height, width = self.shape
        margin, padded = self.margin, self._padded
        self._fill = _fill_margin(padded, fill, self._fill)
        index = self._gather_index(angle)
        np.copyto(padded[:, margin : margin + height, margin : margin + width], image)
        # one torch index_select over the channels: about 90 us for three 224x224 planes, where
        # one per plane takes 130 and numpy's take 250
        torch.index_select(torch.from_numpy(padded.reshape(channels, -1)), 1, index, out=torch.from_numpy(image.reshape(channels, -1)))

    def rotate_to_pixels(self, image: np.ndarray, angle: float, fill: tuple[float, ...], out: np.ndarray) -> None:
        """Rotate `image` as `rotate` does and write the result as uint8 into `out`, a
        C-contiguous H x W x C array: the last step of a sample that ends with its rotation.
        `image`'s values must be whole numbers in [0, 255] (the result is then `rotate`'s, cast),
        and `image` is left as it was.

        The image is cast into the middle of a uint8 copy of the padded buffer, and one gather
        per channel writes straight into the channel's stride-C view of `out`: about 190 us for
        a 224x224 image, where `rotate` and then a per-channel cast into the interleaved output
        take 300.
        """
        channels, height, width = self.shape
        margin, padded = self.margin, self._padded_pixels
        if out.shape != (height, width, channels) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {height}x{width}x{channels} uint8 array, got {out.shape} {out.dtype}")
        self._pixels_fill = _fill_margin(padded, fill, self._pixels_fill)
        index = self._gather_index(angle)
        np.copyto(padded[:, margin : margin + height, margin : margin + width], image, casting="unsafe")
        source, target = torch.from_numpy(padded.reshape(channels, -1)), torch.from_numpy(out.reshape(-1))
        for channel in range(channels):
            torch.index_select(source[channel], 0, index, out=target[channel::channels])

    def rotate_interleaved(self, image: np.ndarray, angle: float, fill: tuple[float, ...], out: np.ndarray) -> None:
        """Rotate `image`, an H x W x 3 uint8 array, as `rotate` does (the same source pixel for
        every output pixel), into `out` (H x W x 3 uint8, C-contiguous, not `image`).

        Each pixel is widened to a 4-byte word (``cvtColor`` to RGBA), so that the rotation is one
        gather of words over a padded plane and one ``cvtColor`` back: about 80 us for a 224x224
        image, where the gather of three planes out of float planes takes 210.
        """
        channels, height, width = self.shape
        margin = self.margin
        if channels != 3 or image.shape != (height, width, 3) or out.shape != (height, width, 3) or not out.flags.c_contiguous:
            raise ValueError(f"image and out must be C-contiguous {height}x{width}x3 uint8 arrays, got {image.shape} and {out.shape}")
        packed = self._packed
        if packed is None:
            packed = self._packed = np.empty((height + 2 * margin, width + 2 * margin, 4), np.uint8)
        if fill != self._packed_fill:
            packed[...] = (*(int(v) for v in fill), 0)
            self._packed_fill = fill
        index = self._gather_index(angle)
        words = self._words
        cv2.cvtColor(image, cv2.COLOR_RGB2RGBA, dst=words)
        np.copyto(packed[margin : margin + height, margin : margin + width], words)
        source = torch.from_numpy(packed.view(np.int32).reshape(-1))
        torch.index_select(source, 0, index, out=torch.from_numpy(words.view(np.int32).reshape(-1)))
        cv2.cvtColor(words, cv2.COLOR_RGBA2RGB, dst=out)

    def _gather_index(self, angle: float) -> torch.Tensor:
        """The flat index into a padded plane of the source pixel of every output pixel."""
        channels, height, width = self.shape
        margin = self.margin
        radians = math.radians(angle)
        cos, sin = math.cos(radians), math.sin(radians)
        # In the buffer's coordinates (the image's plus the margin): x = cos dx - sin dy + cx + margin.
        along, down, xy = self._along, self._down, self._xy
        np.copyto(along[0, 0], self._columns * cos + (width - 1) / 2 + margin, casting="unsafe")
        np.copyto(down[0, :, 0], self._rows * -sin, casting="unsafe")
        np.copyto(along[1, 0], self._columns * sin + (height - 1) / 2 + margin, casting="unsafe")
        np.copyto(down[1, :, 0], self._rows * cos, casting="unsafe")
        torch.add(torch.from_numpy(along), torch.from_numpy(down), out=xy)
        torch.round(xy, out=xy)  # ties to even, as numpy's rint and grid_sample
        flat = xy[0].reshape(-1)
        torch.add(flat, xy[1].reshape(-1), alpha=width + 2 * margin, out=flat)  # below 2^24, so exact in float32
        index = self._index
        index.copy_(flat)
        return index


def _fill_margin(padded: np.ndarray, fill: tuple[float, ...], filled: tuple[float, ...] | None) -> tuple[float, ...]:
    """Fill each channel of `padded` with its value of `fill`, unless it holds `filled` already
    (the margin keeps its fill: only the middle is ever written); return `fill`."""
    if fill != filled:
        for channel, value in enumerate(fill):
            padded[channel].fill(value)
    return fill
