"""Epoch orders: pure functions from (size, seed, epoch, rank, world size) to batches of indices.

Nothing here holds state, so an order can be recomputed anywhere: in a worker, after a restart,
or by a reader in another language (spec/sampling.md gives the same rules). Randomness comes
from SplitMix64 hashing of (seed, stream, epoch, index), not from a generator's hidden state:

- the shuffled order of an epoch is the stable argsort of ``hash(seed, ORDER, epoch, i)``;
- the windowed (block-shuffled) order, for datasets read through a cache smaller than they are,
  first sorts the shards by ``hash(seed, SHARD, epoch, s)``, cuts that order into windows of
  `window` shards, and shuffles records within each window only (`window_order`);
- the augmentation draws of record ``r`` are ``hash(seed, AUGMENT, epoch, r) + k`` for draw ``k``,
  so a record is cropped the same way whichever rank, worker or batch handles it; step ``j`` of a
  transform's ``augment`` list draws from ``hash(seed, STEP + j, epoch, r)`` likewise, and batch
  step ``j`` of its ``batch_augment=`` list from ``hash(seed, BATCH + j, epoch, b)`` for batch b;
- an epoch over a subset of the records (`sample_batches(subset=...)`) is the full epoch order
  with the other records left out, then split over ranks and batches like a full epoch.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AUGMENT_STREAM",
    "BATCH_STREAM",
    "ORDER_STREAM",
    "RNG_STREAM",
    "SHARD_STREAM",
    "STEP_STREAM",
    "EpochPlan",
    "check_subset",
    "keys_by_epoch",
    "mix64",
    "record_keys",
    "sample_batches",
    "uniforms",
    "window_order",
]

ORDER_STREAM = 0x4F52444552
SHARD_STREAM = 0x5348415244
AUGMENT_STREAM = 0x4155474D
STEP_STREAM = 0x53544550530000
""""STEPS" shifted left by 16 bits: step j of an augment list uses stream STEP_STREAM + j, which
meets none of the other streams for j below 2^16 (they are below 2^40)."""
RNG_STREAM = 0x524E47530000
""""RNGS" shifted left by 16 bits: before a user's step j runs on a record, a loader seeds the
process's global torch, numpy and `random` generators from key(seed, RNG_STREAM + j, epoch,
record); like STEP_STREAM + j it meets no other stream for j below 2^16."""
MAX_STEPS = 1 << 16
BATCH_STREAM = 0x4241544348530000
""""BATCHS" shifted left by 16 bits: batch step j (MixUp, CutMix, ...) of a loader's
batch_augment list uses stream BATCH_STREAM + j, indexed by the batch's number."""
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray | np.uint64) -> np.ndarray:
    """SplitMix64's finaliser applied to uint64 values (wrapping arithmetic)."""
    values: np.ndarray = np.asarray(x, dtype=np.uint64) + _GOLDEN
    values = (values ^ (values >> np.uint64(30))) * _M1
    values = (values ^ (values >> np.uint64(27))) * _M2
    mixed: np.ndarray = values ^ (values >> np.uint64(31))
    return mixed


def record_keys(seed: int, stream: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """Return ``mix64(mix64(mix64(mix64(seed) ^ stream) ^ epoch) ^ index)`` for each index."""
    with np.errstate(over="ignore"):
        base = mix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
        base = mix64(base ^ np.uint64(stream))
        base = mix64(base ^ np.uint64(epoch & 0xFFFFFFFFFFFFFFFF))
        return mix64(base ^ np.asarray(indices, dtype=np.uint64))


def keys_by_epoch(seed: int, stream: int, epochs: np.ndarray | int, indices: np.ndarray) -> np.ndarray:
    """`record_keys` with one epoch per index (an array as long as `indices`, or one int for all):
    the keys of repeated augmentation, where each copy of a record draws as its own epoch."""
    if isinstance(epochs, (int, np.integer)):
        return record_keys(seed, stream, int(epochs), indices)
    epochs = np.asarray(epochs, dtype=np.uint64)
    keys = np.empty(len(indices), np.uint64)
    for epoch in np.unique(epochs).tolist():
        chosen = epochs == epoch
        keys[chosen] = record_keys(seed, stream, int(epoch), np.asarray(indices)[chosen])
    return keys


def uniforms(keys: np.ndarray, count: int) -> np.ndarray:
    """Return `count` uniform floats in [0, 1) per key: shape (len(keys), count), 53-bit precision."""
    with np.errstate(over="ignore"):
        draws = mix64(keys[:, None] + np.arange(1, count + 1, dtype=np.uint64)[None, :])
    return (draws >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class EpochPlan:
    """One rank's batches for one epoch: ``indices[bounds[b]:bounds[b + 1]]`` is batch ``b``."""

    indices: np.ndarray
    bounds: np.ndarray

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def batch(self, number: int) -> np.ndarray:
        return self.indices[self.bounds[number] : self.bounds[number + 1]]


def check_split(num_records: int, *, batch_size: int, world_size: int, drop_last: bool) -> None:
    """Raise ValueError if the records cannot give every rank the same number of non-empty batches."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if drop_last:
        if num_records < world_size * batch_size:
            raise ValueError(
                f"{num_records} records make no full batch of {batch_size} on each of {world_size} ranks; "
                "use drop_last=False or a smaller batch_size"
            )
        return
    if num_records < world_size:
        raise ValueError(f"{num_records} records cannot be split over {world_size} ranks")
    if batch_size == 1 and num_records % world_size:
        raise ValueError(
            f"batch_size=1 with {num_records} records on {world_size} ranks would give ranks different "
            "numbers of batches; use drop_last=True or a larger batch_size"
        )


def check_subset(subset: Sequence[int] | np.ndarray, num_records: int) -> np.ndarray:
    """Return `subset` as an int64 array of distinct record indices in [0, num_records): it is
    either such indices (in any order) or a boolean mask of `num_records` entries.

    Raises:
        TypeError: `subset` is not a sequence or array (a set, a generator, a string).
        ValueError: more entries than the dataset has records, a mask of another length, an
            index out of range or repeated, or a value that is neither integers nor booleans.
    """
    if isinstance(subset, (str, bytes, Set, Mapping)) or not hasattr(subset, "__len__"):
        raise TypeError(f"subset must be a sequence of record indices or a boolean mask, got {type(subset).__name__}")
    try:
        length, shown = len(subset), str(len(subset))
    except OverflowError:  # a range longer than sys.maxsize
        length, shown = sys.maxsize, "more than sys.maxsize"
    if length > num_records:  # checked before anything is made of it: range(10**12) would fill the memory
        raise ValueError(
            f"subset must hold at most {num_records} entries (distinct indices in [0, {num_records}) or one per record), got {shown}"
        )
    array = np.asarray(subset)
    if array.ndim != 1:
        raise ValueError(f"subset must be one-dimensional, got shape {array.shape}")
    if array.dtype == np.bool_:
        if len(array) != num_records:
            raise ValueError(f"a subset mask needs one entry per record ({num_records}), got {len(array)}")
        return np.flatnonzero(array).astype(np.int64)
    if len(array) and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"subset must hold record indices (integers) or be a boolean mask, got {array.dtype}")
    indices = array.astype(np.int64)
    if len(indices) and (indices.min() < 0 or indices.max() >= num_records):
        bad = int(indices[(indices < 0) | (indices >= num_records)][0])
        raise ValueError(f"subset index {bad} is outside the dataset's records [0, {num_records})")
    if len(np.unique(indices)) != len(indices):
        raise ValueError("subset holds an index more than once; an epoch sees each record once")
    return indices


def window_order(shard_sizes: Sequence[int] | np.ndarray, *, seed: int, epoch: int, window: int) -> np.ndarray:
    """Return the block-shuffled order of an epoch: a permutation of all records.

    Shards are ordered by ``record_keys(seed, SHARD_STREAM, epoch, shard)`` (stable argsort);
    position p in that order belongs to window ``p // window``. Records are then sorted by
    (their shard's window, ``record_keys(seed, ORDER_STREAM, epoch, record)``, record), so each
    window's records come together, shuffled among themselves, and only about `window` shards
    are read at any time. With ``window >= len(shard_sizes)`` this is the full shuffle that
    `sample_batches` uses without a window, record for record.

    Args:
        shard_sizes: records per shard, in manifest order (records are numbered across shards).
        seed, epoch: as for `sample_batches`.
        window: shards per window, at least 1.

    Raises:
        ValueError: `window` is below 1 or a shard size is negative.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 shard, got {window}")
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    if (sizes < 0).any():
        raise ValueError("shard sizes must not be negative")
    return _window_positions(sizes, np.arange(int(sizes.sum()), dtype=np.int64), seed=seed, epoch=epoch, window=window)


def _window_positions(shard_sizes: Sequence[int] | np.ndarray, members: np.ndarray, *, seed: int, epoch: int, window: int) -> np.ndarray:
    """The windowed order of `members` (ascending record indices) as positions into it."""
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    num_shards = len(sizes)
    shard_rank = np.empty(num_shards, np.int64)
    shard_rank[np.argsort(record_keys(seed, SHARD_STREAM, epoch, np.arange(num_shards, dtype=np.uint64)), kind="stable")] = np.arange(
        num_shards
    )
    shard_of = np.searchsorted(np.cumsum(sizes), members, side="right")
    keys = record_keys(seed, ORDER_STREAM, epoch, members.astype(np.uint64))
    return np.lexsort((keys, shard_rank[shard_of] // window)).astype(np.int64)


def sample_batches(
    num_records: int,
    *,
    batch_size: int,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
    shuffle: bool = True,
    drop_last: bool = False,
    shard_sizes: Sequence[int] | np.ndarray | None = None,
    window: int | None = None,
    subset: np.ndarray | None = None,
) -> EpochPlan:
    """Return rank `rank`'s batches of epoch `epoch`.

    The epoch order is a permutation of all records (or 0..N-1 without `shuffle`); rank r takes
    every world_size-th record of it starting at r, so ranks are disjoint. With `window`, the
    permutation is `window_order` over `shard_sizes` (a block shuffle); the split over ranks and
    batches is the same.

    With `subset` (distinct indices in [0, num_records), as `check_subset` returns them) an epoch
    holds those records only: shuffled, in the order the full epoch would put them (the full
    order with the others left out); else in the order given. The split below then counts
    ``N = len(subset)`` records. Batches hold dataset indices either way.

    - ``drop_last=True``: each rank gets ``N // (world_size * batch_size)`` full batches; the last
      ``N mod (world_size * batch_size)`` records of this epoch's order are left out (other records
      each epoch, since the order changes).
    - ``drop_last=False``: every record exactly once. Each rank gets ``ceil(ceil(N / world_size) /
      batch_size)`` batches, all full but the last; a rank with one record fewer than rank 0 may end
      with batches of ``batch_size - 1`` and 1 records to keep the count equal.

    Raises:
        ValueError: the split is impossible (see `check_split`), `rank` is out of range, or a
            `window` comes without matching `shard_sizes`.
    """
    count = num_records if subset is None else len(subset)
    check_split(count, batch_size=batch_size, world_size=world_size, drop_last=drop_last)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    # The records of the epoch in ascending order: sorting them by key (stable, so ties go by
    # index) gives the full order with the other records left out.
    members = np.arange(num_records, dtype=np.int64) if subset is None else np.sort(subset)
    if window is not None and shuffle:
        if shard_sizes is None or int(np.sum(shard_sizes)) != num_records:
            raise ValueError("a window needs shard_sizes that add up to num_records")
        order = members[_window_positions(shard_sizes, members, seed=seed, epoch=epoch, window=window)]
    elif shuffle:
        keys = record_keys(seed, ORDER_STREAM, epoch, members.astype(np.uint64))
        order = members[np.argsort(keys, kind="stable")]
    else:
        order = members if subset is None else np.asarray(subset, dtype=np.int64)
    num_records = count
    if drop_last:
        per_rank = num_records // (world_size * batch_size)
        mine = order[: per_rank * world_size * batch_size][rank::world_size]
        return EpochPlan(mine, np.arange(per_rank + 1, dtype=np.int64) * batch_size)
    mine = order[rank::world_size]
    most = -(-num_records // world_size)
    num_batches = -(-most // batch_size)
    sizes = np.full(num_batches, batch_size, dtype=np.int64)
    sizes[-1] = len(mine) - (num_batches - 1) * batch_size
    if sizes[-1] == 0:
        sizes[-2] -= 1
        sizes[-1] = 1
    return EpochPlan(mine, np.concatenate([[0], np.cumsum(sizes)]))
