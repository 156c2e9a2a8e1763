"""The loader layer's own options: `Workers` (how the batches are made: processes, prefetch,
order of delivery, start method, stall timeout) and `Output` (the form a batch is handed out
in), each a frozen value checked when it is made; and what the loader derives where options of
several layers meet: the steps and outputs the workers run (`transform_outputs`,
`worker_steps`), the index output, the batch steps, and the check that a user's step can reach
the workers (`check_picklable`).

The other options belong to the layers that read them: `shardfmt._sampling.policy.Sampling`
(the epochs' order) and `shardfmt.ops._transform.ImageTransform` (one image, bytes to row).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import pickle
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from .._arguments import check_int
from .._forks import MAX_WORKERS_PER_CORE, max_workers
from .._sampling.keys import MAX_STEPS
from .._storage import RemoteOptions
from ..ops import Pipeline, RandomErasing
from ..ops._augment import AugmentStep, as_step
from ..ops._batch import BatchStep, check_batch_step
from ..ops._transform import ImageTransform
from .chunk import TransformSpec
from .form import check_fields_form
from .outputs import FieldRequest, OutputSpec, normalise_request
from .sendable import check_sendable

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_PREFETCH",
    "Output",
    "Workers",
    "as_device",
    "as_option",
    "as_transform",
    "batch_steps",
    "check_batch_size",
    "check_fields",
    "check_picklable",
    "check_remote",
    "check_verify",
    "index_output",
    "sample_image",
    "transform_outputs",
    "worker_steps",
]

MAX_BATCH_SIZE = 2**31 - 1
MAX_PREFETCH = 1024


@dataclass(frozen=True)
class Workers:
    """How a loader's batches are made: by how many processes, how far ahead, delivered in
    which order, started how, and when a stall is reported.

    `shardfmt.Loader` takes one as ``workers=``; its ``num_workers`` keyword is the same field.

    Args:
        num_workers: decoding processes, in [0, a cap of `shardfmt._forks.max_workers`]; None:
            one a core; 0 decodes in the loader's process. More than
            `shardfmt._forks.MAX_WORKERS_PER_CORE` a core is warned about.
        prefetch: batches decoded ahead of the consumer, in [1, 1024]; shared memory holds
            prefetch + 1 slots.
        ordered: deliver batches in order (True) or each as soon as it is ready.
        start_method: the multiprocessing start method; None: the platform's, but forkserver
            for a ``gs://`` dataset, which gcsfs reads over gRPC (gRPC does not survive fork).
        timeout: seconds without progress after which a stall is reported, in a worker or,
            with num_workers=0, in the loader's process (docs/limits.md); finite, > 0.

    Raises:
        TypeError, ValueError: an argument is of the wrong type or outside its range.
    """

    num_workers: int | None = None
    prefetch: int = 2
    ordered: bool = True
    start_method: str | None = None
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.num_workers is not None:
            _check_num_workers(self.num_workers)
        check_int("prefetch", self.prefetch, 1, MAX_PREFETCH)
        if not isinstance(self.ordered, (bool, np.bool_)):
            raise TypeError(f"ordered must be True or False, got {self.ordered!r}")
        methods = multiprocessing.get_all_start_methods()
        if self.start_method is not None and self.start_method not in methods:
            raise ValueError(f"start_method must be None or one of {', '.join(methods)}, got {self.start_method!r}")
        value = self.timeout
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"timeout must be a number of seconds, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {value!r}")

    @property
    def count(self) -> int:
        """`num_workers` as the loader runs it: None is one a core."""
        return (os.cpu_count() or 1) if self.num_workers is None else int(self.num_workers)

    @property
    def resolved_start_method(self) -> str:
        """`start_method`, or the platform's default."""
        return self.start_method or multiprocessing.get_start_method(allow_none=False)

    def with_shortcut(self, num_workers: int | None) -> Workers:
        """These workers with `Loader`'s ``num_workers`` keyword in them (None leaves theirs).

        Raises:
            ValueError: both give a number, and not the same.
        """
        if num_workers is None or num_workers == self.num_workers:
            return self
        if self.num_workers is not None:
            raise ValueError(
                f"num_workers is given twice: Loader(num_workers={num_workers!r}) and "
                f"workers=Workers(num_workers={self.num_workers!r}); give it once"
            )
        return dataclasses.replace(self, num_workers=num_workers)

    def fingerprint(self) -> dict[str, Any]:
        """The part of a loader state's settings that is theirs: whether delivery is ordered
        (a state of unordered delivery may hold batches delivered out of turn)."""
        return {"ordered": self.ordered}


def _check_num_workers(num_workers: Any) -> None:
    """Refuse more than `max_workers` (a hard cap against a typo's fork bomb); warn past
    `MAX_WORKERS_PER_CORE` a core, where workers only wait for a core."""
    cores, cap = os.cpu_count() or 1, max_workers()
    check_int("num_workers", num_workers, 0, cap, note=f" (at most {cap} worker processes a loader; docs/limits.md)")
    if num_workers > MAX_WORKERS_PER_CORE * cores:
        warnings.warn(
            f"num_workers={num_workers} is more than {MAX_WORKERS_PER_CORE} a core on this machine of {cores}: the "
            f"workers past {MAX_WORKERS_PER_CORE * cores} only wait for a core and hold memory",
            UserWarning,
            stacklevel=5,
        )


@dataclass(frozen=True)
class Output:
    """The form a loader hands each batch out in (``Loader(output=...)``).

    Args:
        layout: "NCHW" (a channels_last view of the slot, what convolutions run fastest on; use
            .reshape rather than .view) or "NHWC" (contiguous).
        copy: hand out copies in plain memory instead of views of shared memory.
        return_indices: add each sample's record index in the dataset (int64, what
            ``open_dataset(path)[i]`` reads) to every batch: ``(images, labels, indices)``, or
            an "index" entry with the loader's ``fields``.
        image_field, label_field: the fields of the (images, labels) form (label_field=None
            gives zero labels; over a dataset without labels, such as image-text tars, the
            default "label" gives the images alone). Unused with the loader's ``fields``.

    Raises:
        TypeError, ValueError: an argument is of the wrong type or value.
    """

    layout: str = "NCHW"
    copy: bool = False
    return_indices: bool = False
    image_field: str = "image"
    label_field: str | None = "label"

    def __post_init__(self) -> None:
        if self.layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be 'NHWC' or 'NCHW', got {self.layout!r}")
        for name in ("copy", "return_indices"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        if not isinstance(self.image_field, str):
            raise TypeError(f"image_field must be a field name (str), got {self.image_field!r}")
        if self.label_field is not None and not isinstance(self.label_field, str):
            raise TypeError(f"label_field must be a field name (str) or None, got {self.label_field!r}")


def check_batch_size(batch_size: Any) -> int:
    """`batch_size` as an int in [1, `MAX_BATCH_SIZE`]; TypeError or ValueError otherwise."""
    return check_int("batch_size", batch_size, 1, MAX_BATCH_SIZE)


def batch_steps(batch_augment: Sequence[BatchStep] | None) -> tuple[BatchStep, ...]:
    """``batch_augment`` as a tuple of batch steps (`shardfmt.ops.BatchStep`).

    Raises:
        TypeError: not a list of batch steps (`shardfmt.ops._batch.check_batch_step`).
        ValueError: more than `MAX_STEPS` of them.
    """
    if batch_augment is None:
        return ()
    if not isinstance(batch_augment, (list, tuple)):
        raise TypeError(f"batch_augment must be a list of batch steps (MixUp, CutMix, RandomChoice), got {batch_augment!r}")
    for step in batch_augment:
        check_batch_step(step)
    if len(batch_augment) > MAX_STEPS:
        raise ValueError(f"batch_augment holds {len(batch_augment)} steps; at most {MAX_STEPS}")
    return tuple(batch_augment)


_Option = TypeVar("_Option")


def as_option(name: str, value: _Option | None, kind: type[_Option]) -> _Option:
    """`value`, an option object of `kind`, or `kind`'s defaults for None.

    Raises:
        TypeError: `value` is of another type (a dict, say).
    """
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be None or a shardfmt.{kind.__name__}, got {value!r}")
    return value


def as_transform(transform: ImageTransform | Pipeline | str) -> ImageTransform:
    """`transform` as an `ImageTransform`: a crop (a name or a pipeline) alone is ``ImageTransform(crop=...)``.

    Raises:
        TypeError, ValueError: not a transform, a crop name or a pipeline of `shardfmt.ops`.
    """
    if isinstance(transform, ImageTransform):
        return transform
    return ImageTransform(crop=transform)


def check_fields(fields: FieldRequest | None, transform: ImageTransform, *, batch_augment: bool) -> FieldRequest | None:
    """`fields` if it is a well-formed request that the other options can serve.

    Raises:
        TypeError, ValueError: a malformed request, or with an option that serves the (images,
            labels) form only (`batch_augment`, the transform's GPU decode:
            `form.check_fields_form`).
    """
    if fields is None:
        return None
    normalise_request(fields)
    check_fields_form(fields=True, batch_augment=batch_augment, decode=transform.decode)
    return fields


def as_device(device: Any) -> torch.device | None:
    """`device` as a `torch.device` (None stays None).

    Raises:
        TypeError: neither None, a str nor a torch.device.
        ValueError: a string torch does not know as a device.
    """
    if device is None or isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be None, a string such as 'cuda' or a torch.device, got {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device {device!r} is not a device torch knows ({err})") from err


def check_verify(verify: Any) -> bool | str:
    """`verify` if it is True, False or "always"; ValueError otherwise."""
    if verify not in (True, False, "always"):
        raise ValueError(f"verify must be True, False or 'always', got {verify!r}")
    return bool(verify) if verify != "always" else "always"


def check_remote(remote: Any) -> RemoteOptions | None:
    """`remote` if it is None or a `RemoteOptions`; TypeError otherwise."""
    if remote is not None and not isinstance(remote, RemoteOptions):
        raise TypeError(f"remote must be None or a shardfmt.RemoteOptions, got {remote!r}")
    return remote


def check_picklable(transform: ImageTransform, workers: Workers) -> None:
    """What the caller gives the workers must reach them: pickled as it is unless they are
    forked. A crop of the caller's own (`sendable.check_sendable`) and the user's steps.

    Raises:
        TypeError: the crop or a step cannot be pickled and the start method needs it.
    """
    if not isinstance(transform.crop, str):
        check_sendable("pipeline", transform.crop, workers=workers.count, start_method=workers.resolved_start_method)
    if not workers.count or workers.resolved_start_method == "fork":
        return
    for step in transform.augment:
        function = getattr(step, "function", None)
        if function is None:
            continue
        try:
            pickle.dumps(step)
        except Exception as err:
            raise TypeError(
                f"augment step {function!r} cannot be pickled, which the {workers.resolved_start_method!r} start method needs "
                f"to send it to the workers ({type(err).__name__}: {err}); define it at the top level of a module (not a lambda "
                "or a local function)"
            ) from err


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


def worker_steps(transform: ImageTransform, *, on_device: bool) -> tuple[AugmentStep, ...]:
    """The steps of `transform` as the workers run them. With a device (`on_device`) the workers
    deliver uint8 and the device normalises, so a RandomErasing that fills with the mean fills
    with its nearest whole values (after the device's normalisation, within 0.5 / std of 0)."""
    steps = tuple(transform.augment)
    if not on_device or transform.mean is None:
        return steps
    mean = tuple(float(round(v)) for v in transform.mean)
    return tuple(
        dataclasses.replace(step, value=mean) if isinstance(step, RandomErasing) and step.value == "mean" else step for step in steps
    )
