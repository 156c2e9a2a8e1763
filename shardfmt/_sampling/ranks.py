"""One rank's batches of an epoch order, computed batch by batch, and resuming on other ranks.

`RankPlan` applies the split of spec/sampling.md ("Splitting over ranks and into batches") to any
`permutation.EpochOrder` from position `start` on: rank r takes positions ``start + r + k W``,
cut into batches by arithmetic, so a batch costs only its own records whatever the epoch's size.
With ``start = 0`` and an `ArrayOrder` it gives `keys.sample_batches`' batches exactly.

`delivered_records` is the elastic rule: after every rank of W has taken the same number of
batches, the records delivered are the first ``delivered_records(...)`` positions of the split
(a prefix), so a loader on W' ranks continues from ``start`` plus that, over the rest.
"""

from __future__ import annotations

import numpy as np

from .permutation import EpochOrder

__all__ = ["RankPlan", "delivered_records", "split_batches"]


def split_batches(remaining: int, *, batch_size: int, world_size: int, drop_last: bool) -> int:
    """Batches every rank gets from `remaining` records (0 when drop_last leaves none)."""
    if drop_last:
        return remaining // (world_size * batch_size)
    most = -(-remaining // world_size)
    return -(-most // batch_size)


def _batch_starts(counts: np.ndarray, batches: int, batch_size: int, number: int) -> np.ndarray:
    """Offset into each rank's records (ranks with `counts` records) where batch `number` starts."""
    starts: np.ndarray = np.minimum(np.int64(number) * batch_size, counts)
    if batches >= 2 and number == batches - 1:
        # a rank whose last batch would be empty ends with batches of B - 1 and 1 records
        short = counts == (batches - 1) * batch_size
        starts = np.where(short, counts - 1, starts)
    return starts


class RankPlan:
    """Rank `rank`'s batches of `order` from position `start` on.

    Args:
        order: the epoch order.
        batch_size, rank, world_size, drop_last: the split (spec/sampling.md).
        start: positions of the order delivered before this split began (elastic resume), 0
            for a whole epoch.
    """

    def __init__(self, order: EpochOrder, *, batch_size: int, rank: int, world_size: int, drop_last: bool, start: int = 0) -> None:
        if not 0 <= start <= order.size:
            raise ValueError(f"start {start} is outside [0, {order.size}]")
        self.order = order
        self.batch_size, self.rank, self.world_size, self.drop_last, self.start = batch_size, rank, world_size, drop_last, start
        remaining = order.size - start
        self.num_batches = split_batches(remaining, batch_size=batch_size, world_size=world_size, drop_last=drop_last)
        used = self.num_batches * world_size * batch_size if drop_last else remaining
        self.count = max(0, -(-(used - rank) // world_size))
        """Records of this rank."""
        self._indices: np.ndarray | None = None

    def __len__(self) -> int:
        return self.num_batches

    def span(self, number: int) -> tuple[int, int]:
        """(first, stop) offsets of batch `number` among this rank's records."""
        if not 0 <= number < self.num_batches:
            raise IndexError(f"batch {number} out of range for {self.num_batches} batches")
        counts = np.array([self.count], np.int64)
        first = int(_batch_starts(counts, self.num_batches, self.batch_size, number)[0])
        stop = (
            self.count if number == self.num_batches - 1 else int(_batch_starts(counts, self.num_batches, self.batch_size, number + 1)[0])
        )
        return first, stop

    def positions(self, number: int) -> np.ndarray:
        """Positions in the epoch order of batch `number`'s records."""
        first, stop = self.span(number)
        return self.start + self.rank + self.world_size * np.arange(first, stop, dtype=np.int64)

    def batch(self, number: int) -> np.ndarray:
        """Record indices of batch `number`."""
        return self.order.at(self.positions(number))

    @property
    def bounds(self) -> np.ndarray:
        """``bounds[b]`` is where batch b starts among this rank's records; the last entry is their count."""
        bounds = np.minimum(np.arange(self.num_batches + 1, dtype=np.int64) * self.batch_size, self.count)
        if self.num_batches >= 2 and self.count == (self.num_batches - 1) * self.batch_size:
            bounds[-2] = self.count - 1
        return bounds

    @property
    def indices(self) -> np.ndarray:
        """Every record index of this rank in order (8 bytes a record: for small epochs and tests)."""
        if self._indices is None:
            self._indices = self.order.at(self.start + self.rank + self.world_size * np.arange(self.count, dtype=np.int64))
        return self._indices


def delivered_records(remaining: int, *, batch_size: int, world_size: int, drop_last: bool, batches: int) -> int:
    """Records of a split of `remaining` records delivered once every rank has taken `batches` batches.

    They are always the first that many positions of the split: rank r's first c_r records are
    the positions r + k W for k < c_r, and c_r never grows with r.

    Raises:
        ValueError: `batches` exceeds the batches of the split.
    """
    total = split_batches(remaining, batch_size=batch_size, world_size=world_size, drop_last=drop_last)
    if not 0 <= batches <= total:
        raise ValueError(f"{batches} batches delivered, but the split has {total}")
    if drop_last:
        return batches * batch_size * world_size
    counts = -(-(remaining - np.arange(world_size, dtype=np.int64)) // world_size)
    if batches == total:
        return remaining
    return int(_batch_starts(counts, total, batch_size, batches).sum())
