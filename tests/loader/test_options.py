"""The Loader's options as objects owned by their layers: `ImageTransform` (one image, bytes to
row), `Sampling` (the epochs' order), `Workers` (the processes) and `Output` (a batch's form).
Each checks its own arguments where they are given and fingerprints itself; the loader takes the
DataLoader keywords as shortcuts into them, and each stage takes only its slice."""

from __future__ import annotations

import ast
import inspect
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes

import shardfmt
from shardfmt import Dataset, DatasetWriter, ImageTransform, Loader, Output, Sampling, Workers
from shardfmt._loader.epoch import Epochs
from shardfmt._loader.scheduler import Scheduler
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CenterCrop, CutMix, MixUp, RandomChoice, RandomErasing, RandomResizedCrop, RandomVerticalFlip, TrivialAugmentWide

LOADER = Path(shardfmt.__file__).parent / "_loader"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("options") / "ds"
    with DatasetWriter(root, schema=IMAGE_CLASSIFICATION, shard_size=4_000, classes=["a", "b", "c"]) as writer:
        for i in range(24):
            writer.write({"image": jpeg_bytes(20 + i % 5, 24, seed=i), "label": i % 3, "key": f"r{i}"})
    return root


def test_the_loader_takes_15_parameters_dataloaders_first() -> None:
    names = list(inspect.signature(Loader).parameters)
    assert names == [
        "path", "batch_size", "shuffle", "seed", "num_workers", "drop_last", "transform", "fields", "batch_augment", "device",
        "sampling", "workers", "output", "verify", "remote",
    ]  # fmt: skip


def test_no_module_of_the_loader_funnels_locals() -> None:
    """Every option can be followed by name from the constructor to its stage (an IDE's find-usages)."""
    for path in sorted(LOADER.glob("*.py")):
        calls = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]
        assert not [c for c in calls if isinstance(c.func, ast.Name) and c.func.id in ("locals", "vars")], path.name


def test_each_stage_takes_its_slice(dataset: Path) -> None:
    for stage in (Epochs, Scheduler):
        assert "options" not in inspect.signature(stage).parameters
    with Loader(dataset, batch_size=4, num_workers=0, transform=ImageTransform(size=8)) as loader:
        assert not hasattr(loader, "options") and not hasattr(loader.scheduler, "options")
        assert isinstance(loader._epochs.sampling, Sampling) and loader.scheduler.workers is loader.workers
        assert loader.scheduler.config is not None and loader.scheduler.config.pipeline == loader.pipeline


def test_dataloaders_attributes_are_attributes_not_properties(dataset: Path) -> None:
    with Loader(dataset, batch_size=4, num_workers=0, drop_last=True, shuffle=False, seed=3) as loader:
        held = vars(loader)
        for name in ("batch_size", "shuffle", "seed", "num_workers", "drop_last", "pin_memory", "sampler", "batch_sampler"):
            assert name in held, name
        assert (loader.batch_size, loader.shuffle, loader.seed, loader.num_workers, loader.drop_last) == (4, False, 3, 0, True)
        assert loader.sampling == Sampling(shuffle=False, seed=3, drop_last=True) != Sampling(seed=3, drop_last=True)
    assert Sampling(subset=np.arange(4)) == Sampling(subset=np.arange(4)) != Sampling(subset=np.arange(5))


def test_a_shortcut_goes_into_its_object_and_a_conflict_is_refused(dataset: Path) -> None:
    with Loader(dataset, batch_size=4, num_workers=0, seed=9, sampling=Sampling(window=2)) as loader:
        assert (loader.sampling.seed, loader.sampling.window) == (9, 2)
    with Loader(dataset, batch_size=4, num_workers=0, sampling=Sampling(shuffle=False, seed=4)) as loader:
        assert (loader.shuffle, loader.seed) == (False, 4)
    with Loader(dataset, batch_size=4, num_workers=0, seed=4, sampling=Sampling(seed=4)) as loader:
        assert loader.seed == 4
    with pytest.raises(ValueError, match=r"seed is given twice: Loader\(seed=3\) and sampling=Sampling\(seed=4\); give it once"):
        Loader(dataset, batch_size=4, seed=3, sampling=Sampling(seed=4))
    with pytest.raises(ValueError, match=r"num_workers is given twice: Loader\(num_workers=1\) and workers=Workers\(num_workers=2\)"):
        Loader(dataset, batch_size=4, num_workers=1, workers=Workers(num_workers=2))
    with Loader(dataset, batch_size=4, workers=Workers(num_workers=0, prefetch=3)) as loader:
        assert (loader.num_workers, loader.workers.prefetch) == (0, 3)


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        ("sampling", {"window": 2}, r"sampling must be None or a shardfmt.Sampling, got \{'window': 2\}"),
        ("workers", 4, r"workers must be None or a shardfmt.Workers, got 4"),
        ("output", "NHWC", r"output must be None or a shardfmt.Output, got 'NHWC'"),
        ("transform", 5, r"crop must be 'train', 'eval', 'resize' or a pipeline of shardfmt.ops"),
    ],
)
def test_an_option_object_of_another_type_is_refused(dataset: Path, keyword: str, value: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Loader(dataset, batch_size=4, **{keyword: value})


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Sampling(seed=-1), ValueError, r"seed must be in \[0, 18446744073709551615\], got -1"),
        (lambda: Sampling(order="random"), ValueError, r"order must be one of 'auto', 'sorted-key', 'feistel', got 'random'"),
        (lambda: Sampling(window=0), ValueError, r"window must be in \[1, 2147483647\] shards, got 0"),
        (lambda: Sampling(repeats=0), ValueError, r"repeats must be an integer from 1 to"),
        (lambda: Sampling(repeats_epoch="x"), ValueError, r"repeats_epoch must be one of 'copies', 'records', got 'x'"),
        (lambda: Sampling(rank=2, world_size=2), ValueError, r"rank must be in \[0, 1\], got 2"),
        (lambda: Sampling(drop_last="yes"), TypeError, r"drop_last must be True or False, got 'yes'"),
        (lambda: Workers(prefetch=0), ValueError, r"prefetch must be in \[1, 1024\], got 0"),
        (lambda: Workers(timeout=0), ValueError, r"timeout must be a finite number of seconds > 0, got 0"),
        (lambda: Workers(ordered=1), TypeError, r"ordered must be True or False, got 1"),
        (lambda: Workers(start_method="threads"), ValueError, r"start_method must be None or one of"),
        (lambda: Output(layout="CHW"), ValueError, r"layout must be 'NHWC' or 'NCHW', got 'CHW'"),
        (lambda: Output(copy="no"), TypeError, r"copy must be True or False, got 'no'"),
        (lambda: Output(label_field=3), TypeError, r"label_field must be a field name \(str\) or None, got 3"),
        (lambda: ImageTransform(size=0), ValueError, r"size must be a positive int or \(height, width\), each in \[1, 65535\]"),
        (lambda: ImageTransform(interpolation="lanczos"), ValueError, r"interpolation must be 'bilinear' or 'bicubic'"),
        (lambda: ImageTransform(mean=(1.0, 2.0, 3.0)), ValueError, r"give both mean and std, or neither"),
        (lambda: ImageTransform(mean=(1.0,), std=(1.0,)), ValueError, r"mean and std need one value per channel \(3\), got 1 and 1"),
        (lambda: ImageTransform(decode="npu"), ValueError, r"decode must be one of 'cpu', 'gpu', 'hybrid', got 'npu'"),
        (lambda: ImageTransform(decode="gpu", interpolation="nearest"), ValueError, r"interpolation='nearest' needs decode='cpu'"),
        (lambda: ImageTransform(decode="gpu", augment=[RandomVerticalFlip()]), ValueError, r"decode='gpu' cannot run augment= steps"),
        (lambda: ImageTransform(augment=[RandomErasing(value="mean")]), ValueError, r"RandomErasing\(value='mean'\) fills with"),
        (lambda: ImageTransform(augment=[5]), TypeError, r"an augment step is a shardfmt.ops step or a callable"),
        (lambda: ImageTransform(fast_decode="yes"), TypeError, r"fast_decode must be True or False, got 'yes'"),
    ],
)
def test_each_object_checks_its_arguments_when_made(make: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message) as info:
        make()
    assert type(info.value) is error


def test_a_transform_holds_its_values_converted_and_crosses_processes() -> None:
    transform = ImageTransform(augment=[TrivialAugmentWide()], mean=[123, 116, 103], std=np.array([58.0, 57.0, 57.0]), size=(32, 48))
    assert transform.mean == (123.0, 116.0, 103.0) and transform.std == (58.0, 57.0, 57.0)
    assert isinstance(transform.augment, tuple) and transform.pipeline == RandomResizedCrop((32, 48))
    again = pickle.loads(pickle.dumps(transform))
    assert again.augment == transform.augment and again.mean == transform.mean and again.pipeline == transform.pipeline


def test_a_transform_at_another_size_keeps_its_crops_share() -> None:
    assert ImageTransform("eval", size=224).at_size((112, 112)).pipeline == CenterCrop((112, 112), resize=128)
    resized = ImageTransform(CenterCrop((224, 224), resize=256)).at_size((160, 160))
    assert resized.pipeline == CenterCrop((160, 160), resize=183)


def test_the_fingerprints_are_the_settings_a_state_records() -> None:
    assert Sampling(seed=2).fingerprint() == {"seed": 2, "shuffle": True, "drop_last": False, "window": None}
    assert Sampling(repeats=3, repeats_epoch="records").fingerprint()["repeats"] == 3
    assert Workers(ordered=False).fingerprint() == {"ordered": False}
    transform = ImageTransform(interpolation="bicubic", augment=[RandomVerticalFlip()])
    found = transform.fingerprint(transform.pipeline)
    assert set(found) == {"pipeline", "augment", "interpolation"} and "size" not in json.loads(found["pipeline"])


# A state saved by the loader before the option objects (56a25fc, whose batch steps are
# fingerprinted by `describe_steps`), over the dataset of the fixture, with every option that a
# state records. The dataset's fingerprint is that of the fixture as a 1.2 writer writes it (its
# shards' sizes and checksums; 1.1 shards of the same records: xxh3_64:388ae5d3f4182926).
OLD_STATE: dict[str, Any] = {
    "delivered": [],
    "epoch": 0,
    "position": 1,
    "settings": {
        "augment": (
            "[('fill', [0.0, 0.0, 0.0]), ('num_magnitude_bins', 31), ('op', 'trivial_augment_wide')]; [('op', 'random_erasing'), "
            "('p', 0.25), ('ratio', [0.3, 3.3]), ('scale', [0.02, 0.33]), ('value', 'mean')]"
        ),
        "batch_augment": "[('alpha', 0.2), ('num_classes', 3), ('op', 'mixup')]",
        "batch_size": 4,
        "dataset": "xxh3_64:5d94dcc0460e59cf",
        "drop_last": True,
        "interpolation": "bicubic",
        "num_records": 24,
        "order": "sorted-key",
        "ordered": False,
        "pipeline": '{"flip": 0.5, "op": "random_resized_crop", "ratio": [0.75, 1.3333333333333333], "scale": [0.08, 1.0]}',
        "rank": 0,
        "repeats": 2,
        "repeats_epoch": "records",
        "seed": 7,
        "shuffle": True,
        "subset": "xxh3_64:c58cb3b0a260a4e2",
        "window": 2,
        "world_size": 1,
    },
    "size": [16, 16],
    "start": 0,
    "version": 1,
}


def recipe_loader(dataset: Path, **changes: Any) -> Loader:
    """The loader `OLD_STATE` was saved from, in the new API (old: size=16, window=2, repeats=2,
    repeats_epoch="records", interpolation="bicubic", augment=..., mean=..., std=..., subset=...,
    ordered=False as keywords)."""
    settings: dict[str, Any] = dict(
        batch_size=4,
        num_workers=0,
        seed=7,
        drop_last=True,
        batch_augment=[MixUp(alpha=0.2, num_classes=3)],
        transform=ImageTransform(
            size=16,
            interpolation="bicubic",
            augment=[TrivialAugmentWide(), RandomErasing(0.25, value="mean")],
            mean=(123.0, 116.0, 103.0),
            std=(58.0, 57.0, 57.0),
        ),
        sampling=Sampling(window=2, repeats=2, repeats_epoch="records", subset=list(range(0, 24, 2))),
        workers=Workers(ordered=False),
    )
    return Loader(dataset, **(settings | changes))


def test_a_state_saved_before_the_option_objects_resumes(dataset: Path) -> None:
    """The new loader saves the old loader's state byte for byte, and continues from it."""
    with recipe_loader(dataset) as loader:
        iterator = iter(loader)
        next(iterator)
        assert loader.state_dict() == OLD_STATE
        rest = [tuple(t.clone() for t in batch) for batch in iterator]
    with recipe_loader(dataset) as resumed:
        resumed.load_state_dict(OLD_STATE)
        again = [tuple(batch) for batch in resumed]
    assert len(again) == len(rest) == 2
    assert all(torch.equal(a, b) for x, y in zip(rest, again, strict=True) for a, b in zip(x, y, strict=True))
    with recipe_loader(dataset, transform=ImageTransform(size=16, augment=[TrivialAugmentWide()])) as other:
        with pytest.raises(ValueError, match=r"loader state was saved with other settings \(augment: .*interpolation: 'bicubic' -> None"):
            other.load_state_dict(OLD_STATE)


def test_torchvisions_reference_recipe_runs(dataset: Path) -> None:
    """docs/loading.md's recipe (there with 16 workers, 128 a batch and 1000 classes)."""
    transform = ImageTransform(
        "train",
        size=224,
        interpolation="bilinear",
        augment=[TrivialAugmentWide(), RandomErasing(p=0.25, value="mean")],
        mean=(123.675, 116.28, 103.53),
        std=(58.395, 57.12, 57.375),
    )
    mix = [RandomChoice([MixUp(alpha=0.2, num_classes=3), CutMix(alpha=1.0, num_classes=3)])]
    with Loader(dataset, batch_size=8, num_workers=1, transform=transform, batch_augment=mix) as loader:
        images, soft_labels = next(iter(loader))
    assert images.shape == (8, 3, 224, 224) and images.dtype == torch.float32
    assert soft_labels.shape == (8, 3) and torch.allclose(soft_labels.sum(1), torch.ones(8))


def test_the_map_style_dataset_takes_the_transform_and_augments(dataset: Path) -> None:
    plain = Dataset(dataset, transform=ImageTransform("resize", size=12))
    flipped = Dataset(dataset, transform=ImageTransform("resize", size=12, augment=[RandomVerticalFlip(p=1.0)]))
    normalised = Dataset(dataset, transform=ImageTransform("resize", size=12, mean=(100.0, 100.0, 100.0), std=(50.0, 50.0, 50.0)))
    image, label = plain[5]
    assert image.shape == (3, 12, 12) and image.dtype == torch.uint8 and label == 5 % 3
    assert torch.equal(flipped[5][0], image.flip(1))
    assert torch.equal(normalised[5][0], (image.float() - 100) / 50)
    assert pickle.loads(pickle.dumps(flipped)).transform.augment == flipped.transform.augment
    with pytest.raises(ValueError, match=r"decode='gpu' needs a Loader"):
        Dataset(dataset, transform=ImageTransform(decode="gpu"))
