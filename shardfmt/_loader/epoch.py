"""A loader's epochs: `Epochs`, how many records and positions each holds and the order that
shuffles them; `EpochRecords`, what a `Loader` offers as ``loader.dataset``, as torch's
DataLoader does; `EpochSampler`, its ``loader.sampler`` (only ``set_epoch``, what training
loops call on it); and `EpochBatches`, its ``loader.batch_sampler``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._checksum import checksum, format_checksum
from .._dataset.concat import ConcatReader, RecordSource
from .._sampling.keys import check_split, check_subset
from .._sampling.mixture import MAX_EPOCH_SIZE, Mixture
from .._sampling.orders import epoch_order, resolve_order
from .._sampling.permutation import RepeatedOrder, repeated_size
from .._sampling.policy import Sampling

__all__ = ["EpochBatches", "EpochRecords", "EpochSampler", "Epochs"]


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


class EpochBatches:
    """``loader.batch_sampler``, as a DataLoader's `torch.utils.data.BatchSampler`: `sampler`,
    `batch_size`, `drop_last`, ``len`` (this rank's batches an epoch) and iteration over the
    record indices of this rank's batches of the epoch in progress or the next one (what
    ``return_indices`` delivers; it reads no image and moves no position)."""

    def __init__(self, sampler: EpochSampler, *, batch_size: int, drop_last: bool, plan: Callable[[], Any]) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last
        self._plan = plan

    def __len__(self) -> int:
        return len(self._plan())

    def __iter__(self) -> Iterator[list[int]]:
        plan = self._plan()
        for batch in range(len(plan)):
            yield [int(i) for i in plan.batch(batch)]


class Epochs:
    """The epochs a loader draws from its records: how many records and positions each holds,
    the order that shuffles them (`order_of`), and the checks that the batches split over the
    ranks. Made once by the loader from its `Sampling` policy; no state of the stream (`cursor` has it).

    Raises:
        ValueError: a subset or window of a `Mixture`, or a malformed subset; more than `MAX_EPOCH_SIZE`
            positions an epoch (records times repeats); an unknown order; a source of
            the mixture that holds no records but is to give some; a batch split that is
            impossible (e.g. fewer records than ranks); `rank` outside [0, `world_size`).
    """

    def __init__(
        self, sampling: Sampling, dataset: RecordSource, *, batch_size: int, mixture: Mixture | None, rank: int, world_size: int
    ) -> None:
        self.sampling = sampling
        self.batch_size = batch_size
        self.dataset = dataset
        self.mixture = mixture
        self.num_records = mixture.epoch_size if mixture is not None else len(dataset)
        """Records of the dataset, or the mixture's epoch size."""
        if sampling.subset is not None and mixture is not None:
            raise ValueError("subset does not apply to a Mixture: its weights and epoch_size choose the records of an epoch")
        if sampling.window is not None and mixture is not None:
            raise ValueError("window does not apply to a Mixture: its epochs interleave the sources record by record")
        self.subset = None if sampling.subset is None else check_subset(sampling.subset, self.num_records)
        self.epoch_records = self.num_records if self.subset is None else len(self.subset)
        self.epoch_positions = repeated_size(self.epoch_records, sampling.repeats, sampling.repeats_epoch)
        """Positions of an epoch's order: its records, each `repeats` times (or the first
        `epoch_records` of those, `repeats_epoch="records"`)."""
        if self.epoch_records * sampling.repeats > MAX_EPOCH_SIZE:
            raise ValueError(
                f"an epoch of {self.epoch_records} records times repeats={sampling.repeats} holds "
                f"{self.epoch_records * sampling.repeats} positions; "
                f"repeats must be in [1, {MAX_EPOCH_SIZE // self.epoch_records}] here (an epoch holds at most {MAX_EPOCH_SIZE})"
            )
        self.order = resolve_order(sampling.order, num_records=self.num_records, mixture=mixture is not None)
        self.source_sizes: list[int] | None = None
        """Records in each source of the mixture; None without one."""
        self.source_counts: list[int] | None = None
        """Records each source of the mixture gives an epoch; None without one."""
        if mixture is not None:
            sizes, counts = _source_sizes(dataset), mixture.counts
            for name, records, count in zip(mixture.names, sizes, counts, strict=True):
                if count and not records:
                    raise ValueError(f"source {name!r} of the mixture holds no records but is to give {count} an epoch")
            self.source_sizes, self.source_counts = sizes, counts
        self.check_ranks(rank, world_size)
        self.shard_sizes = np.diff(dataset.cumulative)

    def check_ranks(self, rank: int, world_size: int) -> None:
        """Raises ValueError unless each epoch splits over `world_size` ranks and `rank` is one of them."""
        check_split(self.epoch_positions, batch_size=self.batch_size, world_size=world_size, drop_last=self.sampling.drop_last)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, {world_size})")

    def fingerprint(self, *, rank: int, world_size: int) -> dict[str, Any]:
        """The epochs' part of a loader state's settings (a resume compares them): the sampling
        policy's (`Sampling.fingerprint`), the records and subset, the order as resolved, the
        ranks, and the mixture (its config and its sources' sizes) where there is one."""
        subset = None if self.subset is None else format_checksum(checksum(self.subset.astype("<i8").tobytes()))
        found = self.sampling.fingerprint() | {
            "num_records": self.num_records,
            "subset": subset,
            "rank": rank,
            "world_size": world_size,
            "order": self.order,
        }
        if self.mixture is not None:
            found["mixture"] = json.dumps(self.mixture.to_config() | {"sizes": self.source_sizes}, sort_keys=True)
        return found

    def order_of(self, epoch: int) -> Any:
        """Epoch `epoch`'s order of positions: each record `repeats` times in a row of copies."""
        order = self._base_order(epoch)
        return RepeatedOrder(order, self.sampling.repeats, size=self.epoch_positions) if self.sampling.repeats > 1 else order

    def _base_order(self, epoch: int) -> Any:
        sampling = self.sampling
        return epoch_order(
            self.order,
            num_records=self.num_records,
            seed=sampling.seed,
            epoch=epoch,
            shuffle=sampling.shuffle,
            shard_sizes=self.shard_sizes if sampling.window is not None else None,
            window=sampling.window,
            source_sizes=self.source_sizes,
            source_counts=self.source_counts,
            subset=self.subset,
        )


def _source_sizes(dataset: RecordSource) -> list[int]:
    """Records in each source of a mixture's dataset, which `open_records` opened as a `ConcatReader`.

    Raises:
        RuntimeError: the dataset is not a `ConcatReader` (a mixture's records read otherwise).
    """
    if not isinstance(dataset, ConcatReader):
        raise RuntimeError(f"a Mixture's records are read through a ConcatReader (open_records), not a {type(dataset).__name__}")
    return dataset.sizes
