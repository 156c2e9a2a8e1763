"""Arguments and states are checked at the door: a `Loader` refuses a malformed argument when it is
made, and `load_state_dict` a malformed state when it is loaded, each with one message that says
the allowed range; what it takes, it runs. An epoch's size costs nothing before the first batch,
and an iterator replaced before its first `next()` raises as documented.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from pathlib import Path
from typing import Any

import fuzz_loader
import numpy as np
import pytest
import simplejpeg
import torch

from shardfmt import DatasetWriter, ImageTransform, Loader, Mixture, Output, Sampling, Workers
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CutMix, MixUp, RandomChoice

BASE: dict[str, Any] = {"batch_size": 4, "num_workers": 0, "seed": 3, "transform": ImageTransform(size=8, crop="resize")}
FLAT: dict[str, Any] = {"batch_size": 4, "num_workers": 0, "size": 8, "pipeline": "resize", "seed": 3}
"""`BASE` with each option named by its field; `fuzz_loader.loader_arguments` puts it into its option object."""
SOURCE = r"a Mixture's source must be a str or os.PathLike, or a list of them, "
MEAN = r"mean must be in \[-1e\+06, 1e\+06\] \(each channel, 0-255 scale\), got "
STD = r"std must be in \[1e-06, 1e\+06\] \(each channel, 0-255 scale\), got "
STEPS = r"batch_augment must be a list of batch steps \(MixUp, CutMix, RandomChoice\), "
SUBSET = r"subset must hold at most 24 entries \(distinct indices in \[0, 24\) or one per record\), got "
EPOCH_SIZE = r"epoch_size must be in \[1, 9007199254740992\] records, got "
WEIGHTS = r"\[0, 1.79769e\+308\] \(finite and at least 0\), "
WEIGHT_B = r"weights\['b'\] must be in " + WEIGHTS + "got "
CORES = os.cpu_count() or 1


def write(path: Path, shift: int) -> Path:
    with DatasetWriter(path, schema=IMAGE_CLASSIFICATION, shard_size=4_000) as writer:
        for i in range(24):
            pixels = np.full((12, 16, 3), (7 * i + shift) % 256, np.uint8)
            writer.write({"image": simplejpeg.encode_jpeg(pixels, quality=90), "label": i % 3, "key": f"r{i}"})
    return path


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two datasets of 24 records each, with other images."""
    root = tmp_path_factory.mktemp("door")
    return write(root / "ds", 0), write(root / "other", 100)


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (
            {"num_workers": 10**5},
            ValueError,
            rf"num_workers must be in \[0, {max(256, 4 * CORES)}\] \(at most {max(256, 4 * CORES)} worker processes a loader; "
            r"docs/limits.md\), got 100000",
        ),
        ({"num_workers": -1}, ValueError, r"num_workers must be in \[0, "),
        ({"num_workers": 2.5}, TypeError, r"num_workers must be an int in \[0, "),
        ({"batch_size": 2.5}, TypeError, r"batch_size must be an int in \[1, 2147483647\], got 2.5"),
        ({"batch_size": 0}, ValueError, r"batch_size must be in \[1, 2147483647\], got 0"),
        ({"batch_size": 10**12}, ValueError, r"batch_size must be in \[1, 2147483647\]"),
        ({"batch_size": True}, TypeError, r"batch_size must be an int"),
        ({"timeout": 0}, ValueError, r"timeout must be a finite number of seconds > 0, got 0"),
        ({"timeout": -1.0}, ValueError, r"timeout must be a finite number of seconds > 0"),
        ({"timeout": math.nan}, ValueError, r"timeout must be a finite number of seconds > 0, got nan"),
        ({"mean": (120.0, 110.0, 100.0), "std": (math.nan, 1.0, 1.0)}, ValueError, r"std must hold finite numbers"),
        ({"mean": (math.inf, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}, ValueError, r"mean must hold finite numbers"),
        ({"mean": (1.0, 1.0, 1.0), "std": (0.0, 1.0, 1.0)}, ValueError, r"std must hold numbers > 0"),
        ({"mean": 5, "std": 5}, TypeError, r"mean must be a sequence of numbers"),
        ({"seed": -1}, ValueError, r"seed must be in \[0, 18446744073709551615\], got -1"),
        ({"prefetch": 0}, ValueError, r"prefetch must be in \[1, 1024\], got 0"),
        ({"size": (0, 4)}, ValueError, r"size must be a positive int or \(height, width\), each in \[1, 65535\]"),
        ({"size": None}, TypeError, r"size must be a positive int or \(height, width\)"),
        ({"world_size": 0}, ValueError, r"world_size must be in \[1, "),
        ({"rank": 5, "world_size": 2}, ValueError, r"rank must be in \[0, 1\], got 5"),
        ({"shuffle": "no"}, TypeError, r"shuffle must be True or False, got 'no'"),
        ({"start_method": "threads"}, ValueError, r"start_method must be None or one of"),
        ({"device": "nope"}, ValueError, r"device 'nope' is not a device torch knows"),
        ({"pipeline": 5}, TypeError, r"crop must be 'train', 'eval', 'resize' or a pipeline of shardfmt.ops"),
        ({"augment": "flip"}, TypeError, r"augment must be a list of steps"),
        ({"mean": (0.0, 0.0, 0.0), "std": (1e-320, 1.0, 1.0)}, ValueError, STD + "1e-320$"),
        ({"mean": (0.0, 0.0, 0.0), "std": (1e-7, 1.0, 1.0)}, ValueError, STD + "1e-07$"),
        ({"mean": (0.0, 0.0, 0.0), "std": (1e300, 1.0, 1.0)}, ValueError, STD + r"1e\+300$"),
        ({"mean": (1e7, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}, ValueError, MEAN + "10000000.0$"),
        ({"remote": 5}, TypeError, r"remote must be None or a shardfmt.RemoteOptions, got 5$"),
        ({"remote": {"mode": "cache"}}, TypeError, r"remote must be None or a shardfmt.RemoteOptions, got \{'mode': 'cache'\}$"),
        ({"remote": "s3"}, TypeError, r"remote must be None or a shardfmt.RemoteOptions, got 's3'$"),
        ({"fields": 5}, TypeError, r"fields must be a mapping from field name to ImageOutput, size or None, or a list of names, got 5$"),
        ({"fields": [5]}, TypeError, r"fields must name fields by str, got 5$"),
        ({"fields": {"image": "big"}}, ValueError, r"fields\['image'\] must be an ImageOutput, a size or None, got 'big'$"),
        ({"batch_augment": MixUp(num_classes=3)}, TypeError, STEPS + r"got MixUp\(alpha=1.0, num_classes=3\)$"),
        ({"batch_augment": "mixup"}, TypeError, STEPS + "got 'mixup'$"),
        (
            {"batch_augment": [5]},
            TypeError,
            r"batch_augment takes batch steps of shardfmt.ops \(MixUp, CutMix, RandomChoice\) or objects with draws and "
            r"apply\(images, labels, u, \*, layout\), got 5, which lacks draws and apply$",
        ),
        ({"subset": range(10**12)}, ValueError, SUBSET + "1000000000000$"),
        ({"subset": range(10**20)}, ValueError, SUBSET + "more than sys.maxsize$"),
        ({"subset": [0] * 25}, ValueError, SUBSET + "25$"),
        ({"subset": {1, 2}}, TypeError, r"subset must be a sequence of record indices or a boolean mask, got set$"),
        ({"subset": 5}, TypeError, r"subset must be a sequence of record indices or a boolean mask, got int$"),
        ({"subset": "0"}, TypeError, r"subset must be a sequence of record indices or a boolean mask, got str$"),
    ],
)
def test_arguments_are_checked_at_the_door(datasets: tuple[Path, Path], changes: dict[str, Any], error: type, message: str) -> None:
    """Before (the cases after augment="flip"): std=1e-320 gave infinities, remote= of any type
    was ignored, fields=5 and batch_augment=MixUp(...) raised "'int' object is not iterable",
    subset=range(10**12) a bare MemoryError. Each option is checked where it is given: by the
    option object that owns it (`ImageTransform`, `Sampling`, `Workers`, `Output`), or the loader."""
    with pytest.raises(error, match=message) as info:
        Loader(datasets[0], **fuzz_loader.loader_arguments(FLAT | changes))
    assert type(info.value) is error


@pytest.mark.parametrize(
    ("path", "error", "message"),
    [
        ("x" * 100_000, ValueError, r"path must be at most 4096 bytes long \(PATH_MAX\), got 100000 bytes: b'xxx"),
        ("d/" * 3000, ValueError, r"path must be at most 4096 bytes long \(PATH_MAX\), got 6000 bytes"),
        ("x" * 256, ValueError, r"each part of path must be at most 255 bytes long \(NAME_MAX\), got one of 256 bytes"),
        (["a.tar", "x" * 5000 + ".tar"], ValueError, r"path must be at most 4096 bytes long \(PATH_MAX\), got 5004 bytes"),
        (["a.tar", 5], TypeError, r"path must be a str or os.PathLike, a list or tuple of them, or a Mixture, got a list holding 5$"),
    ],
    ids=["100000 characters", "6000 characters in parts", "a part of 256", "a tar of 5004", "a tar that is a number"],
)
def test_a_path_no_file_can_have_is_refused_by_name(path: Any, error: type, message: str) -> None:
    """Before: OSError "[Errno 36] File name too long", naming no argument."""
    with pytest.raises(error, match=message) as info:
        Loader(path, **BASE)
    assert type(info.value) is error


MIXTURE_CASES: list[tuple[str, dict[str, Any], type, str]] = [
    ("epoch_size 2**63", {"epoch_size": 2**63}, ValueError, EPOCH_SIZE + "9223372036854775808$"),
    ("epoch_size 2**53 + 1", {"epoch_size": 2**53 + 1}, ValueError, EPOCH_SIZE + "9007199254740993$"),
    ("epoch_size 0", {"epoch_size": 0}, ValueError, EPOCH_SIZE + "0$"),
    ("epoch_size float", {"epoch_size": 10.0}, TypeError, r"epoch_size must be an int in \[1, 9007199254740992\] records, got 10.0$"),
    ("epoch_size bool", {"epoch_size": True}, TypeError, r"epoch_size must be an int in \[1, 9007199254740992\] records, got True$"),
    ("epoch_size str", {"epoch_size": "10"}, TypeError, r"epoch_size must be an int in \[1, 9007199254740992\] records, got '10'$"),
    ("weights str", {"weights": {"a": "1", "b": 2}}, TypeError, r"weights\['a'\] must be a number in " + WEIGHTS + "got '1'$"),
    ("weights bool", {"weights": {"a": 1, "b": True}}, TypeError, r"weights\['b'\] must be a number in " + WEIGHTS + "got True$"),
    ("weights nan", {"weights": {"a": 1, "b": math.nan}}, ValueError, WEIGHT_B + "nan$"),
    ("weights inf", {"weights": {"a": 1, "b": math.inf}}, ValueError, WEIGHT_B + "inf$"),
    ("weights negative", {"weights": {"a": 1, "b": -1}}, ValueError, WEIGHT_B + "-1$"),
    ("weights list", {"weights": [1, 2]}, TypeError, r"weights must be a mapping from source name to a weight, got \[1, 2\]$"),
    ("sources list", {"sources": ["a", "b"]}, TypeError, r"sources must be a mapping from source name to a path, got \['a', 'b'\]$"),
    ("source number", {"sources": {"a": "x", "b": 5}}, TypeError, SOURCE + "got 5$"),
    ("source long", {"sources": {"a": "x", "b": "x" * 100_000}}, ValueError, r"a Mixture's source path must be at most 4096 bytes long"),
]


@pytest.mark.parametrize(("changes", "error", "message"), [case[1:] for case in MIXTURE_CASES], ids=[case[0] for case in MIXTURE_CASES])
def test_a_mixture_checks_its_arguments_when_it_is_made(changes: dict[str, Any], error: type, message: str) -> None:
    """Before: epoch_size=2**63 was taken (int64 positions overflow), a weight "1" became 1.0."""
    arguments: dict[str, Any] = {"sources": {"a": "x", "b": "y"}, "weights": {"a": 1, "b": 3}, "epoch_size": 10} | changes
    with pytest.raises(error, match=message) as info:
        Mixture(arguments.pop("sources"), **arguments)
    assert type(info.value) is error


def test_an_epoch_holds_at_most_2_53_positions(datasets: tuple[Path, Path]) -> None:
    mixture = Mixture({"a": datasets[0], "b": datasets[1]}, weights={"a": 1, "b": 3}, epoch_size=2**53)
    Loader(mixture, **BASE).close()
    with pytest.raises(
        ValueError,
        match=(
            r"an epoch of 9007199254740992 records times repeats=2 holds 18014398509481984 positions; repeats must be in \[1, 1\] "
            r"here \(an epoch holds at most 9007199254740992\)"
        ),
    ):
        Loader(mixture, **BASE, sampling=Sampling(repeats=2))


@pytest.fixture(scope="module")
def named_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 records of 3 classes that the manifest names."""
    path = tmp_path_factory.mktemp("door-classes") / "ds"
    with DatasetWriter(path, schema=IMAGE_CLASSIFICATION, shard_size=4_000, classes=["a", "b", "c"]) as writer:
        for i in range(24):
            writer.write({"image": simplejpeg.encode_jpeg(np.full((12, 16, 3), 7 * i, np.uint8)), "label": i % 3, "key": f"r{i}"})
    return path


@pytest.mark.parametrize(
    "steps",
    [[MixUp(num_classes=2)], [CutMix(num_classes=1)], [RandomChoice([MixUp(num_classes=3), CutMix(num_classes=2)])]],
    ids=["mixup", "cutmix", "inside a choice"],
)
def test_batch_steps_with_fewer_classes_than_the_dataset_are_refused(named_classes: Path, steps: list[Any]) -> None:
    """Before: taken, and the first batch failed with "labels must lie in [0, 2)"."""
    message = r"num_classes of a batch step must be in \[3, 1048576\] for this dataset, which has 3 classes, got [12]$"
    with pytest.raises(ValueError, match=message):
        Loader(named_classes, **BASE, batch_augment=steps)
    Loader(named_classes, **BASE, batch_augment=[MixUp(num_classes=3), CutMix(num_classes=10)]).close()


@pytest.mark.parametrize("path", [b"ds", range(3), 5])
def test_a_path_of_another_type_is_refused_by_name(path: Any) -> None:
    message = rf"path must be a str or os.PathLike, a list or tuple of them, or a Mixture, got {type(path).__name__}$"
    with pytest.raises(TypeError, match=message):
        Loader(path, **BASE)


def test_a_batch_too_large_for_dev_shm_says_the_largest_that_fits(datasets: tuple[Path, Path]) -> None:
    """Before: batch_size=10**12 gave OSError ENOMEM and a resource_tracker traceback."""
    with pytest.raises(
        ValueError, match=r"batch_size=1073741824 needs \d+ bytes for its 3 batch slots \(prefetch \+ 1\), but /dev/shm has \d+ bytes free"
    ) as info:
        Loader(datasets[0], **(BASE | {"batch_size": 2**30, "num_workers": 1}))
    largest = int(re.search(r"batch_size must be at most (\d+)", str(info.value)).group(1))  # type: ignore[union-attr]
    Loader(datasets[0], **(BASE | {"batch_size": largest, "num_workers": 1, "drop_last": False})).close()  # made, not allocated


def not_picklable(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return sample


def test_a_step_that_cannot_reach_spawned_workers_is_refused(datasets: tuple[Path, Path]) -> None:
    step = lambda sample, generator: sample  # noqa: E731
    stepped = BASE | {"num_workers": 1, "transform": ImageTransform(augment=[step])}
    with pytest.raises(TypeError, match="cannot be pickled, which the 'spawn' start method needs"):
        Loader(datasets[0], **stepped, workers=Workers(start_method="spawn"))
    Loader(datasets[0], **stepped, workers=Workers(start_method="fork")).close()  # forked: no pickling
    pickle.dumps(not_picklable)  # a module-level function is fine under spawn


def saved_after_two_batches(path: Path, **changes: Any) -> dict[str, Any]:
    with Loader(path, **(BASE | changes)) as loader:
        iterator = iter(loader)
        next(iterator)
        next(iterator)
        return loader.state_dict()


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("epoch", -1, ValueError, r"loader state field 'epoch' must be in \[0, 4294967295\], got -1"),
        ("epoch", 10**30, ValueError, r"loader state field 'epoch' must be in \[0, 4294967295\]"),
        ("epoch", "1", TypeError, r"loader state field 'epoch' must be an int"),
        ("position", 2.7, TypeError, r"loader state field 'position' must be an int"),
        ("position", -1, ValueError, r"loader state field 'position' must be in \[0, "),
        ("position", 10**9, ValueError, r"'position' \(1000000000\) and 'delivered' \(\[\]\) must lie in \[0, 6\], the batches of epoch 0"),
        ("delivered", [-1, 10**9], ValueError, r"loader state field 'delivered' must be in \[0, "),
        ("delivered", [4, 10**9], ValueError, r"must lie in \[0, 6\]"),
        ("delivered", [1], ValueError, r"'delivered' must hold distinct batch numbers after position 2"),
        ("delivered", "x", TypeError, r"'delivered' must be a list of batch numbers"),
        ("start", 25, ValueError, r"loader state field 'start' must be in \[0, 24\]"),
        ("size", [0, 8], ValueError, r"loader state field 'size' must be in \[1, 65535\], got 0"),
        ("version", 2, ValueError, r"loader state version 2 is not 1"),
        ("settings", None, TypeError, r"loader state field 'settings' must be a dict"),
    ],
)
def test_states_are_checked_before_use(datasets: tuple[Path, Path], field: str, value: Any, error: type, message: str) -> None:
    """Before: negative or huge epochs and positions, 2.7, delivered=[-1, 10**9] were taken."""
    state = saved_after_two_batches(datasets[0]) | {field: value}
    with Loader(datasets[0], **BASE) as loader:
        with pytest.raises(error, match=message):
            loader.load_state_dict(state)
        assert len(next(iter(loader))[0]) == 4  # a refused state changes nothing


def legacy(state: dict[str, Any], pipeline: str) -> dict[str, Any]:
    """`state` as shardfmt 0.1 saved it (no augment, subset or fingerprint), with `pipeline`."""
    kept = {k: v for k, v in state["settings"].items() if k not in ("augment", "subset", "dataset")}
    return state | {"settings": kept | {"pipeline": pipeline}}


def with_settings(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return state | {"settings": state["settings"] | changes}


STATE_CASES: list[tuple[str, Any, type, str]] = [
    (
        "no fingerprint",
        lambda state: state | {"settings": {k: v for k, v in state["settings"].items() if k != "dataset"}},
        ValueError,
        r"loader state field 'settings.dataset' is missing: a state of this version holds the dataset's fingerprint$",
    ),
    (
        "a legacy pipeline 100000 deep",
        lambda state: legacy(state, "[" * 100_000 + "]" * 100_000),
        ValueError,
        r"loader state field 'settings.pipeline' must be the JSON text of a pipeline: RecursionError$",
    ),
    (
        "a legacy pipeline not JSON",
        lambda state: legacy(state, "{"),
        ValueError,
        r"loader state field 'settings.pipeline' must be the JSON text of a pipeline: JSONDecodeError$",
    ),
    (
        "an array seed",
        lambda state: with_settings(state, seed=np.array([3, 3])),
        TypeError,
        r"loader state field 'settings.seed' must be None, a bool, int, float, str or list of str, got ndarray$",
    ),
    (
        "a dict seed",
        lambda state: with_settings(state, seed={"seed": 3}),
        TypeError,
        r"loader state field 'settings.seed' must be None, a bool, int, float, str or list of str, got dict$",
    ),
    (
        "a list of numbers",
        lambda state: with_settings(state, augment=[1, 2]),
        TypeError,
        r"loader state field 'settings.augment' must be None, a bool, int, float, str or list of str, got list$",
    ),
    (
        "a text of 2**20 + 1",
        lambda state: with_settings(state, pipeline="x" * (2**20 + 1)),
        ValueError,
        r"loader state field 'settings.pipeline' must be at most 1048576 characters, got 1048577$",
    ),
    (
        "the epoch after the last, mid-epoch",
        lambda state: state | {"epoch": 2**32},
        ValueError,
        r"loader state field 'epoch' must be in \[0, 4294967295\], got 4294967296$",
    ),
]


@pytest.mark.parametrize(("change", "error", "message"), [case[1:] for case in STATE_CASES], ids=[case[0] for case in STATE_CASES])
def test_settings_of_a_state_are_checked_before_use(datasets: tuple[Path, Path], change: Any, error: type, message: str) -> None:
    """Before: a state without the fingerprint skipped its check, a deep legacy pipeline gave
    RecursionError, an array seed "The truth value of an array ... is ambiguous"."""
    state = change(saved_after_two_batches(datasets[0]))
    with Loader(datasets[0], **BASE) as loader:
        with pytest.raises(error, match=message) as info:
            loader.load_state_dict(state)
        assert type(info.value) is error
        assert len(next(iter(loader))[0]) == 4  # a refused state changes nothing


def test_the_state_after_the_last_epoch_is_taken_and_says_so_at_the_next_iteration(datasets: tuple[Path, Path]) -> None:
    """Before: the loader ran epoch 2**32 and refused the state it then saved ("'epoch' must be in
    [0, 4294967295], got 4294967296")."""
    with Loader(datasets[0], **BASE) as loader:
        loader.set_epoch(2**32 - 1)
        assert len(list(loader)) == 6
        state = loader.state_dict()
        assert (state["epoch"], state["position"], state["delivered"]) == (2**32, 0, [])
        with pytest.raises(ValueError, match=r"epoch 4294967295 was the last a loader runs \(epochs are in \[0, 4294967295\]\); set_epoch"):
            iter(loader)
    with Loader(datasets[0], **BASE) as resumed:
        resumed.load_state_dict(state)
        with pytest.raises(ValueError, match=r"epoch 4294967295 was the last a loader runs"):
            iter(resumed)
        resumed.set_epoch(0)
        assert len(list(resumed)) == 6


def test_a_state_of_shardfmt_0_1_is_still_taken_without_a_fingerprint(datasets: tuple[Path, Path]) -> None:
    state = saved_after_two_batches(datasets[0])
    old = legacy(state, json.dumps(json.loads(state["settings"]["pipeline"]) | {"size": [8, 8]}, sort_keys=True))
    with Loader(datasets[0], **BASE) as loader:
        loader.load_state_dict(old)
        assert (loader.epoch, loader.cursor.position) == (0, 2)


def test_a_state_of_another_dataset_of_the_same_length_is_refused(datasets: tuple[Path, Path]) -> None:
    theirs = saved_after_two_batches(datasets[1])
    with Loader(datasets[0], **BASE) as loader:
        with pytest.raises(
            ValueError, match=r"loader state was saved with other settings \(dataset: 'xxh3_64:[0-9a-f]{16}' -> 'xxh3_64:[0-9a-f]{16}'\)"
        ):
            loader.load_state_dict(theirs)
        loader.load_state_dict(saved_after_two_batches(datasets[0]))  # its own dataset's, even moved, is taken


@pytest.mark.parametrize(("state", "error"), [(None, TypeError), ([], TypeError), ("state", TypeError), ({"version": 1}, ValueError)])
def test_what_is_not_a_state_is_refused(datasets: tuple[Path, Path], state: Any, error: type) -> None:
    """Before: a non-dict gave AttributeError."""
    with Loader(datasets[0], **BASE) as loader, pytest.raises(error, match="loader state"):
        loader.load_state_dict(state)


def test_a_state_of_other_ranks_is_checked(datasets: tuple[Path, Path]) -> None:
    state = saved_after_two_batches(datasets[0], sampling=Sampling(world_size=2, rank=1))
    with Loader(datasets[0], **BASE) as loader:
        for settings, message in (
            ({"world_size": 0}, r"'settings.world_size' must be in \[1, "),
            ({"rank": 2}, r"'settings.rank' must be in \[0, 1\]"),
        ):
            with pytest.raises(ValueError, match=message):
                loader.load_state_dict(state | {"settings": state["settings"] | settings})


@pytest.mark.parametrize(("epoch", "error"), [(-5, ValueError), (2**32, ValueError), (2.5, TypeError), ("3", TypeError), (True, TypeError)])
def test_set_epoch_takes_a_non_negative_int(datasets: tuple[Path, Path], epoch: Any, error: type) -> None:
    with Loader(datasets[0], **BASE) as loader:
        with pytest.raises(error, match=r"epoch must be (an int )?in \[0, 4294967295\]"):
            loader.set_epoch(epoch)
        loader.set_epoch(4294967295)
        assert len(next(iter(loader))[0]) == 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("epoch_size", [10**3, 10**15])
def test_an_epoch_of_10_15_records_starts_and_resumes_like_one_of_10_3(datasets: tuple[Path, Path], epoch_size: int) -> None:
    """Nothing is listed per batch before the first one (before: 10**15 hung building a list of
    every batch number, and 10**8 took 720 MB); a hang fails the timeout, not a timed assertion."""
    mixture = Mixture({"a": datasets[0], "b": datasets[1]}, weights={"a": 1, "b": 3}, epoch_size=epoch_size)
    with Loader(mixture, **BASE) as loader:
        assert len(loader) == epoch_size // 4
        iterator = iter(loader)
        next(iterator)
        next(iterator)
        state = loader.state_dict()
        expected = next(iterator)[1].tolist()
    assert (state["epoch"], state["position"]) == (0, 2)
    with Loader(mixture, **BASE) as resumed:
        resumed.load_state_dict(state)
        assert next(iter(resumed))[1].tolist() == expected


def test_an_iterator_replaced_before_its_first_next_raises(datasets: tuple[Path, Path]) -> None:
    """Before: it1 gave epoch 1's batch 0 and it2 epoch 1's batch 1; epoch 0 was never delivered
    and nothing said so. An iterator never advanced starts no epoch, so the newer one has epoch 0."""
    with Loader(datasets[0], **BASE, output=Output(return_indices=True)) as reference:
        epoch_zero = [batch[2].tolist() for batch in reference]
    with Loader(datasets[0], **BASE, output=Output(return_indices=True)) as loader:
        first = iter(loader)
        second = iter(loader)
        with pytest.raises(RuntimeError, match="replaced by a newer iter"):
            next(first)
        assert [batch[2].tolist() for batch in second] == epoch_zero  # the newer iterator has its epoch whole
        with pytest.raises(StopIteration):
            next(second)


def test_the_campaign_over_arguments_and_states_finds_nothing() -> None:
    """tools/fuzz.py's loader kind, 200 cases: each a batch, or a refusal at the door; every case
    made of valid values gives a batch."""
    result = fuzz_loader.campaign(seed=0, seconds=600, limit=200, hang_seconds=30)
    assert result.findings == [], [finding.message for finding in result.findings or []]
    assert result.cases == 200 and result.batches + result.refused == 200
    assert result.batches >= 40 and result.refused >= 100
