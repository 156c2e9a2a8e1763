"""Mixtures of datasets: exact per-source counts per epoch and the epoch order that interleaves them.

`Mixture` names the sources, their weights and the epoch size; `Loader` takes it wherever it
takes a path. Records are numbered across the sources in the order given (source 0's records,
then source 1's, ...), so a record index names one record of one source.

Each epoch e draws exactly ``allocate(weights, epoch_size=epoch_size)[i]`` records from source i (the
largest-remainder rounding of ``epoch_size * w_i / sum(w)``, computed on exact rationals), chosen
by `source_records`: whole passes over the source when it is smaller than its share, and for the
rest, consecutive chunks of a shuffled pass, so no record repeats within a pass nor within an
epoch unless the source is smaller than its share. `MixtureOrder` then interleaves the epoch's
draws with the same Feistel bijection as every other order. spec/sampling.md ("Mixtures") states
the rules for other implementations.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Union, cast

import numpy as np

from .._arguments import check_int, check_number, check_path
from .permutation import permute

__all__ = ["MAX_EPOCH_SIZE", "MIXTURE_STREAM", "REPEAT_STREAM", "SOURCE_STREAM", "Mixture", "MixtureOrder", "allocate", "source_records"]

MIXTURE_STREAM = 0x4D4958
"""The stream of the bijection interleaving an epoch's draws ("MIX")."""
SOURCE_STREAM = 0x535243
"""The stream of a source's shuffled passes that epochs take chunks of ("SRC")."""
REPEAT_STREAM = 0x524550
"""The stream of the whole passes of a source smaller than its share ("REP")."""

MAX_EPOCH_SIZE = 2**53
"""The most positions an epoch holds (a mixture's epoch size; records times repeats): every
position and count is then exact as a float64 and as a JSON number in any parser, as a state dict
saves them (2**63 overflowed int64 positions)."""

SourcePath = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]


@dataclass(frozen=True, init=False)
class Mixture:
    """Several datasets with the same schema, drawn in fixed proportions: ``Loader(Mixture(...))``.

    Args:
        sources: name -> what `Loader` takes as a path (a dataset directory or manifest, a URL,
            local tars); binary and tar, local and remote may be mixed. Records are numbered
            across the sources in this order.
        weights: name -> a weight (finite, at least 0, not all 0); every source needs one.
        epoch_size: records per epoch, over all sources.

    Each epoch draws exactly ``allocate(weights, epoch_size=epoch_size)`` records from the sources (see the
    module docstring and spec/sampling.md).

    Raises:
        TypeError: `sources` or `weights` is not a mapping, a weight not a number, `epoch_size`
            not an int.
        ValueError: no source, a weight missing, extra, negative or not finite, all weights 0,
            an epoch size outside [1, `MAX_EPOCH_SIZE`], a path longer than a path can be.
    """

    names: tuple[str, ...]
    paths: tuple[Any, ...]
    weights: tuple[float, ...]
    epoch_size: int

    def __init__(self, sources: Mapping[str, SourcePath], *, weights: Mapping[str, float], epoch_size: int) -> None:
        for argument, value in (("sources", sources), ("weights", weights)):
            if not isinstance(value, Mapping):
                raise TypeError(f"{argument} must be a mapping from source name to {_WHAT[argument]}, got {value!r}")
        if not sources:
            raise ValueError("a Mixture needs at least one source")
        names = tuple(str(name) for name in sources)
        if set(weights) != set(names) or len(names) != len(set(names)):
            missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
            raise ValueError(f"weights must name every source once (missing: {missing}, not a source: {extra})")
        values = tuple(
            check_number(f"weights[{name!r}]", weights[name], 0.0, sys.float_info.max, note=" (finite and at least 0)") for name in names
        )
        if not any(values):
            raise ValueError("at least one weight must be above 0")
        check_int("epoch_size", epoch_size, 1, MAX_EPOCH_SIZE, note=" records")
        paths = tuple(_plain_path(path) for path in sources.values())
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "weights", values)
        object.__setattr__(self, "epoch_size", epoch_size)

    @property
    def counts(self) -> list[int]:
        """Records each source gives every epoch."""
        return allocate(self.weights, epoch_size=self.epoch_size)

    def to_config(self) -> dict[str, Any]:
        """Plain values: the names, paths, weights and epoch size."""
        return {"names": list(self.names), "paths": list(self.paths), "weights": list(self.weights), "epoch_size": self.epoch_size}


_WHAT = {"sources": "a path", "weights": "a weight"}


def _plain_path(path: SourcePath) -> Any:
    """A source's path (or its list of tars) as strings; TypeError for what is no path, ValueError for one too long."""
    items = list(path) if isinstance(path, (list, tuple)) else [path]
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"a Mixture's source must be a str or os.PathLike, or a list of them, got {item!r}")
        check_path("a Mixture's source path", item)
    if isinstance(path, (list, tuple)):
        return tuple(os.fspath(p) for p in path)
    return os.fspath(cast("str | os.PathLike[str]", path))


def allocate(weights: Sequence[float], *, epoch_size: int) -> list[int]:
    """Split `epoch_size` by `weights` with largest remainders, on exact rationals.

    Source i's quota is ``epoch_size * w_i / sum(w)`` (each weight taken as the exact value of
    its binary64); each source gets the floor of its quota, and the records still missing go one
    each to the sources with the largest fractional parts, ties to the earlier source.

    Raises:
        ValueError: a weight is negative or not finite, or every weight is 0.
    """
    exact = [Fraction(w) if math.isfinite(w) else Fraction(-1) for w in weights]
    if any(w < 0 for w in exact) or not any(exact):
        raise ValueError(f"weights must be finite, at least 0 and not all 0, got {list(weights)}")
    total = sum(exact)
    quotas = [epoch_size * w / total for w in exact]
    counts = [math.floor(q) for q in quotas]
    missing = epoch_size - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:missing]:
        counts[i] += 1
    return counts


def source_records(draws: np.ndarray, *, size: int, count: int, source: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Return the records (numbered within the source) of draws `draws` (each in [0, count)) of
    source `source` in epoch `epoch`; the source holds `size` records and gives `count` an epoch.

    With ``f = count // size`` and ``rest = count % size``: draw t < f * size is position
    ``t mod size`` of whole pass ``epoch * f + t // size`` (a permutation by REPEAT_STREAM);
    draw ``t = f * size + u`` is position ``j * rest + u`` of pass ``q`` (by SOURCE_STREAM), where
    ``k = size // rest``, ``q = epoch // k`` and ``j = epoch mod k``: epochs take consecutive
    chunks of one shuffled pass, k epochs a pass. Without `shuffle` a pass is 0..size-1.

    Raises:
        ValueError: the source is empty but is to give records.
    """
    draws = np.asarray(draws, dtype=np.int64)
    if draws.size == 0:
        return draws
    if size < 1:
        raise ValueError(f"source {source} holds no records but is to give {count} an epoch")
    whole, rest = divmod(count, size)
    out = np.empty_like(draws)
    repeat = draws < whole * size
    if repeat.any():
        passes = epoch * whole + draws[repeat] // size
        offsets = draws[repeat] % size
        out[repeat] = _pass_positions(offsets, passes, size=size, seed=seed, stream=REPEAT_STREAM, source=source, shuffle=shuffle)
    chunk = ~repeat
    if chunk.any():
        per_pass = size // rest
        number, part = divmod(epoch, per_pass)
        offsets = part * rest + (draws[chunk] - whole * size)
        passes = np.full(len(offsets), number, dtype=np.int64)
        out[chunk] = _pass_positions(offsets, passes, size=size, seed=seed, stream=SOURCE_STREAM, source=source, shuffle=shuffle)
    return out


def _pass_positions(
    offsets: np.ndarray, passes: np.ndarray, *, size: int, seed: int, stream: int, source: int, shuffle: bool
) -> np.ndarray:
    """Position `offsets` of each pass: pass p of source s is bijection s of (seed, stream, epoch p)."""
    if not shuffle:
        return offsets
    out = np.empty_like(offsets)
    for number in np.unique(passes).tolist():
        chosen = passes == number
        out[chosen] = permute(offsets[chosen], size=size, seed=seed, stream=stream, epoch=number, index=source)
    return out


class MixtureOrder:
    """The order of epoch `epoch` of a mixture: `size` (the epoch size) positions.

    The epoch's draws are numbered source by source: draws [o_i, o_i + n_i) are source i's, n_i
    from `allocate`. Position p holds draw ``d = permute(p; epoch_size, seed, MIXTURE, epoch)``,
    which is draw ``t = d - o_i`` of source i, record ``start_i + source_records(t)``, start_i
    being the records of the sources before it.

    Args:
        source_sizes: records of each source, in the mixture's order.
        counts: records each source gives an epoch (`allocate`).
        seed, epoch: as for every order.
        shuffle: False keeps draws in source order and passes unshuffled.
    """

    def __init__(self, source_sizes: Sequence[int], *, counts: Sequence[int], seed: int, epoch: int, shuffle: bool = True) -> None:
        self.source_sizes = [int(s) for s in source_sizes]
        self.counts = [int(c) for c in counts]
        for number, (size, count) in enumerate(zip(self.source_sizes, self.counts, strict=True)):
            if count and size < 1:
                raise ValueError(f"source {number} holds no records but is to give {count} an epoch")
        self.size = sum(self.counts)
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self._draw_start = np.concatenate([[0], np.cumsum(self.counts, dtype=np.int64)])
        self._record_start = np.concatenate([[0], np.cumsum(self.source_sizes, dtype=np.int64)])

    def at(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if self.shuffle and self.size:
            draws = permute(positions, size=self.size, seed=self.seed, stream=MIXTURE_STREAM, epoch=self.epoch)
        else:
            draws = positions
        sources = np.searchsorted(self._draw_start, draws, side="right") - 1
        out = np.empty_like(draws)
        for source in np.unique(sources).tolist():
            chosen = sources == source
            local = source_records(
                draws[chosen] - self._draw_start[source],
                size=self.source_sizes[source],
                count=self.counts[source],
                source=source,
                seed=self.seed,
                epoch=self.epoch,
                shuffle=self.shuffle,
            )
            out[chosen] = self._record_start[source] + local
        return out
