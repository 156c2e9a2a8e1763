"""Decode-and-augment steps. Each states its output shape before any batch runs, so batch slots
are allocated once. The crop pipelines draw their boxes from the record table, before decoding;
the augmentation steps (`RandomVerticalFlip`, `RandomRotation`, `ColorJitter`,
`RandomGrayscale`, `TrivialAugmentWide`, `RandAugment`, `AutoAugment`, `RandomErasing`,
``Loader(augment=...)``) run on each cropped sample in the workers."""

from __future__ import annotations

from .augment import AugmentStep, ColorJitter, RandomGrayscale, RandomRotation, RandomVerticalFlip
from .autoaugment import AutoAugment, RandAugment, TrivialAugmentWide
from .batch import BatchStep, CutMix, MixUp, RandomChoice, apply_batch_steps
from .crop import (
    CenterCrop,
    CropPlan,
    Pipeline,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    dct_scale,
    pipeline_from_config,
    scale_plan,
    snap_to_scale,
)
from .decode import ImageDecoder
from .erasing import RandomErasing
from .output import ImageOutput
from .resize import Resizer

__all__ = [
    "AugmentStep",
    "AutoAugment",
    "BatchStep",
    "CenterCrop",
    "ColorJitter",
    "CropPlan",
    "CutMix",
    "ImageDecoder",
    "ImageOutput",
    "MixUp",
    "Pipeline",
    "RandAugment",
    "RandomChoice",
    "RandomCrop",
    "RandomErasing",
    "RandomGrayscale",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomVerticalFlip",
    "Resize",
    "Resizer",
    "TrivialAugmentWide",
    "apply_batch_steps",
    "dct_scale",
    "pipeline_from_config",
    "scale_plan",
    "snap_to_scale",
]
