"""`Dataset`: a map-style torch Dataset over a shardfmt dataset, for existing DataLoader code.

``DataLoader(shardfmt.Dataset(path), batch_size=256, num_workers=8, shuffle=True)`` replaces
``DataLoader(ImageFolder(path, transform), ...)`` in one line. Pickling it sends only the path and
settings: each worker opens the shards itself (memory-mapped) on first access.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._dataset.reader import DatasetReader
from .._errors import DecodeError, SchemaError
from .._storage import RemoteOptions
from .._storage.remote import forks_safely
from ..format._layout import column_name
from ..ops import CenterCrop, CropPlan, Pipeline
from ..ops._augment import SampleTransform
from ..ops._decode import ImageDecoder, as_target
from ..ops._transform import ImageTransform
from .options import as_transform

__all__ = ["Dataset"]


class Dataset(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Record i -> (image, label): image a uint8 tensor CHW (or HWC), float32 where the
    transform normalises; label an int.

    Args:
        path: the dataset directory or its manifest, or tars as `open_dataset` takes them.
        transform: what happens to each image, as a `Loader` takes it: an `ImageTransform`
            (crop, size, interpolation, augment steps, mean/std, fast_decode; decode "cpu"),
            or a crop alone ("train", "eval", "resize" or a `shardfmt.ops.Pipeline`).
        layout: "CHW" (as torchvision's PILToTensor gives) or "HWC".
        verify: check each record's checksum before decoding.
        image_field, label_field: field names.
        remote: for a dataset given by URL, how to read it (see `RemoteOptions`).

    A ``gs://`` dataset needs DataLoader workers that are not forked
    (``multiprocessing_context="forkserver"``): gcsfs reads it over gRPC, whose state does not
    survive fork; a forked worker raises RuntimeError saying so.

    Random crops, flips and augment steps draw from torch's random generator, so DataLoader's
    per-worker seeding makes them differ between workers and epochs.

    Raises:
        ValueError: `layout` is unknown, or the transform decodes elsewhere than on the CPU.
        SchemaError: the image field is not a jpeg field.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        transform: ImageTransform | Pipeline | str = "train",
        layout: str = "CHW",
        verify: bool = True,
        image_field: str = "image",
        label_field: str | None = "label",
        remote: RemoteOptions | None = None,
    ) -> None:
        if layout not in ("CHW", "HWC"):
            raise ValueError(f"layout must be 'CHW' or 'HWC', got {layout!r}")
        self.path: str | list[str] = os.fspath(path) if isinstance(path, (str, os.PathLike)) else [os.fspath(p) for p in path]
        self.transform = as_transform(transform)
        if self.transform.decode != "cpu":
            raise ValueError(f"Dataset decodes in its DataLoader's workers; decode={self.transform.decode!r} needs a Loader")
        self.pipeline = self.transform.pipeline
        self.layout = layout
        self.verify = verify
        self.image_field = image_field
        self.label_field = label_field
        self.remote = remote
        reader = DatasetReader(self.path, verify=verify, remote=remote)
        self._length = len(reader)
        kind = reader.schema.field(image_field).type
        reader.close()
        if kind != "jpeg":
            raise SchemaError(f"field {image_field!r} is {kind!r}: Dataset decodes jpeg fields; use Loader(fields=...) for raw ones")
        self._reader: DatasetReader | None = None
        self._decoder: ImageDecoder | None = None
        self._steps: SampleTransform | None = None
        self._opened_in = os.getpid()
        """The process that opened the dataset: one forked from it inherits this object unpickled."""
        locations = [self.path] if isinstance(self.path, str) else self.path
        self._forks_safely = all(forks_safely(location) for location in locations)

    def __len__(self) -> int:
        return self._length

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = state["_decoder"] = state["_steps"] = state["_opened_in"] = None
        return state

    def _decode(self, data: Any, *, height: int, width: int, plan: CropPlan, out: torch.Tensor) -> None:
        """Decode the crop into `out`: the plan's box, or for a `CenterCrop` torchvision's
        resize of the whole image then centered crop (`CenterCrop.resized_crop`)."""
        decoder = self._decoder
        if decoder is None:
            raise RuntimeError("the decoder is made before the first decode")
        if isinstance(self.pipeline, CenterCrop):
            resized_h, resized_w, top, left = self.pipeline.resized_crop(height, width)
            decoder.decode_resized_crop(
                data, height=height, width=width, resized=(resized_h, resized_w), top=top, left=left, flip=False, out=out
            )
            return
        decoder.decode_box(
            data,
            height=height,
            width=width,
            top=int(plan.top[0]),
            left=int(plan.left[0]),
            box_height=int(plan.height[0]),
            box_width=int(plan.width[0]),
            flip=bool(plan.flip[0]),
            out=out,
        )

    def _augment(self, image: np.ndarray, index: int, key: int) -> np.ndarray:
        """`image` (H x W x 3 uint8) through the transform's steps and normalisation, drawn from `key`."""
        transform = self.transform
        if not transform.augment and transform.mean is None:
            return image
        if self._steps is None:
            height, width = image.shape[:2]
            self._steps = SampleTransform(transform.augment, height=height, width=width, mean=transform.mean, std=transform.std)
        out = np.empty(image.shape, np.float32 if transform.mean is not None else np.uint8)
        self._steps.apply(image, self._steps.draw(key, 0, np.array([index])), 0, out)
        return out

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self._reader is None:
            if not self._forks_safely and self._opened_in not in (None, os.getpid()):
                raise RuntimeError(
                    f"{self.path} cannot be read in a forked DataLoader worker: gcsfs reads it over gRPC, whose state "
                    "does not survive fork; pass multiprocessing_context='forkserver' (or 'spawn') to the DataLoader"
                )
            self._reader = DatasetReader(self.path, verify=self.verify, remote=self.remote)
        shard_index, local = self._reader.locate(index)
        shard = self._reader.shard(shard_index)
        shard.check_row(local)
        row = shard.table[local]
        height = int(row[column_name(self.image_field, "height")])
        width = int(row[column_name(self.image_field, "width")])
        key = np.array([torch.randint(0, 2**62, ()).item()], dtype=np.uint64)
        plan = self.pipeline.plan(np.array([height]), np.array([width]), key)
        if self._decoder is None or self._decoder._buffer.size < height * width * 3:
            self._decoder = ImageDecoder(
                max_height=height,
                max_width=width,
                output_size=self.pipeline.size,
                fast=self.transform.fast_decode,
                interpolation=self.transform.interpolation,
            )
        out = np.empty((*self.pipeline.size, 3), np.uint8)
        start = int(row[column_name(self.image_field, "offset")])
        if shard.verify:
            shard.verify_record(local)
        data = shard.source.read(start, start + int(row[column_name(self.image_field, "size")]))
        try:
            self._decode(data, height=height, width=width, plan=plan, out=as_target(out[None]))
        except ValueError as err:
            raise DecodeError(
                f"image field {self.image_field!r} does not decode: {err}", path=shard.path, offset=start, record=local
            ) from err
        image = torch.from_numpy(self._augment(out, index, int(key[0])))
        if self.layout == "CHW":
            image = image.permute(2, 0, 1)
        label = int(row[self.label_field]) if self.label_field else 0
        return image, label
