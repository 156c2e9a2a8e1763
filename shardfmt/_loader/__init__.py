"""The torch-facing side: `Loader` (batches from worker processes over shared memory) and
`Dataset` (a map-style torch Dataset for existing DataLoader pipelines)."""

from __future__ import annotations

from .core import Loader
from .mapstyle import Dataset

__all__ = ["Dataset", "Loader"]
