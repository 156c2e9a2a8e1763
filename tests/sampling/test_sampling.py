"""Epoch orders: permutations, disjoint equal ranks, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfmt._sampling.keys import SHARD_STREAM, check_subset, record_keys, sample_batches, window_order


@settings(max_examples=150, deadline=None)
@given(
    num_records=st.integers(1, 400),
    batch_size=st.integers(2, 40),
    world_size=st.integers(1, 8),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 1000),
    shuffle=st.booleans(),
)
def test_ranks_are_disjoint_equal_and_cover_the_epoch(
    num_records: int, batch_size: int, world_size: int, seed: int, epoch: int, shuffle: bool
) -> None:
    if num_records < world_size:
        with pytest.raises(ValueError, match="cannot be split"):
            sample_batches(num_records, batch_size=batch_size, seed=seed, epoch=epoch, world_size=world_size)
        return
    plans = [
        sample_batches(num_records, batch_size=batch_size, seed=seed, epoch=epoch, rank=r, world_size=world_size, shuffle=shuffle)
        for r in range(world_size)
    ]
    assert len({len(p) for p in plans}) == 1, "every rank gets the same number of batches"
    everything = np.concatenate([p.indices for p in plans])
    assert sorted(everything.tolist()) == list(range(num_records)), "every record exactly once"
    for plan in plans:
        sizes = np.diff(plan.bounds)
        assert sizes.min() >= 1 and sizes.max() <= batch_size


@settings(max_examples=100, deadline=None)
@given(num_records=st.integers(1, 400), batch_size=st.integers(1, 40), world_size=st.integers(1, 8), seed=st.integers(0, 2**32))
def test_drop_last_gives_full_equal_batches(num_records: int, batch_size: int, world_size: int, seed: int) -> None:
    if num_records < world_size * batch_size:
        with pytest.raises(ValueError, match="no full batch"):
            sample_batches(num_records, batch_size=batch_size, seed=seed, epoch=0, world_size=world_size, drop_last=True)
        return
    plans = [
        sample_batches(num_records, batch_size=batch_size, seed=seed, epoch=0, rank=r, world_size=world_size, drop_last=True)
        for r in range(world_size)
    ]
    expected = num_records // (world_size * batch_size)
    assert all(len(p) == expected for p in plans)
    assert all((np.diff(p.bounds) == batch_size).all() for p in plans)
    everything = np.concatenate([p.indices for p in plans])
    assert len(set(everything.tolist())) == len(everything) == expected * world_size * batch_size


def test_orders_are_reproducible_and_differ_between_epochs() -> None:
    first = sample_batches(1000, batch_size=10, seed=7, epoch=0).indices
    assert np.array_equal(first, sample_batches(1000, batch_size=10, seed=7, epoch=0).indices)
    second = sample_batches(1000, batch_size=10, seed=7, epoch=1).indices
    other_seed = sample_batches(1000, batch_size=10, seed=8, epoch=0).indices
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, other_seed)
    assert np.array_equal(sample_batches(1000, batch_size=10, seed=7, epoch=0, shuffle=False).indices, np.arange(1000))


def test_batch_size_one_with_a_remainder_is_refused() -> None:
    with pytest.raises(ValueError, match="drop_last=True"):
        sample_batches(5, batch_size=1, seed=0, epoch=0, world_size=2)


@settings(max_examples=120, deadline=None)
@given(
    shard_sizes=st.lists(st.integers(0, 40), min_size=1, max_size=25),
    window=st.integers(1, 30),
    batch_size=st.integers(2, 16),
    world_size=st.integers(1, 6),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 100),
)
def test_windowed_orders_keep_exact_epochs_and_equal_ranks(
    shard_sizes: list[int], window: int, batch_size: int, world_size: int, seed: int, epoch: int
) -> None:
    num_records = sum(shard_sizes)
    if num_records < world_size:
        return
    plans = [
        sample_batches(
            num_records,
            batch_size=batch_size,
            seed=seed,
            epoch=epoch,
            rank=r,
            world_size=world_size,
            shard_sizes=shard_sizes,
            window=window,
        )
        for r in range(world_size)
    ]
    assert len({len(p) for p in plans}) == 1
    everything = np.concatenate([p.indices for p in plans])
    assert sorted(everything.tolist()) == list(range(num_records))
    order = window_order(shard_sizes, seed=seed, epoch=epoch, window=window)
    assert np.array_equal(plans[0].indices, order[0::world_size])
    # shards in the order of their SHARD_STREAM keys, cut into windows: each window's records
    # come together in the order, so at most `window` shards are read at a time
    shard_keys = record_keys(seed, SHARD_STREAM, epoch, np.arange(len(shard_sizes), dtype=np.uint64))
    shard_window = np.empty(len(shard_sizes), np.int64)
    shard_window[np.argsort(shard_keys, kind="stable")] = np.arange(len(shard_sizes)) // window
    shard_of = np.repeat(np.arange(len(shard_sizes)), shard_sizes)
    windows_along_order = shard_window[shard_of[order]]
    assert (np.diff(windows_along_order) >= 0).all()


def test_a_window_covering_every_shard_is_the_full_shuffle() -> None:
    sizes = [13, 0, 7, 21, 9]
    full = sample_batches(50, batch_size=8, seed=5, epoch=3, world_size=2, rank=1)
    windowed = sample_batches(50, batch_size=8, seed=5, epoch=3, world_size=2, rank=1, shard_sizes=sizes, window=5)
    assert np.array_equal(full.indices, windowed.indices) and np.array_equal(full.bounds, windowed.bounds)
    assert not np.array_equal(
        full.indices, sample_batches(50, batch_size=8, seed=5, epoch=3, world_size=2, rank=1, shard_sizes=sizes, window=2).indices
    )


def test_windowed_orders_are_reproducible_and_change_by_epoch() -> None:
    sizes = [100] * 10
    first = window_order(sizes, seed=1, epoch=0, window=3)
    assert np.array_equal(first, window_order(sizes, seed=1, epoch=0, window=3))
    assert not np.array_equal(first, window_order(sizes, seed=1, epoch=1, window=3))
    with pytest.raises(ValueError, match="window"):
        window_order(sizes, seed=1, epoch=0, window=0)
    with pytest.raises(ValueError, match="shard_sizes"):
        sample_batches(1000, batch_size=10, seed=0, epoch=0, window=2)


@settings(max_examples=120, deadline=None)
@given(
    data=st.data(),
    num_records=st.integers(1, 300),
    batch_size=st.integers(2, 20),
    world_size=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    windowed=st.booleans(),
)
def test_a_subset_epoch_is_the_full_order_restricted_and_splits_exactly(
    data: st.DataObject, num_records: int, batch_size: int, world_size: int, seed: int, epoch: int, windowed: bool
) -> None:
    world_size = min(world_size, num_records)
    subset = np.array(
        data.draw(st.lists(st.integers(0, num_records - 1), min_size=world_size, max_size=num_records, unique=True)), np.int64
    )
    shard_sizes = [num_records // 3, num_records - num_records // 3] if windowed else None
    window = 1 if windowed else None
    full = sample_batches(num_records, batch_size=1, seed=seed, epoch=epoch, shard_sizes=shard_sizes, window=window)
    order = [i for i in full.indices.tolist() if i in set(subset.tolist())]
    plans = [
        sample_batches(
            num_records,
            batch_size=batch_size,
            seed=seed,
            epoch=epoch,
            rank=r,
            world_size=world_size,
            shard_sizes=shard_sizes,
            window=window,
            subset=subset,
        )
        for r in range(world_size)
    ]
    assert len({len(plan) for plan in plans}) == 1
    for rank, plan in enumerate(plans):
        assert plan.indices.tolist() == order[rank::world_size]
    unshuffled = sample_batches(num_records, batch_size=batch_size, seed=seed, epoch=epoch, shuffle=False, subset=subset)
    assert unshuffled.indices.tolist() == subset.tolist()


def test_subsets_are_checked() -> None:
    assert check_subset([4, 1, 2], 5).tolist() == [4, 1, 2]
    assert check_subset(np.array([True, False, True]), 3).tolist() == [0, 2]
    assert check_subset(np.array([], np.int64), 3).tolist() == []
    for bad, message in (
        ([5], "outside"),
        ([1, 1], "more than once"),
        (np.array([True]), "one entry per record"),
        ([[1]], "one-dimensional"),
        (["a"], "integers"),
    ):
        with pytest.raises(ValueError, match=message):
            check_subset(bad, 5)
