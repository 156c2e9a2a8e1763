"""The workers' side of GPU decoding: a row's JPEG bytes and crop box written into its slot.

With ``ImageTransform(decode="gpu")`` or ``"hybrid"`` every slot holds five more arrays besides the
outputs (`bytes_arrays`):

    .jpeg_bytes   (batch, max_bytes) uint8   the stored JPEG of each GPU row, as read and checked
    .jpeg_size    (batch,) int64             its length in bytes
    .jpeg_box     (batch, 8) int64           top, left, height, width, flip of the crop box (the
                                             pipeline's, as on the CPU path), the image's height
                                             and width from the record table, the dataset index
    .on_gpu       (batch,) uint8             1 where the row goes to the GPU; set by the loader
                                             before it sends the slot's chunks
    .row_seconds  (batch,) float64           the seconds the worker spent on the row (read,
                                             check, decode or copy): the CPU's measured rate

`max_bytes` is the largest payload of the field in the record tables, so every record fits.
Nothing is pickled: the bytes go from the memory-mapped shard into shared memory in one copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .shm import SlotArray

__all__ = ["BOXES", "BYTES", "ON_GPU", "SECONDS", "SIZES", "JpegBytesWriter", "bytes_arrays"]

BYTES, SIZES, BOXES, ON_GPU, SECONDS = ".jpeg_bytes", ".jpeg_size", ".jpeg_box", ".on_gpu", ".row_seconds"


def bytes_arrays(max_bytes: int) -> tuple[SlotArray, ...]:
    """The slot arrays of GPU decoding (see the module docstring)."""
    return (
        SlotArray(BYTES, (max(1, max_bytes),), "|u1"),
        SlotArray(SIZES, (), "<i8"),
        SlotArray(BOXES, (8,), "<i8"),
        SlotArray(ON_GPU, (), "|u1"),
        SlotArray(SECONDS, (), "<f8"),
    )


class JpegBytesWriter:
    """Writes GPU rows into a slot's arrays (in a worker, or in the loader without workers).

    Args:
        config: ``{"field": name, "max_bytes": n}`` from the loader.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.field = str(config["field"])
        self.max_bytes = int(config["max_bytes"])

    def write(
        self,
        arrays: dict[str, np.ndarray],
        row: int,
        data: memoryview,
        box: tuple[int, int, int, int, bool],
        *,
        height: int,
        width: int,
        index: int,
    ) -> None:
        """Store one record's JPEG and its crop box in row `row` of a slot's `arrays`.

        Raises:
            ValueError: the payload is larger than the slots allow (the tables said otherwise).
        """
        size = len(data)
        if size > self.max_bytes:
            raise ValueError(f"a JPEG of {size} bytes does not fit the {self.max_bytes} bytes a slot row holds")
        arrays[BYTES][row, :size] = np.frombuffer(data, np.uint8)
        arrays[SIZES][row] = size
        top, left, box_height, box_width, flip = box
        arrays[BOXES][row] = (top, left, box_height, box_width, int(flip), height, width, index)
