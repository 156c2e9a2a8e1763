"""Resize a box of uint8 pixels straight into a batch slot, with the flip and channel count asked for.

Three kernels: "bilinear" and "bicubic", torch's antialiased uint8 kernels (torchvision's
tensor resize with ``antialias=True``, PIL's BILINEAR and BICUBIC), for images, and "nearest",
torch's nearest-exact (PIL's NEAREST: each output pixel is one input pixel, so a mask keeps
exactly the values it had) for masks and label maps. A box already of the output size is
copied, not resampled.

The uint8 kernels are the ones ``torch.nn.functional.interpolate(..., antialias=True)`` runs on a
uint8 tensor, so they equal it exactly. torch's float32 kernel (what runs on a float image)
keeps the intermediate row pass unclamped where the uint8 kernel, as PIL, rounds and clamps it:
on photographs every value is within 1 of it; bicubic on pure noise, where the first pass
overshoots, moves about 0.1% of values by more. OpenCV has no antialiased resize like these
(``INTER_AREA`` averages boxes and took 1.7 ms for a 300x400 to 224x224 resize, where torch's
bilinear took 0.24 and bicubic 0.38 on the build machine), so the crop's resize stays torch's.

torch's horizontal pass costs about three times its vertical pass a pixel (84 us against 31 for
the two passes of a 250x254x4 box to 224x224, one core here). `Resizer.resize_rows` runs it as
the vertical pass of the box turned on its side: OpenCV transposes the 4-byte pixels (9 us),
torch resizes the turned box's rows, and OpenCV turns it back (5 us; a rotation, 11 us, where
the sample is mirrored, which the vertical pass after it cannot tell). The weights, the
roundings and the clamps are those of the horizontal pass, so the pixels are the same, bit for
bit (tested); the box of a decode buffer is read where it lies, with no copy to make it
contiguous: 76 to 97 us where `resize` took 103 to 113 for that box.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch

__all__ = ["INTERPOLATIONS", "Resizer", "match_channels"]

INTERPOLATIONS = ("bilinear", "bicubic", "nearest")

_nn = getattr(torch._C, "_nn", None)
_bilinear_out = getattr(_nn, "_upsample_bilinear2d_aa", None)
_bicubic_out = getattr(_nn, "_upsample_bicubic2d_aa", None)
_nearest_out = getattr(_nn, "_upsample_nearest_exact2d", None)
_KEPT_VIEWS = 1024
"""Shapes whose views a `_Pixels` keeps (a few hundred bytes each)."""
_OPENCV_FLIP_MIN_VALUES = 48 * 48 * 3
"""Outputs of at least this many values are mirrored by OpenCV, smaller ones by torch (`Resizer`)."""
_LUMA = (299, 587, 114)
"""ITU-R 601 weights in thousandths: Pillow's RGB -> L conversion."""


class Resizer:
    """Resize (1, C, h, w) uint8 tensors into (1, C, H, W) slot views of one output size.

    Args:
        output_size: (height, width) of every output.
        channels: C of the outputs (the sources must have it too; see `match_channels`).
        interpolation: "bilinear" or "bicubic" (antialiased), or "nearest".
    """

    def __init__(self, *, output_size: tuple[int, int], channels: int, interpolation: str = "bilinear") -> None:
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {interpolation!r}")
        self.output_size = output_size
        self.channels = channels
        self.interpolation = interpolation
        self._scratch = torch.empty((1, channels, *output_size), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        self._scratch_pixels = self._scratch[0].permute(1, 2, 0).numpy()  # H x W x C, the same memory
        # OpenCV's flip into a slot's row took 10.7 us for 224x224x3 where torch's flip and copy
        # took 18.0; but the row's array costs about 3 us to make, so below about 48x48 pixels
        # (5.5 against 5.8 us there; 5.1 against 4.2 at 8x8) torch's is the faster
        self._flip_with_opencv = output_size[0] * output_size[1] * channels >= _OPENCV_FLIP_MIN_VALUES
        self._turned, self._columns, self._result = (_Pixels(channels) for _ in range(3))  # for resize_rows

    def resize(self, source: torch.Tensor, *, flip: bool, out: torch.Tensor) -> None:
        """Write `source` ((1, C, h, w), any strides) resized to the output size, mirrored left to
        right if `flip`, into `out`: a (1, C, H, W) view of an H x W x C array (see
        `shardfmt.ops._decode.as_target`)."""
        out_h, out_w = self.output_size
        destination = self._scratch if flip else out
        if source.shape[2] == out_h and source.shape[3] == out_w:
            destination.copy_(source)
        elif self.interpolation == "bilinear" and _bilinear_out is not None:
            _bilinear_out(source, [out_h, out_w], False, None, None, out=destination)
        elif self.interpolation == "bicubic" and _bicubic_out is not None:
            _bicubic_out(source, [out_h, out_w], False, None, None, out=destination)
        elif self.interpolation == "nearest" and _nearest_out is not None:
            _nearest_out(source, [out_h, out_w], None, None, out=destination)
        else:
            mode = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest-exact"}[self.interpolation]
            options = {"antialias": True, "align_corners": False} if mode != "nearest-exact" else {}
            destination.copy_(torch.nn.functional.interpolate(source, size=(out_h, out_w), mode=mode, **options))
        if flip:
            self._flip_into(out)

    def resize_rows(self, source: np.ndarray, *, flip: bool) -> np.ndarray:
        """Resize `source`, h x w x C uint8 pixels whose rows may lie apart (a box of a decode
        buffer), as `resize` does, mirrored if `flip`; return the H x W x C result, which is this
        resizer's until its next call. 4-byte pixels whose width changes take the turned
        horizontal pass of the module docstring; the others `resize`."""
        out_h, out_w = self.output_size
        height, width = source.shape[:2]
        result, result_tensor = self._result.views(out_h, out_w)
        kernel = _bilinear_out if self.interpolation == "bilinear" else _bicubic_out if self.interpolation == "bicubic" else None
        if self.channels != 4 or width == out_w or kernel is None:
            self.resize(torch.from_numpy(source).permute(2, 0, 1).unsqueeze(0), flip=flip, out=result_tensor)
            return result
        turned, turned_tensor = self._turned.views(width, height)
        cv2.transpose(source, dst=turned)
        columns, columns_tensor = self._columns.views(out_w, height)
        kernel(turned_tensor, [out_w, height], False, None, None, out=columns_tensor)
        if height == out_h:
            rows, rows_tensor = result, result_tensor
        else:
            rows, rows_tensor = self._turned.views(height, out_w)  # the turned box is read: its memory is free
        if flip:  # row i of the result is column i of `columns` read from its end
            cv2.rotate(columns, cv2.ROTATE_90_CLOCKWISE, dst=rows)
        else:
            cv2.transpose(columns, dst=rows)
        if height != out_h:
            kernel(rows_tensor, [out_h, out_w], False, None, None, out=result_tensor)
        return result

    def _flip_into(self, out: torch.Tensor) -> None:
        """Write the scratch image mirrored left to right into `out`."""
        if self._flip_with_opencv:
            pixels = out[0].permute(1, 2, 0)
            if pixels.is_contiguous():  # a slot's row
                cv2.flip(self._scratch_pixels, 1, dst=pixels.numpy())
                return
        out.copy_(self._scratch.flip(3))

    def resize_crop(self, source: torch.Tensor, *, resized: tuple[int, int], top: int, left: int, flip: bool, out: torch.Tensor) -> None:
        """Resize the whole of `source` ((1, C, h, w)) to `resized`, then write its box of the
        output size at (`top`, `left`), mirrored if `flip`, into `out`: torchvision's
        ``resize`` then ``crop`` on a uint8 tensor (a source already of size `resized` is cut
        as it is, as torchvision returns it unchanged)."""
        out_h, out_w = self.output_size
        if (source.shape[2], source.shape[3]) == resized:
            whole = source
        elif self.interpolation == "nearest":
            whole = torch.nn.functional.interpolate(source, size=resized, mode="nearest-exact")
        else:
            whole = torch.nn.functional.interpolate(source, size=resized, mode=self.interpolation, antialias=True, align_corners=False)
        box = whole[:, :, top : top + out_h, left : left + out_w]
        out.copy_(box.flip(3) if flip else box)


class _Pixels:
    """A uint8 buffer that grows as asked, seen as h x w x C pixels and as the (1, C, h, w)
    channels-last tensor of the same memory.

    The views of the last `_KEPT_VIEWS` shapes asked for are kept (making them took about 4 us,
    a tenth of a resize's cost): a resizer asks for one of the output's width, or its height, and
    the box's other side, so most shapes come back."""

    def __init__(self, channels: int) -> None:
        self.channels = channels
        self._flat = np.empty(0, np.uint8)
        self._tensor = torch.from_numpy(self._flat)
        self._views: dict[tuple[int, int], tuple[np.ndarray, torch.Tensor]] = {}

    def views(self, height: int, width: int) -> tuple[np.ndarray, torch.Tensor]:
        kept = self._views.get((height, width))
        if kept is not None:
            return kept
        channels = self.channels
        size = height * width * channels
        if size > self._flat.size:
            self._flat = np.empty(size, np.uint8)
            self._tensor = torch.from_numpy(self._flat)
            self._views.clear()  # views of the memory given up
        if len(self._views) >= _KEPT_VIEWS:
            self._views.clear()
        row = width * channels
        pixels = self._flat[:size].reshape(height, width, channels)
        made = self._views[height, width] = (pixels, self._tensor.as_strided((1, channels, height, width), (size, 1, row, channels)))
        return made


def match_channels(pixels: torch.Tensor, channels: int) -> torch.Tensor:
    """Return `pixels` (h x w x c uint8, c in 1, 3, 4) with `channels` channels: a view where
    one exists (same count, gray to RGB, RGBA to RGB), else a copy (RGB(A) to gray by Pillow's
    luma weights, gray or RGB to RGBA with opaque alpha)."""
    have = pixels.shape[2]
    if have == channels:
        return pixels
    if channels == 3:
        return pixels.expand(-1, -1, 3) if have == 1 else pixels[:, :, :3]
    if channels == 1:
        weights = torch.tensor(_LUMA, dtype=torch.int32)
        luma = (pixels[:, :, :3].to(torch.int32) * weights).sum(2, keepdim=True)
        return ((luma + 500) // 1000).to(torch.uint8)
    rgb = pixels.expand(-1, -1, 3) if have == 1 else pixels
    alpha = torch.full((*pixels.shape[:2], 1), 255, dtype=torch.uint8)
    return torch.cat([rgb, alpha], dim=2)
