"""Seeded bijections on [0, n) evaluated one position at a time, and the epoch orders built on them.

A sorted-key order (`sampling`) sorts every record's key, 8 bytes a record at least. The orders
here compute the record at any position of an epoch from the position alone, with per-shard
state only, so an epoch of 10^9 records costs nothing before its first batch:

- `permute` is a Feistel network on ``2 * h`` bits (``4^h >= n``) with `ROUNDS` rounds keyed by
  SplitMix64 (`keys.record_keys`), restricted to [0, n) by cycle walking: a value outside
  [0, n) is encrypted again until it falls inside. It is a permutation of [0, n) for every n.
- `FeistelOrder` is the shuffled order of an epoch: position p holds record ``permute(p)``.
- `WindowedFeistelOrder` is the block shuffle: shards ordered by their SHARD keys and cut into
  windows of `window` shards (as `keys.window_order`), then each window's records permuted
  by its own bijection. One window is exactly `FeistelOrder`.
- `RepeatedOrder` is repeated augmentation: any of these orders with each position taken `k`
  times in a row, so each record comes k times an epoch and consecutive copies fall on
  consecutive ranks (DeiT's RASampler); copy c of a record draws its augmentation as in epoch
  ``draw_epoch(epoch, c, k) = k epoch + c``.

spec/sampling.md states the same rules for other implementations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from .keys import SHARD_STREAM, mix64, record_keys

__all__ = [
    "FEISTEL_STREAM",
    "ROUNDS",
    "ArrayOrder",
    "EpochOrder",
    "FeistelOrder",
    "IdentityOrder",
    "RepeatedOrder",
    "WindowedFeistelOrder",
    "draw_epoch",
    "half_bits",
    "permute",
]

FEISTEL_STREAM = 0x46454953
"""The stream of the round keys ("FEIS")."""
ROUNDS = 6
"""Feistel rounds; the round keys of one bijection are ``key(seed, stream, epoch, 8 * index + j)``."""
_MAX_SIZE = 1 << 62


class EpochOrder(Protocol):
    """An epoch order: `size` positions, each holding one record index (`at`)."""

    @property
    def size(self) -> int: ...

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Return the record index at each of `positions` (int64, each in [0, size))."""
        ...


def half_bits(size: int) -> int:
    """Return h, the bits of each half of the Feistel block for [0, size): the least h >= 1 with
    ``4^h >= size``."""
    bits = 1
    while (1 << (2 * bits)) < size:
        bits += 1
    return bits


def round_keys(*, seed: int, stream: int, epoch: int, index: int) -> np.ndarray:
    """The `ROUNDS` round keys of bijection `index` of (seed, stream, epoch)."""
    return record_keys(seed, stream, epoch, np.arange(8 * index, 8 * index + ROUNDS, dtype=np.uint64))


def _encrypt(values: np.ndarray, keys: np.ndarray, bits: int) -> np.ndarray:
    mask = np.uint64((1 << bits) - 1)
    shift = np.uint64(bits)
    left, right = values >> shift, values & mask
    with np.errstate(over="ignore"):
        for key in keys:
            left, right = right, left ^ (mix64(key ^ right) & mask)
    return (left << shift) | right


def permute(positions: np.ndarray, *, size: int, seed: int, stream: int = FEISTEL_STREAM, epoch: int = 0, index: int = 0) -> np.ndarray:
    """Return the image of each position under bijection `index` of (seed, stream, epoch) on [0, size).

    Args:
        positions: integers in [0, size).
        size: the domain's size, 1 to 2^62.
        seed, stream, epoch, index: what the round keys are drawn from (see `round_keys`).

    Returns:
        int64 values in [0, size), distinct for distinct positions.

    Raises:
        ValueError: `size` is out of range or a position lies outside [0, size).
    """
    if not 1 <= size <= _MAX_SIZE:
        raise ValueError(f"a bijection needs a size from 1 to 2^62, got {size}")
    values = np.asarray(positions, dtype=np.int64)
    if values.size and (int(values.min()) < 0 or int(values.max()) >= size):
        raise ValueError(f"positions must lie in [0, {size})")
    bits = half_bits(size)
    keys = round_keys(seed=seed, stream=stream, epoch=epoch, index=index)
    result = _encrypt(values.astype(np.uint64), keys, bits)
    limit = np.uint64(size)
    outside = np.flatnonzero(result >= limit)
    while outside.size:  # cycle walking: the cycle through p returns to [0, size) at p at the latest
        walked = _encrypt(result[outside], keys, bits)
        result[outside] = walked
        outside = outside[walked >= limit]
    return result.astype(np.int64)


class IdentityOrder:
    """Records in dataset order (no shuffle)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def at(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)


class ArrayOrder:
    """An order held as an array of record indices (a sorted-key order)."""

    def __init__(self, order: np.ndarray) -> None:
        self.order = np.asarray(order, dtype=np.int64)
        self.size = len(self.order)

    def at(self, positions: np.ndarray) -> np.ndarray:
        return self.order[np.asarray(positions, dtype=np.int64)]


class FeistelOrder:
    """The shuffled epoch order of `size` records: position p holds ``permute(p, size, seed, epoch)``."""

    def __init__(self, size: int, *, seed: int, epoch: int, stream: int = FEISTEL_STREAM, index: int = 0) -> None:
        self.size = size
        self._key = {"seed": seed, "stream": stream, "epoch": epoch, "index": index}

    def at(self, positions: np.ndarray) -> np.ndarray:
        return permute(positions, size=self.size, **self._key)


class WindowedFeistelOrder:
    """The block shuffle of an epoch without a per-record array (spec/sampling.md).

    Shards are ordered by ``key(seed, SHARD, epoch, s)`` (stable) and window w holds the shards at
    positions [w K, (w + 1) K) of that order. Windows follow one another in that order. Inside
    window w, its records are numbered in dataset order (its shards by manifest index, records
    in table order), and the record at offset q of the window is number
    ``permute(q; size of the window, seed, FEISTEL, epoch, index w)``. With one window this is
    `FeistelOrder`, record for record.

    Args:
        shard_sizes: records per shard, in manifest order.
        seed, epoch: as for the other orders.
        window: shards per window, at least 1.

    Raises:
        ValueError: `window` is below 1 or a shard size is negative.
    """

    def __init__(self, shard_sizes: Sequence[int] | np.ndarray, *, seed: int, epoch: int, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 shard, got {window}")
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        if (sizes < 0).any():
            raise ValueError("shard sizes must not be negative")
        num_shards = len(sizes)
        self.seed, self.epoch = seed, epoch
        self.size = int(sizes.sum())
        self._dataset_start = np.concatenate([[0], np.cumsum(sizes)])
        by_key = np.argsort(record_keys(seed, SHARD_STREAM, epoch, np.arange(num_shards, dtype=np.uint64)), kind="stable")
        shard_window = np.empty(num_shards, np.int64)
        shard_window[by_key] = np.arange(num_shards) // window
        # shards grouped by window (windows in key order), by manifest index within a window
        self._members = np.lexsort((np.arange(num_shards), shard_window))
        self._member_start = np.concatenate([[0], np.cumsum(sizes[self._members])])
        num_windows = -(-num_shards // window)
        self._window_start = self._member_start[np.minimum(np.arange(num_windows + 1) * window, num_shards)]

    def at(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        windows = np.searchsorted(self._window_start, positions, side="right") - 1
        within = np.empty_like(positions)
        for w in np.unique(windows).tolist():
            chosen = windows == w
            start = int(self._window_start[w])
            count = int(self._window_start[w + 1]) - start
            within[chosen] = start + permute(positions[chosen] - start, size=count, seed=self.seed, epoch=self.epoch, index=w)
        members = np.searchsorted(self._member_start, within, side="right") - 1
        shards = self._members[members]
        records: np.ndarray = self._dataset_start[shards] + (within - self._member_start[members])
        return records


MAX_REPEATS = 1 << 16
"""The most copies of a record an epoch may hold."""

REPEAT_EPOCHS = ("copies", "records")
"""How many positions an epoch with repeats holds: "copies", every copy of every record (k N);
"records", as many as it has records (N: the first N positions of the k N, about N / k records
with k copies each, as torchvision's and DeiT's RASampler keeps its epochs)."""


def repeated_size(num_records: int, repeats: int, repeats_epoch: str = "copies") -> int:
    """The positions of an epoch of `num_records` records taken `repeats` times (`REPEAT_EPOCHS`).

    Raises:
        ValueError: `repeats_epoch` is not one of `REPEAT_EPOCHS`.
    """
    if repeats_epoch not in REPEAT_EPOCHS:
        raise ValueError(f"repeats_epoch must be one of {', '.join(repr(e) for e in REPEAT_EPOCHS)}, got {repeats_epoch!r}")
    return num_records * repeats if repeats_epoch == "copies" else num_records


class RepeatedOrder:
    """Repeated augmentation: `base` with every position taken `repeats` times in a row.

    Position p holds record ``base.at(p // k)`` as its copy ``p mod k`` (k = `repeats`), so an
    epoch of N records has k N positions and each record exactly k times; the split over ranks
    (rank r takes positions r, r + W, ...) puts the k copies of a record on k consecutive ranks,
    as DeiT's and torchvision's RASampler do (on one rank, in one batch, as Hoffer et al.'s
    batch augmentation). Every rule that works on positions (batches, resume, elastic resume)
    applies unchanged. With k = 1 this is `base`, position for position. `size` keeps only the
    first `size` positions (`repeated_size`: RASampler's epoch of N samples).

    Raises:
        ValueError: `repeats` is not an integer in [1, `MAX_REPEATS`], or `size` exceeds k N.
    """

    def __init__(self, base: EpochOrder, repeats: int, *, size: int | None = None) -> None:
        self.base = base
        self.repeats = check_repeats(repeats)
        self.size = base.size * self.repeats if size is None else int(size)
        if not 0 <= self.size <= base.size * self.repeats:
            raise ValueError(f"size must be in [0, {base.size * self.repeats}], got {size}")

    def at(self, positions: np.ndarray) -> np.ndarray:
        return self.base.at(np.asarray(positions, dtype=np.int64) // self.repeats)

    def copies(self, positions: np.ndarray) -> np.ndarray:
        """The copy number (0 to k - 1) at each of `positions`."""
        return np.asarray(positions, dtype=np.int64) % self.repeats


def check_repeats(repeats: object) -> int:
    """Return `repeats` if it is an integer in [1, `MAX_REPEATS`].

    Raises:
        ValueError: it is not.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or not 1 <= int(repeats) <= MAX_REPEATS:
        raise ValueError(f"repeats must be an integer from 1 to {MAX_REPEATS}, got {repeats!r}")
    return int(repeats)


def draw_epoch(epoch: int, copy: np.ndarray | int, repeats: int) -> np.ndarray:
    """The epoch whose draws copy `copy` of a record takes in epoch `epoch` with `repeats`
    copies: ``repeats * epoch + copy`` modulo 2^64 (uint64). Distinct (epoch, copy) pairs give
    distinct values for a fixed `repeats`, and with one copy it is the epoch itself."""
    with np.errstate(over="ignore"):
        return np.uint64(epoch & 0xFFFFFFFFFFFFFFFF) * np.uint64(repeats) + np.asarray(copy, dtype=np.uint64)
