"""A `Loader`'s options: `LoaderOptions`, the frozen, checked value its keyword arguments become,
and what the loader derives from them: record indices in each batch, the steps that run on each
sample in the workers (``augment=``, ``mean``/``std`` without a device), and the output size that
`Loader.set_size` changes between epochs.

Adding an option is one typed field of `LoaderOptions` (and the same keyword of `Loader`) plus
one ``_check_<name>`` method, which `LoaderOptions` calls when it is made.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._sampling.keys import MAX_STEPS
from .._storage import RemoteOptions
from ..ops import CenterCrop, Pipeline
from ..ops._augment import AugmentStep, as_step
from .gpudecode import check_request
from .outputs import FieldRequest, OutputSpec, resolve_pipeline
from .worker import TransformSpec

__all__ = ["LoaderOptions", "index_output", "pipeline_at", "size_pair", "transform_outputs"]


@dataclass(frozen=True, eq=False)
class LoaderOptions:
    """Every keyword argument of `Loader`, parsed once (see `Loader` for what each means).

    Made from the arguments as given: `num_workers` None becomes the number of cores, `device` a
    `torch.device`, `mean`/`std` tuples, `augment` a tuple of steps (a user's callable wrapped by
    `ops.augment.as_step`). Each field with a ``_check_<name>`` method is checked by it.

    Raises:
        ValueError, TypeError: an argument is malformed (the message names it).
    """

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    num_workers: int | None = None
    pipeline: Pipeline | str = "train"
    size: int | tuple[int, int] = 224
    drop_last: bool = False
    layout: str = "NCHW"
    rank: int | None = None
    world_size: int | None = None
    ordered: bool = True
    prefetch: int = 2
    copy: bool = False
    device: str | torch.device | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    verify: bool | str = True
    fast_decode: bool = True
    start_method: str | None = None
    timeout: float = 120.0
    image_field: str = "image"
    label_field: str | None = "label"
    fields: FieldRequest | None = None
    remote: RemoteOptions | None = None
    window: int | None = None
    order: str = "auto"
    return_indices: bool = False
    subset: Sequence[int] | np.ndarray | None = None
    augment: Sequence[AugmentStep] | None = None
    decode: str = "cpu"

    def __post_init__(self) -> None:
        normalised = {
            "num_workers": (os.cpu_count() or 1) if self.num_workers is None else self.num_workers,
            "device": torch.device(self.device) if self.device is not None else None,
            "mean": None if self.mean is None else tuple(self.mean),
            "std": None if self.std is None else tuple(self.std),
            "augment": tuple(as_step(step) for step in self.augment or ()),
        }
        for name, value in normalised.items():
            object.__setattr__(self, name, value)
        for option in dataclasses.fields(self):
            check = getattr(self, f"_check_{option.name}", None)
            if check is not None:
                check()

    @property
    def resolved_start_method(self) -> str:
        return self.start_method or multiprocessing.get_start_method(allow_none=False)

    def _check_layout(self) -> None:
        if self.layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be 'NHWC' or 'NCHW', got {self.layout!r}")

    def _check_prefetch(self) -> None:
        if self.prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {self.prefetch}")

    def _check_window(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be at least 1 shard, got {self.window}")

    def _check_verify(self) -> None:
        if self.verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always', got {self.verify!r}")

    def _check_mean(self) -> None:
        if self.fields is not None and (self.mean is not None or self.std is not None):
            raise ValueError(
                "mean and std normalise the images of the (images, labels) form; with fields=..., normalise the fields yourself"
            )

    def _check_decode(self) -> None:
        check_request(self.decode, fields=self.fields is not None, augment=bool(self.augment))

    def _check_augment(self) -> None:
        """A user's step must reach the workers: pickled as it is unless they are forked."""
        if not self.num_workers or self.resolved_start_method == "fork":
            return
        for step in self.augment:  # type: ignore[union-attr]
            if getattr(step, "function", None) is None:
                continue
            try:
                pickle.dumps(step)
            except Exception as err:
                raise TypeError(
                    f"augment step {step.function!r} cannot be pickled, which the {self.resolved_start_method!r} start method needs "  # type: ignore[union-attr]
                    f"to send it to the workers ({type(err).__name__}: {err}); define it at the top level of a module (not a lambda "
                    "or a local function)"
                ) from err


def size_pair(size: int | Sequence[int]) -> tuple[int, int]:
    """`size` as (height, width).

    Raises:
        ValueError: not a positive int or a pair of them (at most 65,535 each).
    """
    pair: tuple[Any, ...] = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65535 for v in pair):
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return (int(pair[0]), int(pair[1]))


def pipeline_at(pipeline: Pipeline | str, size: tuple[int, int]) -> Pipeline:
    """The pipeline that crops to `size`: a named one ("train", "eval", "resize") made for that
    size, or the given object with its size replaced (a `CenterCrop`'s ``resize`` scaled with
    it, so that the crop keeps its share of the image)."""
    if isinstance(pipeline, str):
        return resolve_pipeline(pipeline, size)
    if isinstance(pipeline, CenterCrop):
        resize = max(max(size), round(pipeline.resize * max(size) / max(pipeline.size)))
        return dataclasses.replace(pipeline, size=size, resize=resize)
    return dataclasses.replace(pipeline, size=size)


def index_output(*, fields: bool, names: Sequence[str]) -> OutputSpec:
    """The output holding each sample's dataset index: "index" in a batch of fields, else the
    third element of the batch.

    Raises:
        ValueError: with fields, one of them is already called "index".
    """
    if fields and "index" in names:
        raise ValueError(
            (
                "return_indices adds an 'index' entry to each batch, but a field is called 'index'; rename the field or use the index of "
                "the batch"
            )
        )
    return OutputSpec("index" if fields else ".index", "index", (), "<i8")


def transform_outputs(
    outputs: tuple[OutputSpec, ...],
    *,
    augment: Sequence[AugmentStep],
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
) -> tuple[tuple[OutputSpec, ...], TransformSpec | None]:
    """The outputs with the transformed image as it lands in the slot (float32 when normalised),
    and what the workers run on it; None without steps or normalisation.

    Args:
        outputs: as `fields.resolve_outputs` gives them.
        augment: the steps, applied to the one image field.
        mean, std: per-channel values (0-255 scale) to normalise with in the workers, or None.

    Raises:
        ValueError: steps or normalisation with other than one 3-channel image field, only one of
            mean and std, or values of the wrong count.
        TypeError: a step is neither a shardfmt.ops step nor callable.
    """
    if not augment and mean is None and std is None:
        return outputs, None
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std, or neither")
    if len(augment) > MAX_STEPS:
        raise ValueError(f"augment holds {len(augment)} steps; at most {MAX_STEPS}")
    images = [spec for spec in outputs if spec.is_image]
    if len(images) != 1 or images[0].shape[2] != 3:
        raise ValueError(
            f"augment= and mean/std apply to one 3-channel image, but the loader delivers {len(images)} image fields "
            f"({', '.join(f'{spec.name}: {spec.shape[2]} channels' for spec in images)})"
        )
    if mean is not None and std is not None:
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"mean and std need one value per channel (3), got {len(mean)} and {len(std)}")
        if any(value == 0 for value in std):
            raise ValueError(f"std must not hold 0, got {tuple(std)}")
    image = images[0]
    config = TransformSpec(
        image.name,
        tuple(as_step(step) for step in augment),
        None if mean is None else tuple(float(v) for v in mean),
        None if std is None else tuple(float(v) for v in std),
    )
    if mean is not None:
        outputs = tuple(dataclasses.replace(spec, dtype="<f4") if spec.name == image.name else spec for spec in outputs)
    return outputs, config
