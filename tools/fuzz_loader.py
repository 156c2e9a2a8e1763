"""The ``loader`` kind of `tools/fuzz.py`: a campaign against the `Loader`'s door, its keyword
arguments and the states `load_state_dict` takes.

A case is either a set of `Loader` arguments, one to three of them hostile (wrong types, zero,
negative, huge, NaN, malformed sequences) over a valid base, or a valid state of a small
dataset changed in one to three places (a field set to a hostile value or removed, the state
replaced by something that is not a dict, the state of another dataset of the same length).
The rule under test: every case ends in one batch, or in a `ShardfmtError`, `ValueError` or
`TypeError` raised when the loader is made (or the state loaded), never later, within
``--hang-seconds``. A finding is anything else: another exception, an error raised only when
the batch is asked for, a hang. Some cases hold only values a loader must take (`VALID`, a
valid epoch or position in a state): refusing one is a finding too, so the campaign proves that
valid input is accepted while it shows that invalid input is refused.

Case number i is a function of the campaign's seed and i alone (`make_case`); it is printed as
Python source, so a finding is replayed by running that source again (``--replay``).
"""

from __future__ import annotations

import random
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import simplejpeg

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling, ShardfmtError, Workers
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import MixUp, TrivialAugmentWide

NUM_RECORDS = 24
BASE: dict[str, Any] = {"batch_size": 4, "num_workers": 0, "size": 8, "pipeline": "resize", "seed": 3}
"""A loader that works: a case changes some of these and adds others. A case names each option
flat, by its field name; `loader_arguments` puts it into the option object that owns it."""

PLACES: dict[str, tuple[type[Any], str]] = {
    "pipeline": (ImageTransform, "crop"),
    **{name: (ImageTransform, name) for name in ("size", "interpolation", "augment", "mean", "std", "fast_decode", "decode")},
    **{name: (Sampling, name) for name in ("order", "window", "repeats", "repeats_epoch", "subset", "rank", "world_size")},
    **{name: (Workers, name) for name in ("prefetch", "ordered", "start_method", "timeout")},
    **{name: (Output, name) for name in ("layout", "copy", "return_indices", "image_field", "label_field")},
}
"""Option name -> the class of `shardfmt` that holds it, and its field there; the others are `Loader`'s keywords."""
KEYWORDS = {ImageTransform: "transform", Sampling: "sampling", Workers: "workers", Output: "output"}

NAN, INF = float("nan"), float("inf")
HOSTILE: dict[str, list[Any]] = {
    "batch_size": [0, -1, 2.5, True, "4", None, 10**12, 2**63, NAN, [4]],
    "num_workers": [-1, 10**5, 2.5, "2", True, 10**9, NAN, 1, 2],
    "prefetch": [0, -3, 1.5, 10**9, "2", None, True],
    "timeout": [0, -1.0, NAN, INF, -INF, "5", None, True],
    "mean": [(NAN, 0.0, 0.0), (1.0, 2.0), "abc", (INF, 0.0, 0.0), (1, 2, 3, 4), ("a", "b", "c"), 5, (1e7, 0.0, 0.0)],
    "std": [(0.0, 1.0, 1.0), (NAN, 1.0, 1.0), (-1.0, 1.0, 1.0), (1.0,), (INF, 1.0, 1.0), "xyz", (1e-320, 1.0, 1.0), (1e300, 1.0, 1.0)],
    "seed": [-1, 2**64, 2.5, "s", None, NAN, 10**30],
    "size": [0, -5, (0, 4), (4,), 10**6, 2.5, (8, 8, 8), "8", None, (True, 8)],
    "rank": [-1, 5, 2.5, "0", 10**9],
    "world_size": [0, -1, 2.5, "2", 10**9, 10**30],
    "window": [0, -1, 2.5, "2", 10**9],
    "order": ["x", 5, None],
    "pipeline": ["nope", 5, None],
    "layout": ["XYZ", 3, None],
    "verify": ["sometimes", 2, None],
    "start_method": ["nope", 5],
    "subset": [[-1], [10**9], [1, 1], [0.5], [True], [], "0", np.array([[0, 1]]), np.zeros(3, bool), 5, range(10**12), {1, 2}],
    "remote": [5, "s3", {"mode": "cache"}],
    "batch_augment": [MixUp(num_classes=3), "mixup", [5], [TrivialAugmentWide()]],
    "repeats": [0, 10**9, 2.5, "2", True],
    "augment": [[5], "flip", [None], 7],
    "drop_last": ["yes", 2],
    "fields": [{"nope": None}, ["image", "image"], 5, [], ["key"]],
    "label_field": ["nope", 5],
    "image_field": ["nope", "label", 5],
    "device": ["nope", 5],
    "ordered": ["no", 2],
    "shuffle": ["no", 2],
    "return_indices": ["yes", 2],
}
"""Values no loader should take (or, a few of them, edge values it should take)."""

VALID: dict[str, list[Any]] = {
    "batch_size": [1, 3, 4],
    "num_workers": [0, 1, 2],
    "prefetch": [1, 3],
    "timeout": [5.0, 60],
    "seed": [0, 2**64 - 1],
    "size": [8, (8, 12)],
    "pipeline": ["train", "eval", "resize"],
    "drop_last": [False, True],
    "shuffle": [False, True],
    "order": ["auto", "feistel", "sorted-key"],
    "window": [None, 2],
    "subset": [None, list(range(0, 24, 2))],
    "return_indices": [False, True],
    "layout": ["NCHW", "NHWC"],
    "mean": [None, (120.0, 110.0, 100.0)],
}
"""Values every loader must take, in any combination (with `std` given along with `mean`)."""

STATE_FIELDS: dict[str, list[Any]] = {
    "version": [2, 0, "1", None, 1.5],
    "epoch": [-1, 10**30, 2.7, "1", None, NAN, 2**63, True],
    "position": [-1, 10**9, 2.7, "1", None, 6, 7, True],
    "start": [-1, 10**9, 2.7, NUM_RECORDS + 1, "0", None],
    "delivered": [[-1, 10**9], "x", [2.5], [1, 1], None, [0], [5], list(range(100)), 7],
    "size": [[0, 0], "x", [8], None, [-8, 8], [10**9, 8], [8.5, 8]],
    "settings": [None, "x", [], {}],
}
"""Hostile values of each field of a state."""


@dataclass(frozen=True)
class Case:
    """One case: `kwargs` for the loader, and what is done to a valid state (None: no state)."""

    index: int
    kwargs: dict[str, Any]
    state_changes: tuple[tuple[str, Any], ...] | None = None
    valid: bool = False
    """Every value is one a loader must take: the case must end in a batch."""

    def source(self) -> str:
        """The case as Python that reproduces it."""
        lines = [f"kwargs = {self.kwargs!r}  # valid: {self.valid}"]
        if self.state_changes is not None:
            lines.append(f"state_changes = {list(self.state_changes)!r}")
        return "\n".join(lines)


def make_case(seed: int, index: int) -> Case:
    """Case number `index` of the campaign of `seed`."""
    rng = random.Random(f"loader-{seed}-{index}")
    kwargs = dict(BASE)
    kind = rng.random()
    if kind < 0.2:
        for name in rng.sample(sorted(VALID), rng.randint(1, 5)):
            kwargs[name] = rng.choice(VALID[name])
        if kwargs.get("mean") is not None:
            kwargs["std"] = (60.0, 58.0, 57.0)
        if rng.random() < 0.3:
            kwargs.update(rank=rng.randint(0, 1), world_size=2)
        return Case(index, kwargs, valid=True)
    if kind < 0.3:
        changes = [("epoch", rng.randint(0, 10**6)), ("position", rng.randint(0, 6)), ("delivered", [])]
        return Case(index, kwargs, tuple(rng.sample(changes, rng.randint(1, 3))), valid=True)
    if kind < 0.7:
        for name in rng.sample(sorted(HOSTILE), rng.randint(1, 3)):
            kwargs[name] = rng.choice(HOSTILE[name])
        return Case(index, kwargs)
    changes = [_state_change(rng) for _ in range(rng.randint(1, 3))]
    return Case(index, kwargs, tuple(changes))


def _state_change(rng: random.Random) -> tuple[str, Any]:
    """One change to a saved state: replace it, swap its dataset, delete, set a setting or a field."""
    what = rng.random()
    if what < 0.1:
        return "<replace>", rng.choice([None, [], "state", 5, {"version": 1}])
    if what < 0.2:
        return "<other dataset>", None
    if what < 0.3:
        return "<delete>", rng.choice(sorted(STATE_FIELDS))
    if what < 0.4:
        setting = rng.choice(["seed", "num_records", "batch_size", "world_size", "rank", "shuffle", "dataset"])
        return f"settings.{setting}", rng.choice([None, -1, 10**9, "x", 2.5, np.array([3, 3]), {"x": 1}])
    name = rng.choice(sorted(STATE_FIELDS))
    return name, rng.choice(STATE_FIELDS[name])


def make_datasets(folder: Path) -> tuple[Path, Path]:
    """Two small datasets with the same number of records and different images."""
    paths = []
    for name, shift in (("ds", 0), ("other", 100)):
        path = folder / name
        with DatasetWriter(path, schema=IMAGE_CLASSIFICATION, shard_size=4_000) as writer:
            for i in range(NUM_RECORDS):
                pixels = np.full((12, 16, 3), (7 * i + shift) % 256, np.uint8)
                writer.write({"image": simplejpeg.encode_jpeg(pixels, quality=90), "label": i % 3, "key": f"r{i}"})
        paths.append(path)
    return paths[0], paths[1]


class Refused(Exception):
    """The door refused a case, as it should have: the case is no finding."""


class LateError(Exception):
    """An error raised only once the batch was asked for: the door let the case in."""


def _changed_state(case: Case, dataset: Path, other: Path) -> Any:
    """A valid state of `dataset` after two batches, then `case`'s changes."""
    with Loader(dataset, **loader_arguments(BASE)) as loader:
        iterator = iter(loader)
        next(iterator)
        next(iterator)
        state: Any = loader.state_dict()
    for key, value in case.state_changes or ():
        if key == "<replace>":
            state = value
        elif key == "<other dataset>":
            with Loader(other, **loader_arguments(BASE)) as loader:
                iterator = iter(loader)
                next(iterator)
                next(iterator)
                state = loader.state_dict()
        elif not isinstance(state, dict):
            continue
        elif key == "<delete>":
            state.pop(value, None)
        elif key.startswith("settings."):
            if isinstance(state.get("settings"), dict):
                state["settings"][key.split(".", 1)[1]] = value
        else:
            state[key] = value
    return state


def loader_arguments(flat: dict[str, Any]) -> dict[str, Any]:
    """`Loader`'s keywords for a case's flat options: each option object made from its fields.

    Raises:
        TypeError, ValueError: an option object refuses its fields (as the loader would).
    """
    arguments = {name: value for name, value in flat.items() if name not in PLACES}
    grouped: dict[type[Any], dict[str, Any]] = {}
    for name, value in flat.items():
        if name in PLACES:
            kind, field = PLACES[name]
            grouped.setdefault(kind, {})[field] = value
    return arguments | {KEYWORDS[kind]: kind(**fields) for kind, fields in grouped.items()}


def run_case(case: Case, dataset: Path, other: Path) -> str:
    """Run one case: "batch" if a batch came, else raise `Refused` (an allowed refusal) or the
    error of a finding."""
    state = _changed_state(case, dataset, other) if case.state_changes is not None else None
    try:
        loader = Loader(dataset, **loader_arguments(case.kwargs))
    except (ShardfmtError, ValueError, TypeError) as err:
        raise Refused(f"constructor: {type(err).__name__}") from err
    try:
        if state is not None:
            try:
                loader.load_state_dict(state)
            except (ShardfmtError, ValueError, TypeError) as err:
                raise Refused(f"load_state_dict: {type(err).__name__}") from err
        try:
            next(iter(loader))
        except StopIteration:  # a state at the very end of the last epoch is no such state: the next one starts
            raise LateError("the loader delivered no batch") from None
        except Exception as err:
            raise LateError(f"{type(err).__name__} when the first batch was asked for: {err}"[:500]) from err
    finally:
        loader.close()
    return "batch"


@dataclass
class Finding:
    index: int
    signature: str
    message: str
    trace: str
    source: str


class Hang(BaseException):
    """No outcome within the time allowed."""


def signature(error: BaseException) -> str:
    cause = error.__cause__ if isinstance(error, LateError) and error.__cause__ is not None else error
    frames = traceback.extract_tb(cause.__traceback__)
    inside = [f for f in frames if "/shardfmt/" in f.filename] or frames
    where = f"{Path(inside[-1].filename).name}:{inside[-1].lineno} ({inside[-1].name})" if inside else "?"
    return f"{type(error).__name__}: {type(cause).__name__} at {where}"


def check(case: Case, dataset: Path, other: Path, *, hang_seconds: float) -> tuple[str, Finding | None]:
    """Run `case` under the hang limit; return its outcome ("batch", "refused" or "finding")
    and the finding, if any."""
    alarm = hang_seconds > 0 and threading.current_thread() is threading.main_thread()

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"no outcome within {hang_seconds} s")

    previous: Callable[..., Any] | int | None = None
    if alarm:
        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, hang_seconds)
    try:
        outcome = run_case(case, dataset, other)
        return outcome, None
    except Refused as refusal:
        if not case.valid:
            return "refused", None
        err: BaseException = refusal
        return "finding", Finding(
            case.index,
            f"valid case refused: {signature(refusal.__cause__ or refusal)}",
            str(refusal.__cause__),
            "".join(traceback.format_exception(err)),
            case.source(),
        )
    except (Exception, Hang) as err:
        return "finding", Finding(
            case.index, signature(err), f"{type(err).__name__}: {err}"[:2000], "".join(traceback.format_exception(err)), case.source()
        )
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


@dataclass
class LoaderCampaign:
    """What a loader campaign did."""

    cases: int = 0
    batches: int = 0
    refused: int = 0
    seconds: float = 0.0
    findings: list[Finding] | None = None


def campaign(*, seed: int, seconds: float, limit: int | None, hang_seconds: float, work_dir: Path | None = None) -> LoaderCampaign:
    """Run cases 0, 1, 2, ... until `seconds` or `limit` runs out."""
    result = LoaderCampaign(findings=[])
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shardfmt-fuzz-loader-", dir=work_dir) as temp:
        dataset, other = make_datasets(Path(temp))
        outcome, finding = check(Case(-1, dict(BASE)), dataset, other, hang_seconds=hang_seconds)
        if outcome != "batch":  # valid input must be accepted before invalid input says anything
            raise RuntimeError(f"the base case gives no batch: {finding}")
        index = 0
        while (limit is None or index < limit) and time.monotonic() - started < seconds:
            outcome, finding = check(make_case(seed, index), dataset, other, hang_seconds=hang_seconds)
            result.cases += 1
            result.batches += outcome == "batch"
            result.refused += outcome == "refused"
            if finding is not None:
                result.findings.append(finding)  # type: ignore[union-attr]
            index += 1
    result.seconds = time.monotonic() - started
    return result


def replay(document: dict[str, Any]) -> int:
    """Run the case of a saved finding again; 1 if it is still a finding."""
    with tempfile.TemporaryDirectory(prefix="shardfmt-fuzz-loader-") as temp:
        dataset, other = make_datasets(Path(temp))
        case = make_case(int(document["campaign_seed"]), int(document["index"]))
        outcome, finding = check(case, dataset, other, hang_seconds=float(document.get("hang_seconds", 20.0)))
    print(case.source())
    if finding is None:
        print(f"no finding: {outcome}")
        return 0
    print(finding.trace)
    return 1
