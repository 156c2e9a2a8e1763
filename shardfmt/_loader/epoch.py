"""`EpochRecords`: what a `Loader` offers as ``loader.dataset``, as torch's DataLoader does, and
`EpochSampler`, its ``loader.sampler`` (only ``set_epoch``, what training loops call on it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["EpochRecords", "EpochSampler"]


class EpochRecords:
    """The records an epoch draws from, as a sequence: the subset's, in its order, or all of
    the dataset's. ``len`` counts them, ``[i]`` reads record i of them (what
    ``open_dataset(path)[...]`` reads), ``classes`` are the manifest's class names (None
    without). Of a `Mixture`, ``len`` is the epoch size and ``[i]`` reads record i of the
    sources numbered in the order given."""

    def __init__(self, records: Any, *, subset: np.ndarray | None, epoch_records: int) -> None:
        self._records = records
        self._subset = subset
        self._len = epoch_records

    @property
    def classes(self) -> list[str] | None:
        return getattr(self._records, "classes", None)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        if not -self._len <= index < self._len:
            raise IndexError(f"record {index} is outside the {self._len} records of an epoch")
        index %= self._len
        return self._records[int(self._subset[index]) if self._subset is not None else index]


class EpochSampler:
    """``loader.sampler``: `set_epoch` sets the loader's epoch, as on a DistributedSampler."""

    def __init__(self, set_epoch: Callable[[int], None]) -> None:
        self._set_epoch = set_epoch

    def set_epoch(self, epoch: int) -> None:
        self._set_epoch(epoch)
