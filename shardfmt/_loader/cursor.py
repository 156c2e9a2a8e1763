"""Where a loader's stream stands: the epoch, the batches of it delivered, the plan of each
epoch's batches on this rank, and the state dict that saves and restores all of it (elastic
resume included). No processes and no shared memory: tested without forking.

`epoch` is the epoch in progress, or the one the next ``iter()`` starts; `started` says an
``iter()`` has begun it (so the next one moves on), `resume` that `restore` asked the next
``iter()`` to continue it. `generation` counts the events that end an iterator in progress.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._sampling.keys import check_split
from .._sampling.ranks import RankPlan, delivered_records

__all__ = ["STATE_VERSION", "Cursor", "SavedState"]

STATE_VERSION = 1


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
    def read(cls, state: dict[str, Any]) -> SavedState:
        """Read a state dict, bringing the settings of states from earlier versions up to date.

        Raises:
            ValueError: the state's version is not `STATE_VERSION`.
        """


        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        theirs = dict(state.get("settings", {}))
        theirs.setdefault("order", "sorted-key")  # states of shardfmt 0.1, which had that order only
        size = state.get("size")
        if "augment" not in theirs:  # a state from before augment, subset and set_size
            theirs |= {"augment": "", "subset": None}
            pipeline = json.loads(theirs.get("pipeline", "{}"))
            size = pipeline.pop("size", size)
            theirs["pipeline"] = json.dumps(pipeline, sort_keys=True)
        return cls(
            int(state["epoch"]),
            int(state["position"]),
            int(state.get("start", 0)),
            frozenset(int(b) for b in state.get("delivered", [])),
            None if size is None else tuple(size),
            theirs,
        )

    def check_settings(self, ours: dict[str, Any]) -> None:
        """Raises ValueError naming every setting (but rank and world size) that differs."""
        theirs = self.settings
        changed = sorted(k for k in set(ours) | set(theirs) if k not in ("rank", "world_size") and theirs.get(k) != ours.get(k))
        if changed:
            detail = ", ".join(f"{k}: {theirs.get(k)!r} -> {ours.get(k)!r}" for k in changed)
            raise ValueError(f"loader state was saved with other settings ({detail})")


class Cursor:
    """The position of one rank's stream of batches.

    Args:
        order_of: epoch -> that epoch's order of record indices (`orders.epoch_order`).
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

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position, self.start_position, self.delivered = epoch, 0, 0, set()
        self.started = self.resume = False
        self.generation += 1

    def begin(self) -> int:
        """An ``iter()``: continue a restored epoch, else start the next one; returns the new generation."""
        if self.resume:
            self.resume = False
        elif self.started:
            self.epoch, self.position, self.delivered = self.epoch + 1, 0, set()
        self.started = True
        self.generation += 1
        return self.generation

    def expected(self) -> list[int]:
        """The batches of the current epoch still to deliver, in order."""
        return [b for b in range(self.position, len(self.plan(self.epoch))) if b not in self.delivered]

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
        if (theirs.get("rank"), theirs.get("world_size")) == (self.rank, self.world_size):
            self.epoch, self.position, self.start_position, self.delivered = saved.epoch, saved.position, saved.start, set(saved.delivered)
            if self.position >= len(self.plan(self.epoch)):  # an earlier build's state at an epoch's end
                self.epoch, self.position, self.start_position, self.delivered = self.epoch + 1, 0, 0, set()
        else:
            if saved.delivered:
                raise ValueError(
                    "this state holds batches delivered out of order (ordered=False); it resumes on the ranks it was saved on only"
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
