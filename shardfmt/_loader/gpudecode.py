"""JPEG decoding in the training process, on the GPU: ``ImageTransform(decode="gpu")`` and ``"hybrid"``.

The workers still read, check and batch every record, but for a row marked "on GPU" they write
the JPEG's bytes into the slot instead of decoding them (`jpegbytes`), with the crop box that
the pipeline drew for it: the same pure function of (seed, epoch, record) as on the CPU path.
The training process then decodes the rows of a batch with one batched call of a
`BatchDecoder` (torchvision's nvJPEG decoder, `NvjpegDecoder`, which uses the hardware JPEG
engines of an A100/H100 where it can), cuts every box out of its image and resizes them all at
once (`resize_boxes`: torch's antialiased bilinear kernel, written as two batched matrix
products), flipping where the plan says.

With ``decode="hybrid"`` the CPU workers decode the first rows of every batch as usual and the
GPU the rest; `Split` sets the GPU's share from the rates measured so far: the workers' seconds
per decoded row (each worker writes the time it spent on every row into the slot) and the GPU
stage's seconds per row.

Nothing here imports torchvision until a decoder is opened; a test injects another
`BatchDecoder` (one that decodes on the CPU) by replacing `open_decoder`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from .._dataset.concat import RecordSource
from .._errors import DecodeError
from ..format._layout import column_name
from .jpegbytes import BOXES, BYTES, ON_GPU, SECONDS, SIZES, bytes_arrays

__all__ = [
    "DECODE_MODES",
    "BatchDecoder",
    "GpuDecodeStage",
    "NvjpegDecoder",
    "Split",
    "check_request",
    "max_payload",
    "open_decoder",
    "open_stage",
    "resize_boxes",
]

DECODE_MODES = ("cpu", "gpu", "hybrid")
GROUP_BYTES = 2 << 30
"""Bytes of one group of boxes resized together, 12 a value (the gather's int64 index and the
float32 batch): a batch of 256 boxes of 500 x 450 pixels is one group, larger images go in several."""


class BatchDecoder(Protocol):
    """Decodes a list of JPEGs (1-D uint8 CPU tensors) to (3, H, W) uint8 tensors on `device`."""

    device: torch.device

    def decode(self, data: list[torch.Tensor]) -> list[torch.Tensor]: ...


class NvjpegDecoder:
    """torchvision's batched nvJPEG decode (``torchvision.io.decode_jpeg(list, device=...)``), RGB.

    torchvision decodes baseline JPEGs with the GPU's hardware decoder where there is one and
    the others with nvJPEG's CUDA decoder; the call returns once the images are decoded, so the
    input bytes may be reused at once.
    """

    def __init__(self, device: torch.device) -> None:
        from torchvision.io import ImageReadMode, decode_jpeg

        self.device = device
        self._decode = decode_jpeg
        self._mode = ImageReadMode.RGB

    def decode(self, data: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self._decode(data, mode=self._mode, device=self.device))


def open_decoder(device: torch.device | None) -> BatchDecoder:
    """The GPU decoder for `device` (CUDA; None means "cuda").

    Raises:
        ValueError: the device is not a CUDA device, CUDA is not available, or torchvision (its
            nvJPEG decode) is not installed or was built without it.
    """
    device = torch.device("cuda") if device is None else device
    if device.type != "cuda":
        raise ValueError(
            f"decode='gpu' and decode='hybrid' decode on a CUDA device, but device={str(device)!r}; give device='cuda' or decode='cpu'"
        )
    if not torch.cuda.is_available():
        raise ValueError(
            (
                "decode='gpu' and decode='hybrid' need CUDA, but torch.cuda.is_available() is False on this machine; use decode='cpu' "
                "(the default)"
            )
        )
    try:
        decoder = NvjpegDecoder(device)
    except ImportError as err:
        raise ValueError(
            "decode='gpu' and decode='hybrid' decode with torchvision's nvJPEG (torchvision.io.decode_jpeg on a CUDA device), but "
            f"torchvision cannot be imported ({err}); "
            "install the torchvision that matches your torch, or use decode='cpu'"
        ) from err
    return decoder


def max_payload(dataset: RecordSource, field: str) -> int:
    """The largest stored payload of `field` in bytes, from every record table (at least 1)."""
    largest = 1
    column = column_name(field, "size")
    for shard in range(dataset.num_shards):
        reader = dataset.shard(shard)
        reader.check_all()
        table = reader.table
        if len(table):
            largest = max(largest, int(table[column].max()))
    return largest


def _aa_weights(sizes: torch.Tensor, out_size: int, width: int) -> torch.Tensor:
    """(n, out_size, width) float32: row i of image k holds the weights of torch's antialiased
    bilinear kernel (align_corners=False) for output pixel i from an input of sizes[k] pixels;
    columns from sizes[k] on are 0."""
    device = sizes.device
    size = sizes.to(torch.float32)[:, None]
    scale = size / out_size
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))
    invscale = torch.where(scale >= 1, 1.0 / scale, torch.ones_like(scale))
    center = scale * (torch.arange(out_size, device=device, dtype=torch.float32)[None, :] + 0.5)
    low = torch.floor(center - support + 0.5).clamp(min=0)
    high = torch.minimum(torch.floor(center + support + 0.5), size)
    j = torch.arange(width, device=device, dtype=torch.float32)[None, None, :]
    weights = (1 - ((j - center[..., None] + 0.5) * invscale[..., None]).abs()).clamp(min=0)
    weights = weights * ((j >= low[..., None]) & (j < high[..., None]))
    return weights / weights.sum(-1, keepdim=True).clamp(min=1e-12)


def resize_boxes(images: Sequence[torch.Tensor], boxes: np.ndarray, size: tuple[int, int], out: torch.Tensor) -> None:
    """Cut box k (top, left, height, width, flip) out of images[k] ((C, H, W) uint8), resize it
    to `size` with torch's antialiased bilinear kernel, mirror it if flip, and write it into
    out[k] ((H, W, C) uint8, on the images' device).

    The boxes go into one padded float32 batch (in groups of at most `GROUP_BYTES`) by one
    gather, and the resize is two batched matrix products with per-box weight matrices, so a
    batch costs a few kernels whatever the boxes' sizes. The result is the float kernel
    rounded once; torch's uint8 CPU kernel rounds after each pass, so pixels may differ by 1.
    """
    count = len(images)
    out_h, out_w = size
    start = 0
    while start < count:
        stop, box_h, box_w = start, 1, 1
        while stop < count:
            new_h, new_w = max(box_h, int(boxes[stop, 2])), max(box_w, int(boxes[stop, 3]))
            if stop > start and (stop - start + 1) * new_h * new_w * out.shape[3] * 12 > GROUP_BYTES:
                break
            box_h, box_w, stop = new_h, new_w, stop + 1
        _resize_group(images[start:stop], boxes[start:stop], (out_h, out_w), (box_h, box_w), out[start:stop])
        start = stop


def _resize_group(
    images: Sequence[torch.Tensor], boxes: np.ndarray, size: tuple[int, int], padded: tuple[int, int], out: torch.Tensor
) -> None:
    count, channels = len(images), out.shape[3]
    device = out.device
    # Every box gathered into one zero-padded float batch by one indexing kernel over the images
    # laid end to end (a copy per box costs ~20 us of Python each; this costs a few kernels).
    # Rows and columns past a box repeat its last one; their weights below are 0.
    flat = torch.cat([image.reshape(-1) for image in images])
    shapes = np.array([image.shape[1:] for image in images], np.int64).reshape(count, 2)
    planes = shapes[:, 0] * shapes[:, 1]
    bases = np.concatenate(([0], np.cumsum(planes * channels)[:-1]))
    meta = torch.from_numpy(np.column_stack((bases, planes, shapes[:, 1], boxes[:, :5].astype(np.int64)))).to(device)
    base, plane, stride, top, left, height, width, flip = meta.unbind(1)
    rows = top[:, None] + torch.minimum(torch.arange(padded[0], device=device)[None, :], height[:, None] - 1)
    columns = left[:, None] + torch.minimum(torch.arange(padded[1], device=device)[None, :], width[:, None] - 1)
    plane_offsets = torch.arange(channels, device=device)[None, :] * plane[:, None]  # (n, C)
    index = (base[:, None] + plane_offsets)[:, None, None, :] + (rows * stride[:, None])[:, :, None, None] + columns[:, None, :, None]
    batch = flat[index].to(torch.float32)  # (n, box_h, box_w, C)
    row_weights = _aa_weights(height, size[0], padded[0])  # (n, out_h, box_h)
    column_weights = _aa_weights(width, size[1], padded[1])  # (n, out_w, box_w)
    column_weights = torch.where(flip.bool()[:, None, None], column_weights.flip(1), column_weights)
    vertical = torch.bmm(row_weights, batch.view(count, padded[0], padded[1] * channels))  # (n, out_h, box_w * C)
    vertical = vertical.view(count, size[0], padded[1], channels).permute(0, 1, 3, 2).reshape(count, size[0] * channels, padded[1])
    result = torch.bmm(vertical, column_weights.transpose(1, 2))  # (n, out_h * C, out_w)
    out.copy_(result.view(count, size[0], channels, size[1]).permute(0, 1, 3, 2).round_().clamp_(0, 255))


class Split:
    """How many rows of each batch go to the GPU.

    "gpu": all of them. "hybrid": the GPU's share of the combined rate, ``gpu / (gpu + cpu)``,
    where the CPU's rate is ``workers / (seconds per CPU-decoded row)`` and the GPU's is
    ``1 / (seconds of the GPU stage per row)``, each a moving average over the batches so far;
    half the batch until both have been measured.
    """

    SMOOTHING = 0.3

    def __init__(self, mode: str, *, workers: int) -> None:
        self.mode = mode
        self.workers = max(1, workers)
        self.cpu_seconds: float | None = None
        """Seconds a worker spends on one row it decodes (moving average)."""
        self.gpu_seconds: float | None = None
        """Seconds of the GPU stage per row (moving average)."""

    @property
    def gpu_share(self) -> float:
        if self.mode == "gpu":
            return 1.0
        if self.cpu_seconds is None or self.gpu_seconds is None:
            return 0.5
        cpu_rate, gpu_rate = self.workers / self.cpu_seconds, 1.0 / self.gpu_seconds
        return gpu_rate / (gpu_rate + cpu_rate)

    def gpu_rows(self, count: int) -> int:
        return count if self.mode == "gpu" else min(count, max(0, round(count * self.gpu_share)))

    def observe(self, *, cpu_rows: int, cpu_seconds: float, gpu_rows: int, gpu_seconds: float) -> None:
        if cpu_rows and cpu_seconds > 0:
            self.cpu_seconds = _average(self.cpu_seconds, cpu_seconds / cpu_rows, self.SMOOTHING)
        if gpu_rows and gpu_seconds > 0:
            self.gpu_seconds = _average(self.gpu_seconds, gpu_seconds / gpu_rows, self.SMOOTHING)


def _average(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new


class GpuDecodeStage:
    """The training process's side of ``decode="gpu"``/``"hybrid"`` for the single-image form.

    Args:
        mode: "gpu" or "hybrid".
        decoder: a `BatchDecoder`; its device is where the images are decoded and delivered.
        field: the jpeg field; its slot array gives the output size (`set_size` changes it).
        workers: the loader's worker processes (for the CPU's rate in hybrid mode).
    """

    def __init__(self, mode: str, *, decoder: BatchDecoder, field: str, workers: int) -> None:
        if mode not in ("gpu", "hybrid"):
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {mode!r}")
        self.mode = mode
        self.decoder = decoder
        self.device = decoder.device
        self.field = field
        self.split = Split(mode, workers=workers)
        self.max_bytes = 1
        """The largest JPEG a slot row holds (`max_payload`)."""

    def slot_arrays(self) -> tuple[Any, ...]:
        """The extra arrays each slot holds (see `jpegbytes.bytes_arrays`)."""
        return bytes_arrays(self.max_bytes)

    def config(self) -> dict[str, Any]:
        """The workers' part: which field goes to the GPU as bytes."""
        return {"field": self.field, "max_bytes": self.max_bytes}

    def assign(self, arrays: dict[str, np.ndarray], count: int) -> None:
        """Mark the last rows of a slot about to be filled with `count` records as GPU rows."""
        flags = arrays[ON_GPU]
        flags[:] = 0
        flags[count - self.split.gpu_rows(count) : count] = 1

    def decode(
        self, tensors: dict[str, torch.Tensor], arrays: dict[str, np.ndarray], *, stream: Any = None
    ) -> tuple[dict[str, torch.Tensor], Any]:
        """Return the batch of a filled slot with the image field decoded on the device (N, H,
        W, C uint8: the CPU rows copied, the GPU rows decoded, cut and resized) in place of the
        slot's, the other fields as they are and none of the byte arrays; and the CUDA event
        after which the device no longer reads the slot (the copy of the CPU rows), or None
        when it reads nothing of it once this returns (the decoder takes the bytes at once).

        Args:
            tensors: the batch's fields (the image field: a view of the slot, N rows).
            arrays: the slot's arrays, the byte arrays of `jpegbytes` among them.
            stream: a CUDA stream (the device stage's side stream) for every copy and kernel.

        Raises:
            DecodeError: a JPEG does not decode, or not to the size its record table states;
                naming the dataset record.
        """
        if stream is None:
            return self._decode(tensors, arrays)
        with torch.cuda.stream(stream):
            return self._decode(tensors, arrays)

    def _decode(self, tensors: dict[str, torch.Tensor], arrays: dict[str, np.ndarray]) -> tuple[dict[str, torch.Tensor], Any]:
        slot_images = tensors[self.field]
        count = len(slot_images)
        on_gpu = np.flatnonzero(arrays[ON_GPU][:count])
        first = int(on_gpu[0]) if len(on_gpu) else count
        height, width, channels = slot_images.shape[1:]
        images = torch.empty((count, height, width, channels), dtype=torch.uint8, device=self.device)
        copied = None
        if first:
            images[:first].copy_(slot_images[:first], non_blocking=True)
            if images.device.type == "cuda":
                copied = torch.cuda.Event()
                copied.record()
        started = time.perf_counter()
        if len(on_gpu):
            sizes = arrays[SIZES]
            data = torch.from_numpy(arrays[BYTES])
            blobs = [data[row, : int(sizes[row])] for row in range(first, count)]
            boxes = arrays[BOXES][first:count]
            try:
                decoded = self.decoder.decode(blobs)
            except Exception as err:  # any failure of the decoder: find and name the record
                raise self._failure(blobs, boxes[:, 7], err) from err
            for k, image in enumerate(decoded):
                if image.shape[1] != int(boxes[k, 5]) or image.shape[2] != int(boxes[k, 6]):
                    raise DecodeError(
                        f"dataset record {int(boxes[k, 7])}: the JPEG decodes to {image.shape[2]}x{image.shape[1]} "
                        f"but the record table says {int(boxes[k, 6])}x{int(boxes[k, 5])}"
                    )
                if image.shape[0] != channels:
                    decoded[k] = image.expand(channels, -1, -1) if image.shape[0] == 1 else image[:channels]
            resize_boxes(decoded, boxes, (height, width), images[first:])
        gpu_seconds = time.perf_counter() - started
        seconds = arrays[SECONDS]
        self.split.observe(cpu_rows=first, cpu_seconds=float(seconds[:first].sum()), gpu_rows=count - first, gpu_seconds=gpu_seconds)
        helpers = (BYTES, SIZES, BOXES, ON_GPU, SECONDS)
        return {name: images if name == self.field else tensor for name, tensor in tensors.items() if name not in helpers}, copied

    def _failure(self, blobs: list[torch.Tensor], indices: np.ndarray, err: Exception) -> DecodeError:
        """Find the JPEG the batched decode failed on by decoding them one at a time."""
        for blob, index in zip(blobs, indices, strict=True):
            try:
                self.decoder.decode([blob])
            except Exception as single:
                return DecodeError(f"dataset record {int(index)}: the JPEG does not decode on {self.device}: {single}")
        return DecodeError(f"a batch of {len(blobs)} JPEGs does not decode on {self.device}: {err}")


def check_request(mode: str, *, augment: bool, image_type: str = "jpeg") -> None:
    """Raise ValueError where `mode` cannot serve the loader's other options (with ``fields=...``:
    `form.check_fields_form`)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {', '.join(repr(m) for m in DECODE_MODES)}, got {mode!r}")
    if mode == "cpu":
        return
    if augment:
        raise ValueError(f"decode={mode!r} cannot run augment= steps, which run in the workers on decoded samples; use decode='cpu'")
    if image_type != "jpeg":
        raise ValueError(f"decode={mode!r} decodes JPEG fields, but the image field is {image_type!r}; use decode='cpu'")



def open_stage(
    mode: str, *, device: torch.device | None, dataset: RecordSource, field: str, workers: int, augment: bool
) -> GpuDecodeStage | None:
    """The stage for ``ImageTransform(decode=mode)``; None for "cpu".

    Raises:
        ValueError: `mode` is unknown or cannot serve the other options, or there is no CUDA
            device or no torchvision nvJPEG decode to use (`open_decoder`).
    """
    image_type = dataset.schema.field(field).type if field in dataset.schema.names else "jpeg"
    check_request(mode, augment=augment, image_type=image_type)
    if mode == "cpu":
        return None
    stage = GpuDecodeStage(mode, decoder=open_decoder(device), field=field, workers=workers)
    stage.max_bytes = max_payload(dataset, field)
    return stage
