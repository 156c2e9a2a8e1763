"""A `Loader`'s options beyond its fields: record indices in each batch, the steps that run on
each sample in the workers (``augment=``, ``mean``/``std`` without a device), and the output size
that `Loader.set_size` changes between epochs.

Each turns the loader's request into plain values: an extra `OutputSpec` of type "index" (int64,
one per sample), the "transform" part of the workers' config (which image field, the steps as
`ops.augment.steps_to_config` gives them, the normalisation), or the pipeline at another size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..ops import CenterCrop, Pipeline
from ..ops.augment import AugmentStep, steps_to_config
from ..sampling import MAX_STEPS
from .fields import OutputSpec, resolve_pipeline

__all__ = ["index_output", "pipeline_at", "size_pair", "transform_outputs"]


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
        raise ValueError("return_indices adds an 'index' entry to each batch, but a field is called 'index'; rename the field or use the index of the batch")
    return OutputSpec("index" if fields else ".index", "index", (), "<i8")


def transform_outputs(
    outputs: tuple[OutputSpec, ...],
    *,
    augment: Sequence[AugmentStep],
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
) -> tuple[tuple[OutputSpec, ...], dict[str, Any] | None]:
    """The outputs with the transformed image as it lands in the slot (float32 when normalised),
    and the workers' "transform" config; None without steps or normalisation.

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
    config = {
        "field": image.name,
        "steps": steps_to_config(augment),
        "mean": None if mean is None else [float(v) for v in mean],
        "std": None if std is None else [float(v) for v in std],
    }
    if mean is not None:
        outputs = tuple(dataclasses.replace(spec, dtype="<f4") if spec.name == image.name else spec for spec in outputs)
    return outputs, config
