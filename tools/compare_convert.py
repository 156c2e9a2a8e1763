"""Convert the same sources with two checkouts of shardfmt and compare every output file byte for byte.

The sources are generated: the awkward ImageFolder of the test suite (`tests/conftest.py`
``awkward_tree``: every kind of awkward input, an empty class, a symbolic-link loop, a broken
link, hidden files, a file name that is not UTF-8), a plain ImageFolder, a ``path,label``
listing, a WebDataset tar with a caption member, a Parquet file with a caption column, and two
parallel folders. Each is converted by ``python -m shardfmt convert`` once per checkout (the
checkout first on PYTHONPATH), to binary shards and where the source allows to tar shards, with
small shards and two workers; then every file of the two outputs (shards, member indexes,
manifest.json, rejects.jsonl) is compared. The exit status is 1 if any differs.

Usage:
    git worktree add /tmp/base 80090c5
    python tools/compare_convert.py /tmp/base .
    python tools/compare_convert.py /tmp/base . --keep /tmp/compare   # keep the outputs
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from conftest import jpeg_bytes, make_awkward_tree  # noqa: E402

from shardfmt._synthetic import make_imagefolder  # noqa: E402

FLAGS = ["--workers", "2", "--shard-size", "4KiB", "--quiet"]


def make_sources(folder: Path) -> list[tuple[str, list[str], list[str]]]:
    """Write the sources into `folder`; return (case name, SRC arguments, extra flags) for each run."""
    awkward = make_awkward_tree(folder)
    plain = make_imagefolder(folder / "imagefolder", num_classes=4, per_class=10, size=(48, 64), seed=1)
    listing = folder / "listing.csv"
    listing.write_text("path,label\n" + "".join(f"imagefolder/class_{n % 4:03d}/img_{n:05d}.JPEG,{n % 4}\n" for n in range(40)))
    tar = _tar(folder / "captions.tar")
    parquet = _parquet(folder / "table.parquet")
    pairs = [make_imagefolder(folder / "pairs" / side, num_classes=1, per_class=8, size=(32, 32), seed=4) for side in ("a", "b")]
    return [
        ("nasty", [str(awkward)], []),
        ("nasty-tar", [str(awkward)], ["--format", "tar"]),
        ("imagefolder", [str(plain)], []),
        ("imagefolder-tar", [str(plain)], ["--format", "tar"]),
        ("imagefolder-raw", [str(plain)], ["--store", "raw", "--max-side", "40"]),
        ("listing", [str(listing)], []),
        ("tar-captions", [str(tar)], []),
        ("tar-captions-declared", [str(tar)], ["--field", "txt=str"]),
        ("tar-captions-tar", [str(tar)], ["--format", "tar"]),
        ("parquet", [str(parquet)], []),
        ("two-folders", [str(p / "class_000") for p in pairs], ["--field", "a", "--field", "b"]),
    ]


def _tar(path: Path) -> Path:
    """A WebDataset tar of 12 samples: a JPEG, a .cls label and a .txt caption (two lack it)."""
    import tarfile

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for n in range(12):
            members = {"jpg": jpeg_bytes(24, 32, seed=20 + n), "cls": str(n % 3).encode()}
            if n not in (4, 9):
                members["txt"] = f"caption {n}".encode()
            for ext, data in members.items():
                info = tarfile.TarInfo(f"sample{n:04d}.{ext}")
                info.size, info.mtime = len(data), 0
                tar.addfile(info, io.BytesIO(data))
    return path


def _parquet(path: Path) -> Path:
    """A Parquet file of 20 rows: encoded image bytes, an int label and a caption."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "image": pa.array([{"bytes": jpeg_bytes(20, 28, seed=40 + n), "path": None} for n in range(20)],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "label": pa.array([n % 5 for n in range(20)], pa.int64()),
        "caption": pa.array([f"row {n}" for n in range(20)]),
    })
    pq.write_table(table, path, row_group_size=8)
    return path


def convert_with(checkout: Path, sources: list[str], out: Path, flags: list[str]) -> tuple[int, str]:
    """Run ``shardfmt convert`` of `checkout`; return its exit status and stderr."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    run = subprocess.run([sys.executable, "-m", "shardfmt", "convert", *sources, str(out), *FLAGS, *flags], env=env,
                         capture_output=True, text=True, cwd=checkout, check=False)
    return run.returncode, run.stderr.strip()


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under `root` by relative path (none: the output was not written)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} if root.exists() else {}


def compare(base: Path, new: Path, work: Path) -> int:
    """Convert every case with both checkouts under `work`; print one line per case; return the number that differ."""
    differing = 0
    for name, sources, flags in make_sources(work / "src"):
        runs = {}
        for side, checkout in (("base", base), ("new", new)):
            out = work / side / name
            status, stderr = convert_with(checkout, sources, out, flags)
            runs[side] = (status, stderr, files_of(out))
        (base_status, base_err, base_files), (new_status, new_err, new_files) = runs["base"], runs["new"]
        differ = sorted(p for p in set(base_files) | set(new_files) if base_files.get(p) != new_files.get(p))
        same = base_status == new_status and not differ and base_err == new_err
        differing += not same
        detail = f"{len(base_files)} files, {sum(map(len, base_files.values())):,} bytes" if same else (
            f"exit {base_status} vs {new_status}; differ: {', '.join(differ) or 'none'}; stderr: {base_err!r} vs {new_err!r}")
        print(f"{name:24} {'identical' if same else 'DIFFERENT'}: {detail}")
    return differing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the checkout to compare against (its root folder)")
    parser.add_argument("new", type=Path, help="the checkout under test")
    parser.add_argument("--keep", type=Path, default=None, help="write sources and outputs here and keep them")
    args = parser.parse_args()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
        return 1 if compare(args.base.resolve(), args.new.resolve(), args.keep) else 0
    with tempfile.TemporaryDirectory(prefix="shardfmt-compare-") as work:
        return 1 if compare(args.base.resolve(), args.new.resolve(), Path(work)) else 0


if __name__ == "__main__":
    sys.exit(main())
