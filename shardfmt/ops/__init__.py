"""Decode-and-augment steps. Each states its output shape before any batch runs, so batch slots
are allocated once; each draws its random parameters from the record table, before decoding."""

from __future__ import annotations

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
from .output import ImageOutput
from .resize import Resizer

__all__ = [
    "CenterCrop",
    "CropPlan",
    "ImageDecoder",
    "ImageOutput",
    "Pipeline",
    "RandomCrop",
    "RandomResizedCrop",
    "Resize",
    "Resizer",
    "dct_scale",
    "pipeline_from_config",
    "scale_plan",
    "snap_to_scale",
]
