"""Decode a JPEG with libjpeg-turbo and resize a box of it straight into an output slot.

Per image: pick the largest DCT scale (1/2, 1/4, 1/8) that keeps the box at least as large as the
output, decode into a reused buffer at that scale (as RGB, grayscale or RGBA, whatever the
stored channels: libjpeg-turbo converts), then resize the box with `Resizer` (torch's
antialiased bilinear kernel, matching PIL's BILINEAR, or nearest) writing into the slot, and flip
there if asked. With nearest interpolation no DCT scaling is used, since it averages pixels. The
decoder allocates its buffers once.
"""

from __future__ import annotations

import numpy as np
import simplejpeg
import torch

from ..errors import DecodeError, LimitError
from .resize import Resizer

__all__ = ["MAX_DECODE_PIXELS", "ImageDecoder"]

MAX_DECODE_PIXELS = 1 << 28
"""Largest height x width the loader decodes (256 Mpx, 768 MiB of RGB): a decompression-bomb cap,
checked from the record table before the decode buffer is sized."""

_COLORSPACES = {1: "GRAY", 3: "RGB", 4: "RGBA"}


class ImageDecoder:
    """Decode-crop-resize-flip into caller-provided HxWxC uint8 arrays.

    Args:
        max_height, max_width: the largest source image it will see (from the record table).
        output_size: (height, width) of every output.
        fast: use libjpeg-turbo's fast integer IDCT and upsampling (a few % faster; crops stay
            within about 44 dB PSNR of an exact decode).
        channels: C of the outputs: 3 (RGB), 1 (grayscale) or 4 (RGBA, alpha 255).
        interpolation: "bilinear" (antialiased) or "nearest".
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
        self._colorspace = _COLORSPACES[channels]
        self._buffer = np.empty(max(1, max_height * max_width * channels), np.uint8)
        self._resizer = Resizer(output_size=output_size, channels=channels, interpolation=interpolation)
        self._scales = (8, 4, 2) if interpolation == "bilinear" else ()

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
        out: np.ndarray,
    ) -> None:
        """Write the box [top, top+box_height) x [left, left+box_width) of the image, resized to
        the output size and optionally mirrored, into `out` (output_size + (C,), uint8, C-contiguous).

        Raises:
            ValueError: from libjpeg-turbo when the data is corrupt (the caller names the record).
        """
        out_h, out_w = self.output_size
        scale = 1
        for candidate in self._scales:
            if box_height >= candidate * out_h and box_width >= candidate * out_w:
                scale = candidate
                break
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
            y1 = min(image.shape[0], -(-(top + box_height) // scale))
            x1 = min(image.shape[1], -(-(left + box_width) // scale))
        if image.shape[0] * scale < height - scale or image.shape[1] * scale < width - scale:
            raise DecodeError(f"decoded {image.shape[1]}x{image.shape[0]} at 1/{scale} scale, but the table says {width}x{height}")
        self._resizer.resize(torch.from_numpy(image[y0:y1, x0:x1]), flip=flip, out=out)
