"""Where a loader's stream stands: the epoch, the batches of it delivered, the plan of each
epoch's batches on this rank, and the state dict that saves and restores all of it (elastic
resume included). No processes and no shared memory: tested without forking.

`epoch` is the epoch in progress, or the one the next ``iter()`` starts; `started` says an
iterator has taken a batch of it (so the next one moves on), `resume` that `restore` asked the
next iterator to continue it. An ``iter()`` never advanced changes neither. `generation` counts the events that end an iterator in progress.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from .._sampling.keys import check_split
from .._sampling.ranks import RankPlan, delivered_records, split_batches

__all__ = ["MAX_EPOCH", "STATE_VERSION", "Cursor", "Remaining", "SavedState", "check_epoch"]

STATE_VERSION = 1
MAX_EPOCH = 2**32 - 1
"""The largest epoch a loader takes (`set_epoch`, a state): more than any training runs."""
MAX_COUNT = 2**62
"""A bound on positions and batch numbers that any real epoch stays far below."""


def check_epoch(epoch: Any) -> int:
    """`epoch` if it is an int in [0, MAX_EPOCH]; else TypeError or ValueError."""
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise TypeError(f"epoch must be an int in [0, {MAX_EPOCH}], got {epoch!r}")
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch must be in [0, {MAX_EPOCH}], got {epoch}")
    return epoch


def _field(name: str, value: Any, high: int, *, low: int = 0) -> int:
    """A field of a state: an int in [low, high]; else TypeError or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"loader state field {name!r} must be an int in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"loader state field {name!r} must be in [{low}, {high}], got {value}")
    return value


MAX_SETTINGS_TEXT = 1 << 20
"""The longest text a state's setting holds (a pipeline's or fields' JSON is a few hundred bytes)."""


def _plain_settings(settings: dict[Any, Any]) -> dict[str, Any]:
    """A state's settings as they are compared: str keys, each value None, a bool, an int, a
    float (numpy's scalars too), a str or a list of str (what `Loader.state_dict` writes); else
    TypeError naming it (an array's comparison has no truth value)."""
    for key, value in settings.items():
        plain = value is None or isinstance(value, (bool, int, float, str, np.bool_, np.integer, np.floating))
        if isinstance(value, list):
            plain = all(isinstance(item, str) for item in value)
        if not isinstance(key, str) or not plain:
            raise TypeError(
                f"loader state field 'settings.{key}' must be None, a bool, int, float, str or list of str, got {type(value).__name__}"
            )
        if isinstance(value, str) and len(value) > MAX_SETTINGS_TEXT:
            raise ValueError(f"loader state field 'settings.{key}' must be at most {MAX_SETTINGS_TEXT} characters, got {len(value)}")
    return dict(settings)


def _legacy_pipeline(text: Any) -> dict[str, Any]:
    """The pipeline of a shardfmt 0.1 state, parsed from its JSON text; ValueError if it is not one."""
    if not isinstance(text, str):
        return {}
    try:
        pipeline = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"loader state field 'settings.pipeline' must be the JSON text of a pipeline: {type(err).__name__}") from err
    return pipeline if isinstance(pipeline, dict) else {}


@dataclass(frozen=True)
class SavedState:
    """A `Loader.state_dict()` as read back (`SavedState.read` is the one place that checks one)."""

    epoch: int
    position: int
    start: int
    delivered: frozenset[int]
    size: tuple[int, ...] | None
    settings: dict[str, Any]

    @classmethod
    def read(cls, state: Any) -> SavedState:
        """Read a state dict, checking every field's type and range (what only the loader can
        know, such as how many batches an epoch has, `Cursor.restore` checks), and bringing the
        settings of states from earlier versions up to date.

        Raises:
            TypeError: the state is not a dict, or a field has the wrong type.
            ValueError: the state's version is not `STATE_VERSION`, or a field is out of range.
        """
        if not isinstance(state, dict):
            raise TypeError(f"a loader state is the dict Loader.state_dict() returns, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION or isinstance(state.get("version"), bool):
            raise ValueError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        settings = state.get("settings", {})
        if not isinstance(settings, dict):
            raise TypeError(f"loader state field 'settings' must be a dict, got {settings!r}")
        theirs = _plain_settings(settings)
        theirs.setdefault("order", "sorted-key")  # states of shardfmt 0.1, which had that order only
        size = state.get("size")
        if "augment" not in theirs:  # a state of shardfmt 0.1: before augment, subset, set_size and the fingerprint
            theirs |= {"augment": "", "subset": None}
            pipeline = _legacy_pipeline(theirs.get("pipeline", "{}"))
            size = pipeline.pop("size", size)
            theirs["pipeline"] = json.dumps(pipeline, sort_keys=True)
        elif "dataset" not in theirs:
            raise ValueError("loader state field 'settings.dataset' is missing: a state of this version holds the dataset's fingerprint")
        for name in ("epoch", "position"):
            if name not in state:
                raise ValueError(f"loader state has no field {name!r}")
        position = _field("position", state["position"], MAX_COUNT)
        # MAX_EPOCH + 1 is where a loader stands once its last epoch is delivered, at its start
        last = MAX_EPOCH + 1 if position == 0 and not state.get("start") and not state.get("delivered") else MAX_EPOCH
        epoch = _field("epoch", state["epoch"], last)
        start = _field("start", state.get("start", 0), MAX_COUNT)
        delivered = state.get("delivered", [])
        if not isinstance(delivered, list):
            raise TypeError(f"loader state field 'delivered' must be a list of batch numbers, got {delivered!r}")
        batches = frozenset(_field("delivered", b, MAX_COUNT) for b in delivered)
        if len(batches) != len(delivered) or any(b <= position for b in batches):
            raise ValueError(
                f"loader state field 'delivered' must hold distinct batch numbers after position {position}, got {delivered!r}"
            )
        if size is not None:
            if not isinstance(size, (list, tuple)) or len(size) != 2:
                raise TypeError(f"loader state field 'size' must be [height, width], got {size!r}")
            size = tuple(_field("size", v, 65535, low=1) for v in size)
        world_size = theirs.get("world_size", 1)
        _field("settings.world_size", world_size, 2**31 - 1, low=1)
        _field("settings.rank", theirs.get("rank", 0), world_size - 1)
        return cls(epoch, position, start, batches, size, theirs)

    def check_settings(self, ours: dict[str, Any]) -> None:
        """Raises ValueError naming every setting (but rank and world size) that differs. A state
        saved before states held the dataset's fingerprint is checked without it."""
        theirs = self.settings
        skip = {"rank", "world_size"} | ({"dataset"} if "dataset" not in theirs else set())
        changed = sorted(k for k in set(ours) | set(theirs) if k not in skip and theirs.get(k) != ours.get(k))
        if changed:
            detail = ", ".join(f"{k}: {theirs.get(k)!r} -> {ours.get(k)!r}" for k in changed)
            raise ValueError(f"loader state was saved with other settings ({detail})")


class Remaining(Sequence[int]):
    """Batches [position, total) but those in `delivered` (the few delivered out of order), in
    order: a sequence whose length and items cost O(len(delivered)), however long the epoch."""

    def __init__(self, position: int, total: int, delivered: set[int]) -> None:
        self._position = position
        self._skipped = sorted(b for b in delivered if position <= b < total)
        self._length = max(0, total - position - len(self._skipped))

    def __len__(self) -> int:
        return self._length

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(other) == self._length and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(f"batch {index} of {self._length} remaining")
        batch = self._position + index
        for skipped in self._skipped:
            if skipped > batch:
                break
            batch += 1
        return batch


class Cursor:
    """The position of one rank's stream of batches.

    Args:
        order_of: epoch -> that epoch's order of record indices (`sampling.orders.epoch_order`).
        epoch_records: records an epoch holds (a subset's, or all).
        batch_size, rank, world_size, drop_last: this rank's split of each epoch.
    """

    def __init__(
        self, order_of: Callable[[int], Any], *, epoch_records: int, batch_size: int, rank: int, world_size: int, drop_last: bool
    ) -> None:
        self._order_of = order_of
        self.epoch_records = epoch_records
        self.batch_size, self.rank, self.world_size, self.drop_last = batch_size, rank, world_size, drop_last
        self.epoch = 0
        self.position = 0
        self.start_position = 0
        self.delivered: set[int] = set()
        self.started = False
        self.resume = False
        self.generation = 0
        self._plans: dict[tuple[int, int], RankPlan] = {}

    def plan_start(self, epoch: int) -> int:
        """Where this rank's split of `epoch` starts in its order (0 but after an elastic resume)."""
        return self.start_position if epoch == self.epoch else 0

    def plan(self, epoch: int) -> RankPlan:
        start = self.plan_start(epoch)
        plan = self._plans.get((epoch, start))
        if plan is None:
            plan = RankPlan(
                self._order_of(epoch),
                batch_size=self.batch_size,
                rank=self.rank,
                world_size=self.world_size,
                drop_last=self.drop_last,
                start=start,
            )
            self._plans = {k: p for k, p in self._plans.items() if k[0] >= epoch - 1}
            self._plans[(epoch, start)] = plan
        return plan

    def set_ranks(self, rank: int, world_size: int) -> None:
        """This rank's share from now on (the plans made for other ranks are dropped)."""
        if (rank, world_size) != (self.rank, self.world_size):
            self.rank, self.world_size, self._plans = rank, world_size, {}

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` at the next iteration. For the epoch the next iteration starts anyway
        (no iterator has taken a batch of it: a fresh epoch, or one `restore` left to continue),
        nothing changes: the position stays, and an iterator not yet advanced stays valid."""
        check_epoch(epoch)
        if epoch == self.epoch and not self.started:
            return
        self.epoch, self.position, self.start_position, self.delivered = epoch, 0, 0, set()
        self.started = self.resume = False
        self.generation += 1

    def begin(self) -> int:
        """An ``iter()``: a new generation, which replaces any iterator before it. The epoch is
        decided when the iterator is first advanced (`enter`), so that one never advanced
        starts none.

        Raises:
            ValueError: the epoch it would start is past `MAX_EPOCH`, the last a loader runs.
        """
        upcoming = self.epoch + 1 if self.started and not self.resume else self.epoch
        if upcoming > MAX_EPOCH:
            raise ValueError(f"epoch {MAX_EPOCH} was the last a loader runs (epochs are in [0, {MAX_EPOCH}]); set_epoch() to go on")
        self.generation += 1
        return self.generation

    def enter(self, generation: int) -> None:
        """The iterator of `generation` takes its first batch: continue a restored or fresh
        epoch, else (an earlier iterator took batches of this one) start the next.

        Raises:
            RuntimeError: a newer ``iter()`` (or `set_epoch`, `restore`, ...) replaced it.
        """
        if generation != self.generation:
            raise RuntimeError(
                "this iterator of the Loader was replaced by a newer iter(loader) (or set_epoch, "
                "load_state_dict, set_size, close) before it was advanced: each iter() starts an epoch of its own"
            )
        if self.started and not self.resume:
            self.epoch, self.position, self.start_position, self.delivered = self.epoch + 1, 0, 0, set()
        self.started, self.resume = True, False

    def expected(self) -> Remaining:
        """The batches of the current epoch still to deliver, in order (not listed: an epoch may
        hold 10**14 batches)."""
        return Remaining(self.position, len(self.plan(self.epoch)), self.delivered)

    def deliver(self, batch: int) -> None:
        self.delivered.add(batch)
        while self.position in self.delivered:
            self.delivered.discard(self.position)
            self.position += 1

    def finish(self, epoch: int) -> None:
        """Epoch `epoch` was delivered to its end: the next one starts from scratch."""
        self.epoch, self.position, self.start_position, self.delivered, self.started = epoch + 1, 0, 0, set(), False

    def progress(self) -> tuple[int, int, int, list[int]]:
        """(epoch, position, start, delivered batches past it) as a resumed loader takes them: an
        epoch whose batches have all been handed out resumes as the next one."""
        if self.started and self.position >= len(self.plan(self.epoch)):
            return self.epoch + 1, 0, 0, []
        return self.epoch, self.position, self.start_position, sorted(b for b in self.delivered if b >= self.position)

    def state(self, *, size: tuple[int, int], settings: dict[str, Any]) -> dict[str, Any]:
        epoch, position, start, delivered = self.progress()
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "position": position,
            "start": start,
            "delivered": delivered,
            "size": list(size),
            "settings": settings,
        }

    def restore(self, saved: SavedState) -> None:
        """Continue from `saved` (its settings already checked): on the same ranks exactly where
        it stood; on others, with the records no rank had delivered (spec/sampling.md).

        Raises:
            ValueError: resumed on other ranks, the state holds batches delivered out of order,
                or the rest of its epoch cannot be split equally over the new ranks.
        """
        theirs = saved.settings
        if saved.start > self.epoch_records:
            raise ValueError(
                f"loader state field 'start' must be in [0, {self.epoch_records}] (the records of an epoch), got {saved.start}"
            )
        if (theirs.get("rank"), theirs.get("world_size")) == (self.rank, self.world_size):
            batches = split_batches(
                self.epoch_records - saved.start, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last
            )
            if saved.position > batches or any(b >= batches for b in saved.delivered):
                raise ValueError(
                    f"loader state fields 'position' ({saved.position}) and 'delivered' ({sorted(saved.delivered)}) must lie in "
                    f"[0, {batches}], the batches of epoch {saved.epoch} on this rank"
                )
            self.epoch, self.position, self.start_position, self.delivered = saved.epoch, saved.position, saved.start, set(saved.delivered)
            if self.position >= len(self.plan(self.epoch)):  # an earlier build's state at an epoch's end
                self.epoch, self.position, self.start_position, self.delivered = self.epoch + 1, 0, 0, set()
        else:
            if saved.delivered:
                raise ValueError(
                    "this state holds batches delivered out of order (ordered=False); it resumes on the ranks it was saved on only"
                )
            theirs_batches = split_batches(
                self.epoch_records - saved.start, batch_size=self.batch_size, world_size=int(theirs["world_size"]), drop_last=self.drop_last
            )
            if saved.position > theirs_batches:
                raise ValueError(
                    (
                        f"loader state field 'position' must be in [0, {theirs_batches}], the batches of epoch {saved.epoch} on a rank of "
                        f"{theirs['world_size']}, got {saved.position}"
                    )
                )
            done = saved.start + delivered_records(
                self.epoch_records - saved.start,
                batch_size=self.batch_size,
                world_size=int(theirs["world_size"]),
                drop_last=self.drop_last,
                batches=saved.position,
            )
            remaining = self.epoch_records - done
            if remaining and not (self.drop_last and remaining < self.world_size * self.batch_size):
                try:
                    check_split(remaining, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last)
                except ValueError as err:
                    raise ValueError(
                        (
                            f"the rest of epoch {saved.epoch} cannot go to {self.world_size} ranks: {err}; set_epoch({saved.epoch + 1}) "
                            "starts the next epoch"
                        )
                    ) from err
            self.epoch, self.position, self.start_position, self.delivered = saved.epoch, 0, done, set()
        self.started, self.resume = False, True
        self.generation += 1
