"""Which order an epoch takes, and building it: sorted-key, Feistel, or a mixture's.

Two orders shuffle a dataset (spec/sampling.md): "sorted-key", every record's key sorted (the
order of shardfmt 0.1; 8 bytes a record and a sort), and "feistel", a bijection evaluated
position by position (`permutation`; nothing a record). ``order="auto"`` takes "sorted-key" for
datasets of at most `FEISTEL_FROM` - 1 records and "feistel" from `FEISTEL_FROM` on, so small
datasets keep the orders they always had and large ones cost nothing to start. A `Mixture`
always interleaves with the Feistel bijection (`mixture.MixtureOrder`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .keys import ORDER_STREAM, record_keys, sample_batches, window_order
from .mixture import MixtureOrder
from .permutation import (
    ArrayOrder,
    EpochOrder,
    FeistelOrder,
    IdentityOrder,
    WindowedFeistelOrder,
)

__all__ = ["FEISTEL_FROM", "ORDERS", "epoch_order", "resolve_order"]

FEISTEL_FROM = 1 << 16
"""The dataset size from which ``order="auto"`` is "feistel" (65,536 records: a sorted-key order
of fewer costs at most about 1.5 MB and a few milliseconds)."""
ORDERS = ("auto", "sorted-key", "feistel")


def resolve_order(order: str, *, num_records: int, mixture: bool = False) -> str:
    """Return the order an epoch of `num_records` takes: "sorted-key" or "feistel".

    Raises:
        ValueError: `order` is not one of `ORDERS`, or a mixture is asked for "sorted-key".
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
    if mixture:
        if order == "sorted-key":
            raise ValueError("a Mixture interleaves its sources with the 'feistel' order; give order='auto' or 'feistel'")
        return "feistel"
    if order == "auto":
        return "feistel" if num_records >= FEISTEL_FROM else "sorted-key"
    return order


def epoch_order(
    name: str,
    *,
    num_records: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    shard_sizes: Sequence[int] | np.ndarray | None = None,
    window: int | None = None,
    source_sizes: Sequence[int] | None = None,
    source_counts: Sequence[int] | None = None,
    subset: np.ndarray | None = None,
) -> EpochOrder:
    """Build epoch `epoch`'s order of `num_records` records.

    Args:
        name: "sorted-key" or "feistel" (`resolve_order`).
        num_records, seed, epoch, shuffle: as for `keys.sample_batches`.
        shard_sizes, window: the block shuffle (both, or neither).
        source_sizes, source_counts: for a mixture, each source's records and its draws an epoch
            (then `num_records` is the epoch size).
        subset: distinct record indices (as `keys.check_subset` returns them): the epoch
            holds those only, shuffled in the order the full epoch puts them (the full order with
            the others left out), unshuffled in the order given. The order is then an array of
            the subset's size; with "feistel" the full order is evaluated once to filter it.

    Raises:
        ValueError: a window comes without shard sizes that add up to `num_records`.
    """
    if source_sizes is not None and source_counts is not None:
        return MixtureOrder(source_sizes, counts=source_counts, seed=seed, epoch=epoch, shuffle=shuffle)
    if subset is not None:
        return _subset_order(
            name, subset, num_records=num_records, seed=seed, epoch=epoch, shuffle=shuffle, shard_sizes=shard_sizes, window=window
        )
    if not shuffle:
        return IdentityOrder(num_records)
    if window is not None and (shard_sizes is None or int(np.sum(shard_sizes)) != num_records):
        raise ValueError("a window needs shard_sizes that add up to num_records")
    if name == "feistel":
        if window is not None and shard_sizes is not None:
            return WindowedFeistelOrder(shard_sizes, seed=seed, epoch=epoch, window=window)
        return FeistelOrder(num_records, seed=seed, epoch=epoch)
    if window is not None and shard_sizes is not None:
        return ArrayOrder(window_order(shard_sizes, seed=seed, epoch=epoch, window=window))
    keys = record_keys(seed, ORDER_STREAM, epoch, np.arange(num_records, dtype=np.uint64))
    return ArrayOrder(np.argsort(keys, kind="stable"))


def _subset_order(
    name: str,
    subset: np.ndarray,
    *,
    num_records: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    shard_sizes: Sequence[int] | np.ndarray | None,
    window: int | None,
) -> EpochOrder:
    """The order of an epoch over `subset` (see `epoch_order`)."""
    if not shuffle:
        return ArrayOrder(np.asarray(subset, dtype=np.int64))
    if name == "feistel":
        full = epoch_order(name, num_records=num_records, seed=seed, epoch=epoch, shard_sizes=shard_sizes, window=window)
        positions = full.at(np.arange(num_records, dtype=np.int64))
        member = np.zeros(num_records, dtype=bool)
        member[subset] = True
        return ArrayOrder(positions[member[positions]])
    batches = sample_batches(
        num_records, batch_size=len(subset), seed=seed, epoch=epoch, shard_sizes=shard_sizes, window=window, subset=subset
    )
    return ArrayOrder(batches.indices)
