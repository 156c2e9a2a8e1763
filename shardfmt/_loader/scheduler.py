"""The loader's machinery: the ring of slots, the worker pool that fills them, the queue of
batches scheduled into them, and the device stage.

Every time a slot is filled, the caller gets fresh tensors over its memory. Labels, indices and
every other field of one number a sample are copied out of the slot (a few KB a batch), so no
later batch touches them; when a slot comes back to be refilled, and what a batch the caller
keeps costs, is the `lending.SlotLender`'s concern.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .._dataset.concat import RecordSource
from .chunk import WorkerConfig, encode_copies
from .form import BatchForm
from .gpudecode import GpuDecodeStage
from .lending import KEPT_WARNING, SlotLender
from .options import Workers
from .outputs import OutputSpec
from .pool import Chunk, InlinePool, WorkerPool
from .prefetch import ShardPrefetcher
from .shm import SlotLayout, SlotRing

__all__ = ["KEPT_WARNING", "Item", "Scheduler"]

@dataclass
class Item:
    """A batch scheduled into a slot: it is ready once none of its chunks is pending or in flight."""

    epoch: int
    batch: int
    slot: int
    count: int
    start: int = 0
    """The position of the epoch's order the batch's split starts at (not 0 after an elastic resume)."""


@dataclass
class _Resources:
    """What must be released even if the loader is never closed: a weakref finaliser calls
    `release` at close, garbage collection or interpreter exit. The ring is unmapped then, but
    for the slots a batch of the caller still views (`shm.SlotRing.close`)."""

    pool: Any = None
    ring: SlotRing | None = None
    extra: list[Any] = field(default_factory=list)

    def release(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        for item in self.extra:
            item.close()
        self.extra = []


class Scheduler:
    """Slots, workers, queue and device stage of one loader.

    Args:
        dataset: the loader's records (for the workers' error messages and the prefetcher).
        prefetcher: downloads the shards of coming batches, or None.
        stage: the `cuda.DeviceStage`, or None.
        gpu: the `gpudecode.GpuDecodeStage` of ``decode="gpu"``/``"hybrid"``, or None.
        workers: how many processes, started how, with which stall timeout and delivery order.
        batch_size: rows of a slot.
        copy: hand out copies rather than views of the slots (`options.Output`).
        repeats: copies of each record an epoch (`shardfmt._sampling.policy.Sampling`).
    """

    def __init__(
        self,
        dataset: RecordSource,
        *,
        prefetcher: ShardPrefetcher | None,
        stage: Any,
        gpu: GpuDecodeStage | None = None,
        workers: Workers,
        batch_size: int,
        copy: bool = False,
        repeats: int = 1,
    ) -> None:
        self.dataset = dataset
        self.num_workers = workers.count
        self.workers = workers
        self.copy = copy
        self.repeats = repeats
        self.prefetcher = prefetcher
        self.stage = stage
        self.gpu = gpu
        self.chunk = max(1, min(64, -(-batch_size // (2 * max(1, self.num_workers)))))
        self.resources = _Resources()
        if prefetcher is not None:
            self.resources.extra.append(prefetcher)
        self.pool: WorkerPool | InlinePool | None = None
        self.ring: SlotRing | None = None
        self.checked: Any = None
        self.free: list[int] = []
        self.lender = SlotLender()
        self.queue: deque[Item] = deque()
        self.pending: deque[Chunk] = deque()
        self.config: WorkerConfig | None = None
        self.outputs: tuple[OutputSpec, ...] = ()
        self.form = BatchForm(False)

    def finalizer(self, owner: object) -> Any:
        return weakref.finalize(owner, self.resources.release)

    def configure(self, config: WorkerConfig, form: BatchForm) -> None:
        """Take the workers' config (and the outputs in it) and the form batches are handed out in."""
        self.config, self.outputs, self.form = config, config.outputs, form

    @property
    def layout(self) -> SlotLayout:
        if self.config is None:
            raise RuntimeError("the loader's workers are not configured")
        return self.config.layout

    @property
    def running_pool(self) -> WorkerPool | InlinePool:
        """The pool `start` made, which an iteration feeds and waits on."""
        if self.pool is None:
            raise RuntimeError("the loader's workers are not running: it is closed, or was never iterated")
        return self.pool

    def start(self) -> None:
        """Start the workers (and make or reuse the ring) unless they run."""
        if self.pool is not None:
            return
        if self.config is None:
            raise RuntimeError("the loader's workers are not configured")
        layout = self.layout
        shared = bool(self.num_workers)
        if self.ring is not None and self.ring.shared == shared and self.ring.fits(layout):
            self.ring = self.ring.with_layout(layout)
        else:
            if self.ring is not None:
                self.ring.close()
            self.ring = SlotRing.create(layout) if shared else SlotRing.in_process(layout)
        self.resources.ring = self.ring
        if not shared:
            self.pool = InlinePool(config=self.config, ring=self.ring, timeout=self.workers.timeout, checked=self.checked)
            self.checked = self.pool.processor.checked
        else:
            self.pool = WorkerPool(
                config=self.config,
                ring=self.ring,
                num_workers=self.num_workers,
                start_method=self.workers.start_method,
                timeout=self.workers.timeout,
                dataset=self.dataset,
                checked=self.checked,
            )
            self.checked = self.pool.checked
        self.resources.pool = self.pool
        self.free = list(range(layout.num_slots))
        if self.stage is not None:
            self.stage.pin(self.ring)

    def stop(self) -> None:
        """Stop the workers and forget what was scheduled; the ring (every slot the caller still
        holds set aside first) and the checked records stay."""
        self.release(everything=True)
        if self.pool is not None:
            self.pool.shutdown()
        self.pool = self.resources.pool = None
        self.queue.clear()
        self.pending.clear()
        self.free = []
        if self.stage is not None:
            self.stage.unpin()

    def close(self, finalizer: Any) -> None:
        self.pool = None
        self.lender.forget()
        if self.stage is not None:
            self.stage.unpin()  # before the slots' memory can go
        finalizer()
        self.ring = None

    @property
    def shared_memory_bytes(self) -> int:
        capacity = self.ring.capacity if self.ring is not None and self.num_workers else 0
        return max(self.layout.total_bytes, capacity)

    # -- the slots' lifetime ------------------------------------------------------------------

    @property
    def kept(self) -> list[tuple[list[StorageWeakRef], int]]:
        """The slots set aside for the caller and still held (`SlotLender.kept`)."""
        return self.lender.kept

    def release(self, *, everything: bool = False) -> None:
        """Take back the slots handed out that may be refilled (`SlotLender.take_back`)."""
        self.free.extend(self.lender.take_back(self.ring, everything=everything))

    def hand_out(self, item: Item) -> dict[str, torch.Tensor]:
        """The batch in `item`'s slot, in the loader's one form (`form.BatchForm`): a dict of
        fresh tensors over the slot for images and arrays, copies for fields of one number a
        sample (labels, indices, ...); on the device with a device stage."""
        if self.ring is None:
            raise RuntimeError("the loader's slots are not made: it is closed, or was never iterated")
        arrays = self.ring.arrays[item.slot]
        tensors, refs = {}, []
        for spec in self.outputs:
            array = arrays[spec.name]
            if not spec.shape:
                tensors[spec.name] = torch.from_numpy(array[: item.count].copy())
                continue
            tensor = torch.from_numpy(array)
            refs.append(StorageWeakRef(tensor.untyped_storage()))
            tensors[spec.name] = tensor[: item.count]
        slot_done: Any = None
        if self.gpu is not None:  # the image decoded on the device: the caller gets no view of the slot's
            tensors, slot_done = self.gpu.decode(tensors, arrays, stream=self.stage.stream if self.stage is not None else None)
        if self.stage is not None:
            images = {spec.name for spec in self.outputs if spec.is_image}
            tensors, done = self.stage.transfer(tensors, images, normalised=self.form.normalised)
            # after a GPU decode the slot is free once its CPU rows are copied (the labels are
            # copies), not only after the resize: the next batch's decode need not wait for it
            self.lender.lend(item.slot, [], done=done if self.gpu is None else slot_done)
        elif self.copy:
            tensors = {name: tensor.clone() for name, tensor in tensors.items()}
            self.free.append(item.slot)
        else:
            self.lender.lend(item.slot, refs)
        return tensors

    # -- scheduling ---------------------------------------------------------------------------

    def reconcile(self, epoch: int, start: int, expected: Sequence[int]) -> tuple[int, int]:
        """Keep batches already scheduled if they are exactly what comes next (the start of this
        epoch's remaining batches, then the start of the next epoch); else discard them.
        Returns the scheduling cursor (epoch, index into that epoch's list)."""
        ours = [item.batch for item in self.queue if item.epoch == epoch and item.start == start]
        ahead = [item.batch for item in self.queue if item.epoch == epoch + 1 and item.start == 0]
        keep = (
            len(ours) + len(ahead) == len(self.queue)
            and ours == expected[: len(ours)]
            and ahead == list(range(len(ahead)))
            and (not ahead or len(ours) == len(expected))
        )
        if not keep:
            self.pending.clear()
            self.running_pool.drain()
            self.queue.clear()
            self.free = [slot for slot in range(self.layout.num_slots) if not self.lender.lent(slot)]
            return epoch, 0
        return (epoch + 1, len(ahead)) if ahead else (epoch, len(ours))

    def schedule(self, cursor: Any, position: tuple[int, int], expected: Sequence[int]) -> tuple[int, int]:
        """Fill free slots with the next batches of `cursor`'s plans, running on into the next epoch."""
        epoch, index = position
        if self.ring is None:
            raise RuntimeError("the loader's slots are not made: it is closed, or was never iterated")
        while self.free:
            if epoch == cursor.epoch:
                if index >= len(expected):
                    epoch, index = epoch + 1, 0
                    continue
                batch = expected[index]
            else:
                if index >= len(cursor.plan(epoch)) or epoch > cursor.epoch + 1:
                    break
                batch = index
            plan = cursor.plan(epoch)
            indices = plan.batch(batch)
            if self.repeats > 1:  # the copy numbers travel inside the indices (chunk.encode_copies)
                indices = encode_copies(indices, plan.order.copies(plan.positions(batch)), len(self.dataset))
            if self.prefetcher is not None:
                self.prefetcher.schedule(epoch, plan, batch)
            slot = self.free.pop()
            serial = self.ring.serials[slot]
            if self.gpu is not None:
                self.gpu.assign(self.ring.arrays[slot], len(indices))
            self.queue.append(Item(epoch, batch, slot, len(indices), cursor.plan_start(epoch)))
            for row in range(0, len(indices), self.chunk):
                self.pending.append((slot, serial, row, epoch, np.ascontiguousarray(indices[row : row + self.chunk])))
            index += 1
        return epoch, index

    def take_ready(self, epoch: int) -> Item | None:
        busy = self.running_pool.busy_slots | {chunk[0] for chunk in self.pending}
        for position, item in enumerate(self.queue):
            if item.epoch != epoch:
                return None
            if item.slot not in busy:
                del self.queue[position]
                return item
            if self.workers.ordered:
                return None
        return None
