"""Mixtures: exact per-source counts each epoch, no repeats but where a source is smaller than its
share, the loader over binary, tar and remote sources, equal ranks and exact resume."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from conftest import jpeg_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from remote_servers import range_server

from shardfmt import DatasetWriter, ImageTransform, Loader, Mixture, Output, Sampling, SchemaError
from shardfmt._sampling.mixture import MixtureOrder, allocate, source_records
from shardfmt._sampling.permutation import permute
from shardfmt._sampling.ranks import RankPlan
from shardfmt.format import IMAGE_CLASSIFICATION

SIZES = {"binary": 13, "tar": 9, "remote": 5}
"""Records of each source; a record's label is its index in the concatenation (binary, tar, remote)."""


def test_allocation_rounds_by_largest_remainders() -> None:
    assert allocate([1, 2, 1], epoch_size=30) == [8, 15, 7]  # 7.5, 15, 7.5: the tie goes to the earlier source
    assert allocate([1, 1, 1], epoch_size=10) == [4, 3, 3]
    assert allocate([0.5, 0.25, 0.25], epoch_size=7) == [3, 2, 2]
    assert allocate([0.1, 0.2, 0.7], epoch_size=10) == [1, 2, 7]  # exact rationals of the binary64 weights
    assert allocate([3, 0], epoch_size=5) == [5, 0]
    with pytest.raises(ValueError, match="not all 0"):
        allocate([0, 0], epoch_size=5)


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=8).filter(any), epoch_size=st.integers(1, 10**12))
def test_allocation_is_exact_and_within_one_of_each_quota(weights: list[float], epoch_size: int) -> None:
    counts = allocate(weights, epoch_size=epoch_size)
    assert sum(counts) == epoch_size
    total = sum(Fraction(w) for w in weights)
    for weight, count in zip(weights, counts, strict=True):
        quota = epoch_size * Fraction(weight) / total
        assert abs(count - quota) < 1


def test_mixture_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="missing"):
        Mixture({"a": "x", "b": "y"}, weights={"a": 1}, epoch_size=3)
    with pytest.raises(ValueError, match="finite"):
        Mixture({"a": "x"}, weights={"a": -1}, epoch_size=3)
    with pytest.raises(ValueError, match="epoch_size"):
        Mixture({"a": "x"}, weights={"a": 1}, epoch_size=0)
    mixture = Mixture({"a": Path("x"), "b": ["t-0.tar", Path("t-1.tar")]}, weights={"a": 1, "b": 3}, epoch_size=10)
    assert mixture.counts == [3, 7] and mixture.paths == ("x", ("t-0.tar", "t-1.tar"))


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    weights=st.lists(st.integers(0, 9), min_size=4, max_size=4).filter(any),
    epoch_size=st.integers(1, 200),
    seed=st.integers(0, 2**63),
)
def test_every_epoch_draws_exact_counts_and_repeats_only_beyond_a_source(
    sizes: list[int], weights: list[int], epoch_size: int, seed: int
) -> None:
    weights = weights[: len(sizes)]
    if not any(weights):
        return
    counts = allocate(weights, epoch_size=epoch_size)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for epoch in range(3):
        order = MixtureOrder(sizes, counts=counts, seed=seed, epoch=epoch).at(np.arange(epoch_size))
        source_of = np.searchsorted(starts, order, side="right") - 1
        assert np.bincount(source_of, minlength=len(sizes)).tolist() == counts
        seen = collections.Counter(order.tolist())
        for source, (size, count) in enumerate(zip(sizes, counts, strict=True)):
            times = [seen[int(r)] for r in range(starts[source], starts[source + 1])]
            # each record count // size or count // size + 1 times: no repeat unless the share is larger
            assert set(times) <= {count // size, count // size + 1}
            assert sum(times) == count


def test_epochs_take_consecutive_chunks_of_one_pass_without_replacement() -> None:
    """A source of 10 giving 3 an epoch: epochs 0, 1, 2 take positions [0, 3), [3, 6), [6, 9) of
    one shuffled pass (9 distinct records); epoch 3 starts the next pass."""
    draws = np.arange(3)
    epochs = [source_records(draws, size=10, count=3, source=1, seed=5, epoch=e).tolist() for e in range(4)]
    first_pass = permute(np.arange(9), size=10, seed=5, stream=0x535243, epoch=0, index=1).tolist()
    assert list(itertools.chain.from_iterable(epochs[:3])) == first_pass
    assert epochs[3] == permute(np.arange(3), size=10, seed=5, stream=0x535243, epoch=1, index=1).tolist()


def test_unshuffled_mixture_keeps_source_order() -> None:
    order = MixtureOrder([3, 4], counts=[2, 5], seed=0, epoch=0, shuffle=False).at(np.arange(7))
    assert order.tolist() == [0, 1, 3, 4, 5, 6, 3]


def write_source(root: Path, first: int, count: int, shard_format: str) -> Path:
    with DatasetWriter(root, schema=IMAGE_CLASSIFICATION, shard_size=6_000, shard_format=shard_format) as writer:
        for i in range(first, first + count):
            writer.write({"image": jpeg_bytes(24, 32, seed=i), "label": i, "key": f"r{i:03d}"})
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("mix")
    binary = write_source(root / "binary", 0, SIZES["binary"], "binary")
    tar = write_source(root / "tar", SIZES["binary"], SIZES["tar"], "tar")
    write_source(root / "www" / "ds", SIZES["binary"] + SIZES["tar"], SIZES["remote"], "binary")
    with range_server(root / "www") as server:
        yield {"binary": str(binary), "tar": str(tar), "remote": f"{server.url}/ds"}


def labels_of(loader: Loader, limit: int | None = None) -> list[list[int]]:
    return [labels.tolist() for _, labels in itertools.islice(loader, limit)]


def expected_batches(*, counts: list[int], epoch: int, rank: int, world_size: int, batch_size: int, seed: int) -> list[list[int]]:
    plan = RankPlan(
        MixtureOrder(list(SIZES.values()), counts=counts, seed=seed, epoch=epoch),
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        drop_last=False,
    )
    return [plan.batch(b).tolist() for b in range(len(plan))]


def test_loader_over_binary_tar_and_remote_sources(sources: dict[str, str]) -> None:
    mixture = Mixture(sources, weights={"binary": 1, "tar": 2, "remote": 1}, epoch_size=30)
    assert mixture.counts == [8, 15, 7]
    epochs: dict[int, list[int]] = {}
    for rank in range(2):
        with Loader(
            mixture, batch_size=4, num_workers=0, seed=3, transform=ImageTransform(size=16), sampling=Sampling(rank=rank, world_size=2)
        ) as loader:
            assert len(loader) == 4
            for epoch in range(2):
                got = labels_of(loader)
                # the labels are the indices into the concatenation that the order gives
                assert got == expected_batches(counts=mixture.counts, epoch=epoch, rank=rank, world_size=2, batch_size=4, seed=3)
                epochs.setdefault(epoch, []).extend(itertools.chain.from_iterable(got))
    for records in epochs.values():
        per_source = np.bincount(np.searchsorted([0, 13, 22, 27], records, side="right") - 1, minlength=3)
        assert per_source.tolist() == [8, 15, 7]
        counts = collections.Counter(records)
        assert max(counts[r] for r in range(13)) == 1  # 8 of 13: drawn without replacement
        assert sorted({counts[r] for r in range(13, 22)}) == [1, 2]  # 15 of 9: each once or twice
        assert sorted({counts[r] for r in range(22, 27)}) == [1, 2]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_resumes_exactly(sources: dict[str, str], workers: int) -> None:
    mixture = Mixture(sources, weights={"binary": 3, "tar": 1, "remote": 1}, epoch_size=25)
    with Loader(mixture, batch_size=4, num_workers=workers, seed=9, transform=ImageTransform(size=16)) as loader:
        whole = labels_of(loader)
    with Loader(mixture, batch_size=4, num_workers=workers, seed=9, transform=ImageTransform(size=16)) as loader:
        head = labels_of(loader, 3)
        state = loader.state_dict()
    with Loader(mixture, batch_size=4, num_workers=workers, seed=9, transform=ImageTransform(size=16)) as loader:
        loader.load_state_dict(state)
        assert head + labels_of(loader) == whole
    other = Mixture(sources, weights={"binary": 1, "tar": 1, "remote": 1}, epoch_size=25)
    with Loader(
        other, batch_size=4, num_workers=0, seed=9, transform=ImageTransform(size=16)
    ) as loader, pytest.raises(ValueError, match="mixture"):
        loader.load_state_dict(state)


def test_a_mixture_refuses_a_window_other_schemas_and_empty_sources(sources: dict[str, str], tmp_path: Path) -> None:
    mixture = Mixture(sources, weights={"binary": 1, "tar": 1, "remote": 1}, epoch_size=12)
    with pytest.raises(ValueError, match="window"):
        Loader(mixture, batch_size=4, sampling=Sampling(window=2))
    with pytest.raises(ValueError, match="feistel"):
        Loader(mixture, batch_size=4, sampling=Sampling(order="sorted-key"))
    from shardfmt.format import Field, Schema

    with DatasetWriter(tmp_path / "other", schema=Schema((Field("image", "jpeg"), Field("label", "int64")))) as writer:
        writer.write({"image": jpeg_bytes(8, 8), "label": 0})
    with pytest.raises(SchemaError, match="share one schema"):
        Loader(
            Mixture({"binary": sources["binary"], "other": tmp_path / "other"}, weights={"binary": 1, "other": 1}, epoch_size=4),
            batch_size=2,
        )
    with DatasetWriter(tmp_path / "typed", schema=Schema.of(image="jpeg", label="str", key="str")) as writer:
        writer.write({"image": jpeg_bytes(8, 8), "label": "cat", "key": "k"})
    with pytest.raises(SchemaError, match=r"source 'typed' does not have the schema of source 'binary' \('label' is str, not int64\)"):
        Loader(
            Mixture({"binary": sources["binary"], "typed": tmp_path / "typed"}, weights={"binary": 1, "typed": 1}, epoch_size=4),
            batch_size=2,
        )
    with DatasetWriter(tmp_path / "empty", schema=IMAGE_CLASSIFICATION):
        pass
    with pytest.raises(ValueError, match="holds no records"):
        Loader(
            Mixture({"binary": sources["binary"], "empty": tmp_path / "empty"}, weights={"binary": 1, "empty": 1}, epoch_size=4),
            batch_size=2,
        )


def test_return_indices_of_a_mixture_index_the_concatenation(sources: dict[str, str]) -> None:
    """Each source's label is its record's index into the concatenation of the sources, so a
    loader's indices must equal its labels, batch by batch."""
    mixture = Mixture(sources, weights={name: 1 for name in sources}, epoch_size=24)
    with Loader(
        mixture, batch_size=4, num_workers=0, seed=5, transform=ImageTransform(size=16), output=Output(return_indices=True)
    ) as loader:
        batches = [(labels.tolist(), indices.tolist()) for _, labels, indices in loader]
    assert len(batches) == 6
    assert all(labels == indices for labels, indices in batches)
    with pytest.raises(ValueError, match="subset does not apply to a Mixture"):
        Loader(mixture, batch_size=4, sampling=Sampling(subset=[0, 1]))
