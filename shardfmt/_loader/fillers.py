"""The step that fills one field of one slot row, in a worker, from a record's table row and payload.

Workers receive the loader's `OutputSpec`s as plain config and build one filler per field with
`make_filler`:

- "jpeg": decoded at a reduced DCT scale where the box allows, cropped, resized (`ImageDecoder`,
  made again larger whenever an image exceeds its buffer);
- "raw": the box is cut from a view of the memory-mapped shard, its channels matched, and
  resized straight into the slot, or copied when it already has the output size: no other copy;
- "ndarray", "int64", "float64": copied as stored; "zeros": the labels of a loader without a
  label field.

A spec of type "index" (``Output(return_indices=True)``, `options.index_output`) has no filler:
the worker writes the chunk's dataset indices into it at once.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from ..format._layout import column_name
from ..format._reader import ShardReaderBase
from ..ops._crop import CenterCrop
from ..ops._decode import ImageDecoder
from ..ops._resize import Resizer, match_channels
from .outputs import OutputSpec

__all__ = ["make_filler"]


class _Filler:
    """Fills one field of one slot row from a record's table row (and payload)."""

    reads_payload = True

    def __init__(self, spec: OutputSpec, *, center: CenterCrop | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.center = center
        self.size = (spec.shape[0], spec.shape[1]) if spec.is_image else (0, 0)

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        """Write the field of the record in `row` into row `index` of `out`: for an image field
        a list of (1, C, H, W) views of the slot's images (`shardfmt.ops._decode.as_target`), for
        the others the slot's numpy array. `trusted`: this loader has read the record before and
        decoded it without error, or its checksum has just matched in a dataset whose converter
        strictly decoded every JPEG (see `ImageDecoder.decode_box`)."""
        raise NotImplementedError

    def payload(self, reader: ShardReaderBase, row: Any) -> memoryview:
        start = int(row[column_name(self.name, "offset")])
        return reader.source.read(start, start + int(row[column_name(self.name, "size")]))


class _JpegFiller(_Filler):
    def __init__(self, spec: OutputSpec, *, fast: bool, partial: bool, center: CenterCrop | None = None) -> None:
        super().__init__(spec, center=center)
        self.fast, self.partial = fast, partial
        self.capacity = (0, 0)
        self._make_decoder(*spec.max_size)

    def _make_decoder(self, max_height: int, max_width: int) -> None:
        height, width, channels = self.spec.shape
        previous = getattr(self, "decoder", None)
        self.decoder = ImageDecoder(
            max_height=max_height,
            max_width=max_width,
            output_size=(height, width),
            fast=self.fast,
            channels=channels,
            interpolation=self.spec.interpolation,
            partial=self.partial,
        )
        if previous is not None:  # a grown decoder keeps the flag a loader worker shares with its pool
            self.decoder.in_partial_decode = previous.in_partial_decode
        self.capacity = (max_height, max_width)

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        if box is None:
            raise ValueError(f"image field {self.name!r} is filled without a crop box")
        top, left, box_height, box_width, flip = box
        height, width = int(row[column_name(self.name, "height")]), int(row[column_name(self.name, "width")])
        if height > self.capacity[0] or width > self.capacity[1]:
            self._make_decoder(max(height, self.capacity[0]), max(width, self.capacity[1]))
        if self.center is not None:
            resized_h, resized_w, crop_top, crop_left = self.center.resized_crop(height, width, size=self.size)
            self.decoder.decode_resized_crop(
                self.payload(reader, row),
                height=height,
                width=width,
                resized=(resized_h, resized_w),
                top=crop_top,
                left=crop_left,
                flip=flip,
                out=out[index],
            )
            return
        self.decoder.decode_box(
            self.payload(reader, row),
            height=height,
            width=width,
            top=top,
            left=left,
            box_height=box_height,
            box_width=box_width,
            flip=flip,
            out=out[index],
            trusted=trusted,
        )


class _RawFiller(_Filler):
    def __init__(self, spec: OutputSpec, *, center: CenterCrop | None = None) -> None:
        super().__init__(spec, center=center)
        height, width, channels = spec.shape
        self.channels = channels
        self.resizer = Resizer(output_size=(height, width), channels=channels, interpolation=spec.interpolation)
        self._columns = tuple(column_name(self.name, c) for c in ("offset", "height", "width", "channels"))
        self._files: dict[str, torch.Tensor] = {}

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        if box is None:
            raise ValueError(f"image field {self.name!r} is filled without a crop box")
        top, left, box_height, box_width, flip = box
        values, names = row.item(), row.dtype.names  # one tuple of the row: cheaper than four reads by name
        offset, height, width, channels = (values[names.index(column)] for column in self._columns)
        if self.center is not None:  # the whole image is resized, then cut (CenterCrop.resized_crop)
            top, left, box_height, box_width = 0, 0, height, width
        if reader.source.zero_copy:
            whole = self._files.get(reader.path)
            if whole is None:
                whole = self._files[reader.path] = _tensor(reader.source.read(0, reader.source.size))
        else:
            whole = _tensor(reader.source.read(offset, offset + height * width * channels))
            offset = 0
        # The box as one strided view of the mapped pixels: rows of width * channels bytes.
        start = offset + (top * width + left) * channels
        if channels == self.channels:  # (1, C, h, w) at once
            row_bytes = width * channels
            source = whole.as_strided((1, channels, box_height, box_width), (box_height * row_bytes, 1, row_bytes, channels), start)
        else:
            region = whole.as_strided((box_height, box_width, channels), (width * channels, channels, 1), start)
            source = match_channels(region, self.channels).permute(2, 0, 1).unsqueeze(0)
        if self.center is not None:
            resized_h, resized_w, crop_top, crop_left = self.center.resized_crop(height, width, size=self.size)
            self.resizer.resize_crop(source, resized=(resized_h, resized_w), top=crop_top, left=crop_left, flip=flip, out=out[index])
            return
        self.resizer.resize(source, flip=flip, out=out[index])


def _tensor(buffer: memoryview) -> torch.Tensor:
    """A uint8 tensor over read-only bytes, without a copy (the loader never writes through it)."""
    if not len(buffer):
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given buffer is not writable"
        return torch.frombuffer(buffer, dtype=torch.uint8)


class _ArrayFiller(_Filler):
    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        out[index] = np.frombuffer(self.payload(reader, row), self.spec.dtype).reshape(self.spec.shape)


class _ScalarFiller(_Filler):
    reads_payload = False

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        out[index] = row[self.name]


class _ZerosFiller(_Filler):
    reads_payload = False

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        out[index] = 0


def make_filler(spec: OutputSpec, *, fast_decode: bool, partial: bool = False, center: CenterCrop | None = None) -> _Filler:
    """Return the step that fills `spec`'s field of a slot row; `partial` lets a jpeg field
    decode only the crop box of trusted records (in worker processes only: see `ops.jpegcrop`).
    With `center` (the loader's pipeline, when it is a `CenterCrop`), an image field is resized
    whole and cut as torchvision's ``Resize`` + ``CenterCrop`` (`CenterCrop.resized_crop`), its
    crop box unused."""
    if spec.type == "jpeg":
        return _JpegFiller(spec, fast=fast_decode, partial=partial, center=center)
    if spec.type == "raw":
        return _RawFiller(spec, center=center)
    if spec.type == "ndarray":
        return _ArrayFiller(spec)
    if spec.type == "zeros":
        return _ZerosFiller(spec)
    return _ScalarFiller(spec)
