"""Batches are the caller's: what training and evaluation loops keep stays as it was handed out
(labels and indices are copies; images kept past the next batch are set aside, not
overwritten); user steps drawing from the global RNGs are reproducible; plain callables are
steps; DataLoader's attributes are there."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling, Workers
from shardfmt._loader.scheduler import KEPT_WARNING
from shardfmt.format import IMAGE_CLASSIFICATION

NUM_RECORDS = 60
NUM_CLASSES = 6


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 records of 6 classes, 10 each (label = index % 6), in several shards."""
    out = tmp_path_factory.mktemp("batches") / "ds"
    names = [f"class-{c}" for c in range(NUM_CLASSES)]
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=30_000, classes=names) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"image": jpeg_bytes(40 + i % 7, 48, seed=300 + i), "label": i % NUM_CLASSES, "key": f"key-{i}"})
    return out


def copied_epoch(path: Path, **kwargs: Any) -> list[tuple[torch.Tensor, ...]]:
    with Loader(path, **kwargs, output=Output(copy=True)) as loader:
        return [tuple(t.clone() for t in batch) for batch in loader]


def test_an_epochs_labels_and_indices_collected_then_compared(classes: Path) -> None:
    with Loader(classes, batch_size=8, num_workers=2, transform=ImageTransform(size=16), output=Output(return_indices=True)) as loader:
        batches = list(loader)
    labels = torch.cat([y for _, y, _ in batches])
    indices = torch.cat([i for _, _, i in batches])
    assert torch.bincount(labels, minlength=NUM_CLASSES).tolist() == [10] * NUM_CLASSES
    assert sorted(indices.tolist()) == list(range(NUM_RECORDS))
    assert (labels == indices % NUM_CLASSES).all()


def test_outputs_and_targets_kept_and_scored_at_the_end_equal_a_copy_run(classes: Path) -> None:
    kwargs: dict[str, Any] = {"batch_size": 8, "num_workers": 2, "seed": 3, "transform": ImageTransform(size=16)}
    outputs, targets = [], []
    with Loader(classes, **kwargs) as loader:
        for images, labels in loader:
            outputs.append(images[:, :, 0, 0])  # a view of the slot, as a model's output may be
            targets.append(labels)
    expected = copied_epoch(classes, **kwargs)
    assert torch.equal(torch.cat(outputs), torch.cat([images[:, :, 0, 0] for images, _ in expected]))
    assert torch.equal(torch.cat(targets), torch.cat([labels for _, labels in expected]))
    correct = (torch.cat(outputs)[:, 0].long() % NUM_CLASSES == torch.cat(targets)).sum()
    assert (
        correct == (torch.cat([i[:, :, 0, 0] for i, _ in expected])[:, 0].long() % NUM_CLASSES == torch.cat([y for _, y in expected])).sum()
    )


def test_the_previous_batch_kept_one_step(classes: Path) -> None:
    # decoded in next(), no race
    kwargs: dict[str, Any] = {"batch_size": 8, "num_workers": 0, "seed": 4, "transform": ImageTransform(size=16)}
    expected = copied_epoch(classes, **kwargs)
    seen = 0
    with Loader(classes, **kwargs) as loader:
        prev = None
        for step, (images, _) in enumerate(loader):
            if prev is not None:
                assert torch.equal(prev, expected[step - 1][0]), f"batch {step - 1} changed while kept one step"
                seen += 1
            prev = images
    assert seen == len(expected) - 1


@pytest.mark.usefixtures("no_leaks")
def test_a_view_kept_across_an_epoch_boundary_iter_set_size_and_close(classes: Path) -> None:
    kwargs: dict[str, Any] = {"batch_size": 8, "num_workers": 2, "seed": 5, "transform": ImageTransform(size=16)}
    expected = copied_epoch(classes, **kwargs)
    with Loader(classes, **kwargs) as loader:
        first_epoch = list(loader)
        kept = first_epoch[-1][0][1:, :, 2:]  # a view of the epoch's last batch
        array = first_epoch[2][0].numpy()  # a numpy view of another
        del first_epoch
        for _ in loader:  # the next epoch, run to its end
            pass
        next(iter(loader))
        loader.set_size(12)
        next(iter(loader))
    assert torch.equal(kept, expected[-1][0][1:, :, 2:])
    assert np.array_equal(array, expected[2][0].numpy())


@pytest.mark.usefixtures("no_leaks")
def test_kept_batches_outlive_the_loader_and_leave_nothing_in_dev_shm(classes: Path) -> None:
    loader = Loader(classes, batch_size=8, num_workers=2, seed=6, shuffle=False, transform=ImageTransform(size=16))
    kept = [images for images, _ in loader]
    loader.close()
    del loader
    expected = copied_epoch(classes, batch_size=8, num_workers=0, transform=ImageTransform(size=16), seed=6, shuffle=False)
    assert all(torch.equal(a, b[0]) for a, b in zip(kept, expected, strict=True))


def test_keeping_many_batches_warns_once_with_the_memory_held(classes: Path) -> None:
    with Loader(
        classes, batch_size=2, num_workers=1, shuffle=False, transform=ImageTransform(size=16)
    ) as loader, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = [images for images, _ in loader]
    held = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(kept) == NUM_RECORDS // 2
    assert len(held) == 1
    assert f"holds {KEPT_WARNING + 1} batches" in str(held[0].message) and "MiB" in str(held[0].message)


def test_nothing_is_set_aside_by_a_plain_loop(classes: Path) -> None:
    with Loader(classes, batch_size=8, num_workers=2, transform=ImageTransform(size=16)) as loader:
        for _ in range(2):
            for _batch in loader:
                pass
        assert loader.scheduler.kept == []
        assert loader.scheduler.ring is not None and loader.scheduler.ring.serials == [0, 1, 2]


class GlobalJitter(torch.nn.Module):
    """Like a torchvision transform: one tensor in, and its random draw from torch's global RNG."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        shift = int(torch.randint(0, 50, ()).item()) + int(np.random.randint(0, 50)) + (__import__("random").randrange(50))
        return (image.int() + shift).clamp(0, 255).to(torch.uint8)


def record_shifts(loader: Loader, plain: dict[int, torch.Tensor]) -> dict[int, int]:
    """Per record index, the shift the step added (its image minus the unaugmented image)."""
    shifts = {}
    for images, _, indices in loader:
        for image, index in zip(images, indices.tolist(), strict=True):
            shifts[index] = int((image.int() - plain[index].int()).max())
    return shifts


def test_a_global_rng_step_is_the_same_for_1_2_3_workers_and_after_resume(classes: Path) -> None:
    kwargs: dict[str, Any] = {"batch_size": 6, "seed": 8, "output": Output(return_indices=True)}
    jitter = ImageTransform("resize", size=16, augment=[GlobalJitter()])
    with Loader(classes, num_workers=0, **kwargs, transform=ImageTransform("resize", size=16)) as loader:
        plain = {int(i): image.clone() for images, _, indices in loader for image, i in zip(images, indices, strict=True)}
    results = []
    for workers in (1, 2, 3):
        with Loader(classes, num_workers=workers, **kwargs, transform=jitter) as loader:
            results.append([b[0].clone() for b in loader])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))
    with Loader(classes, num_workers=2, **kwargs, transform=jitter) as loader:
        iterator = iter(loader)
        for _ in range(4):
            next(iterator)
        state = loader.state_dict()
    with Loader(classes, num_workers=2, **kwargs, transform=jitter) as loader:
        loader.load_state_dict(state)
        rest = [b[0].clone() for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(results[0][4:], rest, strict=True))
    with Loader(classes, num_workers=2, **kwargs, transform=jitter) as loader:
        shifts = record_shifts(loader, plain)
    assert len(set(shifts.values())) > 30, "records drew alike from the global RNG"


def test_the_callers_global_rng_is_left_alone_without_workers(classes: Path) -> None:
    torch.manual_seed(1)
    state = torch.get_rng_state()
    with Loader(classes, batch_size=6, num_workers=0, transform=ImageTransform(size=16, augment=[GlobalJitter()])) as loader:
        next(iter(loader))
    assert torch.equal(torch.get_rng_state(), state)


def takes_sample_and_generator(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return sample


def test_plain_callables_are_steps_and_bad_ones_fail_at_construction(classes: Path) -> None:
    with Loader(
        classes, batch_size=6, num_workers=2, transform=ImageTransform(size=16, augment=[GlobalJitter(), takes_sample_and_generator])
    ) as loader:
        images, _ = next(iter(loader))
        assert images.shape == (6, 3, 16, 16)
    with pytest.raises(TypeError, match=r"must take \(sample\) or \(sample, generator\)"):
        Loader(classes, batch_size=6, transform=ImageTransform(augment=[lambda a, b, c: a]))
    with pytest.raises(TypeError, match="callable"):
        Loader(classes, batch_size=6, transform=ImageTransform(augment=[3]))
    with pytest.raises(TypeError, match="cannot be pickled, which the 'spawn' start method needs"):
        Loader(
            classes,
            batch_size=6,
            num_workers=1,
            transform=ImageTransform(augment=[lambda image: image]),
            workers=Workers(start_method="spawn"),
        )


def test_dataloaders_attributes(classes: Path) -> None:
    with Loader(
        classes,
        batch_size=8,
        num_workers=2,
        drop_last=True,
        transform=ImageTransform(size=16),
        sampling=Sampling(subset=list(range(0, NUM_RECORDS, 2))),
    ) as loader:
        assert len(loader.dataset) == NUM_RECORDS // 2
        assert loader.dataset.classes == [f"class-{c}" for c in range(NUM_CLASSES)]
        assert loader.dataset[3]["label"] == 6 % NUM_CLASSES
        assert (loader.batch_size, loader.drop_last, loader.num_workers, loader.pin_memory) == (8, True, 2, False)
        loader.sampler.set_epoch(4)
        assert loader.epoch == 4


def test_the_transform_crosses_to_the_workers_with_its_steps() -> None:
    transform = ImageTransform(augment=[takes_sample_and_generator])
    assert pickle.loads(pickle.dumps(transform)).augment[0].takes_generator


def test_the_cursor_saves_and_restores_without_processes() -> None:
    from shardfmt._loader.cursor import Cursor, SavedState
    from shardfmt._sampling.orders import epoch_order

    def order(epoch: int) -> Any:
        return epoch_order("sorted-key", num_records=20, seed=0, epoch=epoch)

    cursor = Cursor(order, epoch_records=20, batch_size=4, rank=0, world_size=1, drop_last=False)
    cursor.enter(cursor.begin())
    for batch in cursor.expected()[:2]:
        cursor.deliver(batch)
    settings = {"seed": 0, "rank": 0, "world_size": 1, "order": "feistel", "augment": "", "subset": None, "pipeline": "{}", "dataset": "d"}
    state = cursor.state(size=(8, 8), settings=settings)
    other = Cursor(order, epoch_records=20, batch_size=4, rank=0, world_size=1, drop_last=False)
    saved = SavedState.read(state)
    saved.check_settings(settings)
    other.restore(saved)
    other.enter(other.begin())
    assert other.expected() == [2, 3, 4]
    assert np.array_equal(other.plan(0).batch(2), cursor.plan(0).batch(2))
    with pytest.raises(ValueError, match="seed: 0 -> 1"):
        saved.check_settings(settings | {"seed": 1})
