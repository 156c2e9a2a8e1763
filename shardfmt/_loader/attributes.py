"""The options a `core.Loader` was made with, read back as DataLoader's attributes of the same
names (`batch_size`, `num_workers`, `drop_last`, ...): frameworks read these off a data loader."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cursor import Cursor
    from .options import LoaderOptions

__all__ = ["LoaderAttributes"]


class LoaderAttributes:
    """Read-only views of a loader's parsed options (``self.options``, a `options.LoaderOptions`)
    and its epoch (``self.cursor``)."""

    options: LoaderOptions
    cursor: Cursor

    batch_size = property(lambda self: self.options.batch_size)
    shuffle = property(lambda self: self.options.shuffle)
    seed = property(lambda self: self.options.seed)
    num_workers = property(lambda self: self.options.num_workers)
    drop_last = property(lambda self: self.options.drop_last)
    layout = property(lambda self: self.options.layout)
    ordered = property(lambda self: self.options.ordered)
    prefetch = property(lambda self: self.options.prefetch)
    copy = property(lambda self: self.options.copy)
    timeout = property(lambda self: self.options.timeout)
    return_indices = property(lambda self: self.options.return_indices)
    window = property(lambda self: self.options.window)
    augment = property(lambda self: list(self.options.augment))
    batch_augment = property(lambda self: list(self.options.batch_augment))
    interpolation = property(lambda self: self.options.interpolation)
    repeats = property(lambda self: self.options.repeats)
    repeats_epoch = property(lambda self: self.options.repeats_epoch)
    pin_memory = property(lambda self: self.options.device is not None)
    epoch = property(lambda self: self.cursor.epoch)
