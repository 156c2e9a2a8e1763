"""Measure how well the windowed order (block shuffle) mixes records, against the full shuffle.

The data is modelled on a converted ImageFolder: ``--records`` records stored class by class
(``--classes`` classes of equal size, as `shardfmt convert` writes ImageFolder trees) in shards
of ``--shard-records`` records. For each window size K (and for the full shuffle) it computes,
over ``--epochs`` epochs of `sampling.sample_batches` (rank 0 of 1):

  neighbours in a batch   the fraction of records stored next to each other (i, i+1, same
                          shard) that land within one batch length of each other in the epoch
                          order. Lower is better: about 2B/N for a full shuffle, about 2B/(K*R)
                          for windows of K shards of R records. (B = batch size, N = records.)
  shards per batch        the mean number of distinct shards a batch draws from: at most K with
                          windows, about S(1 - (1 - 1/S)^B) for the full shuffle (S shards).
  classes per batch       the mean number of distinct classes in a batch: what a class-sorted
                          storage order costs the optimiser. Full shuffle: about
                          C(1 - (1 - 1/C)^B).
  displacement            mean |epoch position - storage position| divided by N/3 (its
                          expectation for a random permutation). Shards move across the whole
                          epoch, so this is about 1 for every K: it cannot tell the orders
                          apart, and is printed to show that.

Usage::

    PYTHONPATH=. python tools/shuffle_quality.py
    PYTHONPATH=. python tools/shuffle_quality.py --records 100000 --shard-records 1000 --windows 1,2,8
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from shardfmt._sampling.keys import sample_batches


def measure(
    num_records: int, *, shard_records: int, classes: int, batch_size: int, window: int | None, epochs: int, seed: int
) -> dict[str, float]:
    """The four statistics (see the module docstring), averaged over `epochs` epochs."""
    sizes = np.full(-(-num_records // shard_records), shard_records, dtype=np.int64)
    sizes[-1] = num_records - shard_records * (len(sizes) - 1)
    shard_of = np.repeat(np.arange(len(sizes)), sizes)
    class_of = np.arange(num_records) * classes // num_records
    totals = {"neighbours in a batch": 0.0, "shards per batch": 0.0, "classes per batch": 0.0, "displacement": 0.0}
    for epoch in range(epochs):
        order = sample_batches(num_records, batch_size=batch_size, seed=seed, epoch=epoch, shard_sizes=sizes, window=window).indices
        position = np.empty(num_records, np.int64)
        position[order] = np.arange(len(order))
        same_shard = shard_of[:-1] == shard_of[1:]
        gap = np.abs(position[1:] - position[:-1])[same_shard[: len(position) - 1]]
        totals["neighbours in a batch"] += float(np.mean(gap < batch_size))
        batches = order[: len(order) // batch_size * batch_size].reshape(-1, batch_size)
        totals["shards per batch"] += float(np.mean([len(np.unique(shard_of[b])) for b in batches]))
        totals["classes per batch"] += float(np.mean([len(np.unique(class_of[b])) for b in batches]))
        totals["displacement"] += float(np.mean(np.abs(position - np.arange(num_records))) / (num_records / 3))
    return {name: value / epochs for name, value in totals.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=1_281_024, help="records in the dataset (default: ImageNet-1k train, rounded)")
    parser.add_argument("--shard-records", type=int, default=2_560, help="records per shard (default: 256 MiB of 100 KB images)")
    parser.add_argument("--classes", type=int, default=1_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--windows", default="1,4,16,64", help="comma list of window sizes in shards")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    windows: list[int | None] = [int(w) for w in args.windows.split(",")] + [None]
    shards = -(-args.records // args.shard_records)
    print(
        f"{args.records:,} records in {shards} shards of {args.shard_records:,}, {args.classes} classes stored in order, "
        f"batch {args.batch_size}, {args.epochs} epochs, seed {args.seed}"
    )
    print("| window K | shards in use | neighbours in a batch | shards per batch | classes per batch | displacement |")
    print("|---:|---:|---:|---:|---:|---:|")
    for window in windows:
        started = time.perf_counter()
        stats = measure(
            args.records,
            shard_records=args.shard_records,
            classes=args.classes,
            batch_size=args.batch_size,
            window=window,
            epochs=args.epochs,
            seed=args.seed,
        )
        label = "full shuffle" if window is None else str(window)
        cached = str(shards) if window is None else str(min(window, shards))
        print(
            f"| {label} | {cached} | {stats['neighbours in a batch']:.5f} | {stats['shards per batch']:.1f} | "
            f"{stats['classes per batch']:.1f} | {stats['displacement']:.3f} |",
            flush=True,
        )
        print(f"window {label}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
