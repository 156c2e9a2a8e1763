"""Decode-and-augment steps. Each states its output shape before any batch runs, so batch slots
are allocated once; each draws its random parameters from the record table, before decoding."""

from __future__ import annotations

from .crop import CenterCrop, CropPlan, Pipeline, RandomResizedCrop, Resize, pipeline_from_config
from .decode import ImageDecoder

__all__ = ["CenterCrop", "CropPlan", "ImageDecoder", "Pipeline", "RandomResizedCrop", "Resize", "pipeline_from_config"]
