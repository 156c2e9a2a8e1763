"""`ImageTransform`: what happens to one image on its way from its bytes to its row of a batch
(the crop rule, the output size and interpolation, the decode, the augmentation steps and the
normalisation), as one frozen, checked, picklable value. `shardfmt.Loader` sends it to its
workers; `shardfmt.Dataset` runs it in ``__getitem__``."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._arguments import check_number
from .._sampling.keys import MAX_STEPS
from ._augment import AugmentStep, as_step, describe_steps
from ._crop import CenterCrop, Pipeline, RandomResizedCrop, Resize, check_pipeline
from ._erasing import RandomErasing
from ._resize import INTERPOLATIONS

__all__ = ["CROPS", "DECODE_MODES", "MAX_MEAN", "MIN_STD", "ImageTransform", "named_pipeline", "size_pair"]

CROPS = ("train", "eval", "resize")
"""The crop rules given by name (`named_pipeline`)."""
DECODE_MODES = ("cpu", "gpu", "hybrid")
"""Where a loader decodes JPEGs (``ImageTransform(decode=...)``)."""
MAX_MEAN = 1e6
"""The largest magnitude of a normalisation mean or std (0-255 scale; ImageNet's are about 120 and
60): with ``MIN_STD`` it keeps ``(x - mean) / std`` below 2**41, exact to float32's precision and
far from its largest value (a std of 1e-320 gave infinities)."""
MIN_STD = 1e-6
"""The smallest normalisation std."""


@dataclass(frozen=True)
class ImageTransform:
    """One image from its bytes to its row: crop, decode, resize, augment, normalise.

    Given to `shardfmt.Loader` as ``transform=`` (a crop name or a `Pipeline` alone stands for
    ``ImageTransform(crop=...)``) and to `shardfmt.Dataset`. It crosses to the worker processes
    as it is (pickled under spawn and forkserver).

    Args:
        crop: "train" (RandomResizedCrop + horizontal flip), "eval" (resize the shorter side to
            size/0.875, center crop), "resize" (whole image to size), or a `Pipeline`, which
            carries its own size: one of `shardfmt.ops` (`RandomResizedCrop`, `CenterCrop`,
            `Resize`, `RandomCrop`) or an object of your own (docs/augmentation.md).
        size: output size of a named crop, an int or (height, width), each in [1, 65535];
            `shardfmt.Loader.set_size` changes it between epochs.
        interpolation: the crop's resize, "bilinear" or "bicubic", both antialiased (PIL's and
            torchvision's results), or "nearest" (PIL's ``NEAREST``; no DCT-scaled decode);
            an `ImageOutput` given in the loader's ``fields`` keeps its own.
        augment: steps run on each sample after its crop and flip: the steps of `shardfmt.ops`
            (`RandomVerticalFlip`, `RandomRotation`, `ColorJitter`, `RandomGrayscale`,
            `TrivialAugmentWide`, `RandAugment`, `AutoAugment`, `AugMix`, `RandomErasing`:
            docs/augmentation.md) or any callable taking ``(sample)`` (a torchvision transform,
            a `torch.nn.Module`) or ``(sample, generator)`` (a (3, H, W) uint8 tensor and a
            `torch.Generator` seeded from (seed, epoch, record); it returns the (3, H, W) uint8
            sample). Before each such step the worker's global torch, numpy and `random`
            generators are seeded from (seed, epoch, record, step). A `RandomErasing` whose
            value is "mean" fills with `mean` (needed), 0 after the normalisation.
        mean, std: normalise the images to float32 ``(x - mean) / std``, per channel, on the
            0-255 scale (three values each, std > 0): on the loader's device when it has one,
            else in the workers.
        fast_decode: libjpeg-turbo's fast IDCT and upsampling: about 5% faster; crops stay
            within 44 dB PSNR of PIL's exact decode and resize. False gives PIL's pixels
            (64 dB). A `CenterCrop` (``crop="eval"``) always decodes exactly, to give
            torchvision's ``Resize`` + ``CenterCrop`` pixels (spec/sampling.md).
        decode: where JPEGs are decoded: "cpu" in the workers; "gpu" on the CUDA device with
            nvJPEG, the workers still reading, checking and batching the bytes; "hybrid" the
            first rows of each batch in the workers and the rest on the GPU, in proportion to
            their measured rates (docs/gpu.md). "gpu" and "hybrid" take no `augment` steps and
            need the "bilinear" or "bicubic" interpolation.

    Raises:
        TypeError, ValueError: an argument is malformed or outside its range, or two do not go
            together (the message names them).

    Example::

        ImageTransform(augment=[TrivialAugmentWide(), RandomErasing(0.25)],
                       mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4))
    """

    crop: Pipeline | str = "train"
    size: int | tuple[int, int] = 224
    interpolation: str = "bilinear"
    augment: Sequence[AugmentStep] = ()
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    fast_decode: bool = True
    decode: str = "cpu"

    def __post_init__(self) -> None:
        # converted first (sequences to tuples, user callables to steps), then checked
        object.__setattr__(self, "augment", tuple(as_step(step) for step in _steps(self.augment)))
        object.__setattr__(self, "mean", _numbers("mean", self.mean))
        object.__setattr__(self, "std", _numbers("std", self.std))
        named_pipeline(self.crop, size_pair(self.size))
        if not isinstance(self.fast_decode, (bool, np.bool_)):
            raise TypeError(f"fast_decode must be True or False, got {self.fast_decode!r}")
        self._check_normalisation()
        self._check_decode()
        if len(self.augment) > MAX_STEPS:
            raise ValueError(f"augment holds {len(self.augment)} steps; at most {MAX_STEPS}")
        for step in self.augment:
            if isinstance(step, RandomErasing) and step.value == "mean" and self.mean is None:
                raise ValueError(
                    "RandomErasing(value='mean') fills with the normalisation mean: give the transform mean= and std=, or the step a value"
                )

    def _check_normalisation(self) -> None:
        mean, std = self.mean, self.std
        for name, values in (("mean", mean), ("std", std)):
            if values is not None and not all(math.isfinite(v) for v in values):
                raise ValueError(f"{name} must hold finite numbers, got {values!r}")
        if std is not None and not all(v > 0 for v in std):
            raise ValueError(f"std must hold numbers > 0 (each channel is divided by it), got {std!r}")
        for name, values, low in (("mean", mean, -MAX_MEAN), ("std", std, MIN_STD)):
            for value in values or ():
                check_number(name, value, low, MAX_MEAN, note=" (each channel, 0-255 scale)")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None and std is not None and (len(mean) != 3 or len(std) != 3):
            raise ValueError(f"mean and std need one value per channel (3), got {len(mean)} and {len(std)}")

    def _check_decode(self) -> None:
        if self.decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(repr(m) for m in DECODE_MODES)}, got {self.decode!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be 'bilinear' or 'bicubic' (antialiased) or 'nearest', got {self.interpolation!r}"
            )
        if self.decode == "cpu":
            return
        if self.interpolation == "nearest":
            raise ValueError(f"decode={self.decode!r} resizes with an antialiased kernel; interpolation='nearest' needs decode='cpu'")
        if self.augment:
            raise ValueError(
                f"decode={self.decode!r} cannot run augment= steps, which run in the workers on decoded samples; use decode='cpu'"
            )

    @property
    def pipeline(self) -> Pipeline:
        """The crop rule as an object: a named crop made at `size`, or `crop` itself."""
        return named_pipeline(self.crop, size_pair(self.size))

    def at_size(self, size: tuple[int, int]) -> ImageTransform:
        """This transform cropping to `size`: a named crop made for that size, or the pipeline's
        `Pipeline.with_size` (a `CenterCrop`'s ``resize`` scales with it, so that the crop keeps
        its share of the image)."""
        if isinstance(self.crop, str):
            return dataclasses.replace(self, size=size)
        return dataclasses.replace(self, crop=self.crop.with_size(size))

    def fingerprint(self, pipeline: Pipeline) -> dict[str, Any]:
        """The transform's part of a loader state's settings (a resume compares them): the crop
        rule as resolved (`pipeline`; without its size, which the state records itself), the
        steps (`describe_steps`), and the interpolation where it is not "bilinear" (states saved
        before it existed still resume). Normalisation and decode device change no draw."""
        shape = {k: v for k, v in pipeline.to_config().items() if k != "size"}
        found: dict[str, Any] = {"pipeline": json.dumps(shape, sort_keys=True), "augment": describe_steps(self.augment)}
        if self.interpolation != "bilinear":
            found["interpolation"] = self.interpolation
        return found


def named_pipeline(crop: Pipeline | str, size: tuple[int, int]) -> Pipeline:
    """The pipeline object for a crop name ("train", "eval", "resize") at `size`, or the object
    itself: one of `shardfmt.ops`' or a `Pipeline` of the caller's own.

    Raises:
        TypeError: `crop` is neither a name nor a `Pipeline` (`_crop.check_pipeline`).
        ValueError: an unknown name.
    """
    if not isinstance(crop, str):
        check_pipeline(crop, name="crop")
        return crop
    if crop == "train":
        return RandomResizedCrop(size)
    if crop == "eval":
        return CenterCrop(size, resize=round(max(size) / 0.875))
    if crop == "resize":
        return Resize(size)
    raise ValueError(f"crop must be 'train', 'eval', 'resize' or a pipeline object, got {crop!r}")


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


def _steps(augment: Any) -> Sequence[Any]:
    if augment is None:
        return ()
    if isinstance(augment, (str, bytes)) or not isinstance(augment, Sequence):
        raise TypeError(f"augment must be a list of steps, got {augment!r}")
    return augment
