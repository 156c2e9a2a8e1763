"""Decode a JPEG with libjpeg-turbo and resize a box of it straight into an output slot.

Per image: pick the largest DCT scale (1/2, 1/4, 1/8) that keeps the box at least as large as the
output, decode into a reused buffer at that scale, then resize the box with torch's antialiased
bilinear kernel (the one torchvision's resize uses, matching PIL's BILINEAR) writing into the
slot, and flip there if asked. The decoder allocates its buffers once.
"""

from __future__ import annotations

import numpy as np
import simplejpeg
import torch

from ..errors import DecodeError, LimitError
from .crop import dct_scale

__all__ = ["MAX_DECODE_PIXELS", "ImageDecoder", "as_target"]

MAX_DECODE_PIXELS = 1 << 28
"""Largest height x width the loader decodes (256 Mpx, 768 MiB of RGB): a decompression-bomb cap,
checked from the record table before the decode buffer is sized."""

_resize_out = getattr(getattr(torch._C, "_nn", None), "_upsample_bilinear2d_aa", None)


class ImageDecoder:
    """Decode-crop-resize-flip into caller-provided HxWx3 uint8 arrays.

    Args:
        max_height, max_width: the largest source image it will see (from the record table).
        output_size: (height, width) of every output.
        fast: use libjpeg-turbo's fast integer IDCT and upsampling (a few % faster; crops stay
            within about 44 dB PSNR of an exact decode).
    """

    def __init__(self, *, max_height: int, max_width: int, output_size: tuple[int, int], fast: bool = True) -> None:
        if max_height * max_width > MAX_DECODE_PIXELS:
            raise LimitError(
                f"an image of {max_height}x{max_width} exceeds the decode limit of {MAX_DECODE_PIXELS} pixels"
            )
        self.output_size = output_size
        self.fast = fast
        self._buffer = np.empty(max(1, max_height * max_width * 3), np.uint8)
        self._buffer_tensor = torch.from_numpy(self._buffer)
        self._scratch = torch.empty((1, 3, *output_size), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        self._use_out = _resize_out is not None

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
    ) -> None:
        """Write the box [top, top+box_height) x [left, left+box_width) of the image, resized to
        the output size and optionally mirrored, into `out`: a (1, 3, H, W) uint8 view of an
        H x W x 3 array (see `as_target`).

        Raises:
            ValueError: from libjpeg-turbo when the data is corrupt (the caller names the record).
            DecodeError: the JPEG's size is not the size the record table states.
        """
        out_h, out_w = self.output_size
        scale = dct_scale(box_height, box_width, self.output_size)
        if scale == 1:
            image = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=self.fast, fastupsample=self.fast, buffer=self._buffer)
            y0, y1, x0, x1 = top, top + box_height, left, left + box_width
        else:
            image = simplejpeg.decode_jpeg(
                data,
                colorspace="RGB",
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
        row = decoded_w * 3
        source = self._buffer_tensor.as_strided((1, 3, y1 - y0, x1 - x0), (decoded_h * row, 1, row, 3), y0 * row + x0 * 3)
        destination = self._scratch if flip else out
        if y1 - y0 == out_h and x1 - x0 == out_w:
            destination.copy_(source)
        elif self._use_out:
            _resize_out(source, [out_h, out_w], False, None, None, out=destination)
        else:
            destination.copy_(torch.nn.functional.interpolate(source, size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False))
        if flip:
            out.copy_(self._scratch.flip(3))  # 19 us for 224x224; numpy's reversed copy takes 220


def as_target(images: np.ndarray) -> torch.Tensor:
    """Return N x H x W x 3 uint8 images as the (N, 3, H, W) channels_last view `decode_box`
    writes into; ``as_target(a)[k : k + 1]`` is image k."""
    return torch.from_numpy(images).permute(0, 3, 1, 2)
