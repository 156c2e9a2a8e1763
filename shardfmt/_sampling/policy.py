"""`Sampling`: the sampling policy of a loader's epochs as one frozen, checked value: shuffled or
not, the seed, the order that shuffles, windows of shards, repeated augmentation, a subset of
the records, this process's share of the ranks, and whether the remainder is dropped. The epoch
order (`shardfmt._loader.epoch.Epochs`) reads it; nothing here opens a dataset, so the checks
that need the number of records (a subset's indices, the split over the ranks) happen there."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from .._arguments import check_int
from .orders import ORDERS
from .permutation import REPEAT_EPOCHS, check_repeats

__all__ = ["MAX_SEED", "MAX_WINDOW", "MAX_WORLD_SIZE", "Sampling"]

MAX_SEED = 2**64 - 1
"""Seeds are hashed as 64-bit words (`shardfmt._sampling.keys.record_keys`)."""
MAX_WINDOW = 2**31 - 1
MAX_WORLD_SIZE = 2**31 - 1

@dataclass(frozen=True, eq=False)
class Sampling:
    """Which records each epoch holds, in which order, and this process's share of them.

    `shardfmt.Loader` takes one as ``sampling=``; its own ``shuffle``, ``seed`` and
    ``drop_last`` keywords are the same three fields (`with_shortcuts`).

    Args:
        shuffle: a seeded permutation per epoch (else the dataset's order).
        seed: the permutation and the augmentations are pure functions of (seed, epoch,
            record); an int in [0, 2**64 - 1].
        drop_last: drop the epoch's remainder so that every batch is full
            (`shardfmt._sampling.keys.sample_batches`).
        order: how a shuffled epoch is ordered: "sorted-key" (every record's key sorted: 8
            bytes a record), "feistel" (a bijection computed batch by batch: nothing a record),
            or "auto": "sorted-key" below `shardfmt._sampling.orders.FEISTEL_FROM` (65,536)
            records, "feistel" from there on. A `shardfmt.Mixture` is always "feistel".
        window: shuffle shards, then records within windows of this many shards
            (`shardfmt._sampling.keys.window_order`), so that only about `window` shards are
            read at a time; None shuffles all records at once. Not with a `shardfmt.Mixture`.
        repeats: repeated augmentation (DeiT's RASampler): each record `repeats` times an
            epoch, every copy with its own crop and draws, the copies of a record on
            consecutive ranks; ``len()`` and the state count the copies (spec/sampling.md).
        repeats_epoch: with `repeats` k, "copies": an epoch of k N samples, every copy of every
            record; "records": an epoch of N samples, as RASampler's (the first N of those
            positions), so that epoch-based schedules need no dividing by k.
        subset: the records an epoch holds: record indices (distinct, any order) or a boolean
            mask with one entry per record (kept as a read-only copy). Shuffled, an epoch of a
            subset is the full epoch's order with the other records left out; unshuffled, the
            indices' own order. Ranks, drop_last, ``len()`` and resume count its records.
        rank, world_size: this process's share; where not given, torch.distributed's when it
            is initialised as each epoch starts (the loader may be made before the process
            group).

    Raises:
        TypeError, ValueError: an argument is of the wrong type or outside its range (the
            message names it and the range).

    Example::

        Loader(path, batch_size=256, sampling=Sampling(window=8, repeats=3))
    """

    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    order: str = "auto"
    window: int | None = None
    repeats: int = 1
    repeats_epoch: str = "copies"
    subset: Sequence[int] | np.ndarray | None = None
    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("shuffle", "drop_last"):
            value = getattr(self, name)
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        check_int("seed", self.seed, 0, MAX_SEED)
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {self.order!r}")
        if self.window is not None:
            check_int("window", self.window, 1, MAX_WINDOW, note=" shards")
        object.__setattr__(self, "repeats", check_repeats(self.repeats))  # a numpy integer as an int
        if self.repeats_epoch not in REPEAT_EPOCHS:
            raise ValueError(f"repeats_epoch must be one of {', '.join(repr(e) for e in REPEAT_EPOCHS)}, got {self.repeats_epoch!r}")
        if self.world_size is not None:
            check_int("world_size", self.world_size, 1, MAX_WORLD_SIZE)
        if self.rank is not None:
            check_int("rank", self.rank, 0, (self.world_size or MAX_WORLD_SIZE) - 1)
        if isinstance(self.subset, np.ndarray):  # a copy the caller cannot change under the loader
            subset = self.subset.copy()
            subset.flags.writeable = False
            object.__setattr__(self, "subset", subset)

    def __eq__(self, other: object) -> bool:  # field by field, a subset array by its values (unhashable, as an array is)
        if not isinstance(other, Sampling):
            return NotImplemented
        mine, theirs = self.subset, other.subset
        same_subset = mine is theirs or (mine is not None and theirs is not None and np.array_equal(mine, theirs))
        return same_subset and all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.name != "subset")

    def with_shortcuts(self, *, shuffle: bool, seed: int, drop_last: bool) -> Sampling:
        """This policy with `Loader`'s ``shuffle``, ``seed`` and ``drop_last`` keywords in it.

        A keyword at `Loader`'s default leaves this policy's field as it is; a keyword given
        otherwise sets it, unless this policy holds another value that is not the default
        either (the same option given twice, two ways).

        Raises:
            ValueError: such a conflict.
        """
        given = (("shuffle", shuffle), ("seed", seed), ("drop_last", drop_last))
        values: dict[str, Any] = {name: self._merge(name, value) for name, value in given}
        if all(values[name] == getattr(self, name) for name in values):
            return self
        return replace(self, shuffle=values["shuffle"], seed=values["seed"], drop_last=values["drop_last"])

    def _merge(self, name: str, value: Any) -> Any:
        """The value of shortcut `name` given `Loader`'s `value` (see `with_shortcuts`)."""
        default = next(option.default for option in fields(self) if option.name == name)
        ours = getattr(self, name)
        if value == default or value == ours:
            return ours
        if ours != default:
            raise ValueError(f"{name} is given twice: Loader({name}={value!r}) and sampling=Sampling({name}={ours!r}); give it once")
        return value

    def fingerprint(self) -> dict[str, Any]:
        """The policy's part of a loader state's settings (a resume compares them): seed,
        shuffle, drop_last and window always; repeats and repeats_epoch only where they are not
        the defaults (states saved before they existed still resume). The subset, the order as
        resolved and the ranks are recorded by the epochs that resolve them."""
        found: dict[str, Any] = {"seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last, "window": self.window}
        if self.repeats != 1:
            found["repeats"] = int(self.repeats)
        if self.repeats_epoch != "copies":
            found["repeats_epoch"] = self.repeats_epoch
        return found
