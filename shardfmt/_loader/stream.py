"""An iteration of a `Loader`: the loop that has the scheduler fill slots with the cursor's
batches and hands them out in turn (`stream_batches`), and each batch in the form the caller
receives it (`package_batch`, then the value fields and the batch steps).

An iterator is tied to the cursor's `generation` when it is made: once a newer ``iter()`` (or
`set_epoch`, `load_state_dict`, `set_size`, `close`) moves the generation on, advancing it
raises RuntimeError. Any other failure closes the loader before it propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._dataset.concat import RecordSource
from ..ops._batch import BatchStep, apply_batch_steps
from .cursor import Cursor
from .scheduler import Item, Scheduler
from .values import read_values

__all__ = ["BatchForm", "package_batch", "stream_batches"]


@dataclass(frozen=True)
class BatchForm:
    """How the stream hands a batch out: the image layout, the dict of `fields` or the (images,
    labels) form, and the batch steps (drawn from `seed`, the epoch and the batch)."""

    layout: str
    fields: bool
    batch_augment: tuple[BatchStep, ...]
    seed: int


def stream_batches(
    cursor: Cursor,
    scheduler: Scheduler,
    generation: int,
    *,
    dataset: RecordSource,
    values: Sequence[str],
    form: BatchForm,
    close: Callable[[], None],
) -> Iterator[Any]:
    """Yield the batches of `cursor`'s epoch, from where it stands, for the iterator made at
    `generation`. `values` name the fields read from `dataset` for each batch
    (`values.read_values`); `form` says how a batch is handed out; `close` closes the loader
    when a failure ends the iteration.

    Raises:
        RuntimeError: the iterator was replaced, before its first batch or after one.
    """
    cursor.enter(generation)  # the epoch is decided at the first next(), not at iter()
    epoch = cursor.epoch
    expected = cursor.expected()
    replaced = False
    try:
        scheduler.release()
        position = scheduler.reconcile(epoch, cursor.plan_start(epoch), expected)
        remaining = len(expected)
        while remaining:
            position = scheduler.schedule(cursor, position, expected)
            pool = scheduler.running_pool
            pool.feed(scheduler.pending)
            item = scheduler.take_ready(epoch)
            if item is None:
                pool.wait()
                continue
            remaining -= 1
            cursor.deliver(item.batch)
            # yielded without a name: the suspended frame holds no reference to the batch, so
            # only the caller's may keep its slot (mapped after close, not refilled)
            yield _deliver(item, epoch, cursor, scheduler, dataset=dataset, values=values, form=form)
            if generation != cursor.generation:
                replaced = True
                break
            if remaining:  # the next batch is asked for (at the end, the next iter() asks)
                scheduler.release()
        if not replaced:
            cursor.finish(epoch)
    except GeneratorExit:
        raise
    except BaseException:
        close()
        raise
    if replaced:
        raise RuntimeError(
            "this iterator of the Loader was replaced by a newer iter(loader) (or set_epoch, "
            "load_state_dict, set_size): each iter() starts an epoch of its own"
        )


def _deliver(
    item: Item, epoch: int, cursor: Cursor, scheduler: Scheduler, *, dataset: RecordSource, values: Sequence[str], form: BatchForm
) -> Any:
    """`item`'s batch as the caller gets it: packaged, with its value fields, through the batch steps."""
    batch = package_batch(scheduler.hand_out(item), scheduler, layout=form.layout, fields=form.fields)
    if values:
        batch.update(read_values(dataset, values, cursor.plan(item.epoch).batch(item.batch)))
    if form.batch_augment:
        mixed = apply_batch_steps(form.batch_augment, batch[0], batch[1], seed=form.seed, epoch=epoch, batch=item.batch, layout=form.layout)
        batch = (*mixed, *batch[2:])
    return batch


def package_batch(tensors: dict[str, torch.Tensor], scheduler: Scheduler, *, layout: str, fields: bool) -> Any:
    """The batch as handed out: images NCHW (a channels_last view) if `layout` asks and they are
    not already on the device, then with `fields` the dict of every field, else (images,
    labels[, indices])."""
    outputs = scheduler.outputs
    if layout == "NCHW" and scheduler.stage is None:
        tensors = {spec.name: tensors[spec.name].permute(0, 3, 1, 2) if spec.is_image else tensors[spec.name] for spec in outputs}
    if fields:
        return tensors
    if len(outputs) == 1:  # a dataset without labels: the images alone
        return tensors[outputs[0].name]
    return tuple(tensors[spec.name] for spec in outputs)
