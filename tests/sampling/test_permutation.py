"""Orders computed position by position: the Feistel bijection, its windowed form, the lazy rank
split, and the sizes at which they cost nothing a record."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfmt._sampling.keys import ORDER_STREAM, SHARD_STREAM, record_keys, sample_batches
from shardfmt._sampling.orders import FEISTEL_FROM, epoch_order, resolve_order
from shardfmt._sampling.permutation import (
    ArrayOrder,
    FeistelOrder,
    WindowedFeistelOrder,
    half_bits,
    permute,
)
from shardfmt._sampling.ranks import RankPlan, delivered_records


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 5000), seed=st.integers(-(2**63), 2**64 - 1), epoch=st.integers(0, 2**64 - 1), index=st.integers(0, 2**40))
def test_the_bijection_is_a_permutation_for_every_size(size: int, seed: int, epoch: int, index: int) -> None:
    image = permute(np.arange(size), size=size, seed=seed, epoch=epoch, index=index)
    assert image.dtype == np.int64
    assert np.array_equal(np.sort(image), np.arange(size))


@settings(max_examples=40, deadline=None)
@given(size=st.integers(5001, 2**62), seed=st.integers(0, 2**64 - 1), data=st.data())
def test_the_bijection_stays_in_range_and_injective_on_large_domains(size: int, seed: int, data: st.DataObject) -> None:
    positions = np.array(sorted(set(data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=300)))), np.int64)
    image = permute(positions, size=size, seed=seed)
    assert int(image.min()) >= 0 and int(image.max()) < size
    assert len(set(image.tolist())) == len(positions)


def test_half_bits_and_refusals() -> None:
    assert [half_bits(n) for n in (1, 4, 5, 16, 17, 2**20, 2**20 + 1, 10**9)] == [1, 1, 2, 2, 3, 10, 11, 15]
    with pytest.raises(ValueError, match="size from 1"):
        permute(np.arange(1), size=0, seed=0)
    with pytest.raises(ValueError, match="positions must lie"):
        permute(np.array([5]), size=5, seed=0)


def test_orders_depend_on_seed_epoch_and_stream() -> None:
    base = permute(np.arange(1000), size=1000, seed=1, epoch=0)
    assert not np.array_equal(base, permute(np.arange(1000), size=1000, seed=2, epoch=0))
    assert not np.array_equal(base, permute(np.arange(1000), size=1000, seed=1, epoch=1))
    assert not np.array_equal(base, permute(np.arange(1000), size=1000, seed=1, epoch=0, stream=ORDER_STREAM))
    assert np.array_equal(base, FeistelOrder(1000, seed=1, epoch=0).at(np.arange(1000)))


@settings(max_examples=120, deadline=None)
@given(
    shard_sizes=st.lists(st.integers(0, 40), min_size=1, max_size=25),
    window=st.integers(1, 30),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 100),
)
def test_windowed_feistel_orders_are_permutations_read_window_by_window(shard_sizes: list[int], window: int, seed: int, epoch: int) -> None:
    order = WindowedFeistelOrder(shard_sizes, seed=seed, epoch=epoch, window=window)
    records = order.at(np.arange(order.size))
    assert np.array_equal(np.sort(records), np.arange(sum(shard_sizes)))
    shard_window = np.empty(len(shard_sizes), np.int64)
    shard_window[np.argsort(record_keys(seed, SHARD_STREAM, epoch, np.arange(len(shard_sizes), dtype=np.uint64)), kind="stable")] = (
        np.arange(len(shard_sizes)) // window
    )
    shard_of = np.repeat(np.arange(len(shard_sizes)), shard_sizes)
    assert (np.diff(shard_window[shard_of[records]]) >= 0).all(), "windows come one after another"
    if window >= len(shard_sizes) and order.size:
        assert np.array_equal(records, FeistelOrder(order.size, seed=seed, epoch=epoch).at(np.arange(order.size)))


@settings(max_examples=150, deadline=None)
@given(
    num_records=st.integers(1, 300),
    batch_size=st.integers(1, 20),
    world_size=st.integers(1, 8),
    seed=st.integers(0, 2**63),
    drop_last=st.booleans(),
)
def test_the_lazy_split_gives_sample_batches_exactly(
    num_records: int, batch_size: int, world_size: int, seed: int, drop_last: bool
) -> None:
    try:
        plans = [
            sample_batches(num_records, batch_size=batch_size, seed=seed, epoch=3, rank=r, world_size=world_size, drop_last=drop_last)
            for r in range(world_size)
        ]
    except ValueError:
        return
    order = ArrayOrder(np.argsort(record_keys(seed, ORDER_STREAM, 3, np.arange(num_records, dtype=np.uint64)), kind="stable"))
    for rank, plan in enumerate(plans):
        lazy = RankPlan(order, batch_size=batch_size, rank=rank, world_size=world_size, drop_last=drop_last)
        assert len(lazy) == len(plan)
        assert np.array_equal(lazy.bounds, plan.bounds)
        assert all(np.array_equal(lazy.batch(b), plan.batch(b)) for b in range(len(plan)))


@settings(max_examples=100, deadline=None)
@given(num_records=st.integers(1, 400), batch_size=st.integers(2, 30), world_size=st.integers(1, 8), seed=st.integers(0, 2**63))
def test_feistel_ranks_are_disjoint_equal_and_cover_the_epoch(num_records: int, batch_size: int, world_size: int, seed: int) -> None:
    if num_records < world_size:
        return
    order = FeistelOrder(num_records, seed=seed, epoch=1)
    plans = [RankPlan(order, batch_size=batch_size, rank=r, world_size=world_size, drop_last=False) for r in range(world_size)]
    assert len({len(p) for p in plans}) == 1
    everything = np.concatenate([p.batch(b) for p in plans for b in range(len(p))])
    assert np.array_equal(np.sort(everything), np.arange(num_records))


@pytest.mark.parametrize("stop", ["start", "middle", "end"])
def test_a_feistel_plan_resumed_at_any_batch_continues_the_same_order(stop: str) -> None:
    order = epoch_order("feistel", num_records=10_007, seed=4, epoch=2)
    plan = RankPlan(order, batch_size=64, rank=1, world_size=3, drop_last=False)
    at = {"start": 0, "middle": len(plan) // 2, "end": len(plan)}[stop]
    again = RankPlan(epoch_order("feistel", num_records=10_007, seed=4, epoch=2), batch_size=64, rank=1, world_size=3, drop_last=False)
    assert [again.batch(b).tolist() for b in range(at, len(again))] == [plan.batch(b).tolist() for b in range(at, len(plan))]
    assert (
        delivered_records(10_007, batch_size=64, world_size=3, drop_last=False, batches=at)
        == {"start": 0, "middle": 26 * 64 * 3, "end": 10_007}[stop]
    )


def test_auto_takes_feistel_from_the_threshold_on() -> None:
    assert FEISTEL_FROM == 65_536
    assert resolve_order("auto", num_records=FEISTEL_FROM - 1) == "sorted-key"
    assert resolve_order("auto", num_records=FEISTEL_FROM) == "feistel"
    assert resolve_order("sorted-key", num_records=10**9) == "sorted-key"
    assert resolve_order("auto", num_records=10, mixture=True) == "feistel"
    with pytest.raises(ValueError, match="order must be"):
        resolve_order("random", num_records=10)
    with pytest.raises(ValueError, match="Mixture"):
        resolve_order("sorted-key", num_records=10, mixture=True)


def test_the_first_batch_of_a_billion_records_costs_nothing_a_record() -> None:
    """Rank 0 of 1,024 at N = 10^9: the first batch from per-shard state alone (a sorted-key
    order would need 8 GB of keys)."""
    shard_sizes = np.full(10_000, 100_000, np.int64)
    tracemalloc.start()
    try:
        full = RankPlan(
            epoch_order("feistel", num_records=10**9, seed=0, epoch=0), batch_size=256, rank=0, world_size=1024, drop_last=False
        )
        windowed = RankPlan(
            epoch_order("feistel", num_records=10**9, seed=0, epoch=0, shard_sizes=shard_sizes, window=64),
            batch_size=256,
            rank=0,
            world_size=1024,
            drop_last=False,
        )
        first, first_windowed = full.batch(0), windowed.batch(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * 1024 * 1024
    assert len(full) == 3815 and first.shape == (256,) and len(set(first.tolist())) == 256
    assert first.tolist()[:4] == permute(np.arange(0, 4 * 1024, 1024), size=10**9, seed=0).tolist()
    assert len({int(i) // 100_000 for i in first_windowed}) <= 64
