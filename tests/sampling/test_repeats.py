"""Repeated augmentation (`RepeatedOrder`): each record k times an epoch, the copies on
consecutive ranks, equal ranks, and resuming (on the same or other ranks) exact, for every order."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfmt._sampling.orders import epoch_order
from shardfmt._sampling.permutation import MAX_REPEATS, RepeatedOrder, check_repeats, draw_epoch, repeated_size
from shardfmt._sampling.ranks import RankPlan, delivered_records


def split(order: RepeatedOrder, *, batch_size: int, world_size: int, drop_last: bool, start: int = 0) -> list[RankPlan]:
    return [
        RankPlan(order, batch_size=batch_size, rank=r, world_size=world_size, drop_last=drop_last, start=start) for r in range(world_size)
    ]


def pairs(plan: RankPlan, order: RepeatedOrder, number: int) -> list[tuple[int, int]]:
    positions = plan.positions(number)
    return list(zip(order.at(positions).tolist(), order.copies(positions).tolist(), strict=True))


@st.composite
def settings_(draw: st.DrawFn) -> dict[str, int | str | bool]:
    num_records = draw(st.integers(1, 200))
    repeats = draw(st.integers(1, 5))
    world_size = draw(st.integers(1, 8))
    batch_size = draw(st.integers(2, 9))
    drop_last = draw(st.booleans())
    if num_records * repeats < (world_size * batch_size if drop_last else world_size):
        drop_last = False
        world_size = min(world_size, num_records * repeats)
    return {
        "num_records": num_records,
        "repeats": repeats,
        "world_size": world_size,
        "batch_size": batch_size,
        "drop_last": drop_last,
        "order": draw(st.sampled_from(["sorted-key", "feistel"])),
        "seed": draw(st.integers(0, 2**64 - 1)),
        "epoch": draw(st.integers(0, 1000)),
    }


def build(case: dict) -> RepeatedOrder:
    base = epoch_order(case["order"], num_records=case["num_records"], seed=case["seed"], epoch=case["epoch"])
    return RepeatedOrder(base, case["repeats"])


@settings(max_examples=200, deadline=None)
@given(case=settings_())
def test_each_record_comes_k_times_over_equal_ranks_with_copies_on_distinct_ranks(case: dict) -> None:
    order = build(case)
    plans = split(order, batch_size=case["batch_size"], world_size=case["world_size"], drop_last=case["drop_last"])
    assert len({len(plan) for plan in plans}) == 1
    seen: Counter[tuple[int, int]] = Counter()
    ranks_of: dict[int, list[int]] = {}
    for rank, plan in enumerate(plans):
        for number in range(len(plan)):
            for record, copy in pairs(plan, order, number):
                seen[(record, copy)] += 1
                ranks_of.setdefault(record, []).append(rank)
    assert all(count == 1 for count in seen.values())  # each (record, copy) at most once
    if not case["drop_last"]:
        assert set(seen) == {(r, c) for r in range(case["num_records"]) for c in range(case["repeats"])}
    else:
        used = len(plans[0]) * case["world_size"] * case["batch_size"]
        assert sum(seen.values()) == used
    if case["repeats"] <= case["world_size"]:
        for record, ranks in ranks_of.items():
            assert len(set(ranks)) == len(ranks), (record, ranks)  # RASampler: one copy a rank


@settings(max_examples=150, deadline=None)
@given(case=settings_(), data=st.data())
def test_resuming_on_other_ranks_delivers_the_rest_exactly_once(case: dict, data: st.DataObject) -> None:
    order = build(case)
    case["drop_last"] = False
    world_size, batch_size = case["world_size"], case["batch_size"]
    plans = split(order, batch_size=batch_size, world_size=world_size, drop_last=False)
    taken = data.draw(st.integers(0, len(plans[0])))
    delivered = Counter(p for plan in plans for number in range(taken) for p in pairs(plan, order, number))
    start = delivered_records(order.size, batch_size=batch_size, world_size=world_size, drop_last=False, batches=taken)
    assert sum(delivered.values()) == start
    rest = order.size - start
    new_world = data.draw(st.integers(1, 8))
    if rest and rest < new_world:
        return  # the loader refuses such a state and says to start the next epoch
    if rest:
        later = split(order, batch_size=batch_size, world_size=new_world, drop_last=False, start=start)
        assert len({len(plan) for plan in later}) == 1
        delivered.update(p for plan in later for number in range(len(plan)) for p in pairs(plan, order, number))
    assert sorted(delivered) == [(r, c) for r in range(case["num_records"]) for c in range(case["repeats"])]
    assert max(delivered.values()) == 1


def test_one_copy_is_the_base_order_and_draws_of_copies_differ() -> None:
    base = epoch_order("sorted-key", num_records=50, seed=4, epoch=2)
    repeated = RepeatedOrder(base, 1)
    positions = np.arange(50)
    assert np.array_equal(repeated.at(positions), base.at(positions))
    assert draw_epoch(2, 0, 1) == 2
    epochs = {int(draw_epoch(e, c, 3)) for e in range(10) for c in range(3)}
    assert epochs == set(range(30))
    assert int(draw_epoch(2**64 - 1, 2, 3)) == (3 * (2**64 - 1) + 2) % 2**64
    three = RepeatedOrder(base, 3)
    assert three.size == 150
    assert three.at(np.arange(6)).tolist() == [int(base.at(np.array([0]))[0])] * 3 + [int(base.at(np.array([1]))[0])] * 3
    assert three.copies(np.arange(6)).tolist() == [0, 1, 2, 0, 1, 2]
    for bad in (0, -1, MAX_REPEATS + 1, 2.0, True):
        with pytest.raises(ValueError):
            check_repeats(bad)


@settings(max_examples=100, deadline=None)
@given(case=settings_())
def test_an_rasampler_epoch_holds_n_samples_about_n_over_k_records_k_copies_each(case: dict) -> None:
    n, k, world_size = case["num_records"], case["repeats"], case["world_size"]
    if n < world_size:
        world_size = n
    size = repeated_size(n, k, "records")
    assert size == n and repeated_size(n, k, "copies") == n * k
    full = build(case)
    order = RepeatedOrder(full.base, k, size=size)
    assert order.size == n
    positions = np.arange(n)
    assert np.array_equal(order.at(positions), full.at(positions)) and np.array_equal(order.copies(positions), full.copies(positions))
    counts = Counter(order.at(positions).tolist())
    assert len(counts) == -(-n // k) and all(c == k for c in list(counts.values())[:-1] or [k])  # ceil(N / k) records
    assert sorted(counts.values())[0] == (n - k * (n // k) or k)  # only the last record may have fewer copies
    plans = split(order, batch_size=case["batch_size"], world_size=world_size, drop_last=False)
    assert len({len(plan) for plan in plans}) == 1
    seen = [pair for plan in plans for b in range(len(plan)) for pair in pairs(plan, order, b)]
    assert set(seen) == {(int(order.at(np.array([p]))[0]), p % k) for p in range(n)}
    again = RepeatedOrder(build(case).base, k, size=size)  # a pure function of (seed, epoch)
    assert np.array_equal(again.at(positions), order.at(positions))


def test_repeats_epoch_is_checked() -> None:
    with pytest.raises(ValueError, match="repeats_epoch"):
        repeated_size(10, 2, "samples")
    with pytest.raises(ValueError, match="size"):
        RepeatedOrder(epoch_order("sorted-key", num_records=4, seed=0, epoch=0), 2, size=9)
