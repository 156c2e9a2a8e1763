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

``--first-batch`` measures only the first batch of a full shuffle (2 workers, batch 256, the
default order), warm and cold (each shard file dropped from the page cache with
``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs no root for one's own files; every name
links the same file, so a page read for one shard is cached for the others and cold figures
understate a real cold start, unless ``--copies`` makes every shard its own file), the median of
``--rounds`` fresh processes, alternating with the tree of ``--compare`` (each tree over a
dataset its own writer wrote: trees a format version apart may not read each other's shards). Timers set before the
workers fork run in the workers too, so each worker reports what it had done when the batch
came: its start (from ``Loader()`` to its first chunk), the shards it opened and their seconds
(header, footer, the table's checksum (of a 1.2 shard: its block checksums), the map; the table checks made while opening are counted
as checks), the blocks of table rows it checked and their seconds, the rows it decoded and their
seconds (checksums and fills); the table shows the mean of the two workers. From the largest
size it projects the first batch at ``--project`` records (default 10^9) in shards of the same
size: ``Loader()`` measured over a manifest of that many shards, then per worker its start, one
shard opened and two blocks checked per row it reads (the shards then far outnumber the rows),
and the rows decoded:

    PYTHONPATH=. python tools/bench_scale.py --first-batch --rounds 3 --compare DIR   # DIR: the code before

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
from shardfmt.format._layout import MAX_SHARDS
from shardfmt.format._manifest import Manifest, ShardEntry

# Each script below builds its loader with this function, which reads a --compare tree from
# before the option objects too (it gives size and the sampling keywords to Loader directly).
MAKE_LOADER = r"""
def make_loader(path, workers, sampling):
    if not hasattr(shardfmt, "Sampling"):  # a --compare tree from before the option objects
        return Loader(path, batch_size=256, num_workers=workers, size=8, **sampling)
    return Loader(path, batch_size=256, num_workers=workers, transform=shardfmt.ImageTransform(size=8),
                  sampling=shardfmt.Sampling(**sampling))
"""

MEASURE = r"""
import json, os, sys, time
import torch
import shardfmt
from shardfmt import Loader
MAKE_LOADER_HERE


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
""".replace("MAKE_LOADER_HERE\n", MAKE_LOADER)


FIRST_BATCH = r"""
import json, os, sys, tempfile, time
import torch
import shardfmt
import shardfmt.format._reader as reader_module
import shardfmt._loader.chunk as chunk_module
import shardfmt._loader.pool as pool_module
from shardfmt import Loader
MAKE_LOADER_HERE


path, cold, folder = sys.argv[1], sys.argv[2] == "cold", sys.argv[3]
assert os.path.dirname(shardfmt.__file__).startswith(os.getcwd()), shardfmt.__file__
# The timers are set here, before the workers fork, so each worker runs them too; each writes
# its totals after every chunk, stamped on the system-wide monotonic clock perf_counter reads.
totals = {"open_s": 0.0, "opens": 0, "check_s": 0.0, "checks": 0, "check_in_open_s": 0.0, "decode_s": 0.0, "rows": 0}
inside = []

def timed(cls, name, key):
    original = cls.__dict__.get(name)
    def run(*args, **kwargs):
        start = time.perf_counter()
        inside.append(key)
        try:
            return original(*args, **kwargs)
        finally:
            inside.pop()
            spent = time.perf_counter() - start
            totals[key + "_s"] += spent
            if key != "decode":
                totals[key + "s"] += 1
            if key == "check" and "open" in inside:
                totals["check_in_open_s"] += spent
    setattr(cls, name, run)

timed(reader_module.ShardReader, "_open", "open")
timed(reader_module.ShardReaderBase, "_check_block", "check")
timed(chunk_module.ChunkProcessor, "_fill", "decode")
process = chunk_module.ChunkProcessor.process
def process_timed(self, slot, serial, row, epoch, indices):
    totals.setdefault("first_task", time.perf_counter())
    process(self, slot, serial, row, epoch, indices)
    totals["rows"] += len(indices)
    with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(totals | {"at": time.perf_counter()}) + "\n")
chunk_module.ChunkProcessor.process = process_timed
worker_main = pool_module.worker_main
def worker_timed(*args, **kwargs):
    for key in totals:
        totals[key] = 0
    with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps(totals | {"at": time.perf_counter()}) + "\n")
    worker_main(*args, **kwargs)
pool_module.worker_main = worker_timed
if cold:  # drop the shards from the page cache (posix_fadvise: no root needed for one's own files)
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
start = time.perf_counter()
loader = make_loader(path, 2, {})
built = time.perf_counter()
images, labels = next(iter(loader))
first = time.perf_counter()
assert images.shape == (256, 3, 8, 8), images.shape
loader.close()
order = getattr(loader, "order", "?")
print(json.dumps({"first_s": first - start, "init_s": built - start, "start": start, "first": first, "order": order}))
""".replace("MAKE_LOADER_HERE\n", MAKE_LOADER)


EPOCH = r"""
import json, os, sys, time
import torch
import shardfmt
from shardfmt import Loader
MAKE_LOADER_HERE


path, options = sys.argv[1], json.loads(sys.argv[2])
assert os.path.dirname(shardfmt.__file__).startswith(os.getcwd()), shardfmt.__file__
loader = make_loader(path, 2, options)
for _ in loader:  # the first epoch: workers started, shards opened, blocks checked, records verified
    pass
start, records = time.perf_counter(), 0
for images, labels in loader:
    records += len(labels)
seconds = time.perf_counter() - start
loader.close()
print(json.dumps({"records_per_s": records / seconds, "seconds": seconds}))
""".replace("MAKE_LOADER_HERE\n", MAKE_LOADER)


def epoch_main(args: argparse.Namespace, base: Path) -> int:
    """--epoch: records/s of the second epoch (steady state) over the first of --sizes, a full
    shuffle and ``window=8``, alternating with the tree of --compare; medians of --rounds."""
    trees: dict[str, Path | None] = {"this tree": None}
    if args.compare is not None:
        trees = {str(args.compare): args.compare, "this tree": None}
    size = args.sizes[0]
    paths = write_datasets(base / f"records-{size}", size, args.shard_records, trees)
    print(f"{os.cpu_count()} cores; load average (1 min) at the start: {os.getloadavg()[0]:.2f}")
    runs: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for label, options in (("full shuffle", {}), ("window=8", {"window": 8})):
                for name, tree in trees.items():
                    package_root = tree if tree is not None else Path(__file__).resolve().parents[1]
                    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
                    command = [sys.executable, "-c", EPOCH, str(paths[name]), json.dumps(options)]
                    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=package_root, check=True)
                    runs.setdefault((label, name), []).append(json.loads(out.stdout.strip().splitlines()[-1])["records_per_s"])
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"| {size:,} records, shards of {args.shard_records:,} | shardfmt | records/s, second epoch (median) | every round |")
    print("|---|---|---:|---|")
    for (label, name), rates in runs.items():
        print(f"| {label} | {name} | {sorted(rates)[(len(rates) - 1) // 2]:,.0f} | {', '.join(f'{rate:,.0f}' for rate in rates)} |")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    return 0


LOADER_ONLY = r"""
import sys, time
import torch
import shardfmt
from shardfmt import Loader
MAKE_LOADER_HERE
start = time.perf_counter()
make_loader(sys.argv[1], 2, {}).close()
print(time.perf_counter() - start)
""".replace("MAKE_LOADER_HERE\n", MAKE_LOADER)


def measure_first_batch(path: Path, *, cold: bool, tree: Path | None) -> dict[str, Any]:
    """Run FIRST_BATCH in a fresh process: seconds to the first batch of a full shuffle with 2
    workers, and for each worker what it had done when the batch came: when it started, and the
    shards it opened, the table blocks it checked and the rows it decoded, with their seconds."""
    package_root = tree if tree is not None else Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="bench-scale-workers-") as folder:
        command = [sys.executable, "-c", FIRST_BATCH, str(path), "cold" if cold else "warm", folder]
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=package_root, check=False)
        if out.returncode:
            raise RuntimeError(out.stderr)
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        workers = []
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name)) as f:
                lines = [json.loads(line) for line in f]
            done = [line for line in lines[1:] if line["at"] <= result["first"]]  # the chunks in hand at the first batch
            began = done[0]["first_task"] if done else result["first"]  # its first chunk begun: forked, ready, sent a task
            workers.append((done[-1] if done else lines[0]) | {"start_s": began - result["start"]})
    result["workers"] = workers
    return result


def first_batch(paths: dict[str, Path], trees: dict[str, Path | None], rounds: int) -> dict[tuple[str, str], dict[str, Any]]:
    """The median of `rounds` runs of each (tree, cache), the trees alternating within a round,
    each over its own dataset in `paths`."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(rounds):
        for cache in ("warm", "cold"):
            for name, tree in trees.items():
                runs.setdefault((name, cache), []).append(measure_first_batch(paths[name], cold=cache == "cold", tree=tree))
    return {key: sorted(found, key=lambda run: run["first_s"])[(len(found) - 1) // 2] for key, found in runs.items()}


def breakdown(run: dict[str, Any]) -> dict[str, float]:
    """Per worker, averaged over the workers: start (from `Loader()` to its first chunk begun),
    shards opened and their seconds without the table checks made while opening, blocks checked
    and their seconds, rows decoded and their seconds (checksums and fills)."""
    workers = run["workers"]
    keys = ("start_s", "opens", "open_s", "check_in_open_s", "checks", "check_s", "rows", "decode_s")
    mean = {key: sum(float(w[key]) for w in workers) / len(workers) for key in keys}
    mean["open_s"] -= mean.pop("check_in_open_s")
    return mean


def print_first_batch(size: int, num_shards: int, medians: dict[tuple[str, str], dict[str, Any]]) -> None:
    """One table row per tree and cache."""
    for (name, cache), run in sorted(medians.items()):
        b = breakdown(run)
        print(
            f"| {size:,} | {num_shards} | {name} | {cache} | {run['first_s']:.3f} | {b['start_s']:.3f} "
            f"| {b['opens']:.0f} | {b['open_s']:.3f} | {b['checks']:.0f} | {b['check_s']:.3f} | {b['rows']:.0f} | {b['decode_s']:.3f} |"
        )


def manifest_seconds(paths: dict[str, Path], shards: int, trees: dict[str, Path | None]) -> dict[str, float]:
    """Seconds `Loader()` takes (the manifest parsed, no shard opened) over a manifest of
    `shards` entries, each naming the first shard of the tree's dataset in `paths`: the median
    of 3 fresh processes per tree."""
    seconds: dict[str, float] = {}
    for name, tree in trees.items():
        folder = Path(tempfile.mkdtemp(prefix="bench-scale-manifest-"))
        try:
            entry = Manifest.load(paths[name] / "manifest.json").shards[0]
            entries = tuple(
                ShardEntry(f"shard-{number:06d}.shard", entry.num_records, entry.size, entry.checksum) for number in range(shards)
            )
            Manifest(schema=IMAGE_CLASSIFICATION, shards=entries, converter={"name": "bench_scale"}).write(folder)
            package_root = tree if tree is not None else Path(__file__).resolve().parents[1]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
            command = [sys.executable, "-c", LOADER_ONLY, str(folder)]
            runs = [subprocess.run(command, capture_output=True, text=True, env=env, cwd=package_root, check=True) for _ in range(3)]
            seconds[name] = sorted(float(run.stdout.split()[-1]) for run in runs)[1]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return seconds


def print_projection(records: int, shard_records: int, medians: dict[tuple[str, str], dict[str, Any]], manifest: dict[str, float]) -> None:
    """First batch at `records`, from the per-shard, per-block and per-row costs measured: each
    worker opens one shard per row it reads once the shards far outnumber the rows, and checks
    two blocks for it (block 0 on open, the row's own); `manifest` is `Loader()`'s time with
    that many shards, per tree."""
    shards = -(-records // shard_records)
    for (name, cache), run in sorted(medians.items()):
        b = breakdown(run)
        per_open = b["open_s"] / max(b["opens"], 1)
        per_block = b["check_s"] / max(b["checks"], 1)
        per_row = b["decode_s"] / max(b["rows"], 1)
        rows = 256 / 2  # each worker's share of the first batch (a worker may have done more when it came)
        opens = shards * (1 - (1 - 1 / shards) ** rows)
        total = manifest[name] + b["start_s"] + opens * per_open + (opens + rows) * per_block + rows * per_row
        print(
            f"| {name} | {cache} | {records:,} | {shards:,} | {manifest[name]:.3f} | {b['start_s']:.3f} "
            f"| {opens:.0f} x {per_open * 1e3:.2f} ms "
            f"| {opens + rows:.0f} x {per_block * 1e3:.2f} ms | {rows:.0f} x {per_row * 1e3:.3f} ms | **{total:.2f} s** |"
        )


def write_dataset(root: Path, num_records: int, shard_records: int, *, copies: bool = False) -> Path:
    """Write `num_records` tiny records: one real shard, linked under every shard name (with
    `copies`, copied: every shard its own file, so that a cold page cache is cold for each)."""
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
            if copies:
                raise OSError("a copy was asked for")
            os.link(seed / entry.path, root / name)
        except OSError:
            shutil.copyfile(seed / entry.path, root / name)
        entries.append(ShardEntry(name, records, entry.size, entry.checksum))
    Manifest(schema=IMAGE_CLASSIFICATION, shards=tuple(entries), converter={"name": "bench_scale"}).write(root)
    shutil.rmtree(seed)
    return root


WRITE_DATASET = r"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path.cwd() / "tools"))
import bench_scale
bench_scale.write_dataset(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), copies=sys.argv[4] == "copies")
"""


def write_datasets(
    root: Path, num_records: int, shard_records: int, trees: dict[str, Path | None], *, copies: bool = False
) -> dict[str, Path]:
    """One dataset per tree, each written by that tree's `DatasetWriter` (``ROOT-1``, ...): the
    trees may write different format versions, and an older reader refuses a newer minor's
    flags. A tree's dataset is written in a process that imports that tree's shardfmt."""
    paths: dict[str, Path] = {}
    for number, (name, tree) in enumerate(trees.items()):
        path = root if len(trees) == 1 else root.with_name(f"{root.name}-{number}")
        if tree is None:
            write_dataset(path, num_records, shard_records, copies=copies)
        else:
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
            how = "copies" if copies else "links"
            command = [sys.executable, "-c", WRITE_DATASET, str(path), str(num_records), str(shard_records), how]
            subprocess.run(command, env=env, cwd=tree, check=True)
        paths[name] = path
    return paths


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
        "with each worker's breakdown (and for --compare alternately), and a projection to --project records",
    )
    parser.add_argument(
        "--copies",
        action="store_true",
        help="with --first-batch: copy the shard under every name instead of linking it (10^7 records: 9 GB), so that a cold "
        "page cache is cold for every shard",
    )
    parser.add_argument(
        "--epoch",
        action="store_true",
        help="only the steady state: records/s of a second epoch over the first size, full shuffle and window=8 "
        "(and --compare alternately)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --first-batch or --epoch: the median of this many runs of each")
    parser.add_argument("--project", type=int, default=10**9, help="with --first-batch: project the first batch to this many records")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    if args.first_batch:
        return first_batch_main(args, base)
    if args.epoch:
        return epoch_main(args, base)
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
    """--first-batch: the table of first-batch times and their breakdown, each size in turn,
    then the projection to --project records from the largest size."""
    projected_shards = -(-args.project // args.shard_records)
    if projected_shards > MAX_SHARDS:
        raise SystemExit(
            f"--project {args.project:,} at --shard-records {args.shard_records:,} is {projected_shards:,} shards, "
            f"over a manifest's limit of {MAX_SHARDS:,}: give a smaller --project or larger shards"
        )
    trees: dict[str, Path | None] = {"this tree": None}
    if args.compare is not None:
        trees = {str(args.compare): args.compare, "this tree": None}
    print(f"{os.cpu_count()} cores; load average (1 min) at the start: {os.getloadavg()[0]:.2f}")
    print(
        "| records | shards | shardfmt | page cache | first batch s (2 workers) | worker start s | shards opened | opens s "
        "| blocks checked | table checks s | rows decoded | decode s |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    medians: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for size in args.sizes:
            paths = write_datasets(base / f"records-{size}", size, args.shard_records, trees, copies=args.copies)
            medians = first_batch(paths, trees, args.rounds)
            print_first_batch(size, -(-size // args.shard_records), medians)
            print(f"<!-- load average (1 min) after {size:,} records: {os.getloadavg()[0]:.2f} -->")
            sys.stdout.flush()
            if size == args.sizes[-1]:
                manifest = manifest_seconds(paths, -(-args.project // args.shard_records), trees)
            if args.keep is None:
                for path in paths.values():
                    shutil.rmtree(path, ignore_errors=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\nprojection from {args.sizes[-1]:,} records (per worker, the costs measured there; manifest: Loader() measured):\n")
    print(
        "| shardfmt | page cache | records | shards | Loader() s | worker start s | shard opens | block checks | rows decoded "
        "| first batch |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print_projection(args.project, args.shard_records, medians, manifest)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
