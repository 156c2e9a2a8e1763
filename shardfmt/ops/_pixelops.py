"""The operations of `imageops` and `colour` that the built-in steps use, on uint8 H x W x 3
pixels with OpenCV: the same values, or within the one level spec/pixels.md allows.

A sample whose steps are all built-in (and random erasing last, if at all) never needs float
planes: this module runs them on its interleaved uint8 pixels, as Albumentations does, which
saves the sample's move into float planes and back (about 160 to 185 us a 224x224 sample on
the build machine). Exactly the values of the float-plane twin:

- a warp is one ``warpAffine`` over the three channels (the coordinates are computed in the
  same fixed point whatever the type, so the pixels picked are the same); a bilinear or bicubic
  warp is `imageops.resample_affine` on the pixels as float planes;
- brightness, autocontrast, equalize, posterize and invert are one lookup table, each entry the
  formula of the float-plane kernel for that level, run by stringzilla's byte translation where
  it is installed (`_byte_translator`), else ``cv2.LUT`` or a bitwise operation; solarize is a
  threshold and an exclusive or (``255 - x`` is ``x ^ 255``); a vertical flip is ``cv2.flip``.

Within one level of the float32 formula (OpenCV's rounding uint8 kernels, Albumentations'
choice), unless ``exact`` is set, which gives the float-plane values:

- grayscale is OpenCV's fixed-point gray (``cvtColor``), round(0.299 R + 0.587 G + 0.114 B):
  torchvision's trunc(0.2989 R + 0.587 G + 0.114 B) or one more, on every one of the 2^24
  colours (13 us a 224x224 sample where the float32 gray takes 60 to 75);
- contrast's table takes the weighted mean of the channels (0.2989, 0.587, 0.114, from their
  sums) less half a level, within 0.5 of the formula's mean of truncated grays, so the blend
  moves by at most 0.5 |1 - factor|; saturation is one ``cv2.transform``:
  factor x + (1 - factor) (0.2989 R + 0.587 G + 0.114 B - 1/2), the gray left untruncated, so
  again within 0.5 |1 - factor| of the formula's blend, whatever the kernel's fixed point adds
  staying within the level (checked on all 2^24 colours for 45 factors in [0, 2]); a factor
  beyond [0, 2] takes the formula itself, where the gray's half level could weigh more;
- sharpness is one ``addWeighted`` of x and its 3x3 mean (``cv2.blur``): the smoothed image
  unrounded and from the rounded mean, within 0.85 |1 - factor| of the formula's blend; beyond
  [0, 2] the smoothed image is exact in int16 (box sums, then ``round((sum + 4 x) / 13)``,
  never a tie) and blended by ``addWeighted``;
- the blends' truncation is ``addWeighted``'s or ``transform``'s rounding of the value less
  0.49998 (`_TRUNCATE`), which differs from a floor only within 2e-5 below a whole number.

Hue is OpenCV's float32 HSV round trip on the 0-255 scale (``cvtColor`` to HSV, the hue moved by
``360 shift`` degrees, ``cvtColor`` back; OpenCV's hue sectors break ties as torchvision's, R then
G), then scaled by 255.999 / 255 and truncated: torchvision's formula in another order of float
operations, so a value may differ from its by one level, as spec/sampling.md allows (about 150
to 180 us a 224x224 sample, where the float-plane kernel takes 320 and the move in and out of
float planes 160 more).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np
import torch

from ._imageops import resample_affine

__all__ = ["PixelOps"]


def _byte_translator() -> Callable[[np.ndarray, np.ndarray, np.ndarray | None], None] | None:
    """stringzilla's ``translate`` (a vectorised 256-byte lookup, what Albumentations' lookups
    run), where it is installed and maps bytes as `cv2.LUT` does; else None. About 3 us for a
    224x224 sample where `cv2.LUT` takes 60 on the build machine; the values are the same."""
    try:
        import stringzilla
    except ImportError:
        return None

    def translate(image: np.ndarray, table: np.ndarray, target: np.ndarray | None = None) -> None:
        # contiguous arrays: the reshapes are views
        if target is None or target is image:
            stringzilla.translate(image.reshape(-1).data, table.data, inplace=True)
        else:
            stringzilla.translate(image.reshape(-1).data, table.data, out=target.reshape(-1).data)

    levels = np.arange(256, dtype=np.uint8)
    probe, table, into = levels.copy(), levels[::-1].copy(), np.zeros(256, np.uint8)
    try:
        translate(probe, table, into)
        translate(probe, table)
    except (TypeError, ValueError, AttributeError):  # another API than the one tried here
        return None
    return translate if np.array_equal(probe, table) and np.array_equal(into, table) else None


_TRANSLATE = _byte_translator()

_R, _G, _B = np.float32(0.2989), np.float32(0.587), np.float32(0.114)
_LEVELS = np.arange(256, dtype=np.float32)
_GRAY_WEIGHTS = np.array([0.2989, 0.587, 0.114])
_BYTES = np.arange(256, dtype=np.uint8)
_INVERTED = _BYTES[::-1].copy()
_THIRTEENTH = np.float32(1 / 13)
_WARP_FLAGS = cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP
_TO_UINT8 = np.float32(255.999 / 255.0)
_TRUNCATE = -0.49998
"""What addWeighted adds so that its rounding truncates: round(v - 0.49998) is floor(v) unless v
lies within 2e-5 below a whole number (the float32 blends of torchvision can land either side
of one there too)."""


class PixelOps:
    """Scratch arrays for H x W x 3 uint8 samples of one size, and the operations on them.

    The methods have the names and meanings of `ImageOps`' and `ColourKernels`' (`colour` is
    the object itself), so `autoaugment.apply_operation` runs on either.

    Args:
        height, width: the size of every image given to the methods.
        exact: contrast, saturation, grayscale and sharpness with the float32 formulas of the
            float-plane kernels, value for value (else OpenCV's uint8 kernels, within one level
            of them; the attribute may be changed between calls).
    """

    def __init__(self, height: int, width: int, *, exact: bool = False) -> None:
        self.shape = (height, width, 3)
        self.size = (height, width)
        self.colour = self
        self._buffers = (np.empty(self.shape, np.uint8), np.empty(self.shape, np.uint8))
        self._float = np.empty(self.shape, np.float32)
        self._float_tensor = torch.from_numpy(self._float)
        self._gray = np.empty((height, width), np.float32)
        self._term = np.empty((height, width), np.float32)
        self._table = np.empty((256, 1, 3), np.uint8)
        self._hsv = np.empty(self.shape, np.float32)
        self._plane = np.empty((height, width), np.uint8)
        self._sums = np.empty(self.shape, np.int16)
        self._wide = np.empty(self.shape, np.int16)
        self._matrix = np.empty((3, 4), np.float64)
        self.exact = exact

    @property
    def buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """The two H x W x 3 uint8 buffers the operations write into."""
        return self._buffers

    def spare(self, image: np.ndarray) -> np.ndarray:
        first, second = self._buffers
        return second if image is first else first

    def _lut(self, image: np.ndarray, table: np.ndarray, target: np.ndarray | None = None) -> None:
        """Map every value through `table` (256 levels, or 256 x 3 per channel), in place or into
        `target`. One table for all channels takes OpenCV's fast path (about 2.5 times a
        per-channel table's speed)."""
        into = image if target is None else target
        if _TRANSLATE is not None and image.flags.c_contiguous and into.flags.c_contiguous:
            if table.ndim == 1:
                _TRANSLATE(image, table, into)
                return
            # a table per channel: each split plane translated (about 40 us, where cv2.LUT takes 100)
            planes = cv2.split(image)
            for plane, column in zip(planes, table.T, strict=True):
                _TRANSLATE(plane, np.ascontiguousarray(column), None)
            cv2.merge(planes, dst=into)
            return
        if table.ndim != 1:
            self._table[:, 0, :] = table
            table = self._table
        if target is not None:
            cv2.LUT(image, table, dst=target)
            return
        # into the spare buffer and copied back: OpenCV's lookup in place took twice as long (113 us
        # against 58, and 6 for the copy)
        spare = self.spare(image)
        cv2.LUT(image, table, dst=spare)
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

    def brightness(self, image: np.ndarray, factor: float, target: np.ndarray | None = None) -> None:
        """Brightness by `factor`, in place or into `target` (so for contrast, saturation and hue)."""
        table = np.floor(np.minimum(_LEVELS * np.float32(factor), np.float32(255)))
        self._lut(image, table.astype(np.uint8), target)

    def gray_levels(self, image: np.ndarray) -> np.ndarray:
        """OpenCV's fixed-point gray, round(0.299 R + 0.587 G + 0.114 B), in a uint8 scratch
        plane: 0 or 1 above `gray` at every one of the 2^24 colours."""
        return cv2.cvtColor(image, cv2.COLOR_RGB2GRAY, dst=self._plane)

    def contrast(self, image: np.ndarray, factor: float, target: np.ndarray | None = None) -> None:
        if self.exact or abs(1.0 - factor) > 1.0:
            gray = self.gray(image)
            mean = np.float32(np.add.reduce(gray, axis=None, dtype=np.float32) / np.float32(gray.size))
        else:
            # The weighted mean of the channels (their sums: one pass, 2 us, where a gray image
            # and its sum took 14): every truncated gray lies within one level below its pixel's
            # weighted sum, so the formula's mean lies within one below this one, and this one
            # less half a level within 0.5 of it: the blend moves by at most 0.5 |1 - factor| <= 0.5
            red, green, blue = cv2.sumElems(image)[:3]
            weighted = (0.2989 * red + 0.587 * green + 0.114 * blue) / (image.shape[0] * image.shape[1])
            mean = np.float32(max(weighted - 0.5, 0.0))  # at least the formula's 0
        other = np.float32(np.float32(1.0 - factor) * mean)
        table = _LEVELS * np.float32(factor) + other
        if factor > 1.0:
            np.minimum(np.maximum(table, np.float32(0), out=table), np.float32(255), out=table)
        self._lut(image, np.floor(table).astype(np.uint8), target)

    def saturation(self, image: np.ndarray, factor: float, target: np.ndarray | None = None) -> None:
        into = image if target is None else target
        if self.exact or abs(1.0 - factor) > 1.0:
            self._saturation_formula(image, factor, into)
            return
        # One pass of cv2.transform: factor x + (1 - factor) (0.2989 R + 0.587 G + 0.114 B - 1/2),
        # the gray not truncated but half a level taken back, within 0.5 |1 - factor| <= 0.5 of
        # the formula's blend; the offset makes the rounding of transform a truncation. Within
        # one level of the formula at every one of the 2^24 colours (checked for 45 factors in
        # [0, 2]), equal to it at 75 to 95% of them; about twice the speed of a gray image,
        # spread to three channels and blended by addWeighted.
        weight = 1.0 - factor
        matrix = self._matrix
        matrix[:, :3] = _GRAY_WEIGHTS * weight
        matrix[0, 0] += factor
        matrix[1, 1] += factor
        matrix[2, 2] += factor
        matrix[:, 3] = _TRUNCATE - 0.5 * weight
        cv2.transform(image, matrix, dst=into)

    def _saturation_formula(self, image: np.ndarray, factor: float, into: np.ndarray) -> None:
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
        np.copyto(into, mixed, casting="unsafe")  # whole or not, at least 0: the cast truncates as floor

    def grayscale(self, image: np.ndarray, target: np.ndarray | None = None) -> None:
        """The gray image in every channel, in `image` or into `target`."""
        if self.exact:
            gray = self.gray(image)
            np.copyto(self._plane, gray, casting="unsafe")  # whole numbers in [0, 255]
            levels = self._plane
        else:
            levels = self.gray_levels(image)
        cv2.cvtColor(levels, cv2.COLOR_GRAY2RGB, dst=image if target is None else target)

    def flip_vertically(self, image: np.ndarray, target: np.ndarray | None = None) -> np.ndarray:
        """`image` upside down, in `target` or the spare buffer; returns that array."""
        into = self.spare(image) if target is None else target
        cv2.flip(image, 0, dst=into)
        return into

    def hue(self, image: np.ndarray, shift: float, target: np.ndarray | None = None) -> None:
        values = self._float
        if image.flags.writeable:  # torch's uint8 to float32 cast: about 10 us, numpy's 16 to 20
            self._float_tensor.copy_(torch.from_numpy(image))
        else:  # torch would warn of a read-only array
            np.copyto(values, image)
        # Both conversions in place (a pixel's values depend on that pixel alone; the same values,
        # tested): one float buffer of 600 KB for a 224x224 sample, where two filled 1.2 MB, more
        # than a core's L2 cache here, between the decode's and the resize's buffers.
        cv2.cvtColor(values, cv2.COLOR_RGB2HSV, dst=values)  # H in degrees, S in [0, 1], V on the 0-255 scale
        # moved forward only: OpenCV's way back wraps a hue in [360, 720) into [0, 360), not a
        # negative one; on the hue channel alone (18 us, where cv2.add over all three took 23)
        angles = values[:, :, 0]
        np.add(angles, np.float32((360.0 * shift) % 360.0), out=angles)
        cv2.cvtColor(values, cv2.COLOR_HSV2RGB, dst=values)
        # scaled, and truncated by the rounding of |v - 0.49998| (one pass where a multiply and a
        # cast took two): a value that rounding left just below 0 (by far less than 1e-3) gives 0
        cv2.convertScaleAbs(values, dst=image if target is None else target, alpha=float(_TO_UINT8), beta=_TRUNCATE)

    def sharpness(self, image: np.ndarray, factor: float) -> None:
        height, width = self.shape[:2]
        if height <= 2 or width <= 2:
            return
        if self.exact:
            self._sharpness_formula(image, factor)
            return
        if abs(1.0 - factor) <= 1.0:
            # One blend of x and its 3x3 mean (cv2.blur, which rounds sum / 9): factor x + (1 -
            # factor) (sum + 4 x) / 13, the smoothed image neither rounded (0.5 |1 - factor| off
            # at most) nor from the exact sum (0.35 |1 - factor|): within 0.85 of the formula's
            # blend, so within one level after the truncation (about 60 us a 224x224 sample,
            # where the exact smoothing below takes 95 and OpenCV's filter2D 120)
            mean, weight = self.spare(image), (1.0 - factor) / 13
            cv2.blur(image, (3, 3), dst=mean, borderType=cv2.BORDER_REPLICATE)
            border = image[0].copy(), image[-1].copy(), image[:, 0].copy(), image[:, -1].copy()
            cv2.addWeighted(image, factor + 4 * weight, mean, 9 * weight, _TRUNCATE, dst=image)
            image[0], image[-1], image[:, 0], image[:, -1] = border  # blend(x, x, factor): x, within the level
            return
        # the smoothed image in int16, exact: the 3x3 sums (a box filter), and round((sums + 4 x)
        # / 13) by addWeighted (a whole number over 13 is never a tie); then the blend, truncated
        # by addWeighted's rounding
        sums, wide, blurred = self._sums, self._wide, self.spare(image)
        cv2.boxFilter(image, cv2.CV_16S, (3, 3), dst=sums, normalize=False, borderType=cv2.BORDER_REPLICATE)
        np.copyto(wide, image)
        cv2.addWeighted(sums, 1 / 13, wide, 4 / 13, 0.0, dst=sums)
        np.copyto(blurred, sums, casting="unsafe")  # whole numbers in [0, 255]
        blurred[0], blurred[-1], blurred[:, 0], blurred[:, -1] = image[0], image[-1], image[:, 0], image[:, -1]
        cv2.addWeighted(image, factor, blurred, 1.0 - factor, _TRUNCATE, dst=image)

    def _sharpness_formula(self, image: np.ndarray, factor: float) -> None:
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
        if bits >= 8:
            return
        mask = 256 - (1 << (8 - bits))  # x & -(2^(8 - bits)) on a byte
        if _TRANSLATE is not None and image.flags.c_contiguous:  # about 3 us, the bitwise and 7
            _TRANSLATE(image, _BYTES & np.uint8(mask), None)
            return
        cv2.bitwise_and(image, (float(mask),) * 3 + (0.0,), dst=image)  # type: ignore[call-overload]  # a Scalar

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
        if _TRANSLATE is not None and image.flags.c_contiguous:
            _TRANSLATE(image, _INVERTED, None)
            return
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
