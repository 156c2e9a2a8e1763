"""The operations of `imageops` and `colour` that the built-in steps use, on uint8 H x W x 3
pixels with OpenCV, giving the same values (hue: within one level).

A sample whose steps are all built-in (and random erasing last, if at all) never needs float
planes: this module runs them on its interleaved uint8 pixels, as Albumentations does, which
saves the sample's move into float planes and back (about 160 to 185 us a 224x224 sample on
the build machine). Each operation gives exactly the values of its float-plane twin, but hue:

- a warp is one ``warpAffine`` over the three channels (the coordinates are computed in the
  same fixed point whatever the type, so the pixels picked are the same); a bilinear or bicubic
  warp is `imageops.resample_affine` on the pixels as float planes;
- invert is a bitwise not; brightness, contrast, autocontrast and equalize are one lookup
  table (``cv2.LUT``), each entry computed by the float32 formula of the float-plane kernel for
  that level (contrast's mean from the same float32 gray image and reduction);
- saturation and sharpness blend in float32 as the float-plane kernels do; sharpness's
  smoothed image is the rounded ``(box sum + 4 x) / 13`` in float32, whose sums of whole
  numbers are exact and whose quotient is never a tie;
- posterize is a bitwise and; solarize a threshold and an exclusive or (``255 - x`` is
  ``x ^ 255``); a table over all channels runs stringzilla's byte translation where it is
  installed (`_byte_translator`);
- grayscale is `gray` (the float32 formula) in every channel; a vertical flip is ``cv2.flip``;
- hue is OpenCV's float32 HSV round trip on the 0-255 scale (``cvtColor`` to HSV, the hue
  moved by ``360 shift`` degrees, ``cvtColor`` back; OpenCV's hue sectors break ties as
  torchvision's, R then G), then scaled by 255.999 / 255 and truncated: torchvision's formula in
  another order of float operations, so a value may differ from its by one level, as
  spec/sampling.md allows (about 230 us a 224x224 sample, where the float-plane kernel takes 320
  and the move in and out of float planes 160 more).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np

from ._imageops import resample_affine

__all__ = ["PixelOps"]


def _byte_translator() -> Callable[[np.ndarray, np.ndarray], None] | None:
    """stringzilla's ``translate`` (a vectorised 256-byte lookup, what Albumentations' lookups
    run), where it is installed and maps bytes as `cv2.LUT` does; else None. About 3 us for a
    224x224 sample where `cv2.LUT` takes 60 on the build machine; the values are the same."""
    try:
        import stringzilla
    except ImportError:
        return None

    def translate(image: np.ndarray, table: np.ndarray) -> None:
        stringzilla.translate(image.reshape(-1).data, table.data, inplace=True)  # a contiguous image: a view

    levels = np.arange(256, dtype=np.uint8)
    probe, table = levels.copy(), levels[::-1].copy()
    try:
        translate(probe, table)
    except (TypeError, ValueError, AttributeError):  # another API than the one tried here
        return None
    return translate if np.array_equal(probe, table) else None


_TRANSLATE = _byte_translator()

_R, _G, _B = np.float32(0.2989), np.float32(0.587), np.float32(0.114)
_LEVELS = np.arange(256, dtype=np.float32)
_THIRTEENTH = np.float32(1 / 13)
_WARP_FLAGS = cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP
_TO_UINT8 = np.float32(255.999 / 255.0)


class PixelOps:
    """Scratch arrays for H x W x 3 uint8 samples of one size, and the operations on them.

    The methods have the names and meanings of `ImageOps`' and `ColourKernels`' (`colour` is
    the object itself), so `autoaugment.apply_operation` runs on either.
    """

    def __init__(self, height: int, width: int) -> None:
        self.shape = (height, width, 3)
        self.size = (height, width)
        self.colour = self
        self._buffers = (np.empty(self.shape, np.uint8), np.empty(self.shape, np.uint8))
        self._float = np.empty(self.shape, np.float32)
        self._gray = np.empty((height, width), np.float32)
        self._term = np.empty((height, width), np.float32)
        self._table = np.empty((256, 1, 3), np.uint8)
        self._hsv = np.empty(self.shape, np.float32)
        self._plane = np.empty((height, width), np.uint8)

    def spare(self, image: np.ndarray) -> np.ndarray:
        first, second = self._buffers
        return second if image is first else first

    def _lut(self, image: np.ndarray, table: np.ndarray) -> None:
        """Map every value through `table` (256 levels, or 256 x 3 per channel), in place. One
        table for all channels takes OpenCV's fast path (about 2.5 times a per-channel table's speed)."""
        # into the spare buffer and copied back: OpenCV's lookup in place took twice as long (113 us
        # against 58, and 6 for the copy)
        if _TRANSLATE is not None and image.flags.c_contiguous:
            if table.ndim == 1:
                _TRANSLATE(image, table)
                return
            # a table per channel: each split plane translated (about 40 us, where cv2.LUT takes 100)
            planes = cv2.split(image)
            for plane, column in zip(planes, table.T, strict=True):
                _TRANSLATE(plane, np.ascontiguousarray(column))
            cv2.merge(planes, dst=image)
            return
        spare = self.spare(image)
        if table.ndim == 1:
            cv2.LUT(image, table, dst=spare)
        else:
            self._table[:, 0, :] = table
            cv2.LUT(image, self._table, dst=spare)
        np.copyto(image, spare)

    def warp(
        self, image: np.ndarray, matrix: Sequence[Sequence[float]], fill: Sequence[float], interpolation: str = "nearest"
    ) -> np.ndarray:
        height, width = self.shape[:2]
        target = self.spare(image)
        if interpolation != "nearest":
            planes = resample_affine(image.transpose(2, 0, 1).astype(np.float32), matrix, fill, interpolation)
            np.copyto(target, planes.transpose(1, 2, 0), casting="unsafe")
            return target
        cv2.warpAffine(
            image, np.asarray(matrix, np.float64), (width, height), dst=target, flags=_WARP_FLAGS, borderMode=cv2.BORDER_CONSTANT,
            borderValue=tuple(float(v) for v in fill),
        )
        return target

    def gray(self, image: np.ndarray) -> np.ndarray:
        """trunc(0.2989 R + 0.587 G + 0.114 B) in float32, as `colour.ColourKernels.gray`."""
        out, term = self._gray, self._term
        red, green, blue = cv2.split(image)  # contiguous planes: the products below then take 2/3 of the time
        np.multiply(red, _R, out=out)
        np.add(out, np.multiply(green, _G, out=term), out=out)
        np.add(out, np.multiply(blue, _B, out=term), out=out)
        return np.floor(out, out=out)

    def brightness(self, image: np.ndarray, factor: float) -> None:
        table = np.floor(np.minimum(_LEVELS * np.float32(factor), np.float32(255)))
        self._lut(image, table.astype(np.uint8))

    def contrast(self, image: np.ndarray, factor: float) -> None:
        gray = self.gray(image)
        mean = np.float32(np.add.reduce(gray, axis=None, dtype=np.float32) / np.float32(gray.size))
        other = np.float32(np.float32(1.0 - factor) * mean)
        table = _LEVELS * np.float32(factor) + other
        if factor > 1.0:
            np.clip(table, np.float32(0), np.float32(255), out=table)
        self._lut(image, np.floor(table).astype(np.uint8))

    def saturation(self, image: np.ndarray, factor: float) -> None:
        gray = self.gray(image)
        np.multiply(gray, np.float32(1.0 - factor), out=gray)
        # on the interleaved values at once: the gray term spread to three channels by
        # cvtColor, so that every pass runs over contiguous arrays of one shape (numpy's
        # broadcast of a plane over an innermost axis of 3 took 1.9 ms)
        mixed, spread = self._float, self._hsv
        np.copyto(mixed, image)
        np.multiply(mixed, np.float32(factor), out=mixed)
        cv2.cvtColor(gray, cv2.COLOR_GRAY2RGB, dst=spread)
        np.add(mixed, spread, out=mixed)
        if factor > 1.0:
            np.clip(mixed, np.float32(0), np.float32(255), out=mixed)
        np.copyto(image, mixed, casting="unsafe")  # whole or not, at least 0: the cast truncates as floor

    def grayscale(self, image: np.ndarray) -> None:
        gray = self.gray(image)
        np.copyto(self._plane, gray, casting="unsafe")  # whole numbers in [0, 255]
        cv2.cvtColor(self._plane, cv2.COLOR_GRAY2RGB, dst=image)

    def flip_vertically(self, image: np.ndarray) -> np.ndarray:
        target = self.spare(image)
        cv2.flip(image, 0, dst=target)
        return target

    def hue(self, image: np.ndarray, shift: float) -> None:
        values, hsv = self._float, self._hsv
        np.copyto(values, image)
        cv2.cvtColor(values, cv2.COLOR_RGB2HSV, dst=hsv)  # H in degrees, S in [0, 1], V on the 0-255 scale
        # moved forward only: OpenCV's way back wraps a hue in [360, 720) into [0, 360), not a negative one
        cv2.add(hsv, ((360.0 * shift) % 360.0, 0.0, 0.0, 0.0), dst=hsv)  # type: ignore[call-overload]  # a Scalar
        cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=values)
        np.multiply(values, _TO_UINT8, out=values)
        # in (-1, 256): a value that rounding left just below 0 truncates to 0, the others as floor
        np.copyto(image, values, casting="unsafe")

    def sharpness(self, image: np.ndarray, factor: float) -> None:
        height, width = self.shape[:2]
        if height <= 2 or width <= 2:
            return
        # In float32, where every sum of whole numbers below 2^24 is exact: the 3x3 sums (a box
        # filter), plus 4 x, divided by 13 and rounded (never a tie) are filter2D's uint8 result;
        # about 100 us less than filter2D on uint8 and a blend with mixed types.
        blurred, values = self._hsv, self._float
        cv2.boxFilter(image, cv2.CV_32F, (3, 3), dst=blurred, normalize=False, borderType=cv2.BORDER_REPLICATE)
        np.copyto(values, image)
        cv2.scaleAdd(values, 4.0, blurred, dst=blurred)
        np.multiply(blurred, _THIRTEENTH, out=blurred)
        np.rint(blurred, out=blurred)
        blurred[0], blurred[-1], blurred[:, 0], blurred[:, -1] = values[0], values[-1], values[:, 0], values[:, -1]
        np.multiply(blurred, np.float32(1.0 - factor), out=blurred)
        np.multiply(values, np.float32(factor), out=values)
        np.add(values, blurred, out=blurred)
        np.clip(blurred, np.float32(0), np.float32(255), out=blurred)
        np.copyto(image, blurred, casting="unsafe")  # at least 0: the cast truncates as floor

    @staticmethod
    def posterize(image: np.ndarray, bits: int) -> None:
        if bits < 8:
            mask = float(256 - (1 << (8 - bits)))  # x & -(2^(8 - bits)) on a byte
            cv2.bitwise_and(image, (mask, mask, mask, 0.0), dst=image)  # type: ignore[call-overload]  # a Scalar

    def solarize(self, image: np.ndarray, threshold: float) -> None:
        # the levels at or above the float32 threshold are k and up; 255 - x is x ^ 255, so the
        # result is x ^ (255 where x > k - 1, else 0): a threshold and an exclusive or
        first = int(np.count_nonzero(_LEVELS < np.float32(threshold)))
        if first > 255:
            return
        mask = self.spare(image)
        cv2.threshold(image, first - 1, 255, cv2.THRESH_BINARY, dst=mask)
        cv2.bitwise_xor(image, mask, dst=image)

    def invert(self, image: np.ndarray) -> None:
        cv2.bitwise_not(image, dst=image)

    def autocontrast(self, image: np.ndarray) -> None:
        # numpy's reductions over the first two axes of interleaved uint8 take some 20 times longer
        extremes = [cv2.minMaxLoc(cv2.extractChannel(image, channel))[:2] for channel in range(3)]
        low = np.array([e[0] for e in extremes], np.float32)
        high = np.array([e[1] for e in extremes], np.float32)
        table = np.empty((256, 3), np.uint8)
        for channel in range(3):
            if high[channel] == low[channel]:
                table[:, channel] = np.arange(256)
                continue
            scale = np.float32(255) / np.float32(high[channel] - low[channel])
            values = np.clip((_LEVELS - low[channel]) * scale, np.float32(0), np.float32(255))
            table[:, channel] = np.floor(values)
        self._lut(image, table)

    def equalize(self, image: np.ndarray) -> None:
        table = np.empty((256, 3), np.uint8)
        for channel in range(3):
            hist = cv2.calcHist([image], [channel], None, [256], [0, 256]).reshape(-1).astype(np.int64)
            nonzero = hist[hist != 0]
            step = int(nonzero[:-1].sum()) // 255
            if step == 0:
                table[:, channel] = np.arange(256)
                continue
            table[0, channel] = 0
            table[1:, channel] = np.minimum((np.cumsum(hist)[:-1] + step // 2) // step, 255)
        self._lut(image, table)

    @staticmethod
    def erase(image: np.ndarray, top: int, left: int, height: int, width: int, values: Sequence[float]) -> None:
        # a filled rectangle: numpy's assignment of three values broadcasts over an innermost axis of 3 (about 5 times slower)
        cv2.rectangle(image, (left, top), (left + width - 1, top + height - 1), tuple(float(int(v)) for v in values), thickness=-1)
