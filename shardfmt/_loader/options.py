"""A `Loader`'s options: `LoaderOptions`, the frozen, checked value its keyword arguments become,
and what the loader derives from them: record indices in each batch, the steps that run on each
sample in the workers (``augment=``, ``mean``/``std`` without a device), and the output size that
`Loader.set_size` changes between epochs.

Adding an option is one typed field of `LoaderOptions` (and the same keyword of `Loader`) plus
one ``_check_<name>`` method, which `LoaderOptions` calls when it is made. An option whose
argument is converted (a default resolved, a sequence made a tuple) is converted in
`LoaderOptions.parse`, so that its field has the type of what it holds.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import pickle
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._arguments import check_int, check_number
from .._forks import MAX_WORKERS_PER_CORE, max_workers
from .._sampling.keys import MAX_STEPS
from .._sampling.permutation import check_repeats, repeated_size
from .._storage import RemoteOptions
from ..ops import Pipeline, RandomErasing
from ..ops._augment import AugmentStep, as_step
from ..ops._batch import BatchStep, check_batch_step
from ..ops._crop import check_pipeline
from ..ops._resize import INTERPOLATIONS
from .chunk import TransformSpec
from .form import check_fields_form
from .gpudecode import check_request
from .outputs import FieldRequest, OutputSpec, normalise_request, resolve_pipeline
from .sendable import check_sendable

__all__ = ["LoaderOptions", "index_output", "pipeline_at", "sample_image", "size_pair", "transform_outputs", "worker_steps"]


def _default_workers() -> int:
    """The workers of ``num_workers=None``: one a core."""
    return os.cpu_count() or 1


@dataclass(frozen=True, eq=False)
class LoaderOptions:
    """Every keyword argument of `Loader`, parsed once (see `Loader` for what each means).

    `parse` makes it from the arguments as given; each field holds its value as parsed, and each
    field with a ``_check_<name>`` method is checked by it when the options are made.

    Raises:
        ValueError, TypeError: an argument is malformed (the message names it).
    """

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    num_workers: int = field(default_factory=_default_workers)
    pipeline: Pipeline | str = "train"
    size: int | tuple[int, int] = 224
    drop_last: bool = False
    layout: str = "NCHW"
    rank: int | None = None
    world_size: int | None = None
    ordered: bool = True
    prefetch: int = 2
    copy: bool = False
    device: torch.device | None = None
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
    augment: tuple[AugmentStep, ...] = ()
    decode: str = "cpu"
    interpolation: str = "bilinear"
    repeats: int = 1
    batch_augment: tuple[BatchStep, ...] = ()
    repeats_epoch: str = "copies"

    @classmethod
    def parse(cls, **arguments: Any) -> LoaderOptions:
        """The options that `Loader`'s keyword arguments, as given, make: `num_workers` None
        becomes the number of cores, `device` a `torch.device`, `mean`/`std` tuples of floats,
        `augment` a tuple of steps (a user's callable wrapped by `ops.augment.as_step`),
        `batch_augment` a tuple (None an empty one); the others are kept as they are.

        Raises:
            ValueError, TypeError: an argument is malformed (the message names it).
        """
        num_workers = arguments.get("num_workers")
        parsed = {
            "num_workers": _default_workers() if num_workers is None else num_workers,
            "device": _device(arguments.get("device")),
            "mean": _numbers("mean", arguments.get("mean")),
            "std": _numbers("std", arguments.get("std")),
            "augment": tuple(as_step(step) for step in _steps(arguments.get("augment"))),
            "batch_augment": tuple(_batch_steps(arguments.get("batch_augment"))),
        }
        return cls(**(arguments | parsed))

    def __post_init__(self) -> None:
        for option in dataclasses.fields(self):
            check = getattr(self, f"_check_{option.name}", None)
            if check is not None:
                check()

    @property
    def resolved_start_method(self) -> str:
        return self.start_method or multiprocessing.get_start_method(allow_none=False)

    def _check_batch_size(self) -> None:
        check_int("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)

    def _check_shuffle(self) -> None:
        for name in ("shuffle", "drop_last", "ordered", "copy", "fast_decode", "return_indices"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {value!r}")

    def _check_seed(self) -> None:
        check_int("seed", self.seed, 0, MAX_SEED)

    def _check_num_workers(self) -> None:
        """Refuse more than `max_workers` (a hard cap against a typo's fork bomb); warn past
        `MAX_WORKERS_PER_CORE` a core, where workers only wait for a core."""
        cores, cap = os.cpu_count() or 1, max_workers()
        check_int("num_workers", self.num_workers, 0, cap, note=f" (at most {cap} worker processes a loader; docs/limits.md)")
        if self.num_workers > MAX_WORKERS_PER_CORE * cores:
            warnings.warn(
                f"num_workers={self.num_workers} is more than {MAX_WORKERS_PER_CORE} a core on this machine of {cores}: the "
                f"workers past {MAX_WORKERS_PER_CORE * cores} only wait for a core and hold memory",
                UserWarning,
                stacklevel=6,
            )

    def _check_rank(self) -> None:
        if self.world_size is not None:
            check_int("world_size", self.world_size, 1, MAX_WORLD_SIZE)
        if self.rank is not None:
            check_int("rank", self.rank, 0, (self.world_size or MAX_WORLD_SIZE) - 1)

    def _check_timeout(self) -> None:
        value = self.timeout
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"timeout must be a number of seconds, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {value!r}")

    def _check_std(self) -> None:
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values is not None and not all(math.isfinite(v) for v in values):
                raise ValueError(f"{name} must hold finite numbers, got {values!r}")
        if self.std is not None and not all(v > 0 for v in self.std):
            raise ValueError(f"std must hold numbers > 0 (each channel is divided by it), got {self.std!r}")
        for name, values, low in (("mean", self.mean, -MAX_MEAN), ("std", self.std, MIN_STD)):
            for value in values or ():
                check_number(name, value, low, MAX_MEAN, note=" (each channel, 0-255 scale)")

    def _check_remote(self) -> None:
        if self.remote is not None and not isinstance(self.remote, RemoteOptions):
            raise TypeError(f"remote must be None or a shardfmt.RemoteOptions, got {self.remote!r}")

    def _check_fields(self) -> None:
        if self.fields is not None:
            normalise_request(self.fields)
        check_fields_form(fields=self.fields is not None, batch_augment=bool(self.batch_augment), decode=self.decode)

    def _check_start_method(self) -> None:
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(f"start_method must be None or one of {', '.join(methods)}, got {self.start_method!r}")

    def _check_pipeline(self) -> None:
        if not isinstance(self.pipeline, str):
            check_pipeline(self.pipeline)
            check_sendable("pipeline", self.pipeline, workers=self.num_workers, start_method=self.resolved_start_method)

    def _check_size(self) -> None:
        size_pair(self.size)

    def _check_layout(self) -> None:
        if self.layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be 'NHWC' or 'NCHW', got {self.layout!r}")

    def _check_prefetch(self) -> None:
        check_int("prefetch", self.prefetch, 1, MAX_PREFETCH)

    def _check_window(self) -> None:
        if self.window is not None:
            check_int("window", self.window, 1, MAX_WINDOW, note=" shards")

    def _check_verify(self) -> None:
        if self.verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always', got {self.verify!r}")

    def _check_decode(self) -> None:
        check_request(self.decode, augment=bool(self.augment))

    def _check_interpolation(self) -> None:
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be 'bilinear' or 'bicubic' (antialiased) or 'nearest', got {self.interpolation!r}"
            )
        if self.interpolation == "nearest" and self.decode != "cpu":
            raise ValueError(f"decode={self.decode!r} resizes with an antialiased kernel; interpolation='nearest' needs decode='cpu'")

    def _check_repeats(self) -> None:
        object.__setattr__(self, "repeats", check_repeats(self.repeats))

    def _check_repeats_epoch(self) -> None:
        repeated_size(1, 1, self.repeats_epoch)

    def _check_batch_augment(self) -> None:
        for step in self.batch_augment:
            check_batch_step(step)
        if len(self.batch_augment) > MAX_STEPS:
            raise ValueError(f"batch_augment holds {len(self.batch_augment)} steps; at most {MAX_STEPS}")

    def _check_augment(self) -> None:
        """A RandomErasing that fills with the mean needs one; a user's step must reach the
        workers: pickled as it is unless they are forked."""
        for step in self.augment:
            if isinstance(step, RandomErasing) and step.value == "mean" and self.mean is None:
                raise ValueError(
                    "RandomErasing(value='mean') fills with the normalisation mean: give the loader mean= and std=, or the step a value"
                )
        if not self.num_workers or self.resolved_start_method == "fork":
            return
        for step in self.augment:
            function = getattr(step, "function", None)
            if function is None:
                continue
            try:
                pickle.dumps(step)
            except Exception as err:
                raise TypeError(
                    f"augment step {function!r} cannot be pickled, which the {self.resolved_start_method!r} start method needs "
                    f"to send it to the workers ({type(err).__name__}: {err}); define it at the top level of a module (not a lambda "
                    "or a local function)"
                ) from err


MAX_BATCH_SIZE = 2**31 - 1
MAX_MEAN = 1e6
"""The largest magnitude of a normalisation mean or std (0-255 scale; ImageNet's are about 120 and
60): with ``MIN_STD`` it keeps ``(x - mean) / std`` below 2**41, exact to float32's precision and
far from its largest value (a std of 1e-320 gave infinities)."""
MIN_STD = 1e-6
"""The smallest normalisation std."""
MAX_PREFETCH = 1024
MAX_WINDOW = 2**31 - 1
MAX_SEED = 2**64 - 1
"""Seeds are hashed as 64-bit words (`sampling.keys.record_keys`)."""
MAX_WORLD_SIZE = 2**31 - 1


def _numbers(name: str, values: Any) -> tuple[float, ...] | None:
    """`values` (mean or std) as a tuple of floats, or None."""
    if values is None:
        return None
    try:
        items = tuple(values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of numbers, one per channel, got {values!r}") from None
    if not items or any(isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) for v in items):
        raise TypeError(f"{name} must be a sequence of numbers, one per channel, got {values!r}")
    return tuple(float(v) for v in items)


def _device(device: Any) -> torch.device | None:
    if device is None or isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be None, a string such as 'cuda' or a torch.device, got {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a device torch knows ({err})") from err


def _steps(augment: Any) -> Sequence[Any]:
    if augment is None:
        return ()
    if isinstance(augment, (str, bytes)) or not isinstance(augment, Sequence):
        raise TypeError(f"augment must be a list of steps, got {augment!r}")
    return augment


def _batch_steps(batch_augment: Any) -> Sequence[Any]:
    if batch_augment is None:
        return ()
    if not isinstance(batch_augment, (list, tuple)):
        raise TypeError(f"batch_augment must be a list of batch steps (MixUp, CutMix, RandomChoice), got {batch_augment!r}")
    return batch_augment


def size_pair(size: int | Sequence[int]) -> tuple[int, int]:
    """`size` as (height, width).

    Raises:
        TypeError: neither an int nor a pair.
        ValueError: not a positive int or a pair of them (at most 65,535 each).
    """
    if isinstance(size, (int, np.integer)) and not isinstance(size, (bool, np.bool_)):
        pair: tuple[Any, ...] = (size, size)
    elif isinstance(size, (str, bytes)) or not isinstance(size, Sequence):
        raise TypeError(f"size must be a positive int or (height, width), got {size!r}")
    else:
        pair = tuple(size)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and 0 < v <= 65535 for v in pair):
        raise ValueError(f"size must be a positive int or (height, width), each in [1, 65535], got {size!r}")
    return (int(pair[0]), int(pair[1]))


def pipeline_at(pipeline: Pipeline | str, size: tuple[int, int]) -> Pipeline:
    """The pipeline that crops to `size`: a named one ("train", "eval", "resize") made for that
    size, or the given object's `Pipeline.with_size` (a `CenterCrop`'s ``resize`` scales with
    it, so that the crop keeps its share of the image)."""
    if isinstance(pipeline, str):
        return resolve_pipeline(pipeline, size)
    return pipeline.with_size(size)


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
        outputs: as `outputs.resolve_outputs` gives them.
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
    image = sample_image(outputs)
    if mean is not None and std is not None:
        if len(mean) != 3 or len(std) != 3:
            raise ValueError(f"mean and std need one value per channel (3), got {len(mean)} and {len(std)}")
        if any(value == 0 for value in std):
            raise ValueError(f"std must not hold 0, got {tuple(std)}")
    config = TransformSpec(
        image.name,
        tuple(as_step(step) for step in augment),
        None if mean is None else tuple(float(v) for v in mean),
        None if std is None else tuple(float(v) for v in std),
    )
    if mean is not None:
        outputs = tuple(dataclasses.replace(spec, dtype="<f4") if spec.name == image.name else spec for spec in outputs)
    return outputs, config


def sample_image(outputs: Sequence[OutputSpec]) -> OutputSpec:
    """The image field that augment steps and mean/std apply to: the one 3-channel image.

    Raises:
        ValueError: the outputs hold another number of image fields, or it has other channels.
    """
    images = [spec for spec in outputs if spec.is_image]
    if len(images) != 1 or images[0].shape[2] != 3:
        raise ValueError(
            f"augment= and mean/std apply to one 3-channel image, but the loader delivers {len(images)} image fields "
            f"({', '.join(f'{spec.name}: {spec.shape[2]} channels' for spec in images)})"
        )
    return images[0]


def worker_steps(options: LoaderOptions) -> tuple[AugmentStep, ...]:
    """The steps as the workers run them. With a device the workers deliver uint8 and the device
    normalises, so a RandomErasing that fills with the mean fills with its nearest whole values
    (after the device's normalisation, within 0.5 / std of 0)."""
    if options.device is None or options.mean is None:
        return options.augment
    mean = tuple(float(round(v)) for v in options.mean)
    return tuple(
        dataclasses.replace(step, value=mean) if isinstance(step, RandomErasing) and step.value == "mean" else step
        for step in options.augment
    )
