"""Slot lending: which slots of the ring the caller holds, and when each comes back.

Every time a slot is filled, the caller gets fresh tensors over its memory, and the lender keeps
only a weak reference to their storage (`StorageWeakRef`). A slot is taken back only once
nothing the caller holds still views it: the batch handed out last is looked at when the one
after it is asked for (a ``for`` loop still holds it then) and again on the request after; a
slot still referenced then is set aside, left to the caller (`shm.SlotRing.replace` unlinks its
shared-memory name at once and puts a fresh slot in its place; its memory is released with its
last reference). More than `KEPT_WARNING` slots set aside and still held give one
`ResourceWarning` naming the memory.

A slot copied to a device is lent with the event that ends its copy instead: it comes back once
that copy is over, whatever the caller holds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from torch.multiprocessing.reductions import StorageWeakRef

from .shm import SlotRing

__all__ = ["KEPT_WARNING", "SlotLender"]

KEPT_WARNING = 16
"""Slots set aside for the caller and still held, beyond which the loader warns (once)."""


@dataclass
class _Loan:
    """A slot handed out: weak references to the caller's tensors over it, the end of its copy
    to the device, and whether it was handed out last."""

    refs: list[StorageWeakRef]
    done: Any = None
    last: bool = True

    def held(self) -> bool:
        return any(not ref.expired() for ref in self.refs)


class SlotLender:
    """The slots lent to the caller, and those set aside because the caller kept them."""

    def __init__(self) -> None:
        self.loans: dict[int, _Loan] = {}
        self.kept: list[tuple[list[StorageWeakRef], int]] = []
        """The weak references and bytes of each slot set aside (pruned as they expire)."""
        self.warned = False

    def lend(self, slot: int, refs: list[StorageWeakRef], *, done: Any = None) -> None:
        """Record that slot `slot` is handed out, viewed by the storages `refs`; or, with `done`
        (an event with ``synchronize()``), copied out of by a copy that ends with it."""
        self.loans[slot] = _Loan(refs, done)

    def lent(self, slot: int) -> bool:
        return slot in self.loans

    def take_back(self, ring: SlotRing | None, *, everything: bool = False) -> list[int]:
        """Take back the slots handed out and return them, free to refill: those nothing
        references any more, and those still held but the one handed out last (looked at again
        next time; all of them with `everything`), each set aside first (`set_aside`).

        Raises:
            RuntimeError: a slot must be set aside, but there is no `ring` (the loader is closed).
        """
        freed = []
        for slot, loan in list(self.loans.items()):
            if loan.done is not None:
                loan.done.synchronize()  # the copy out of the slot is over before it is refilled
            elif loan.held():
                if loan.last and not everything:
                    loan.last = False
                    continue
                self.set_aside(ring, slot, loan.refs)
            del self.loans[slot]
            freed.append(slot)
        return freed

    def set_aside(self, ring: SlotRing | None, slot: int, refs: list[StorageWeakRef]) -> None:
        """Leave slot `slot` of `ring` to the caller, who holds `refs`, and put a fresh one in its
        place; warn once past `KEPT_WARNING` slots set aside and still held."""
        if ring is None:
            raise RuntimeError("the loader's slots are not made: it is closed, or was never iterated")
        ring.replace(slot)
        self.kept = [(kept, size) for kept, size in self.kept if any(not ref.expired() for ref in kept)]
        self.kept.append((refs, ring.layout.slot_bytes))
        if len(self.kept) > KEPT_WARNING and not self.warned:
            self.warned = True
            held = sum(size for _, size in self.kept) / 2**20
            warnings.warn(
                f"the caller holds {len(self.kept)} batches of this Loader ({held:.0f} MiB of shared memory): each batch kept "
                "past the next one is set aside, not overwritten, and its memory stays until its last reference goes; "
                "keep copies (or pass output=Output(copy=True)) to hold many",
                ResourceWarning,
                stacklevel=5,  # set_aside, take_back, Scheduler.release, stream_batches, then the caller's next()
            )

    def forget(self) -> None:
        """Drop every loan (the loader is closing: the ring keeps the memory the caller views)."""
        self.loans = {}
