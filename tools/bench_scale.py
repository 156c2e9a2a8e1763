"""Loader start-up, memory and first batch against the number of records: flat, not linear.

For each size (default 10^5, 10^6 and 10^7 records) the bench writes a synthetic dataset of tiny
records (an 8x8 RGB JPEG, a label and a key, `IMAGE_CLASSIFICATION`): one shard of
``--shard-records`` records written with `DatasetWriter`, hard-linked under as many shard names
as the size needs (a copy where links are not possible), and a manifest listing them all. The
loader reads every name as its own shard, so the only thing shared is the disk space.

Each measurement runs in a fresh Python process that has imported torch and shardfmt first:

  Loader()         seconds to construct ``Loader(path, batch_size=256, num_workers=2, transform=ImageTransform(size=8))``
  bytes/record     the training process's resident memory after ``Loader()`` minus before,
                   divided by the records (target: under 16 at 10^7)
  first batch      seconds from ``Loader()`` to the first batch in hand (workers started, shards
                   opened and validated by the workers, 256 records decoded); with the default
                   order ("feistel" from 65,536 records), with ``window=8``, and with
                   ``order="sorted-key"`` (the order of shardfmt 0.1: every key sorted) as the
                   baseline of the same run
  peak bytes/rec   the training process's peak resident memory during Loader() and the first
                   batch, above its resident memory before, per record (default order)

Ratios print against the smallest size: near 1 is flat. Run:

    PYTHONPATH=. python tools/bench_scale.py                  # 10^5, 10^6, 10^7
    PYTHONPATH=. python tools/bench_scale.py --sizes 100000 1000000 --keep /tmp/scale

Memory figures do not depend on what else runs on the machine; times do, so the bench prints
the load average with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg

from shardfmt import DatasetWriter
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.format._manifest import Manifest, ShardEntry

MEASURE = r"""
import json, os, sys, time
import torch
import shardfmt
from shardfmt import Loader

def make_loader(path, workers, sampling):
    if not hasattr(shardfmt, "Sampling"):  # a --compare tree from before the option objects
        return Loader(path, batch_size=256, num_workers=workers, size=8, **sampling)
    return Loader(path, batch_size=256, num_workers=workers, transform=shardfmt.ImageTransform(size=8),
                  sampling=shardfmt.Sampling(**sampling))

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def peak():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0

path, options = sys.argv[1], json.loads(sys.argv[2])
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # reset the peak resident size
except OSError:
    pass
before = rss()
start = time.perf_counter()
loader = make_loader(path, 2, options)
built = time.perf_counter()
after = rss()
images, labels = next(iter(loader))
first = time.perf_counter()
assert images.shape == (256, 3, 8, 8), images.shape
assert os.path.dirname(shardfmt.__file__).startswith(os.getcwd()), shardfmt.__file__
result = {"init_s": built - start, "init_bytes": after - before, "first_s": first - start, "peak_bytes": peak() - before}
print(json.dumps(result | {"order": getattr(loader, "order", "sorted-key")}))
loader.close()
"""


FIRST_BATCH = r"""
import json, os, sys, time
import torch
import shardfmt
import shardfmt.format._reader as reader_module
from shardfmt import Loader

def make_loader(path, workers, sampling):
    if not hasattr(shardfmt, "Sampling"):  # a --compare tree from before the option objects
        return Loader(path, batch_size=256, num_workers=workers, size=8, **sampling)
    return Loader(path, batch_size=256, num_workers=workers, transform=shardfmt.ImageTransform(size=8),
                  sampling=shardfmt.Sampling(**sampling))

path, workers, cold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "cold"
assert os.path.dirname(shardfmt.__file__).startswith(os.getcwd()), shardfmt.__file__
times = {"open_s": 0.0, "check_s": 0.0, "check_in_open_s": 0.0, "opens": 0, "checks": 0}
depth = []

def timed(cls, name, key):
    original = cls.__dict__.get(name)
    if original is None:
        return
    def run(*args, **kwargs):
        start = time.perf_counter()
        depth.append(key)
        try:
            return original(*args, **kwargs)
        finally:
            depth.pop()
            spent = time.perf_counter() - start
            times[key + "_s"] += spent
            times[key + "s"] += 1
            if key == "check" and "open" in depth:
                times["check_in_open_s"] += spent
    setattr(cls, name, run)

timed(reader_module.ShardReader, "_open", "open")
timed(reader_module.ShardReader, "_check_table", "check")       # before: every row, on open
timed(reader_module.ShardReaderBase, "_check_block", "check")   # after: one block, on first use
if cold:  # drop the shards' pages from the page cache (every name links the same file)
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
start = time.perf_counter()
loader = make_loader(path, workers, {})
images, labels = next(iter(loader))
first = time.perf_counter() - start
assert images.shape == (256, 3, 8, 8), images.shape
loader.close()
print(json.dumps(times | {"first_s": first, "order": getattr(loader, "order", "?")}))
"""


def measure_first_batch(path: Path, *, workers: int, cold: bool, tree: Path | None) -> dict[str, Any]:
    """Run FIRST_BATCH in a fresh process: seconds to the first batch of a full shuffle, and
    the time spent opening shards and checking record tables in this process (all of it with
    ``workers=0``; none with workers, which do that work themselves)."""
    package_root = tree if tree is not None else Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-c", FIRST_BATCH, str(path), str(workers), "cold" if cold else "warm"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=package_root, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def first_batch(path: Path, trees: dict[str, Path | None], rounds: int) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Best of `rounds` of each (tree, cache, workers), the trees alternating within a round."""
    best: dict[tuple[str, str, int], dict[str, Any]] = {}
    for _ in range(rounds):
        for cache in ("warm", "cold"):
            for workers in (2, 0):
                for name, tree in trees.items():
                    result = measure_first_batch(path, workers=workers, cold=cache == "cold", tree=tree)
                    key = (name, cache, workers)
                    if key not in best or result["first_s"] < best[key]["first_s"]:
                        best[key] = result
    return best


def print_first_batch(size: int, num_shards: int, best: dict[tuple[str, str, int], dict[str, Any]]) -> None:
    """One table row per tree and cache: 2 workers, then the breakdown of a 0-worker run."""
    for (name, cache, workers), two in sorted(best.items()):
        if workers != 2:
            continue
        zero = best[(name, cache, 0)]
        opens = zero["open_s"] - zero["check_in_open_s"]
        decode = zero["first_s"] - opens - zero["check_s"]
        print(
            f"| {size:,} | {num_shards} | {name} | {cache} | {two['first_s']:.3f} | {max(two['first_s'] - zero['first_s'], 0):.3f} "
            f"| {zero['first_s']:.3f} | {zero['opens']} | {opens:.3f} | {zero['checks']} | {zero['check_s']:.3f} | {decode:.3f} |"
        )


def write_dataset(root: Path, num_records: int, shard_records: int) -> Path:
    """Write `num_records` tiny records: one real shard, linked under every shard name."""
    if root.exists():
        shutil.rmtree(root)
    seed = root.parent / f"{root.name}-first"
    image = simplejpeg.encode_jpeg(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8), quality=75)
    count = min(shard_records, num_records)
    with DatasetWriter(seed, schema=IMAGE_CLASSIFICATION, shard_size=1 << 40) as writer:
        for i in range(count):
            writer.write({"image": image, "label": i % 1000, "key": f"{i:09d}"})
    entry = Manifest.load(seed / "manifest.json").shards[0]
    root.mkdir(parents=True)
    entries = []
    for number in range(-(-num_records // count)):
        records = min(count, num_records - number * count)
        if records != count:
            raise ValueError(f"{num_records} is not a multiple of {count} records per shard")
        name = f"shard-{number:05d}.shard"
        try:
            os.link(seed / entry.path, root / name)
        except OSError:
            shutil.copyfile(seed / entry.path, root / name)
        entries.append(ShardEntry(name, records, entry.size, entry.checksum))
    Manifest(schema=IMAGE_CLASSIFICATION, shards=tuple(entries), converter={"name": "bench_scale"}).write(root)
    shutil.rmtree(seed)
    return root


def measure(path: Path, options: dict[str, Any], *, tree: Path | None = None) -> dict[str, Any]:
    """Run MEASURE in a fresh process, with this checkout's shardfmt or the one in `tree`."""
    package_root = tree if tree is not None else Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), json.dumps(options)],
        capture_output=True,
        text=True,
        env=env,
        cwd=package_root,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(out.stderr)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7])
    parser.add_argument("--shard-records", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, default=None, help="write the datasets here and keep them (default: a temporary folder)")
    parser.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="also measure the shardfmt of this source tree (e.g. an export of an older commit), default options only",
    )
    parser.add_argument(
        "--first-batch",
        action="store_true",
        help="only the first batch of a full shuffle, 2 workers, warm and with the shards dropped from the page cache, "
        "with a breakdown from a 0-worker run (and for --compare alternately)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="with --first-batch: keep the best of this many runs of each")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    if args.first_batch:
        return first_batch_main(args, base)
    rows = []
    try:
        for size in args.sizes:
            began = time.perf_counter()
            path = write_dataset(base / f"records-{size}", size, args.shard_records)
            written = time.perf_counter() - began
            default = measure(path, {})
            windowed = measure(path, {"window": 8})
            sorted_key = measure(path, {"order": "sorted-key"})
            other = measure(path, {}, tree=args.compare) if args.compare is not None else None
            rows.append((size, written, default, windowed, sorted_key, other))
            print(f"# {size:,} records written in {written:.1f} s; load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    first = rows[0]
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(
        (
            "| records | Loader() s | Loader() bytes/record (MB) | first batch s (order) | first batch s (window=8) | first batch s "
            "(sorted-key) | peak bytes/record (MB) |"
        )
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size, _written, default, windowed, sorted_key, _other in rows:
        print(
            f"| {size:,} | {default['init_s']:.3f} | {default['init_bytes'] / size:.2f} ({default['init_bytes'] / 2**20:.1f}) "
            f"| {default['first_s']:.2f} ({default['order']}) | {windowed['first_s']:.2f} | {sorted_key['first_s']:.2f} "
            f"| {default['peak_bytes'] / size:.2f} ({default['peak_bytes'] / 2**20:.1f}) |"
        )
    print(f"ratios to {first[0]:,} records (1 is flat; {{records ratio}} is linear):")
    if args.compare is not None:
        print(f"shardfmt of {args.compare}, same datasets and settings:")
        print("| records | Loader() s | Loader() bytes/record (MB) | first batch s | peak bytes/record (MB) |")
        print("|---:|---:|---:|---:|---:|")
        for size, _written, _default, _windowed, _sorted_key, other in rows:
            print(
                f"| {size:,} | {other['init_s']:.3f} | {other['init_bytes'] / size:.2f} ({other['init_bytes'] / 2**20:.1f}) "
                f"| {other['first_s']:.2f} | {other['peak_bytes'] / size:.2f} ({other['peak_bytes'] / 2**20:.1f}) |"
            )
    for size, _written, default, windowed, sorted_key, _other in rows[1:]:
        print(
            f"  {size:,} ({size / first[0]:.0f}x records): Loader() {default['init_s'] / first[2]['init_s']:.2f}x, "
            f"Loader() memory {max(default['init_bytes'], 4096) / max(first[2]['init_bytes'], 4096):.2f}x, "
            f"first batch {default['first_s'] / first[2]['first_s']:.2f}x, window=8 {windowed['first_s'] / first[3]['first_s']:.2f}x, "
            f"sorted-key {sorted_key['first_s'] / first[4]['first_s']:.2f}x"
        )
    return 0



def first_batch_main(args: argparse.Namespace, base: Path) -> int:
    """--first-batch: the table of first-batch times and their breakdown, each size in turn."""
    trees: dict[str, Path | None] = {"this tree": None}
    if args.compare is not None:
        trees = {str(args.compare): args.compare, "this tree": None}
    print(f"{os.cpu_count()} cores; load average (1 min) at the start: {os.getloadavg()[0]:.2f}")
    print(
        "| records | shards | shardfmt | page cache | first batch s (2 workers) | worker start s | first batch s (0 workers) "
        "| shards opened | opens s | blocks checked | table checks s | decode and rest s |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    try:
        for size in args.sizes:
            path = write_dataset(base / f"records-{size}", size, args.shard_records)
            best = first_batch(path, trees, args.rounds)
            print_first_batch(size, -(-size // args.shard_records), best)
            sys.stdout.flush()
            if args.keep is None:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
