"""The torch-facing side: `Loader` (batches from worker processes over shared memory) with its
option objects (`ImageTransform`, `Workers`, `Output`; `Sampling` lives below, in `_sampling`),
and `Dataset` (a map-style torch Dataset for existing DataLoader pipelines)."""

from __future__ import annotations

import torch  # noqa: F401  (first: a missing torch is reported for the name asked for, not for shardfmt.ops)

from ..ops._transform import ImageTransform
from .core import Loader
from .mapstyle import Dataset
from .options import Output, Workers

__all__ = ["Dataset", "ImageTransform", "Loader", "Output", "Workers"]
