"""An iteration of a `Loader`: the loop that has the scheduler fill slots with the cursor's
batches and hands them out in turn (`stream_batches`), and each batch, a dict of fields until the
end (`form.BatchForm`), laid out, with its value fields, through the batch steps, rendered.

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

__all__ = ["Delivery", "lay_out", "stream_batches"]


@dataclass(frozen=True)
class Delivery:
    """What the stream applies to each batch on its way out: the image layout, and the batch
    steps (drawn from `seed`, the epoch and the batch). The form the batch is rendered in is the
    scheduler's (`form.BatchForm`, made with the outputs at each size)."""

    layout: str
    batch_augment: tuple[BatchStep, ...]
    seed: int


def stream_batches(
    cursor: Cursor,
    scheduler: Scheduler,
    generation: int,
    *,
    dataset: RecordSource,
    values: Sequence[str],
    delivery: Delivery,
    close: Callable[[], None],
) -> Iterator[Any]:
    """Yield the batches of `cursor`'s epoch, from where it stands, for the iterator made at
    `generation`. `values` name the fields read from `dataset` for each batch
    (`values.read_values`); `delivery` says what is applied to a batch on its way out; `close`
    closes the loader when a failure ends the iteration.

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
            yield _deliver(item, epoch, cursor, scheduler, dataset=dataset, values=values, delivery=delivery)
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
    item: Item, epoch: int, cursor: Cursor, scheduler: Scheduler, *, dataset: RecordSource, values: Sequence[str], delivery: Delivery
) -> Any:
    """`item`'s batch as the caller gets it: the dict of its fields (`Scheduler.hand_out`, laid
    out by `lay_out`, with its value fields), through the batch steps, rendered in the form
    asked for (`form.BatchForm.render`)."""
    form = scheduler.form
    batch: dict[str, Any] = lay_out(scheduler.hand_out(item), scheduler, layout=delivery.layout)
    if values:
        batch.update(read_values(dataset, values, cursor.plan(item.epoch).batch(item.batch)))
    if delivery.batch_augment and form.image is not None and form.label is not None:  # refused otherwise (`form`, `stages`)
        image, label = form.image, form.label
        batch[image], batch[label] = apply_batch_steps(
            delivery.batch_augment, batch[image], batch[label], seed=delivery.seed, epoch=epoch, batch=item.batch, layout=delivery.layout
        )
    return form.render(batch)


def lay_out(tensors: dict[str, torch.Tensor], scheduler: Scheduler, *, layout: str) -> dict[str, torch.Tensor]:
    """The images NCHW (a channels_last view of the slot) if `layout` asks for it and they are not
    already laid out on the device; the other fields as they are."""
    if layout != "NCHW" or scheduler.stage is not None:
        return tensors
    return {spec.name: tensors[spec.name].permute(0, 3, 1, 2) if spec.is_image else tensors[spec.name] for spec in scheduler.outputs}
