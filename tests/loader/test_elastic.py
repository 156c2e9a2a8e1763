"""Resuming on another number of ranks covers the epoch exactly once; the Feistel order in the
loader: the same batches whatever the worker count, exact resume at the start, middle and end."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from conftest import jpeg_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling
from shardfmt._sampling.orders import epoch_order
from shardfmt._sampling.ranks import RankPlan, delivered_records
from shardfmt.format import IMAGE_CLASSIFICATION

NUM_RECORDS = 103


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """103 records whose label is their index, in several shards."""
    out = tmp_path_factory.mktemp("elastic") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=8_000) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"image": jpeg_bytes(20, 28, seed=i), "label": i, "key": f"r{i}"})
    return out


def split_rest(order_name: str, *, num_records: int, batch_size: int, worlds: list[tuple[int, int]], drop_last: bool) -> list[int]:
    """Every record delivered by a chain of splits: (world size, batches taken) per hop, the last
    hop taking everything left."""
    order = epoch_order(order_name, num_records=num_records, seed=6, epoch=2)
    start, delivered = 0, []
    for hop, (world_size, batches) in enumerate(worlds):
        plans = [
            RankPlan(order, batch_size=batch_size, rank=r, world_size=world_size, drop_last=drop_last, start=start)
            for r in range(world_size)
        ]
        assert len({len(p) for p in plans}) == 1, "ranks stay equal"
        take = len(plans[0]) if hop == len(worlds) - 1 else batches
        delivered += [i for p in plans for b in range(take) for i in p.batch(b).tolist()]
        start += delivered_records(num_records - start, batch_size=batch_size, world_size=world_size, drop_last=drop_last, batches=take)
    return delivered


@settings(max_examples=150, deadline=None)
@given(
    num_records=st.integers(40, 500),
    batch_size=st.integers(2, 9),
    new_world=st.sampled_from([2, 3, 8]),
    fraction=st.floats(0, 1),
    order_name=st.sampled_from(["sorted-key", "feistel"]),
)
def test_elastic_splits_cover_the_epoch_exactly_once(
    num_records: int, batch_size: int, new_world: int, fraction: float, order_name: str
) -> None:
    per_rank = -(-num_records // 4)
    total = -(-per_rank // batch_size)
    taken = int(fraction * total)
    left = num_records - delivered_records(num_records, batch_size=batch_size, world_size=4, drop_last=False, batches=taken)
    if 0 < left < new_world:
        return  # too few records left to give every new rank one (the loader refuses it)
    delivered = split_rest(order_name, num_records=num_records, batch_size=batch_size, worlds=[(4, taken), (new_world, 0)], drop_last=False)
    assert sorted(delivered) == list(range(num_records))


def labels(loader: Loader, limit: int | None = None) -> list[int]:
    return [i for _, batch in itertools.islice(loader, limit) for i in batch.tolist()]


@pytest.mark.parametrize("order", ["sorted-key", "feistel"])
@pytest.mark.parametrize("new_world", [2, 3, 8])
def test_loader_state_at_4_ranks_resumes_on_2_3_and_8(indexed: Path, order: str, new_world: int) -> None:
    options = {"batch_size": 4, "num_workers": 0, "seed": 5, "transform": ImageTransform(size=16)}
    delivered, states = [], []
    for rank in range(4):
        with Loader(indexed, **options, sampling=Sampling(order=order, rank=rank, world_size=4)) as loader:  # type: ignore[arg-type]
            loader.set_epoch(1)
            delivered += labels(loader, 3)
            states.append(loader.state_dict())
    assert len(delivered) == 48
    rest = []
    for rank in range(new_world):
        with Loader(indexed, **options, sampling=Sampling(order=order, rank=rank, world_size=new_world)) as loader:  # type: ignore[arg-type]
            loader.load_state_dict(states[rank % 4])
            mine = [batch.tolist() for _, batch in loader]
            rest.append(mine)
            assert loader.epoch == 2
            next_epoch = labels(loader)
        with Loader(indexed, **options, sampling=Sampling(order=order, rank=rank, world_size=new_world)) as fresh:  # type: ignore[arg-type]
            fresh.set_epoch(2)
            assert next_epoch == labels(fresh), "later epochs are whole epochs on the new ranks"
    assert len({len(batches) for batches in rest}) == 1, "the new ranks take the same number of steps"
    delivered += [i for batches in rest for batch in batches for i in batch]
    assert sorted(delivered) == list(range(NUM_RECORDS))


def test_two_elastic_hops_and_a_same_size_resume_inside_the_rest(indexed: Path) -> None:
    options = {"batch_size": 4, "num_workers": 0, "seed": 1, "transform": ImageTransform(size=16)}
    delivered = []
    with Loader(indexed, **options, sampling=Sampling(order="feistel", rank=0, world_size=4)) as loader:  # type: ignore[arg-type]
        state = loader.state_dict()
    for rank in range(4):
        with Loader(indexed, **options, sampling=Sampling(order="feistel", rank=rank, world_size=4)) as loader:  # type: ignore[arg-type]
            delivered += labels(loader, 2)
            state = loader.state_dict()
    states = []
    for rank in range(3):
        with Loader(indexed, **options, sampling=Sampling(order="feistel", rank=rank, world_size=3)) as loader:  # type: ignore[arg-type]
            loader.load_state_dict(state)
            delivered += labels(loader, 2)
            states.append(loader.state_dict())
            assert states[-1]["start"] == 32
    # rank 1 of 3 resumes its own state exactly, then every rank moves on to 8
    with Loader(indexed, **options, sampling=Sampling(order="feistel", rank=1, world_size=3)) as loader:  # type: ignore[arg-type]
        loader.load_state_dict(states[1])
        with Loader(indexed, **options, sampling=Sampling(order="feistel", rank=1, world_size=3)) as again:  # type: ignore[arg-type]
            again.load_state_dict(states[1])
            assert labels(loader, 1) == labels(again, 1)
    for rank in range(8):
        with Loader(indexed, **options, sampling=Sampling(order="feistel", rank=rank, world_size=8)) as loader:  # type: ignore[arg-type]
            loader.load_state_dict(states[0])
            delivered += labels(loader)
    assert sorted(delivered) == list(range(NUM_RECORDS))


def test_the_epoch_after_an_abandoned_elastic_resume_is_whole(indexed: Path) -> None:
    """Before: the next iter() started epoch 1 where the resumed epoch 0 had started (record 16
    of its order), and delivered 87 of the 103 records."""
    options = {"batch_size": 4, "num_workers": 0, "seed": 1, "transform": ImageTransform(size=16)}
    with Loader(indexed, **options, sampling=Sampling(rank=0, world_size=2)) as loader:  # type: ignore[arg-type]
        labels(loader, 2)
        state = loader.state_dict()
    with Loader(indexed, **options) as reference:  # type: ignore[arg-type]
        reference.set_epoch(1)
        epoch_one = labels(reference)
    with Loader(indexed, **options) as resumed:  # type: ignore[arg-type]
        resumed.load_state_dict(state)
        assert resumed.state_dict()["start"] == 16
        labels(resumed, 1)  # the rest of epoch 0, left after one batch
        assert labels(resumed) == epoch_one
        assert sorted(epoch_one) == list(range(NUM_RECORDS))


def test_elastic_resume_refuses_what_it_cannot_split(indexed: Path) -> None:
    options = {"batch_size": 1, "num_workers": 0, "drop_last": True, "transform": ImageTransform(size=16)}
    with Loader(indexed, **options, sampling=Sampling(rank=0, world_size=1)) as loader:  # type: ignore[arg-type]
        labels(loader, 100)
        state = loader.state_dict()
    with Loader(indexed, **options, sampling=Sampling(rank=0, world_size=8)) as loader:  # type: ignore[arg-type]
        loader.load_state_dict(state)  # 3 records left, drop_last: an empty rest of the epoch
        assert labels(loader) == [] and loader.epoch == 1
    with Loader(indexed, batch_size=4, num_workers=0, transform=ImageTransform(size=16), sampling=Sampling(rank=0, world_size=1)) as loader:
        labels(loader, 25)
        state = loader.state_dict()
    with (
        Loader(indexed, batch_size=4, num_workers=0, transform=ImageTransform(size=16), sampling=Sampling(rank=0, world_size=8)) as loader,
        pytest.raises(ValueError, match="set_epoch"),
    ):
        loader.load_state_dict(state)  # 3 records left for 8 ranks


@pytest.mark.parametrize("stop", ["start", "middle", "end"])
def test_feistel_loader_resumes_exactly_and_ignores_the_worker_count(indexed: Path, stop: str) -> None:
    options = {"batch_size": 8, "seed": 3, "transform": ImageTransform(size=16), "sampling": Sampling(order="feistel")}
    streams = []
    for workers in (0, 1, 2):
        with Loader(indexed, num_workers=workers, **options) as loader:  # type: ignore[arg-type]
            streams.append([batch.tolist() for _ in range(2) for _, batch in loader])
    assert streams[0] == streams[1] == streams[2]
    whole = streams[0]
    assert sorted(i for batch in whole[:13] for i in batch) == list(range(NUM_RECORDS))
    at = {"start": 0, "middle": 6, "end": 13}[stop]
    with Loader(indexed, num_workers=0, **options) as loader:  # type: ignore[arg-type]
        head = [batch.tolist() for _, batch in itertools.islice(loader, at)]
        state = loader.state_dict()
    with Loader(indexed, num_workers=2, **options) as loader:  # type: ignore[arg-type]
        loader.load_state_dict(state)
        tail = [batch.tolist() for _, batch in loader]  # the rest of the epoch; taken at its end, the next epoch
        if stop != "end":
            tail += [batch.tolist() for _, batch in loader]  # and the next one
    assert head + tail == whole
    assert len(tail) == {"start": 26, "middle": 20, "end": 13}[stop]


def test_an_old_state_without_an_order_is_a_sorted_key_state(indexed: Path) -> None:
    with Loader(indexed, batch_size=8, num_workers=0, transform=ImageTransform(size=16)) as loader:
        state = loader.state_dict()
    del state["settings"]["order"], state["start"]
    with Loader(indexed, batch_size=8, num_workers=0, transform=ImageTransform(size=16)) as loader:
        loader.load_state_dict(state)
    with (
        Loader(indexed, batch_size=8, num_workers=0, transform=ImageTransform(size=16), sampling=Sampling(order="feistel")) as loader,
        pytest.raises(ValueError, match="order: 'sorted-key' -> 'feistel'"),
    ):
        loader.load_state_dict(state)


def test_a_subset_under_the_feistel_order_is_the_full_order_with_the_others_left_out(indexed: Path) -> None:
    subset = list(range(0, NUM_RECORDS, 3))
    options = {"batch_size": 5, "seed": 4, "num_workers": 0, "transform": ImageTransform(size=16)}
    with Loader(indexed, **options, sampling=Sampling(order="feistel")) as loader:  # type: ignore[arg-type]
        full = [i for _, batch in loader for i in batch.tolist()]
    subsetted = Sampling(order="feistel", subset=subset)
    with Loader(indexed, **options, sampling=subsetted, output=Output(return_indices=True)) as loader:  # type: ignore[arg-type]
        batches = [(labels.tolist(), indices.tolist()) for _, labels, indices in loader]
        assert len(loader) == len(batches) == 7
    order = [i for labels, _ in batches for i in labels]
    assert order == [i for i in full if i % 3 == 0]
    assert all(labels == indices for labels, indices in batches)
