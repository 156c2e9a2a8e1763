"""A pipeline and a batch step of the user's own (`shardfmt.ops.Pipeline`, `shardfmt.ops.BatchStep`):
used by a Loader with workers, fingerprinted so that a resume continues them and refuses others,
and refused when they lack what the loader calls."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Workers
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CropPlan, MixUp, RandomChoice, RandomResizedCrop, apply_batch_steps
from shardfmt.ops._augment import describe_steps

NUM_RECORDS = 24
NUM_CLASSES = 4
SIXTEEN = ImageTransform(size=16)


@pytest.fixture(scope="module")
def squares(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 square 48 x 48 records of 4 classes: a centred square box is the whole image."""
    out = tmp_path_factory.mktemp("user-steps") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=20_000, classes=[f"c{c}" for c in range(NUM_CLASSES)]) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"image": jpeg_bytes(48, 48, seed=500 + i), "label": i % NUM_CLASSES, "key": f"k{i}"})
    return out


@dataclass(frozen=True)
class CentreBox:
    """The centred square of each image, never flipped: a pipeline of one's own."""

    size: tuple[int, int] = (16, 16)
    shrink: int = 0

    def plan(self, heights: np.ndarray, widths: np.ndarray, keys: np.ndarray) -> CropPlan:
        side = np.minimum(heights, widths) - self.shrink
        return CropPlan((heights - side) // 2, (widths - side) // 2, side, side, np.zeros(len(heights), bool))

    def to_config(self) -> dict[str, Any]:
        return {"op": "centre_box", "size": list(self.size), "shrink": self.shrink}

    def with_size(self, size: tuple[int, int]) -> CentreBox:
        return replace(self, size=size)


@dataclass(frozen=True)
class Delegating:
    """A pipeline of one's own that draws a built-in's boxes."""

    inner: RandomResizedCrop

    @property
    def size(self) -> tuple[int, int]:
        return self.inner.size

    def plan(self, heights: np.ndarray, widths: np.ndarray, keys: np.ndarray) -> CropPlan:
        return self.inner.plan(heights, widths, keys)

    def to_config(self) -> dict[str, Any]:
        return {"op": "delegating", "inner": self.inner.to_config()}

    def with_size(self, size: tuple[int, int]) -> Delegating:
        return Delegating(self.inner.with_size(size))


@dataclass(frozen=True)
class LabelNoise:
    """A batch step of one's own: each label replaced by a uniform class with probability `p`."""

    p: float
    num_classes: int
    draws = 1

    def apply(
        self, images: torch.Tensor, labels: torch.Tensor, u: np.ndarray, *, layout: str = "NCHW"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(int(u[0] * 2**53))
        noisy = torch.rand(len(labels), generator=generator) < self.p
        return images, torch.where(noisy, torch.randint(0, self.num_classes, (len(labels),), generator=generator), labels)


def epoch(path: Path, *, pipeline: Any = "train", **kwargs: Any) -> list[tuple[torch.Tensor, ...]]:
    transform = ImageTransform(crop=pipeline, size=16)
    with Loader(path, batch_size=5, seed=4, transform=transform, output=Output(copy=True), **kwargs) as loader:
        return [tuple(t.clone() for t in batch) for batch in loader]


def same(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))


def test_a_fixed_centre_box_of_ones_own_crops_as_the_resize_of_a_square(squares: Path) -> None:
    mine = epoch(squares, num_workers=2, pipeline=CentreBox())
    assert same(mine, epoch(squares, num_workers=2, pipeline="resize"))
    assert mine[0][0].shape == (5, 3, 16, 16)


def test_a_pipeline_of_ones_own_draws_with_the_workers_and_changes_size(squares: Path) -> None:
    crop = RandomResizedCrop((16, 16))
    assert same(epoch(squares, num_workers=2, pipeline=Delegating(crop)), epoch(squares, num_workers=2, pipeline=crop))
    with Loader(squares, batch_size=5, seed=4, num_workers=2, transform=Delegating(crop)) as loader:
        loader.set_size(12)
        images, _ = next(iter(loader))
        assert loader.pipeline == Delegating(crop.with_size((12, 12)))
    assert images.shape == (5, 3, 12, 12)


def test_a_pipeline_of_ones_own_resumes_and_its_parameters_are_checked(squares: Path) -> None:
    whole = epoch(squares, num_workers=2, pipeline=CentreBox(shrink=6), shuffle=True)
    with Loader(squares, batch_size=5, seed=4, num_workers=2, transform=CentreBox(shrink=6), output=Output(copy=True)) as loader:
        iterator = iter(loader)
        next(iterator), next(iterator)
        state = loader.state_dict()
    with Loader(squares, batch_size=5, seed=4, num_workers=2, transform=CentreBox(shrink=6), output=Output(copy=True)) as loader:
        loader.load_state_dict(state)
        assert same([tuple(t.clone() for t in b) for b in loader], whole[2:])
    with Loader(squares, batch_size=5, seed=4, num_workers=2, transform=CentreBox(shrink=2)) as loader:
        with pytest.raises(ValueError, match="pipeline"):
            loader.load_state_dict(state)


def test_a_batch_step_of_ones_own_runs_on_each_batch_as_apply_batch_steps_does(squares: Path) -> None:
    noise = LabelNoise(0.5, NUM_CLASSES)
    plain = epoch(squares, num_workers=2)
    mixed = epoch(squares, num_workers=2, batch_augment=[noise])
    expected = [apply_batch_steps([noise], images, labels, seed=4, epoch=0, batch=number) for number, (images, labels) in enumerate(plain)]
    assert same(mixed, expected)
    assert not same(mixed, plain)  # half the labels drawn again: some differ


def test_a_batch_step_of_ones_own_mixes_with_the_built_ins_and_resumes(squares: Path) -> None:
    steps = [LabelNoise(0.5, NUM_CLASSES), RandomChoice([MixUp(0.4, NUM_CLASSES), LabelNoise(0.2, NUM_CLASSES)])]
    whole = epoch(squares, num_workers=2, batch_augment=steps)
    with Loader(squares, batch_size=5, seed=4, num_workers=2, transform=SIXTEEN, batch_augment=steps, output=Output(copy=True)) as loader:
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
    with Loader(squares, batch_size=5, seed=4, num_workers=2, transform=SIXTEEN, batch_augment=steps, output=Output(copy=True)) as loader:
        loader.load_state_dict(state)
        assert same([tuple(t.clone() for t in b) for b in loader], whole[1:])
    with Loader(squares, batch_size=5, seed=4, num_workers=2, transform=SIXTEEN, batch_augment=steps[1:]) as loader:
        with pytest.raises(ValueError, match="batch_augment"):
            loader.load_state_dict(state)


def test_batch_steps_are_fingerprinted_as_augment_steps_are() -> None:
    assert describe_steps([MixUp(0.4, 3)]) == "[('alpha', 0.4), ('num_classes', 3), ('op', 'mixup')]"
    assert describe_steps([LabelNoise(0.5, 3)]) == f"{__name__}.LabelNoise"
    assert describe_steps([LabelNoise(0.5, 3)]) == describe_steps([LabelNoise(0.5, 3)])  # no address in it


class NoPlan:
    size = (16, 16)

    def to_config(self) -> dict[str, Any]:
        return {}

    def with_size(self, size: tuple[int, int]) -> NoPlan:
        return self


@dataclass(frozen=True)
class BadConfig(CentreBox):
    def to_config(self) -> dict[str, Any]:
        return {"op": object()}


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (NoPlan(), r", got .*NoPlan object at .*, which lacks plan$"),
        (object(), r", which lacks size and plan and to_config and with_size$"),
        (CentreBox(size=16), r"size must be a \(height, width\) tuple of ints in \[1, 65535\], got 16$"),  # type: ignore[arg-type]
        (BadConfig(), r"to_config\(\) must return a JSON object \(a loader's state records it\): Object of type object"),
    ],
)
def test_a_pipeline_lacking_what_the_loader_calls_is_refused(squares: Path, pipeline: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Loader(squares, batch_size=5, num_workers=0, transform=pipeline)


def test_a_pipeline_that_cannot_be_pickled_is_refused_where_the_workers_are_spawned(squares: Path) -> None:
    @dataclass(frozen=True)
    class Local(CentreBox):
        pass

    with pytest.raises(TypeError, match=r"pipeline .*Local.* cannot be pickled, which the 'spawn' start method needs"):
        Loader(squares, batch_size=5, num_workers=1, workers=Workers(start_method="spawn"), transform=Local())
    with Loader(squares, batch_size=5, num_workers=0, transform=Local()) as loader:  # no worker to send it to
        assert next(iter(loader))[0].shape == (5, 3, 16, 16)


class NoApply:
    draws = 1


@dataclass(frozen=True)
class HalfDraw(LabelNoise):
    draws = 1.5  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (NoApply(), r"or objects with draws and apply\(images, labels, u, \*, layout\), got .*NoApply.*, which lacks apply$"),
        (HalfDraw(0.1, 3), r"draws must be an int in \[0, 65536\], got 1.5$"),
    ],
)
def test_a_batch_step_lacking_what_the_loader_calls_is_refused(squares: Path, step: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Loader(squares, batch_size=5, num_workers=0, batch_augment=[step])
    with pytest.raises(TypeError, match=message):
        RandomChoice([MixUp(0.2, 3), step])
