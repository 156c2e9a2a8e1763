"""Pipelines and augmentation steps, the objects a `Loader` takes.

Pipelines (``ImageTransform(crop=...)``, or ``Loader(transform=...)`` alone) draw one crop box per record from the record table, before
decoding: `RandomResizedCrop`, `CenterCrop`, `Resize`, `RandomCrop`. Augmentation steps
(``ImageTransform(augment=[...])``) run on each cropped sample in the workers: `RandomVerticalFlip`,
`RandomRotation`, `ColorJitter`, `RandomGrayscale`, `TrivialAugmentWide`, `RandAugment`,
`AutoAugment`, `AugMix`, `RandomErasing`. Batch steps (``Loader(batch_augment=[...])``) run on each batch:
`MixUp`, `CutMix`, `RandomChoice` (`apply_batch_steps` applies them to batches of your own).
`ImageOutput` states how one image field of several is
delivered (``Loader(fields=...)``). `Pipeline` and `BatchStep` are protocols that a pipeline or
batch step of your own implements (its boxes a `CropPlan`), and `AugmentStep` what ``augment``
takes (docs/augmentation.md, "Pipelines and batch steps of your own"). The modules of this
package are internal.

The steps run on torch tensors: this package needs the ``shardfmt[torch]`` extra and says so
when torch is missing.
"""

from __future__ import annotations

from .._errors import torch_missing

try:
    import torch  # noqa: F401  (checked first, so that a missing torch is named with its extra)
except ModuleNotFoundError as _error:
    if _error.name != "torch" and not (_error.name or "").startswith("torch."):
        raise
    raise torch_missing("shardfmt.ops", _error) from _error

from ._augment import AugmentStep, ColorJitter, RandomGrayscale, RandomRotation, RandomVerticalFlip
from ._augmix import AugMix
from ._autoaugment import AutoAugment, RandAugment, TrivialAugmentWide
from ._batch import BatchStep, CutMix, MixUp, RandomChoice, apply_batch_steps
from ._crop import CenterCrop, CropPlan, Pipeline, RandomCrop, RandomResizedCrop, Resize
from ._erasing import RandomErasing
from ._output import ImageOutput

__all__ = [
    "AugMix",
    "AugmentStep",
    "AutoAugment",
    "BatchStep",
    "CenterCrop",
    "ColorJitter",
    "CropPlan",
    "CutMix",
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
    "TrivialAugmentWide",
    "apply_batch_steps",
]
