"""Decode a JPEG with libjpeg-turbo and resize a box of it straight into an output slot.

Per image: pick the largest DCT scale (1/2, 1/4, 1/8) that keeps the box at least as large as the
output (`dct_scale`; the pipelines have snapped the box's edges to it), decode into a reused
buffer at that scale (as RGB, grayscale or RGBA, whatever the stored channels: libjpeg-turbo
converts), take the box as one strided view of that buffer, then resize it with `Resizer`
(torch's antialiased bilinear kernel, matching PIL's BILINEAR, or nearest) writing into the
slot's view (`as_target`), and flip there if asked. With nearest interpolation no DCT scaling is
used, since it averages pixels. The decoder allocates its buffers once. For records the caller
trusts (decoded before without error, or checked against their checksum in a dataset the
converter strictly decoded), a full-scale RGB box is decoded alone (`jpegcrop`); for outputs of
`WIDE_MIN_PIXELS` or more, as 4-byte pixels (RGBX), resized as such and packed back to RGB in
the slot: about 40 us a 224x224 box less than 3-byte pixels on the build machine
(libjpeg-turbo writes them faster, and torch's resize reads them without widening them first),
the same values. Their resize reads the box where it lies in the decode buffer and runs the
horizontal pass on it turned on its side, flipping it on the way back (`Resizer.resize_rows`).
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import simplejpeg
import torch

from .._errors import DecodeError, LimitError
from ._crop import dct_scale
from ._jpegcrop import CropDecoder
from ._resize import Resizer

__all__ = ["MAX_DECODE_PIXELS", "ImageDecoder", "as_target"]

MAX_DECODE_PIXELS = 1 << 28
"""Largest height x width the loader decodes (256 Mpx, 768 MiB of RGB): a decompression-bomb cap,
checked from the record table before the decode buffer is sized."""

_COLORSPACES = {1: "GRAY", 3: "RGB", 4: "RGBA"}
WIDE_MIN_PIXELS = 2048
"""Outputs of at least this many pixels take the partial decode's 4-byte path (RGBX, the turned
resize, the pack into the slot). Its calls cost about 8 us a box more than 3-byte pixels
resized straight into the slot, and it saves a share of the decode and resize: 3-byte pixels
were 5 us faster at 32x32 outputs (34 against 39), 4-byte ones 4 us faster at 64x48 (63
against 67) and 20 at 96x96 (99 against 120), boxes of a third to all of each side of square
JPEGs 1.5 times the output's side, one core of the build machine."""


class ImageDecoder:
    """Decode-crop-resize-flip into caller-provided HxWxC uint8 arrays.

    Args:
        max_height, max_width: the largest source image it will see (from the record table).
        output_size: (height, width) of every output.
        fast: use libjpeg-turbo's fast integer IDCT and upsampling (a few % faster; crops stay
            within about 44 dB PSNR of an exact decode).
        channels: C of the outputs: 3 (RGB), 1 (grayscale) or 4 (RGBA, alpha 255).
        interpolation: "bilinear" or "bicubic" (antialiased), or "nearest".
        partial: decode only the box of records the caller trusts (`decode_box(trusted=True)`)
            with libjpeg-turbo's partial decoding (`jpegcrop.CropDecoder`), where it is
            available and the output is fast-decoded RGB at full scale; the pixels are the same.

    `in_partial_decode` is a one-byte writable buffer that holds 1 while the partial decoder
    runs and 0 otherwise; a loader worker replaces it with a byte of shared memory, so that the
    loader can tell a worker that libjpeg ended (it reports fatal errors by ``exit()``) from one
    that died elsewhere.
    """

    def __init__(
        self,
        *,
        max_height: int,
        max_width: int,
        output_size: tuple[int, int],
        fast: bool = True,
        channels: int = 3,
        interpolation: str = "bilinear",
        partial: bool = False,
    ) -> None:
        if max_height * max_width > MAX_DECODE_PIXELS:
            raise LimitError(
                f"an image of {max_height}x{max_width} exceeds the decode limit of {MAX_DECODE_PIXELS} pixels"
            )
        if channels not in _COLORSPACES:
            raise ValueError(f"channels must be 1, 3 or 4, got {channels}")
        self.output_size = output_size
        self.fast = fast
        self.channels = channels
        self.interpolation = interpolation
        self._colorspace = _COLORSPACES[channels]
        self._buffer = np.empty(max(1, max_height * max_width * channels), np.uint8)
        self._buffer_tensor = torch.from_numpy(self._buffer)
        self._resizer = Resizer(output_size=output_size, channels=channels, interpolation=interpolation)
        self._dct_scaling = interpolation != "nearest"
        self._crop: CropDecoder | None = None
        self.in_partial_decode: Any = memoryview(bytearray(1))
        self._wide = output_size[0] * output_size[1] >= WIDE_MIN_PIXELS
        if partial and fast and channels == 3 and CropDecoder.available():
            # 4-byte pixels (RGBX) for outputs of at least WIDE_MIN_PIXELS: libjpeg-turbo writes
            # them and torch's resize reads them faster; the resized box is packed back to RGB
            # into the slot. Smaller outputs take 3-byte pixels resized straight into the slot.
            self._crop = CropDecoder(max_height=max_height, max_width=max_width, pixel_bytes=4 if self._wide else 3)
            if self._wide:
                self._crop_rows = self._crop.buffer.reshape(-1, self._crop.row_stride)  # row r of a decode is row r here
                self._wide_resizer = Resizer(output_size=output_size, channels=4, interpolation=interpolation)
                # the last target and its H x W x 3 array (None if not contiguous): a transformed
                # sample is always decoded into the loader's scratch sample, and making the array
                # took about 10 us. One only: a loader lets go of a slot's views to unmap it.
                self._last_target: tuple[torch.Tensor | None, np.ndarray | None] = (None, None)
            else:
                self._crop_tensor = torch.from_numpy(self._crop.buffer)

    def decode_box(
        self,
        data: memoryview | bytes,
        *,
        height: int,
        width: int,
        top: int,
        left: int,
        box_height: int,
        box_width: int,
        flip: bool,
        out: torch.Tensor,
        trusted: bool = False,
    ) -> None:
        """Write the box [top, top+box_height) x [left, left+box_width) of the image, resized to
        the output size and optionally mirrored, into `out`: a (1, C, H, W) uint8 view of an
        H x W x C array (see `as_target`).

        `trusted`: the caller has decoded these very bytes before without error (and checked
        their checksum), or has just matched them against the checksum of a dataset whose
        converter strictly decoded every JPEG, so the partial decoder, which cannot raise, may
        take them.

        Raises:
            ValueError: from libjpeg-turbo when the data is corrupt (the caller names the record).
            DecodeError: the JPEG's size is not the size the record table states.
        """
        scale = dct_scale(box_height, box_width, self.output_size) if self._dct_scaling else 1
        if trusted and scale == 1 and self._crop is not None:
            flag = self.in_partial_decode
            flag[0] = 1
            try:
                start = self._crop.decode(data, top=top, left=left, box_height=box_height, box_width=box_width)
            finally:
                flag[0] = 0
            if self._wide:
                box = self._crop_rows[:box_height, start : start + 4 * box_width].reshape(box_height, box_width, 4)
                self._pack(self._wide_resizer.resize_rows(box, flip=flip), out)
            else:
                stride = self._crop.row_stride
                source = self._crop_tensor.as_strided((1, 3, box_height, box_width), (box_height * stride, 1, stride, 3), start)
                self._resizer.resize(source, flip=flip, out=out)
            return
        if scale == 1:
            image = simplejpeg.decode_jpeg(
                data, colorspace=self._colorspace, fastdct=self.fast, fastupsample=self.fast, buffer=self._buffer
            )
            y0, y1, x0, x1 = top, top + box_height, left, left + box_width
        else:
            image = simplejpeg.decode_jpeg(
                data,
                colorspace=self._colorspace,
                fastdct=self.fast,
                fastupsample=self.fast,
                min_height=-(-height // scale),
                min_width=-(-width // scale),
                min_factor=scale,
                buffer=self._buffer,
            )
            y0, x0 = top // scale, left // scale
            y1 = -(-(top + box_height) // scale)
            x1 = -(-(left + box_width) // scale)
        decoded_h, decoded_w = image.shape[0], image.shape[1]
        if decoded_h != -(-height // scale) or decoded_w != -(-width // scale):
            raise DecodeError(f"the JPEG decodes to {decoded_w * scale}x{decoded_h * scale} but the record table says {width}x{height}")
        # One strided view of the decode buffer instead of from_numpy + slice + permute + unsqueeze.
        channels = self.channels
        row = decoded_w * channels
        source = self._buffer_tensor.as_strided(
            (1, channels, y1 - y0, x1 - x0), (decoded_h * row, 1, row, channels), y0 * row + x0 * channels
        )
        self._resizer.resize(source, flip=flip, out=out)

    def _pack(self, wide: np.ndarray, out: torch.Tensor) -> None:
        """Write `wide`, the resized box's H x W x 4 RGBX pixels, as RGB into `out`."""
        last = self._last_target
        if last[0] is not out:
            pixels = out[0].permute(1, 2, 0)
            last = self._last_target = (out, pixels.numpy() if pixels.is_contiguous() else None)
        if last[1] is not None:
            cv2.cvtColor(wide, cv2.COLOR_RGBA2RGB, dst=last[1])  # about 4 us for 224x224
        else:
            out[0].permute(1, 2, 0).copy_(torch.from_numpy(wide[:, :, :3]))

    def decode_resized_crop(
        self,
        data: memoryview | bytes,
        *,
        height: int,
        width: int,
        resized: tuple[int, int],
        top: int,
        left: int,
        flip: bool,
        out: torch.Tensor,
    ) -> None:
        """Decode the whole image at full scale, resize it to `resized` and write its box of the
        output size at (`top`, `left`) into `out` (see `Resizer.resize_crop`): torchvision's
        ``Resize`` then ``CenterCrop``, pixel for pixel. The decode is libjpeg's default (exact
        IDCT, fancy upsampling: PIL's and torchvision's), whatever `fast`: the fast one moves
        such crops to 33-41 dB PSNR of torchvision's. No DCT scaling either: a 1/2-scale decode
        moves them to 31-36 dB at 256/224.

        Raises:
            ValueError: from libjpeg-turbo when the data is corrupt (the caller names the record).
            DecodeError: the JPEG's size is not the size the record table states.
        """
        image = simplejpeg.decode_jpeg(data, colorspace=self._colorspace, fastdct=False, fastupsample=False, buffer=self._buffer)
        decoded_h, decoded_w = image.shape[0], image.shape[1]
        if decoded_h != height or decoded_w != width:
            raise DecodeError(f"the JPEG decodes to {decoded_w}x{decoded_h} but the record table says {width}x{height}")
        channels = self.channels
        row = decoded_w * channels
        source = self._buffer_tensor.as_strided((1, channels, decoded_h, decoded_w), (decoded_h * row, 1, row, channels), 0)
        self._resizer.resize_crop(source, resized=resized, top=top, left=left, flip=flip, out=out)


def as_target(images: np.ndarray) -> torch.Tensor:
    """Return N x H x W x C uint8 images as the (N, C, H, W) channels_last view `decode_box`
    writes into; ``as_target(a)[k : k + 1]`` is image k."""
    return torch.from_numpy(images).permute(0, 3, 1, 2)
