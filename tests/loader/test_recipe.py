"""The training recipe's options of the Loader: interpolation=, repeats= and batch_augment=, and
RandomErasing's fill from the loader's mean; each reproducible across workers and resumes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from conftest import jpeg_bytes
from fuzz_loader import loader_arguments

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling, open_dataset
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CutMix, MixUp, RandomChoice, RandomErasing, TrivialAugmentWide
from shardfmt.ops._batch import apply_batch_steps

NUM_RECORDS = 18
CLASSES = 6


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("recipe") / "ds"
    rng = np.random.default_rng(8)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=20_000) as writer:
        for i in range(NUM_RECORDS):
            h, w = int(rng.integers(40, 70)), int(rng.integers(40, 70))
            writer.write({"image": jpeg_bytes(h, w, seed=600 + i), "label": i % CLASSES, "key": f"r{i}"})
    return out


def collect(dataset: Path, epochs: int = 1, **options: Any) -> list[tuple[torch.Tensor, ...]]:
    """`epochs` epochs of a loader made with `options` (each named by its field, put into its
    option object by `fuzz_loader.loader_arguments`) over these defaults."""
    settings: dict[str, Any] = dict(batch_size=4, num_workers=0, size=24, seed=5, copy=True)
    with Loader(dataset, **loader_arguments(settings | options)) as loader:
        return [tuple(batch) for _ in range(epochs) for batch in loader]


def test_bicubic_resizes_the_crop_with_torchs_antialiased_kernel(dataset: Path) -> None:
    images = collect(dataset, pipeline="resize", size=40, interpolation="bicubic", fast_decode=False, shuffle=False, return_indices=True)
    bilinear = collect(dataset, pipeline="resize", size=40, fast_decode=False, shuffle=False)
    with open_dataset(dataset) as data:
        for (batch, _, indices), (plain, _) in zip(images, bilinear, strict=True):
            assert not torch.equal(batch, plain)
            for image, index in zip(batch, indices.tolist(), strict=True):
                pixels = simplejpeg.decode_jpeg(bytes(data[index]["image"]), colorspace="RGB")  # under 2 x 40 a side: no DCT scaling
                source = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0).contiguous(memory_format=torch.channels_last)
                want = torch.nn.functional.interpolate(source, size=(40, 40), mode="bicubic", antialias=True)[0]
                assert torch.equal(image, want)
    with pytest.raises(ValueError, match="interpolation"):
        Loader(dataset, batch_size=4, transform=ImageTransform(interpolation="lanczos"))


def test_repeats_give_each_record_k_times_with_distinct_draws(dataset: Path) -> None:
    batches = collect(dataset, repeats=3, return_indices=True, augment=[TrivialAugmentWide()])
    indices = torch.cat([b[2] for b in batches]).tolist()
    assert Counter(indices) == {i: 3 for i in range(NUM_RECORDS)}
    assert len(batches) == -(-3 * NUM_RECORDS // 4)
    images = torch.cat([b[0] for b in batches])
    first = indices.index(0)
    copies = [images[p] for p, i in enumerate(indices) if i == 0]
    assert not torch.equal(copies[0], copies[1]) and not torch.equal(copies[1], copies[2])
    assert indices[first : first + 3] == [0, 0, 0]  # one rank: the copies come together
    two = collect(dataset, repeats=3, return_indices=True, augment=[TrivialAugmentWide()], num_workers=2)
    assert all(torch.equal(a, b) for x, y in zip(batches, two, strict=True) for a, b in zip(x, y, strict=True))
    plain = collect(dataset, return_indices=True, repeats=1)
    assert Counter(torch.cat([b[2] for b in plain]).tolist()) == {i: 1 for i in range(NUM_RECORDS)}


def test_repeats_spread_copies_over_ranks_and_resume_exactly(dataset: Path) -> None:
    ranks = [collect(dataset, repeats=2, return_indices=True, rank=r, world_size=2) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    seen = [torch.cat([b[2] for b in rank]).tolist() for rank in ranks]
    assert Counter(seen[0] + seen[1]) == {i: 2 for i in range(NUM_RECORDS)}
    assert all(Counter(rank)[i] <= 1 for rank in seen for i in range(NUM_RECORDS))  # one copy a rank
    settings: dict[str, Any] = dict(
        batch_size=4,
        num_workers=0,
        seed=5,
        transform=ImageTransform(size=24),
        sampling=Sampling(repeats=3),
        output=Output(copy=True, return_indices=True),
    )
    with Loader(dataset, **settings) as loader:
        iterator = iter(loader)
        head = [next(iterator) for _ in range(5)]
        state = loader.state_dict()
        tail = list(iterator)
    with Loader(dataset, **settings) as loader:
        loader.load_state_dict(state)
        resumed = list(loader)
    assert len(head) + len(tail) == -(-3 * NUM_RECORDS // 4)
    assert all(torch.equal(a, b) for x, y in zip(tail, resumed, strict=True) for a, b in zip(x, y, strict=True))
    with Loader(dataset, **(settings | {"sampling": Sampling(repeats=2)})) as loader:
        with pytest.raises(ValueError, match="repeats"):
            loader.load_state_dict(state)


def test_batch_steps_mix_each_batch_from_seed_epoch_and_batch(dataset: Path) -> None:
    steps = [RandomChoice([MixUp(0.4, CLASSES), CutMix(1.0, CLASSES)])]
    plain = collect(dataset, epochs=2)
    mixed = collect(dataset, epochs=2, batch_augment=steps)
    per_epoch = len(plain) // 2
    for number, ((images, labels), (want_images, want_labels)) in enumerate(zip(mixed, plain, strict=True)):
        assert labels.shape == (len(want_labels), CLASSES) and labels.dtype == torch.float32
        torch.testing.assert_close(labels.sum(1), torch.ones(len(labels)))
        epoch, batch = divmod(number, per_epoch)
        expected = apply_batch_steps(steps, want_images.permute(0, 2, 3, 1), want_labels, seed=5, epoch=epoch, batch=batch, layout="NHWC")
        assert torch.equal(images.permute(0, 2, 3, 1), expected[0]) and torch.equal(labels, expected[1])
    settings: dict[str, Any] = dict(
        batch_size=4, num_workers=0, seed=5, batch_augment=steps, transform=ImageTransform(size=24), output=Output(copy=True)
    )
    with Loader(dataset, **settings) as loader:
        iterator = iter(loader)
        next(iterator), next(iterator)
        state = loader.state_dict()
        tail = list(iterator)
    with Loader(dataset, **settings) as loader:
        loader.load_state_dict(state)
        assert all(torch.equal(a, b) for x, y in zip(tail, loader, strict=True) for a, b in zip(x, y, strict=True))
    with pytest.raises(TypeError, match="batch_augment takes batch steps"):
        Loader(dataset, batch_size=4, batch_augment=[TrivialAugmentWide()])


def test_random_erasing_takes_the_loaders_mean(dataset: Path) -> None:
    mean, std = (120.0, 110.0, 100.0), (50.0, 60.0, 70.0)
    batches = collect(dataset, augment=[RandomErasing(p=1.0)], mean=mean, std=std, num_workers=2)
    zeros = sum(int((images == 0).all(dim=1).sum()) for images, _ in batches)
    assert zeros >= NUM_RECORDS * 0.02 * 24 * 24  # every sample has an erased box of 2% of its area at least
    with pytest.raises(ValueError, match="mean"):
        Loader(dataset, batch_size=4, transform=ImageTransform(augment=[RandomErasing(p=1.0)]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batch_steps_run_on_the_device_after_the_transfer(dataset: Path) -> None:
    steps = [CutMix(1.0, CLASSES)]
    mean, std = (120.0, 110.0, 100.0), (50.0, 60.0, 70.0)
    on_device = collect(dataset, device="cuda", mean=mean, std=std, batch_augment=steps)
    plain = collect(dataset, device="cuda", mean=mean, std=std)
    for number, ((images, labels), (want_images, want_labels)) in enumerate(zip(on_device, plain, strict=True)):
        assert images.is_cuda and labels.is_cuda and labels.shape == (len(want_labels), CLASSES)
        expected = apply_batch_steps(steps, want_images, want_labels, seed=5, epoch=0, batch=number)
        assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])


def test_repeats_resume_on_other_ranks_with_the_rest_of_the_epoch(dataset: Path) -> None:
    settings: dict[str, Any] = dict(
        batch_size=3,
        num_workers=0,
        seed=5,
        transform=ImageTransform(size=24),
        output=Output(copy=True, return_indices=True),
    )
    taken = []
    states = []
    for rank in range(2):  # 36 samples over 2 ranks: 6 batches each; take 2
        with Loader(dataset, **settings, sampling=Sampling(repeats=2, rank=rank, world_size=2)) as loader:
            iterator = iter(loader)
            taken += [next(iterator)[2] for _ in range(2)]
            states.append(loader.state_dict())
    rest = []
    for rank in range(3):  # the 24 samples left, over 3 ranks
        with Loader(dataset, **settings, sampling=Sampling(repeats=2, rank=rank, world_size=3)) as loader:
            loader.load_state_dict(states[0])
            rest += [batch[2] for batch in loader]
    everything = Counter(torch.cat(taken + rest).tolist())
    assert everything == {i: 2 for i in range(NUM_RECORDS)}


def test_nearest_interpolation_is_accepted_and_takes_pils_nearest_pixels(dataset: Path) -> None:
    images = collect(dataset, pipeline="resize", size=40, interpolation="nearest", fast_decode=False, shuffle=False, return_indices=True)
    with open_dataset(dataset) as data:
        for batch, _, indices in images:
            for image, index in zip(batch, indices.tolist(), strict=True):
                pixels = simplejpeg.decode_jpeg(bytes(data[index]["image"]), colorspace="RGB")
                source = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
                want = torch.nn.functional.interpolate(source, size=(40, 40), mode="nearest-exact")[0]  # PIL's NEAREST
                assert torch.equal(image, want)
    with pytest.raises(ValueError, match="interpolation=.nearest. needs decode=.cpu."):
        Loader(dataset, batch_size=4, transform=ImageTransform(interpolation="nearest", decode="gpu"))


def test_an_rasampler_epoch_keeps_n_samples(dataset: Path) -> None:
    batches = collect(dataset, repeats=3, repeats_epoch="records", return_indices=True, augment=[TrivialAugmentWide()])
    indices = torch.cat([b[2] for b in batches]).tolist()
    assert len(indices) == NUM_RECORDS and len(batches) == -(-NUM_RECORDS // 4)  # N samples, not 3 N
    assert Counter(indices) == {i: 3 for i in set(indices)} and len(set(indices)) == NUM_RECORDS // 3
    copies = collect(dataset, repeats=3, return_indices=True, augment=[TrivialAugmentWide()])
    assert indices == torch.cat([b[2] for b in copies]).tolist()[:NUM_RECORDS]  # the first N of the 3 N positions
    assert torch.equal(torch.cat([b[0] for b in batches]), torch.cat([b[0] for b in copies])[:NUM_RECORDS])
    ranks = [collect(dataset, repeats=3, repeats_epoch="records", return_indices=True, rank=r, world_size=3) for r in range(3)]
    seen = [torch.cat([b[2] for b in rank]).tolist() for rank in ranks]
    assert [len(s) for s in seen] == [NUM_RECORDS // 3] * 3
    assert Counter(seen[0] + seen[1] + seen[2]) == Counter(indices)
    assert all(len(set(rank)) == len(rank) for rank in seen)  # the 3 copies of a record on 3 ranks
    with Loader(dataset, batch_size=4, sampling=Sampling(repeats=3, repeats_epoch="records")) as loader:
        assert len(loader) == -(-NUM_RECORDS // 4) and loader.sampling.repeats_epoch == "records"
    with pytest.raises(ValueError, match="repeats_epoch"):
        Loader(dataset, batch_size=4, sampling=Sampling(repeats=3, repeats_epoch="samples"))
