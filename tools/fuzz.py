"""A time-budgeted mutation campaign against every input shardfmt reads.

Three kinds of input, each from valid seeds that are generated afresh (never committed):

- ``binary``: binary shards, seeded with the golden vectors ``spec/vectors/v*/valid/*.shard``;
- ``tar``: WebDataset tars with their member index, written by `TarShardWriter` and by the
  ``webdataset`` library's ``TarWriter`` from small generated JPEGs; a mutant changes the tar,
  the index or both;
- ``manifest``: manifest.json of small valid datasets (binary shards, tar shards, tars indexed
  in place, the golden datasets), changed as bytes or as JSON (wrong types, huge numbers, NaN,
  repeated and missing keys, path tricks).

Each mutant is opened and every record and field is read (and checksummed); a tar is indexed
anew and scanned; a dataset is read through `open_dataset`, checked by `verify_dataset` (full
and quick) and summarised by `summarise_dataset`. The rule under test: whatever the input,
shardfmt raises only `ShardfmtError`. A finding is

- any other exception, or no result within ``--hang-seconds``;
- an inconsistency: a tar that `index_tar` indexed but whose index `TarShardReader` refuses (read
  with the schema the indexing found: without labels when no sample has a label member), or a
  dataset that `verify_dataset` passes but that cannot be read;
- a record read from a file outside the dataset root (the datasets lie beside a shard, a tar
  and an index named ``outside.*`` whose keys start with "outside").

A finding is saved under ``--out`` as ``KIND-INDEX/`` (the input files under ``input/`` and
``finding.json``: seed, mutation, traceback), at most ``--keep`` per distinct signature, and the
campaign goes on. Mutation number i of a kind is a function of ``--seed``, the kind and i alone,
and a campaign runs the mutations 0, 1, 2, ... in chunks, so two campaigns with the same seed that
ran the same number of mutations ran the same mutants, whatever ``--jobs``.

Usage:
    python tools/fuzz.py --seconds 60                        # each kind for 60 s, 1 process
    python tools/fuzz.py --kinds tar,manifest --seconds 300 --jobs 2 --seed 7
    python tools/fuzz.py --kinds binary --mutations 20000     # exactly mutations 0..19999
    python tools/fuzz.py --replay fuzz-out/tar-00001234       # run one reproducer again

It prints the rate of each kind and a summary, writes ``OUT/summary.json``, and exits with
status 1 if there was a finding.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fuzz_loader  # noqa: E402
import simplejpeg  # noqa: E402
from fuzz_mutations import (  # noqa: E402
    encode_json,
    index_records,
    mutate_binary_structure,
    mutate_bytes,
    mutate_index,
    mutate_json,
    mutate_paths,
    mutate_tar,
    shard_hot_ranges,
)
from PIL import Image  # noqa: E402

import shardfmt  # noqa: E402
from shardfmt import DatasetWriter
from shardfmt._dataset.reader import open_dataset  # noqa: E402
from shardfmt._dataset.summary import summarise_dataset  # noqa: E402
from shardfmt._dataset.tars import index_tars  # noqa: E402
from shardfmt._dataset.verify import verify_dataset  # noqa: E402
from shardfmt._errors import ShardfmtError  # noqa: E402
from shardfmt._synthetic import make_image  # noqa: E402
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.format._fieldtypes import IMAGE_TYPES  # noqa: E402
from shardfmt.format._reader import ShardReader  # noqa: E402
from shardfmt.format._schema import tar_schema  # noqa: E402
from shardfmt.tar._index import index_tar  # noqa: E402
from shardfmt.tar._reader import TarShardReader  # noqa: E402
from shardfmt.tar._scan import iter_tar_samples  # noqa: E402
from shardfmt.tar._writer import TarShardWriter  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = os.path.dirname(shardfmt.__file__) + os.sep
KINDS = ("binary", "tar", "manifest")
LOADER_KIND = "loader"
"""The Loader's arguments and states (`fuzz_loader`): run in this process, after the file kinds."""
OUTSIDE = "outside"
"""Key prefix of the records of the files beside the datasets, that no manifest may reach."""
T = TypeVar("T")


# -- seeds -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Seed:
    """A valid input: its files by path relative to its folder, and for a tar its index rows."""

    name: str
    files: dict[str, bytes]
    rows: tuple[dict[str, Any], ...] = ()

    def __repr__(self) -> str:
        # short: a failing property test prints every seed it drew, and the files are bytes
        sizes = ", ".join(f"{name}: {len(data)} bytes" for name, data in self.files.items())
        return f"Seed({self.name!r}, {{{sizes}}})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # the pretty-printer Hypothesis uses would list every field


@dataclass(frozen=True)
class Corpus:
    """The seeds of every kind, and the files that lie beside the datasets."""

    binary: tuple[Seed, ...]
    tar: tuple[Seed, ...]
    manifest: tuple[Seed, ...]
    outside: dict[str, bytes]

    def seeds(self, kind: str) -> tuple[Seed, ...]:
        return getattr(self, kind)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        # short: a failing property test prints its fixtures, and the corpus holds about 800 kB
        return f"Corpus({len(self.binary)} binary, {len(self.tar)} tar, {len(self.manifest)} manifest seeds)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # the pretty-printer Hypothesis uses would list every field


def jpeg(height: int, width: int, seed: int) -> bytes:
    data: bytes = simplejpeg.encode_jpeg(make_image(height, width, seed=seed), quality=85, colorsubsampling="420")
    return data


def exif_jpeg(seed: int) -> bytes:
    """A JPEG with an EXIF orientation, so that mutations reach the EXIF parser."""
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.fromarray(make_image(14, 18, seed=seed)).save(out, "JPEG", exif=exif, quality=80)
    return out.getvalue()


def _files(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def _our_tar(path: Path, keys: Sequence[str], *, first_seed: int) -> None:
    with TarShardWriter(path) as writer:
        for i, key in enumerate(keys):
            writer.write(key, image=jpeg(10 + 3 * i, 12 + 2 * i, first_seed + i), label=i, meta={"n": i} if i % 2 else None)


def _webdataset_tar(path: Path, samples: Sequence[dict[str, Any]], fmt: str) -> None:
    import webdataset

    with webdataset.TarWriter(str(path), user="", group="", mode=0o644, mtime=0.0, format=fmt) as writer:
        for sample in samples:
            writer.write(sample)


def _webdataset_samples(first_seed: int) -> list[dict[str, Any]]:
    return [
        {"__key__": "s/000", "jpg": jpeg(12, 16, first_seed), "cls": b"1", "txt": b"caption"},
        {"__key__": "s/001", "jpg": exif_jpeg(first_seed + 1), "cls": b"0"},
        {"__key__": "s/002", "JPG": jpeg(9, 13, first_seed + 2), "cls": b"2"},
        {"__key__": "s/003", "jpg": jpeg(8, 8, first_seed + 3)},  # no label: left out of the index
    ]


def build_corpus(folder: Path) -> Corpus:
    """Generate every seed in `folder` (the same bytes on every run) and read them back."""
    binary = tuple(
        Seed(f"{path.parent.parent.name}/{path.stem}", {"fuzz.shard": path.read_bytes()})
        for path in sorted(ROOT.glob("spec/vectors/v*/valid/*.shard"))
    )
    tars = folder / "tars"
    tars.mkdir(parents=True)
    _our_tar(tars / "ours.tar", ["plain", "dir/sub/" + "long" * 30, "v1.2/dotted-dir", "caf\udce9"], first_seed=10)
    _our_tar(tars / "small.tar", ["a", "b"], first_seed=20)
    _webdataset_tar(tars / "wds.tar", _webdataset_samples(30), "USTAR_FORMAT")
    long_samples = [dict(sample, __key__="g/" + "n" * 120 + sample["__key__"][-3:]) for sample in _webdataset_samples(40)]
    _webdataset_tar(tars / "wds-gnu.tar", long_samples, "GNU_FORMAT")
    tar_seeds = []
    for name in ("ours", "small", "wds", "wds-gnu"):
        path = tars / f"{name}.tar"
        if name.startswith("wds"):
            index_tar(path)
        index = path.read_bytes(), (tars / f"{name}.tar.idx").read_bytes()
        tar_seeds.append(Seed(name, {"fuzz.tar": index[0], "fuzz.tar.idx": index[1]}, tuple(index_records(index[1]))))

    datasets = folder / "datasets"
    manifests = []
    for shard_format in ("binary", "tar"):
        root = datasets / shard_format
        classes = ["a", "b", "c"]
        with DatasetWriter(root, schema=IMAGE_CLASSIFICATION, shard_size=1500, classes=classes, shard_format=shard_format) as writer:
            for i in range(5):
                writer.write({"image": jpeg(10 + i, 14, 50 + i), "label": i % 3, "key": f"r{i}"})
        manifests.append(Seed(shard_format, _files(root)))
    indexed = datasets / "indexed"
    indexed.mkdir()
    _webdataset_tar(indexed / "part-0.tar", _webdataset_samples(60), "USTAR_FORMAT")
    _webdataset_tar(indexed / "part-1.tar", _webdataset_samples(70)[:2], "PAX_FORMAT")
    index_tars([indexed])
    manifests.append(Seed("indexed", _files(indexed)))
    for version in sorted(ROOT.glob("spec/vectors/v*/dataset")):
        manifests.append(Seed(version.parent.name, _files(version)))

    outside = datasets / OUTSIDE
    with DatasetWriter(outside / "b", schema=IMAGE_CLASSIFICATION, classes=["a", "b", "c"]) as writer:
        writer.write({"image": jpeg(10, 10, 90), "label": 0, "key": f"{OUTSIDE}-binary"})
    _our_tar(outside / "outside.tar", [f"{OUTSIDE}-tar"], first_seed=91)
    sentinel = {
        "outside.shard": (outside / "b" / "shard-00000.shard").read_bytes(),
        "outside.tar": (outside / "outside.tar").read_bytes(),
        "outside.tar.idx": (outside / "outside.tar.idx").read_bytes(),
    }
    return Corpus(binary, tuple(tar_seeds), tuple(manifests), sentinel)


# -- mutants ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    """Mutation `index` of `kind`: the seed it changed, the files it changed, and how."""

    kind: str
    index: int
    seed: Seed
    changed: dict[str, bytes]
    notes: tuple[str, ...]

    def files(self) -> dict[str, bytes]:
        return {**self.seed.files, **self.changed}


def make_mutant(corpus: Corpus, kind: str, *, seed: int, index: int, scratch: Path) -> Mutant:
    """Mutation number `index` of `kind` in the campaign of `seed` (`scratch`: a folder for
    temporary files; it does not change the result)."""
    rng = random.Random(f"shardfmt-fuzz/{seed}/{kind}/{index}")
    seeds = corpus.seeds(kind)
    chosen = rng.choice(seeds)
    notes: list[str]
    if kind == "binary":
        data = chosen.files["fuzz.shard"]
        if rng.random() < 0.35:
            new, notes = mutate_binary_structure(rng, data)
        else:
            donors = [s.files["fuzz.shard"] for s in seeds]
            new, notes = mutate_bytes(rng, data, donors=donors, hot=shard_hot_ranges(data))
        changed = {"fuzz.shard": new}
    elif kind == "tar":
        target = rng.choice(["tar", "tar", "index", "both"])
        changed, notes = {}, []
        tar = chosen.files["fuzz.tar"]
        if target in ("tar", "both"):
            donors = [s.files["fuzz.tar"] for s in seeds]
            changed["fuzz.tar"], more = mutate_tar(rng, tar, donors=donors)
            notes += [f"tar: {note}" for note in more]
        if target in ("index", "both"):
            rows = list(chosen.rows)
            changed["fuzz.tar.idx"], more = mutate_index(rng, chosen.files["fuzz.tar.idx"], rows, folder=scratch, tar_size=len(tar))
            notes += [f"index: {note}" for note in more]
    else:
        text = chosen.files["manifest.json"]
        roll = rng.random()
        if roll < 0.2:
            new, notes = mutate_bytes(rng, text)
        elif roll < 0.4:
            document, notes = mutate_paths(rng, json.loads(text), names=sorted(chosen.files))
            new = encode_json(document).encode()
        else:
            document, notes = mutate_json(rng, json.loads(text), totals=True)
            new = encode_json(document).encode()
        changed = {"manifest.json": new}
    return Mutant(kind, index, chosen, changed, tuple(notes))


# -- reading every byte ----------------------------------------------------------------------------


class Inconsistency(Exception):
    """Two parts of shardfmt disagree about one input (see the module docstring)."""


class RootEscape(Exception):
    """A record was read from a file outside the dataset root."""


class Hang(BaseException):
    """No result within the time allowed; a BaseException, so that no `except Exception` in the
    code under test turns it into something else."""


def attempt(action: Callable[[], T]) -> T | None:
    """Run `action`; a ShardfmtError is an expected answer (None), anything else goes on up."""
    try:
        return action()
    except ShardfmtError:
        return None


def succeeds(action: Callable[[], object]) -> bool:
    """Run `action`: True if it returned, False if it raised a ShardfmtError."""
    try:
        action()
    except ShardfmtError:
        return False
    return True


def read_records(reader: Any) -> int:
    """Verify and read every field of every record of a `ShardReader` or `TarShardReader`; return
    how many records read whole."""
    images = [f.name for f in reader.schema.fields if f.type in IMAGE_TYPES]
    whole = 0
    for index in range(len(reader)):
        ok = succeeds(lambda: reader.verify_record(index))  # noqa: B023
        record = reader.record(index)
        for name in reader.schema.names:
            try:
                value = record[name]
            except ShardfmtError:
                ok = False
                continue
            if name == "key" and isinstance(value, str) and value.startswith(OUTSIDE):
                raise RootEscape(f"record {index} of {reader.path} has the key {value!r}: the file lies outside the dataset")
        for name in images:
            record.image_info(name)
        if isinstance(reader, TarShardReader):
            ok = succeeds(lambda: reader.members(index)) and ok  # noqa: B023
        whole += ok
    return whole


def check_binary(folder: Path, changed: Sequence[str]) -> None:
    reader = attempt(lambda: ShardReader(folder / "fuzz.shard", verify=False))
    if reader is not None:
        with reader:
            read_records(reader)


def check_tar(folder: Path, changed: Sequence[str]) -> None:
    tar, index = folder / "fuzz.tar", folder / "fuzz.tar.idx"
    reader = attempt(lambda: TarShardReader(tar, index=index, verify=False))
    if reader is not None:
        with reader:
            read_records(reader)
    if "fuzz.tar" not in changed:
        return
    rebuilt = folder / "rebuilt.idx"
    info = attempt(lambda: index_tar(tar, index=rebuilt))
    if info is not None:
        try:
            # a tar left without any label member is indexed unlabelled (spec/tar.md, section 3):
            # its index is read as a dataset without labels, as open_dataset and index_tars read it
            with TarShardReader(tar, index=rebuilt, verify=True, schema=tar_schema(labelled=info.labelled)) as reader:
                whole = read_records(reader)
        except ShardfmtError as err:
            raise Inconsistency(f"index_tar indexed the tar, but its index cannot be read: {err}") from err
        if whole != info.tar.num_records:
            raise Inconsistency(f"index_tar indexed {info.tar.num_records} records, but {whole} read whole")
    attempt(lambda: sum(1 for _ in iter_tar_samples(tar)))


def check_manifest(folder: Path, changed: Sequence[str]) -> None:
    reader = attempt(lambda: open_dataset(folder, verify=False))
    if reader is not None:
        with reader:
            for number, count in enumerate(reader.cumulative[1:] - reader.cumulative[:-1]):
                shard = attempt(lambda: reader.shard(number))  # noqa: B023
                if shard is None:
                    continue
                read_records(shard)
                if count:
                    first = int(reader.cumulative[number])
                    reader[first], reader[first + int(count) - 1]  # noqa: B018
    report = attempt(lambda: verify_dataset(folder))
    attempt(lambda: verify_dataset(folder, quick=True))
    attempt(lambda: summarise_dataset(folder))
    if report is not None and report.ok:
        try:
            with open_dataset(folder, verify=True) as dataset:
                for record in dataset:
                    for name in dataset.schema.names:
                        record[name]  # noqa: B018
        except ShardfmtError as err:
            raise Inconsistency(f"verify_dataset passed the dataset, but reading it failed: {err}") from err


CHECKS: dict[str, Callable[[Path, Sequence[str]], None]] = {"binary": check_binary, "tar": check_tar, "manifest": check_manifest}


# -- one process's share ---------------------------------------------------------------------------


@dataclass
class Finding:
    """One input that broke the rule; `files` is what a reproducer holds."""

    kind: str
    index: int
    seed_name: str
    notes: tuple[str, ...]
    signature: str
    exception: str
    traceback: str
    files: dict[str, bytes]
    changed: tuple[str, ...]


def signature(error: BaseException) -> str:
    """The exception type and the innermost frame of shardfmt that raised it (of the cause, for
    an inconsistency): one signature per bug, whatever input reaches it."""
    cause = error.__cause__ if isinstance(error, Inconsistency) and error.__cause__ is not None else error
    frames = traceback.extract_tb(cause.__traceback__)
    inside = [f for f in frames if f.filename.startswith(PACKAGE)] or frames
    where = f"{Path(inside[-1].filename).name}:{inside[-1].lineno} ({inside[-1].name})" if inside else "?"
    name = type(error).__name__
    return f"{name}: {type(cause).__name__} at {where}" if cause is not error else f"{name} at {where}"


class Worker:
    """Runs mutations in one process: the seeds' files are laid out once in `folder`, and each
    mutant only rewrites the files it changes."""

    def __init__(self, corpus: Corpus, folder: Path, *, seed: int, hang_seconds: float) -> None:
        self.corpus = corpus
        self.folder = folder
        self.seed = seed
        self.hang_seconds = hang_seconds
        self.scratch = folder / "scratch"
        self.scratch.mkdir(parents=True)
        self._disk: dict[Path, bytes] = {}
        self._folders: dict[tuple[str, int], Path] = {}
        for name, data in corpus.outside.items():
            self._put(folder / "manifest" / name, data)
        self._alarm = (
            hang_seconds > 0
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        )
        if self._alarm:
            signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        raise Hang(f"no result within {self.hang_seconds} s")

    def close(self) -> None:
        if self._alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def _put(self, path: Path, data: bytes) -> None:
        """Write `data` at `path` under a new inode (a map of the old file stays valid)."""
        if self._disk.get(path) is data:
            return
        if path not in self._disk:
            path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(path.name + ".new")
        temp.write_bytes(data)
        os.replace(temp, path)
        self._disk[path] = data

    def seed_folder(self, kind: str, seed: Seed) -> Path:
        key = (kind, self.corpus.seeds(kind).index(seed))
        if key not in self._folders:
            self._folders[key] = self.folder / kind / str(key[1])
        return self._folders[key]

    def check(self, mutant: Mutant) -> Finding | None:
        """Lay out `mutant`'s files, read them, and return a finding or None."""
        folder = self.seed_folder(mutant.kind, mutant.seed)
        for name, data in mutant.files().items():
            self._put(folder / name, data)
        if self._alarm:
            signal.setitimer(signal.ITIMER_REAL, self.hang_seconds)
        try:
            CHECKS[mutant.kind](folder, list(mutant.changed))
        except ShardfmtError:
            return None
        except (Exception, Hang) as err:
            return Finding(
                mutant.kind,
                mutant.index,
                mutant.seed.name,
                mutant.notes,
                signature(err),
                f"{type(err).__name__}: {err}"[:2000],
                "".join(traceback.format_exception(err)),
                mutant.files(),
                tuple(mutant.changed),
            )
        finally:
            if self._alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        return None

    def run(self, kind: str, start: int, stop: int, keep: int) -> tuple[int, list[Finding], dict[str, int]]:
        """Run mutations [start, stop) of `kind`; return (count, findings with files, at most
        `keep` per signature, and the number of findings per signature)."""
        findings: list[Finding] = []
        counts: dict[str, int] = {}
        for index in range(start, stop):
            mutant = make_mutant(self.corpus, kind, seed=self.seed, index=index, scratch=self.scratch)
            finding = self.check(mutant)
            if finding is not None:
                counts[finding.signature] = counts.get(finding.signature, 0) + 1
                if counts[finding.signature] <= keep:
                    findings.append(finding)
        return stop - start, findings, counts


_WORKER: Worker | None = None


def _start_worker(corpus: Corpus, folder: str, seed: int, hang_seconds: float) -> None:
    global _WORKER
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the parent's handler is not this worker's
    _WORKER = Worker(corpus, Path(tempfile.mkdtemp(dir=folder)), seed=seed, hang_seconds=hang_seconds)


def _run_chunk(kind: str, start: int, stop: int, keep: int) -> tuple[int, list[Finding], dict[str, int]]:
    if _WORKER is None:
        raise RuntimeError("no worker: the pool's initializer starts one")
    return _WORKER.run(kind, start, stop, keep)


# -- the campaign ----------------------------------------------------------------------------------


@dataclass
class KindResult:
    """What a campaign did with one kind."""

    mutations: int = 0
    seconds: float = 0.0
    findings: int = 0

    @property
    def per_second(self) -> float:
        return self.mutations / self.seconds if self.seconds else 0.0


@dataclass
class Campaign:
    """What a campaign did: per kind, and every distinct finding with its saved reproducers."""

    seed: int
    jobs: int
    kinds: dict[str, KindResult] = field(default_factory=dict)
    signatures: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def num_findings(self) -> int:
        return sum(entry["count"] for entry in self.signatures.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "jobs": self.jobs,
            "kinds": {
                kind: {
                    "mutations": r.mutations,
                    "seconds": round(r.seconds, 3),
                    "per_second": round(r.per_second, 1),
                    "findings": r.findings,
                }
                for kind, r in self.kinds.items()
            },
            "mutations": sum(r.mutations for r in self.kinds.values()),
            "findings": [{"signature": s, **entry} for s, entry in self.signatures.items()],
        }


def save_reproducer(out: Path, finding: Finding, *, seed: int, outside: dict[str, bytes]) -> Path:
    """Write `finding`'s input files and finding.json under `out`; return its folder."""
    folder = out / f"{finding.kind}-{finding.index:08d}"
    shutil.rmtree(folder, ignore_errors=True)
    for name, data in finding.files.items():
        (folder / "input" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "input" / name).write_bytes(data)
    if finding.kind == "manifest":
        for name, data in outside.items():
            (folder / name).write_bytes(data)
    document = {
        "kind": finding.kind,
        "campaign_seed": seed,
        "mutation": finding.index,
        "seed_input": finding.seed_name,
        "mutation_steps": list(finding.notes),
        "changed_files": list(finding.changed),
        "signature": finding.signature,
        "exception": finding.exception,
        "traceback": finding.traceback,
        "replay": f"python tools/fuzz.py --replay {folder}",
    }
    (folder / "finding.json").write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return folder


class Printer:
    """Prints a progress line at most every `every` seconds (never for 0)."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.last = time.monotonic()

    def progress(self, kind: str, done: int, started: float, findings: int) -> None:
        now = time.monotonic()
        if self.every > 0 and now - self.last >= self.every:
            self.last = now
            print(f"  {kind}: {done:,} mutations, {done / (now - started):,.0f}/s, {findings} findings", flush=True)


def run_kind(
    kind: str,
    campaign: Campaign,
    *,
    submit: Callable[[int, int], Any],
    collect: Callable[[Any], tuple[int, list[Finding], dict[str, int]]],
    jobs: int,
    seconds: float,
    limit: int | None,
    out: Path,
    keep: int,
    outside: dict[str, bytes],
    printer: Printer,
) -> KindResult:
    """Hand out chunks of mutation numbers until the time or the count runs out; every chunk
    handed out is finished, so the mutations run are 0 .. N-1."""
    result = KindResult()
    started = time.monotonic()
    deadline = started + seconds
    chunk, next_start = 16, 0
    pending: deque[tuple[Any, int]] = deque()

    def more() -> bool:
        return (limit is None or next_start < limit) and time.monotonic() < deadline

    while True:
        while len(pending) < 2 * jobs and more():
            stop = next_start + chunk if limit is None else min(limit, next_start + chunk)
            pending.append((submit(next_start, stop), stop - next_start))
            next_start = stop
        if not pending:
            break
        handle, _ = pending.popleft()
        count, findings, counts = collect(handle)
        result.mutations += count
        for name, number in counts.items():
            entry = campaign.signatures.setdefault(name, {"kind": kind, "count": 0, "reproducers": []})
            entry["count"] += number
            result.findings += number
        for finding in findings:
            entry = campaign.signatures[finding.signature]
            if len(entry["reproducers"]) < keep:
                entry["reproducers"].append(str(save_reproducer(out, finding, seed=campaign.seed, outside=outside)))
        rate = result.mutations / max(time.monotonic() - started, 1e-3)
        chunk = max(8, min(2000, int(rate * 0.5 / jobs)))
        printer.progress(kind, result.mutations, started, result.findings)
    result.seconds = time.monotonic() - started
    return result


def check_seeds(worker: Worker) -> None:
    """Every seed must read whole, checksums verified, and pass its check: the campaign proves
    that valid input is accepted before it says anything about invalid input."""
    for kind in KINDS:
        for seed in worker.corpus.seeds(kind):
            folder = worker.seed_folder(kind, seed)
            for name, data in seed.files.items():
                worker._put(folder / name, data)
            try:
                _read_seed(kind, seed, folder)
                CHECKS[kind](folder, list(seed.files))
            except BaseException as err:
                raise RuntimeError(f"seed {kind}/{seed.name} does not read cleanly: {err!r}") from err


def _read_seed(kind: str, seed: Seed, folder: Path) -> None:
    if kind == "manifest":
        report = verify_dataset(folder)
        if not report.ok:
            raise report.problems[0]
        with open_dataset(folder) as dataset:
            expected = len(dataset)
            whole = sum(read_records(dataset.shard(i)) for i in range(len(dataset.manifest.shards)))
    elif kind == "binary":
        with ShardReader(folder / "fuzz.shard") as reader:
            expected, whole = len(reader), read_records(reader)
    else:
        with TarShardReader(folder / "fuzz.tar", index=folder / "fuzz.tar.idx") as reader:
            expected, whole = len(seed.rows), read_records(reader)
    if whole != expected:
        raise RuntimeError(f"{whole} of {expected} records read whole")


def _dispatch(kind: str, pool: Any, local: Worker, keep: int) -> tuple[Callable[[int, int], Any], Callable[[Any], Any]]:
    """How `run_kind` hands out a chunk and collects its result: in this process, or in the pool."""
    if pool is None:
        return (lambda start, stop: (start, stop)), (lambda task: local.run(kind, task[0], task[1], keep))
    return (lambda start, stop: pool.apply_async(_run_chunk, (kind, start, stop, keep))), (lambda handle: handle.get())


def campaign(
    *,
    kinds: Sequence[str],
    seconds: float,
    mutations: int | None,
    seed: int,
    jobs: int,
    out: Path,
    keep: int = 3,
    hang_seconds: float = 20.0,
    progress: float = 30.0,
    work_dir: Path | None = None,
) -> Campaign:
    """Run the campaign; see the module docstring. Work files live in a temporary folder under
    `work_dir` (default: `default_work_dir()`) that is removed at the end; reproducers and
    summary.json go to `out`."""
    work_dir = default_work_dir() if work_dir is None else work_dir
    result = Campaign(seed, jobs)
    out.mkdir(parents=True, exist_ok=True)
    printer = Printer(progress)
    with tempfile.TemporaryDirectory(prefix="shardfmt-fuzz-", dir=work_dir) as temp:
        corpus = build_corpus(Path(temp) / "seeds")
        local = Worker(corpus, Path(temp) / "main", seed=seed, hang_seconds=hang_seconds)
        try:
            check_seeds(local)
            print(
                f"seeds: {len(corpus.binary)} binary, {len(corpus.tar)} tar, {len(corpus.manifest)} datasets; seed {seed}, {jobs} job(s)",
                flush=True,
            )
            pool = None
            if jobs > 1:
                pool = multiprocessing.get_context("fork").Pool(jobs, _start_worker, (corpus, temp, seed, hang_seconds))
            try:
                for kind in [kind for kind in kinds if kind != LOADER_KIND]:
                    submit, collect = _dispatch(kind, pool, local, keep)
                    done = run_kind(
                        kind,
                        result,
                        submit=submit,
                        collect=collect,
                        jobs=jobs,
                        seconds=seconds,
                        limit=mutations,
                        out=out,
                        keep=keep,
                        outside=corpus.outside,
                        printer=printer,
                    )
                    result.kinds[kind] = done
                    print(
                        f"{kind:>8}: {done.mutations:>10,} mutations in {done.seconds:7.1f} s = {done.per_second:>8,.0f}/s, "
                        f"{done.findings} findings",
                        flush=True,
                    )
            except BaseException:
                if pool is not None:
                    pool.terminate()
                raise
            if pool is not None:
                pool.close()
                pool.join()
        finally:
            local.close()
    if LOADER_KIND in kinds:
        run_loader_kind(result, seconds=seconds, limit=mutations, hang_seconds=hang_seconds, out=out, keep=keep, work_dir=work_dir)
    (out / "summary.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def run_loader_kind(
    result: Campaign, *, seconds: float, limit: int | None, hang_seconds: float, out: Path, keep: int, work_dir: Path
) -> None:
    """The ``loader`` kind: cases of `fuzz_loader`, in this process (a loader starts processes of
    its own), each finding saved as finding.json with the case's source."""
    done = fuzz_loader.campaign(seed=result.seed, seconds=seconds, limit=limit, hang_seconds=hang_seconds, work_dir=work_dir)
    kind = KindResult(done.cases, done.seconds, len(done.findings or []))
    result.kinds[LOADER_KIND] = kind
    for finding in done.findings or []:
        entry = result.signatures.setdefault(finding.signature, {"kind": LOADER_KIND, "count": 0, "reproducers": []})
        entry["count"] += 1
        if len(entry["reproducers"]) < keep:
            folder = out / f"{LOADER_KIND}-{finding.index:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            document = {
                "kind": LOADER_KIND,
                "campaign_seed": result.seed,
                "index": finding.index,
                "hang_seconds": hang_seconds,
                "case": finding.source,
                "signature": finding.signature,
                "exception": finding.message,
                "traceback": finding.trace,
                "replay": f"python tools/fuzz.py --replay {folder}",
            }
            (folder / "finding.json").write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
            entry["reproducers"].append(str(folder))
    print(
        f"{LOADER_KIND:>8}: {done.cases:>10,} cases in {done.seconds:7.1f} s = {kind.per_second:>8,.1f}/s "
        f"({done.batches} batches, {done.refused} refused at the door), {kind.findings} findings",
        flush=True,
    )


def default_work_dir() -> Path:
    """/dev/shm where it can be written (a mutant is written in about 30 us there, against
    0.5 ms or more on a disk that flushes on rename), else the system's temporary folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def replay(folder: Path) -> int:
    """Run the check of one reproducer again and print what it raises; 1 if it still fails."""
    document = json.loads((folder / "finding.json").read_text())
    if document["kind"] == LOADER_KIND:
        return fuzz_loader.replay(document)
    with tempfile.TemporaryDirectory(prefix="shardfmt-fuzz-") as temp:
        shutil.copytree(folder, Path(temp) / "finding")
        work = Path(temp) / "finding" / "input"
        try:
            CHECKS[document["kind"]](work, document["changed_files"])
        except ShardfmtError as err:
            print(f"raised only a ShardfmtError: {err}")
            return 0
        except Exception:
            traceback.print_exc()
            return 1
    print("no finding")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="time for each kind (default 60)")
    parser.add_argument("--mutations", type=int, default=None, help="at most this many mutations of each kind")
    parser.add_argument("--seed", type=int, default=0, help="the campaign's seed (default 0)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"), help="where reproducers and summary.json go (default fuzz-out)")
    parser.add_argument(
        "--kinds", default=",".join((*KINDS, LOADER_KIND)), help=f"comma-separated, of {', '.join((*KINDS, LOADER_KIND))} (default all)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--keep", type=int, default=3, help="reproducers saved per distinct finding (default 3)")
    parser.add_argument(
        "--hang-seconds", type=float, default=20.0, help="a mutant that takes longer is a finding; 0: no limit (default 20)"
    )
    parser.add_argument("--progress", type=float, default=30.0, help="seconds between progress lines; 0: none (default 30)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the temporary work folder goes (default /dev/shm, else TMPDIR)")
    parser.add_argument("--replay", type=Path, default=None, help="run the reproducer in this folder again, and nothing else")
    args = parser.parse_args(argv)
    args.kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    unknown = sorted(set(args.kinds) - {*KINDS, LOADER_KIND})
    if unknown or not args.kinds:
        parser.error(f"unknown kinds {unknown}; choose from {', '.join((*KINDS, LOADER_KIND))}")
    if args.jobs < 1 or (args.mutations is not None and args.mutations < 0) or args.seconds < 0:
        parser.error("--jobs must be at least 1, --mutations and --seconds at least 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replay is not None:
        return replay(args.replay)
    result = campaign(
        kinds=args.kinds,
        seconds=args.seconds,
        mutations=args.mutations,
        seed=args.seed,
        jobs=args.jobs,
        out=args.out,
        keep=args.keep,
        hang_seconds=args.hang_seconds,
        progress=args.progress,
        work_dir=args.work_dir,
    )
    total = sum(r.mutations for r in result.kinds.values())
    seconds = sum(r.seconds for r in result.kinds.values())
    print(f"total: {total:,} mutations in {seconds:.1f} s ({total / max(seconds, 1e-9):,.0f}/s), {result.num_findings} findings")
    for name, entry in result.signatures.items():
        print(f"  FINDING x{entry['count']} ({entry['kind']}): {name}")
        for folder in entry["reproducers"]:
            print(f"    {folder}")
    return 1 if result.num_findings else 0


if __name__ == "__main__":
    sys.exit(main())
