"""Loader iterations as torch's DataLoader has them, record indices in batches, subsets, and
output sizes that change between epochs (progressive resizing)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling, open_dataset
from shardfmt._sampling.keys import sample_batches
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CenterCrop, RandomCrop

NUM_RECORDS = 61


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """61 records whose label is their index, in several shards."""
    out = tmp_path_factory.mktemp("epochs") / "ds"
    rng = np.random.default_rng(17)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=30_000) as writer:
        for i in range(NUM_RECORDS):
            h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
            writer.write({"image": jpeg_bytes(h, w, seed=100 + i), "label": i, "key": f"key-{i}"})
    return out


def labels_of(batches: Any) -> list[list[int]]:
    return [batch[1].tolist() for batch in batches]


def epoch(loader: Loader, limit: int | None = None) -> tuple[list[list[int]], list[bytes]]:
    labels, images = [], []
    for batch in itertools.islice(loader, limit):
        labels.append(batch[1].tolist())
        images.append(batch[0].numpy().tobytes())
    return labels, images


def flat(labels: list[list[int]]) -> list[int]:
    return [x for batch in labels for x in batch]


# -- iterations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_peek_then_a_full_epoch(indexed: Path, num_workers: int) -> None:
    """next(iter(loader)) looks at one batch; the for loop after it is a whole epoch."""
    with Loader(indexed, batch_size=8, num_workers=num_workers, seed=2, transform=ImageTransform(size=24)) as reference:
        expected = [epoch(reference)[0] for _ in range(3)]
    with Loader(indexed, batch_size=8, num_workers=num_workers, seed=2, transform=ImageTransform(size=24)) as loader:
        peek = next(iter(loader))
        assert peek[1].tolist() == expected[0][0]
        labels, _ = epoch(loader)
        assert labels == expected[1]
        assert sorted(flat(labels)) == list(range(NUM_RECORDS))
        head = [batch[1].tolist() for batch in itertools.islice(loader, 3)]  # a 3-batch peek
        assert head == expected[2][:3]
        assert sorted(flat(epoch(loader)[0])) == list(range(NUM_RECORDS))


def test_set_epoch_in_every_loop_gives_the_same_epochs_as_plain_iteration(indexed: Path) -> None:
    with Loader(indexed, batch_size=8, num_workers=2, seed=6, transform=ImageTransform(size=24)) as plain:
        expected = [epoch(plain)[0] for _ in range(3)]
    with Loader(indexed, batch_size=8, num_workers=2, seed=6, transform=ImageTransform(size=24)) as loader:
        for number in range(3):
            loader.set_epoch(number)
            assert epoch(loader)[0] == expected[number]
        loader.set_epoch(1)
        next(iter(loader))  # epoch 1 begun ...
        loader.set_epoch(1)  # ... and started over
        assert epoch(loader)[0] == expected[1]


def test_resume_continues_only_the_first_iteration_after_load_state_dict(indexed: Path) -> None:
    settings: dict[str, Any] = dict(batch_size=8, num_workers=2, seed=8, transform=ImageTransform(size=24))
    with Loader(indexed, **settings) as reference:
        expected = [epoch(reference) for _ in range(3)]
    with Loader(indexed, **settings) as first:
        epoch(first)
        iterator = iter(first)
        for _ in range(3):
            next(iterator)
        state = first.state_dict()
    assert (state["epoch"], state["position"]) == (1, 3)
    with Loader(indexed, **settings) as resumed:
        resumed.load_state_dict(state)
        assert epoch(resumed) == (expected[1][0][3:], expected[1][1][3:])
        assert epoch(resumed) == expected[2]


def test_a_state_taken_before_any_iteration_resumes_at_the_start(indexed: Path) -> None:
    with Loader(indexed, batch_size=8, num_workers=0, seed=8, transform=ImageTransform(size=24)) as loader:
        loader.set_epoch(4)
        state = loader.state_dict()
        expected = epoch(loader)[0]
    with Loader(indexed, batch_size=8, num_workers=0, seed=8, transform=ImageTransform(size=24)) as resumed:
        resumed.load_state_dict(state)
        assert epoch(resumed)[0] == expected


def test_an_iterator_replaced_by_a_newer_one_raises(indexed: Path) -> None:
    with Loader(indexed, batch_size=8, num_workers=2, transform=ImageTransform(size=24)) as loader:
        old = iter(loader)
        next(old)
        new = iter(loader)
        next(new)
        with pytest.raises(RuntimeError, match="replaced by a newer iter"):
            next(old)
        assert len(list(new)) == len(loader) - 1  # the newer one is unharmed


# -- indices ------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_indices_cover_each_epoch_exactly_and_name_the_records(indexed: Path, num_workers: int) -> None:
    reader = open_dataset(indexed)
    with Loader(
        indexed, batch_size=8, num_workers=num_workers, seed=3, transform=ImageTransform(size=24), output=Output(return_indices=True)
    ) as loader:
        for _ in range(2):
            seen = []
            for _images, labels, indices in loader:
                assert indices.dtype == torch.int64 and indices.shape == labels.shape
                assert torch.equal(indices, labels)  # each record's label is its index
                seen.extend(indices.tolist())
            assert sorted(seen) == list(range(NUM_RECORDS))
        assert [reader[i]["key"] for i in seen[:3]] == [f"key-{i}" for i in seen[:3]]
        assert reader[seen[0]]["label"] == seen[0]


def test_indices_with_fields_arrive_as_an_index_entry(indexed: Path) -> None:
    with Loader(
        indexed,
        batch_size=10,
        num_workers=1,
        fields={"image": 16, "label": None},
        shuffle=False,
        output=Output(return_indices=True, copy=True),
    ) as loader:
        batches = list(loader)
    assert set(batches[0]) == {"image", "label", "index"}
    assert [b["index"].tolist() for b in batches] == [list(range(i, min(i + 10, NUM_RECORDS))) for i in range(0, NUM_RECORDS, 10)]


# -- subsets ------------------------------------------------------------------------------------

SUBSET = np.array([3, 59, 10, 11, 12, 40, 41, 7, 0, 33, 34, 35, 36, 60, 21, 22, 18, 5, 50, 51, 52, 2, 9], np.int64)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_subsets_split_over_ranks_exactly(indexed: Path, world_size: int, drop_last: bool) -> None:
    per_rank = []
    for rank in range(world_size):
        with Loader(
            indexed,
            batch_size=2,
            num_workers=0,
            seed=1,
            drop_last=drop_last,
            transform=ImageTransform(size=16),
            sampling=Sampling(subset=SUBSET, rank=rank, world_size=world_size),
        ) as loader:
            labels, _ = epoch(loader)
            assert len(labels) == len(loader)
            per_rank.append(labels)
    assert len({len(labels) for labels in per_rank}) == 1  # every rank runs the same number of steps
    seen = [x for labels in per_rank for x in flat(labels)]
    assert len(seen) == len(set(seen))
    if drop_last:
        assert len(seen) == len(SUBSET) // (world_size * 2) * world_size * 2
        assert set(seen) <= set(SUBSET.tolist())
    else:
        assert sorted(seen) == sorted(SUBSET.tolist())


def test_a_subset_epoch_is_the_full_order_without_the_other_records(indexed: Path) -> None:
    full = sample_batches(NUM_RECORDS, batch_size=4, seed=9, epoch=2).indices.tolist()
    mask = np.zeros(NUM_RECORDS, bool)
    mask[SUBSET] = True
    with Loader(indexed, batch_size=4, num_workers=0, seed=9, transform=ImageTransform(size=16), sampling=Sampling(subset=mask)) as loader:
        loader.set_epoch(2)
        labels = flat(epoch(loader)[0])
    assert labels == [i for i in full if mask[i]]
    with Loader(
        indexed, batch_size=4, num_workers=0, shuffle=False, transform=ImageTransform(size=16), sampling=Sampling(subset=SUBSET)
    ) as loader:
        assert flat(epoch(loader)[0]) == SUBSET.tolist()  # unshuffled: the order given


def test_a_subset_resumes_and_refuses_another_subset(indexed: Path) -> None:
    settings: dict[str, Any] = dict(
        batch_size=4, num_workers=2, seed=4, transform=ImageTransform(size=16), sampling=Sampling(subset=SUBSET)
    )
    with Loader(indexed, **settings) as reference:
        expected = epoch(reference)
    with Loader(indexed, **settings) as first:
        iterator = iter(first)
        next(iterator), next(iterator)
        state = first.state_dict()
    with Loader(indexed, **settings) as resumed:
        resumed.load_state_dict(state)
        assert epoch(resumed) == (expected[0][2:], expected[1][2:])
    with Loader(indexed, **(settings | {"sampling": Sampling(subset=SUBSET[:-1])})) as other:
        with pytest.raises(ValueError, match="subset"):
            other.load_state_dict(state)


@pytest.mark.parametrize(
    ("subset", "message"),
    [
        ([1, 1, 2], "more than once"),
        ([0, NUM_RECORDS], "outside"),
        ([-1], "outside"),
        (np.ones(5, bool), "one entry per record"),
        ([0.5], "integers"),
    ],
)
def test_malformed_subsets_are_refused(indexed: Path, subset: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Loader(indexed, batch_size=1, num_workers=0, sampling=Sampling(subset=subset))


# -- progressive resizing -------------------------------------------------------------------------


@pytest.mark.usefixtures("no_leaks")
def test_set_size_gives_the_batches_of_a_loader_made_at_that_size(indexed: Path) -> None:
    with Loader(indexed, batch_size=8, num_workers=2, seed=5, transform=ImageTransform(size=48)) as direct:
        direct.set_epoch(1)
        expected = epoch(direct)
    with Loader(indexed, batch_size=8, num_workers=2, seed=5, transform=ImageTransform(size=32)) as loader:
        first = next(iter(loader))[0]
        assert first.shape == (8, 3, 32, 32)
        small = loader.shared_memory_bytes
        mine = loader.scheduler.ring.name  # type: ignore[union-attr]
        loader.set_size(48)
        assert epoch(loader) == expected
        assert loader.shared_memory_bytes > small
        grown = loader.scheduler.ring.name  # type: ignore[union-attr]
        assert grown != mine  # grown: a new ring
        loader.set_size((24, 40))  # smaller: the ring is kept
        images = next(iter(loader))[0]
        assert images.shape == (8, 3, 24, 40)
        assert loader.scheduler.ring.name == grown  # type: ignore[union-attr]
        assert loader.shared_memory_bytes == SLOTS_48


SLOTS_48 = 3 * (-(-8 * 48 * 48 * 3 // 4096) * 4096 + 4096)
"""3 slots of 8 images of 48 x 48 x 3 bytes and 8 labels, each part rounded up to 4 KiB."""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_set_size_then_resume(indexed: Path, num_workers: int) -> None:
    settings: dict[str, Any] = dict(
        batch_size=8, num_workers=num_workers, seed=12, transform=ImageTransform(size=32), output=Output(return_indices=True)
    )
    with Loader(indexed, **settings) as first:
        epoch(first)
        first.set_size(40)
        reference = [batch for batch in ((b[0].clone(), b[2].clone()) for b in first)]  # epoch 1 at 40
        first.set_epoch(1)
        iterator = iter(first)
        for _ in range(3):
            next(iterator)
        state = first.state_dict()
    assert state["size"] == [40, 40]
    with Loader(indexed, **settings) as resumed:  # made at 32, as a training script restarts
        resumed.load_state_dict(state)
        rest = [(b[0].clone(), b[2].clone()) for b in resumed]
    assert len(rest) == len(reference) - 3
    for (images, indices), (want_images, want_indices) in zip(rest, reference[3:], strict=True):
        assert images.shape[2:] == (40, 40)
        assert torch.equal(indices, want_indices) and torch.equal(images, want_images)


def test_set_size_keeps_an_object_pipelines_parameters(indexed: Path) -> None:
    with Loader(indexed, batch_size=8, num_workers=0, transform=CenterCrop(32, resize=40)) as loader:
        loader.set_size(48)
        assert loader.pipeline == CenterCrop((48, 48), resize=60)
        assert next(iter(loader))[0].shape == (8, 3, 48, 48)
    with Loader(indexed, batch_size=8, num_workers=0, transform=RandomCrop(16, flip=0.0)) as loader:
        loader.set_size(20)
        assert loader.pipeline == RandomCrop((20, 20), flip=0.0)


def test_set_size_is_refused_with_fields(indexed: Path) -> None:
    with Loader(indexed, batch_size=8, num_workers=0, fields={"image": 16, "label": None}) as loader:
        with pytest.raises(ValueError, match="fields"):
            loader.set_size(32)


def test_a_state_saved_before_the_size_was_recorded_still_resumes(indexed: Path) -> None:
    """States of earlier builds lack "size", "subset" and "augment", and keep the size in the
    pipeline's settings."""
    with Loader(indexed, batch_size=8, num_workers=0, seed=8, transform=ImageTransform(size=24)) as first:
        iterator = iter(first)
        next(iterator)
        state = first.state_dict()
        expected = [b[1].tolist() for b in iterator]
    settings = dict(state["settings"])
    del settings["augment"], settings["subset"]
    settings["pipeline"] = json.dumps(json.loads(settings["pipeline"]) | {"size": [24, 24]}, sort_keys=True)
    old = {key: value for key, value in state.items() if key != "size"} | {"settings": settings}
    with Loader(indexed, batch_size=8, num_workers=0, seed=8, transform=ImageTransform(size=24)) as resumed:
        resumed.load_state_dict(old)
        assert [b[1].tolist() for b in resumed] == expected
        following = [b[1].tolist() for b in resumed]  # epoch 1
    # Those builds saved the end of an epoch as its last position, not as the next epoch's start.
    ended = old | {"epoch": 0, "position": len(expected) + 1, "delivered": []}
    with Loader(indexed, batch_size=8, num_workers=0, seed=8, transform=ImageTransform(size=24)) as resumed:
        resumed.load_state_dict(ended)
        assert [b[1].tolist() for b in resumed] == following
        assert resumed.epoch == 2
