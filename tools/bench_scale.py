"""Loader start-up, memory and first batch against the number of records: flat, not linear.

For each size (default 10^5, 10^6 and 10^7 records) the bench writes a synthetic dataset of tiny
records (an 8x8 RGB JPEG, a label and a key, `IMAGE_CLASSIFICATION`): one shard of
``--shard-records`` records written with `DatasetWriter`, hard-linked under as many shard names
as the size needs (a copy where links are not possible), and a manifest listing them all. The
loader reads every name as its own shard, so the only thing shared is the disk space.

Each measurement runs in a fresh Python process that has imported torch and shardfmt first:

  Loader()         seconds to construct ``Loader(path, batch_size=256, num_workers=2, size=8)``
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
loader = Loader(path, batch_size=256, num_workers=2, size=8, **options)
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
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-scale-"))
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


if __name__ == "__main__":
    sys.exit(main())
