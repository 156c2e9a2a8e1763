"""Pipelines and augmentation steps, the objects a `Loader` takes.

Pipelines (``Loader(pipeline=...)``) draw one crop box per record from the record table, before
decoding: `RandomResizedCrop`, `CenterCrop`, `Resize`, `RandomCrop`. Augmentation steps
(``Loader(augment=[...])``) run on each cropped sample in the workers: `RandomVerticalFlip`,
`RandomRotation`, `ColorJitter`, `RandomGrayscale`. `ImageOutput` states how one image field of
several is delivered (``Loader(fields=...)``). `Pipeline`, `CropPlan` and `AugmentStep` are the
types a pipeline or step of your own implements. The modules of this package are internal.
"""

from __future__ import annotations

from ._augment import AugmentStep, ColorJitter, RandomGrayscale, RandomRotation, RandomVerticalFlip
from ._crop import CenterCrop, CropPlan, Pipeline, RandomCrop, RandomResizedCrop, Resize
from ._output import ImageOutput

__all__ = [
    "AugmentStep",
    "CenterCrop",
    "ColorJitter",
    "CropPlan",
    "ImageOutput",
    "Pipeline",
    "RandomCrop",
    "RandomGrayscale",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomVerticalFlip",
    "Resize",
]
