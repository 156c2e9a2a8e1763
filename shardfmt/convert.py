"""`convert`: image folders, listings or WebDataset tars become a dataset, in parallel and resumably.

Inputs (`scan.py` has the details). A folder is read as torchvision's ImageFolder: each
sub-folder is a class, classes sorted by name as plain strings and numbered from 0, files found
recursively (following symbolic links) in torchvision's order. A ``.csv`` (``path,label``) or
``.jsonl`` (``{"path": ..., "label": ...}``) listing names files relative to its folder; labels
are all integers (no class names) or all strings (class names sorted, label = index). A record's
key is its path relative to the source root, '/'-separated, without the last extension.
WebDataset tars (a ``.tar`` file, a brace pattern, or a folder of ``.tar`` files only) are read in
place: each sample's image member with one ``pread``, its label from its ``.cls`` member, its key
kept; classes are the labels in decimal.

Output: binary shards, or with ``shard_format="tar"`` WebDataset tars with a member index each
(spec/tar.md), under the same manifest. A tar key cannot hold a dot in its last part, so there
each dot becomes "_" (``img.001`` -> ``img_001``); a record whose key still cannot be a tar key is
rejected as "bad-key", one whose key repeats in its shard as "duplicate-key", and one whose label is
outside [0, 2^20) as "bad-label".

Awkward inputs are handled on purpose, and every file that does not become a record is listed in
``rejects.jsonl`` (path, reason, detail, and for a sample of a tar its key) in input order:

- the content decides, not the name: every regular file is a candidate, a text file is rejected
  as "not-an-image", a PNG named ``.JPEG`` is converted;
- a baseline 8-bit JPEG with 1 or 3 components, no EXIF rotation and within ``max_side`` is kept
  byte for byte once a strict reduced-scale decode accepts it; a truncated or damaged one is
  rejected as "corrupt", never kept;
- grayscale JPEGs are kept (one channel; the loader decodes them to RGB);
- CMYK/YCCK, progressive and EXIF-rotated JPEGs and other formats Pillow opens (PNG, BMP, GIF,
  WebP, TIFF, ...) are decoded, turned upright, converted to RGB (L for grayscale sources, alpha
  dropped) and re-encoded as baseline JPEG at ``quality``; a progressive JPEG needing nothing
  else keeps its quantisation tables; ``max_side`` shrinks only larger images, keeping the aspect
  ratio; the manifest counts re-encodes by reason;
- "empty": a zero-byte file; "corrupt": a decoder failed; "too-large": over 89,478,485 pixels
  (read from the header, before decoding; Pillow's decompression-bomb warnings become this
  reject too), a side over libjpeg's 65,500 pixels, or a file over 1 GiB; "unreadable": the operating
  system refused (its message is the detail), a broken symbolic link, or not a regular file;
- "hidden": a file or folder whose name starts with "." is skipped (a hidden folder is not
  entered and is no class); "symlink-loop": a folder reached through a symbolic link that is one
  of its own ancestors (same st_dev and st_ino) is not entered again; "no-class": a file directly
  in the root folder;
- a class folder with no records keeps its class, so labels match torchvision's; the manifest
  counts such classes in ``stats.empty_classes``;
- the hidden-file rule is for discovery only: a path a listing names is converted even if hidden;
- file names that are not UTF-8 keep their record; the key shows each undecodable byte as ``\\xNN``.

The run goes on after a reject. With ``strict`` it still finishes and writes everything, then
raises `ConvertError` naming the first reject.

Sharding, determinism and crash safety. All inputs are scanned and ordered first, then cut into
shards by their file sizes: consecutive inputs until their sizes add up to ``shard_size`` (or
`layout.MAX_RECORDS_PER_SHARD` inputs). The plan (inputs with size and mtime, options, classes)
is written to ``OUT/.shardfmt-work/plan.json`` before any shard. Each shard is an independent
task (`task.py`) run in a process pool; it writes ``shard-NNNNN.shard`` atomically, then a
sidecar. At the end come ``rejects.jsonl`` and, as the commit point, ``manifest.json``; then the
work folder is removed. Equal inputs and options give byte-identical shards and manifest for any
number of workers. A shard whose inputs are all rejected is not written.

After a crash or ``kill -9`` at any moment, ``resume`` finishes the job: it refuses if inputs or
options changed, keeps every shard whose file matches its sidecar (size and re-hashed checksum),
and redoes the rest. A folder without manifest.json is never read as a dataset.

Object storage and Ray. A source or output given by URL (``s3://bucket/prefix``) goes through
`convert_remote` with the same plan, tasks and bytes; ``engine="ray"`` runs each shard's task on
a Ray cluster instead of the local process pool (`ray_engine`). Both work for binary and tar
shards and for `fields.convert_fields`; what is not supported is refused with a `ConvertError`
naming the combination: WebDataset tars given by URL as a source (they are read in place with
``pread``), and sources given by URL for a multi-field conversion.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tqdm import tqdm

from . import __version__
from .checksum import parse_checksum
from .errors import ConvertError, WorkerError
from .fileio import atomic_write_bytes, fsync_directory
from .layout import MAX_RECORDS_PER_SHARD, MAX_SHARD_SIZE
from .manifest import MANIFEST_NAME, IndexEntry, Manifest, ShardEntry
from .normalise import DEFAULT_QUALITY, REENCODE_REASONS
from .scan import SourceScan, display_path, scan_source
from .schema import IMAGE_CLASSIFICATION, Schema
from .storage import RemoteOptions
from .storage.urls import is_url
from .task import WORK_DIR, ShardTask, run_shard_task, shard_file_name
from .writer import DEFAULT_SHARD_SIZE

__all__ = [
    "ENGINES",
    "PLAN_NAME",
    "REJECTS_NAME",
    "ConvertResult",
    "build_outputs",
    "check_options",
    "convert",
    "plan_shards",
    "prepare_output",
    "run_plan",
]

PLAN_NAME: Final = "plan.json"
REJECTS_NAME: Final = "rejects.jsonl"
ENGINES: Final = ("local", "ray")
_PLAN_VERSION: Final = 1
_OWN_NAME = re.compile(r"(manifest\.json|rejects\.jsonl|shard-\d{5,}\.(?:shard|tar|tar\.idx)|\.shardfmt-work)\Z")
_OWN_TEMP = re.compile(r"\.(manifest\.json|rejects\.jsonl|shard-\d{5,}\.(?:shard|tar|tar\.idx))\.tmp-\d+\Z")
_WORK_TEMP = re.compile(r"\..+\.tmp-\d+\Z")


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion did.

    Attributes:
        path: the output folder (or URL, without credentials).
        manifest: the manifest written there.
        num_inputs: candidate files found (rejects found while scanning are not among them).
        num_records: records written.
        num_rejects: lines in rejects.jsonl.
        input_bytes: total size of the candidate files.
        reused_shards: shards a previous, interrupted run had finished and this one kept.
        seconds: wall time of the whole call.
    """

    path: Path | str
    manifest: Manifest
    num_inputs: int
    num_records: int
    num_rejects: int
    input_bytes: int
    reused_shards: int
    seconds: float

    @property
    def images_per_second(self) -> float:
        return self.num_inputs / self.seconds if self.seconds > 0 else 0.0


def plan_shards(sizes: Sequence[int], *, shard_size: int, max_records: int = MAX_RECORDS_PER_SHARD) -> list[tuple[int, int]]:
    """Cut consecutive inputs into shards by their sizes.

    Args:
        sizes: input file sizes in conversion order.
        shard_size: a shard takes inputs until their sizes add up to at least this.
        max_records: and at most this many inputs.

    Returns:
        [start, stop) input ranges, one per shard, covering every input.
    """
    spans: list[tuple[int, int]] = []
    start = total = 0
    for i, size in enumerate(sizes):
        total += size
        if total >= shard_size or i + 1 - start >= max_records:
            spans.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        spans.append((start, len(sizes)))
    return spans


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    max_side: int | None = None,
    quality: int = DEFAULT_QUALITY,
    workers: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = False,
    shard_format: str = "binary",
    engine: str = "local",
    remote: RemoteOptions | None = None,
) -> ConvertResult:
    """Convert an ImageFolder tree or a listing into a dataset (see the module docstring).

    Args:
        src: an ImageFolder directory, a ``.csv`` / ``.jsonl`` listing, or WebDataset tars: a
            ``.tar`` file, a brace pattern of them, or a folder holding ``.tar`` files and no
            sub-folders (read where they are, nothing extracted). A folder or listing may be a
            URL (``s3://bucket/train``, ``gs://.../listing.csv``); tars must be local.
        out: the output folder; created if missing. It must be empty unless `resume` or
            `overwrite` is given, and must not lie inside an ImageFolder source. A URL
            (``s3://bucket/prefix``) writes straight to object storage (see `convert_remote`),
            binary or tar shards.
        shard_size: target bytes of input per shard (default 256 MiB).
        max_side: shrink images whose longer side exceeds this; None keeps every size.
        quality: JPEG quality (1 to 100) of re-encoded images.
        workers: processes converting shards in parallel; None uses every CPU, 1 runs in this
            process. The output does not depend on it.
        resume: finish an interrupted conversion into `out` with the same inputs and options.
        overwrite: first remove shardfmt's files from `out` (nothing else there is touched).
        strict: raise `ConvertError` naming the first reject, after writing everything.
        progress: show a progress bar with images/s and ETA on stderr.
        shard_format: "binary" shards, or "tar": WebDataset tars with a member index each
            (spec/tar.md), same manifest otherwise.
        engine: "local" (default): a process pool on this machine; "ray": one Ray task per
            shard on the running Ray cluster (or a local Ray instance). The bytes written are
            the same.
        remote: credentials and retries for a `src` or `out` given by URL.

    Returns:
        A `ConvertResult`.

    Raises:
        ValueError: an option is out of range.
        ConvertError: the source is unusable, `out` is not empty (and neither `resume` nor
            `overwrite` was given), the inputs or options changed since the interrupted run,
            or `strict` is set and an input was rejected.
        WorkerError: a task failed for a reason other than a bad input, naming the shard and
            the input; or a worker process died.
        OSError: the output cannot be written.
    """
    started = time.perf_counter()
    check_options(shard_size=shard_size, max_side=max_side, quality=quality, workers=workers, resume=resume, overwrite=overwrite, engine=engine)
    if shard_format not in ("binary", "tar"):
        raise ValueError(f"shard_format must be 'binary' or 'tar', got {shard_format!r}")
    if is_url(os.fspath(src)) or is_url(os.fspath(out)):
        from .convert_remote import convert_with_store

        return convert_with_store(
            os.fspath(src), os.fspath(out), options={"max_side": max_side, "quality": quality, "shard_size": shard_size},
            shard_format=shard_format, workers=workers, resume=resume, overwrite=overwrite, strict=strict, progress=progress,
            engine=engine, remote=remote, started=started,
        )
    src, out = Path(src), Path(out)
    if src.is_dir() and (out.resolve() == src.resolve() or src.resolve() in out.resolve().parents):
        raise ConvertError("the output folder lies inside the source tree, where it would become a class; choose another", path=out)
    prepare_output(out, resume=resume, overwrite=overwrite)
    scan = scan_source(src)
    options = {"max_side": max_side, "quality": quality, "shard_size": shard_size}
    plan = _make_plan(scan, str(src.resolve()), options, shard_format=shard_format)
    tasks = [
        ShardTask(
            index=index,
            root=str(scan.root),
            out=str(out),
            inputs=tuple(
                (i, path, size, label, *member) for i, (path, size, _, label, *member) in enumerate(plan["inputs"][start:stop], start)
            ),
            max_side=max_side,
            quality=quality,
            shard_format=shard_format,
        )
        for index, (start, stop) in enumerate(plan["shards"])
    ]
    reject_root = src if scan.kind == "imagefolder" else scan.root
    return run_plan(
        plan, tasks, runner=run_shard_task, schema=IMAGE_CLASSIFICATION, out=out, workers=workers,
        progress=progress, strict=strict, reject_root=reject_root, started=started, engine=engine,
    )


def check_options(
    *, shard_size: int, max_side: int | None, quality: int, workers: int | None, resume: bool, overwrite: bool, engine: str = "local"
) -> None:
    """Raise ValueError (or ConvertError) for options out of range or in conflict."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not 1 <= shard_size <= MAX_SHARD_SIZE:
        raise ValueError(f"shard_size {shard_size} is outside [1, {MAX_SHARD_SIZE}]")
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side {max_side} must be at least 1")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality {quality} is outside [1, 100]")
    if workers is not None and workers < 1:
        raise ValueError(f"workers {workers} must be at least 1")
    if resume and overwrite:
        raise ConvertError("--resume and --overwrite exclude each other: resume keeps finished shards, overwrite removes them")


def run_plan(
    plan: dict[str, Any],
    tasks: Sequence[Any],
    *,
    runner: Callable[..., tuple[dict[str, Any], bool]],
    schema: Schema,
    out: Path,
    workers: int | None,
    progress: bool,
    strict: bool,
    reject_root: Path,
    started: float,
    engine: str = "local",
) -> ConvertResult:
    """Store the plan (or check it against the stored one when resuming), run every shard's task
    with `runner` (a module-level function, so that it reaches worker processes or Ray tasks),
    then write rejects.jsonl and manifest.json. Shared by `convert` and `fields.convert_fields`;
    `convert_remote.run_plan_in_store` is its twin for an output given by URL."""
    work = out / WORK_DIR
    plan_path = work / PLAN_NAME
    if plan_path.is_file():
        _check_stored_plan(plan_path, plan)
        _remove_temp_files(out, work)
    else:
        work.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(plan_path, json.dumps(plan, sort_keys=True, separators=(",", ":")).encode())
    outcomes = _run_tasks(
        list(tasks), out=out, workers=workers if workers is not None else os.cpu_count() or 1, progress=progress, runner=runner, engine=engine
    )
    manifest, rejects = _finish(out, plan, [sidecar for sidecar, _ in outcomes], schema=schema)
    return conclude(
        path=out,
        manifest=manifest,
        plan=plan,
        outcomes=outcomes,
        rejects=rejects,
        started=started,
        strict=strict,
        rejects_at=str(out / REJECTS_NAME),
        reject_path=lambda first: reject_root / first["path"],
    )


def conclude(
    *,
    path: Any,
    manifest: Manifest,
    plan: dict[str, Any],
    outcomes: Sequence[tuple[dict[str, Any], bool]],
    rejects: list[dict[str, Any]],
    started: float,
    strict: bool,
    rejects_at: str,
    reject_path: Callable[[dict[str, Any]], Any],
) -> ConvertResult:
    """Summarise a finished conversion; with `strict`, raise for the first reject instead.

    Raises:
        ConvertError: `strict` and at least one input was rejected (everything is written).
    """
    if strict and rejects:
        first = rejects[0]
        raise ConvertError(
            f"{first['reason']}: {first['detail']} (the first of {len(rejects)} rejects; --strict; all are in {rejects_at})",
            path=reject_path(first),
        )
    return ConvertResult(
        path=path,
        manifest=manifest,
        num_inputs=len(plan["inputs"]),
        num_records=manifest.num_records,
        num_rejects=len(rejects),
        input_bytes=sum(item[1] for item in plan["inputs"]),
        reused_shards=sum(reused for _, reused in outcomes),
        seconds=time.perf_counter() - started,
    )


def _is_own(name: str) -> bool:
    return bool(_OWN_NAME.match(name) or _OWN_TEMP.match(name))


def prepare_output(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Make sure `out` may be written: empty, resumable, or cleared of shardfmt's own files."""
    if out.exists() and not out.is_dir():
        raise ConvertError("the output exists and is not a folder", path=out)
    entries = sorted(os.listdir(out)) if out.is_dir() else []
    if not entries:
        return
    if overwrite:
        _remove_own(out, entries)
        return
    if resume:
        if (out / WORK_DIR / PLAN_NAME).is_file():
            return
        if MANIFEST_NAME in entries:
            raise ConvertError("the output holds a finished dataset: nothing to resume (use --overwrite to convert again)", path=out)
        if all(_is_own(name) for name in entries):  # stopped before the plan was written
            _remove_own(out, entries)
            return
        raise ConvertError("the output holds no interrupted conversion to resume (no .shardfmt-work/plan.json)", path=out)
    raise ConvertError(
        "the output folder is not empty: use --resume to finish an interrupted conversion, "
        "or --overwrite to replace the dataset in it",
        path=out,
    )


def _remove_own(out: Path, entries: list[str]) -> None:
    for name in entries:
        if not _is_own(name):
            continue
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _remove_temp_files(out: Path, work: Path) -> None:
    """Remove the temporary files a killed run left behind (its shards in progress)."""
    for folder, pattern in ((out, _OWN_TEMP), (work, _WORK_TEMP)):
        for name in os.listdir(folder):
            if pattern.match(name):
                (folder / name).unlink()


def _make_plan(scan: SourceScan, source: str, options: dict[str, Any], *, shard_format: str) -> dict[str, Any]:
    # A sample of a tar adds where its image is and its key; a file keeps the short form.
    inputs = [
        [item.path, item.size, item.mtime_ns, item.label, *([item.offset, item.sample_key] if item.offset is not None else [])]
        for item in scan.inputs
    ]
    return {
        "version": _PLAN_VERSION,
        "source": source,
        "kind": scan.kind,
        "shard_format": shard_format,
        "options": options,
        "classes": list(scan.classes) if scan.classes is not None else None,
        "inputs": inputs,
        "scan_rejects": [[r.position, r.path, r.reason, r.detail, *([r.key] if r.key is not None else [])] for r in scan.rejects],
        "shards": [list(span) for span in plan_shards([item.size for item in scan.inputs], shard_size=options["shard_size"])],
    }


def _check_stored_plan(path: Path, plan: dict[str, Any]) -> None:
    """Refuse to resume when the stored plan differs from the one the inputs give now."""
    try:
        stored = json.loads(path.read_bytes())
    except (OSError, ValueError) as err:
        raise ConvertError(f"the stored plan cannot be read ({err}); use --overwrite to start again", path=path) from err
    _compare_plans(stored, plan, where=path.parent.parent)


def _compare_plans(stored: Any, plan: dict[str, Any], *, where: str | os.PathLike[str]) -> None:
    """Raise `ConvertError` saying what changed if `stored` is not `plan`."""
    if stored == plan:
        return
    for key in ("version", "source", "kind", "shard_format", "options", "classes"):
        if stored.get(key) != plan[key]:
            change = f"{key} changed from {_short(stored.get(key))} to {_short(plan[key])}"
            break
    else:
        before = {item[0]: item for item in stored.get("inputs", [])}
        now = {item[0]: item for item in plan["inputs"]}
        changed = [p for p in now if p not in before or before[p] != now[p]] + [p for p in before if p not in now]
        first = f" (first: {display_path(changed[0])})" if changed else ""
        change = f"{len(changed)} input files were added, removed or modified{first}"
    raise ConvertError(
        f"cannot resume: {change} since the conversion started; use --overwrite to start again", path=where
    )


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _run_tasks(
    tasks: list[Any],
    *,
    out: Path | str,
    workers: int,
    progress: bool,
    runner: Callable[..., tuple[dict[str, Any], bool]] = run_shard_task,
    engine: str = "local",
) -> list[tuple[dict[str, Any], bool]]:
    if engine == "ray":
        from .ray_engine import run_tasks_on_ray

        return run_tasks_on_ray(tasks, runner=runner, progress=progress)
    total = sum(len(task.inputs) for task in tasks)
    bar_options: dict[str, Any] = {"total": total, "unit": "img", "desc": "convert", "disable": not progress, "smoothing": 0.1}
    workers = min(workers, len(tasks))
    if workers <= 1:
        with tqdm(**bar_options) as bar:
            return [runner(task, on_image=bar.update) for task in tasks]
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    counter = context.Value("q", 0)
    outcomes: list[tuple[dict[str, Any], bool]] = [({}, False)] * len(tasks)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=(counter, os.getpid())) as pool:
        futures: dict[Future[tuple[dict[str, Any], bool]], Any] = {pool.submit(_pool_task, task, runner): task for task in tasks}
        try:
            with tqdm(**bar_options) as bar:  # after the pool has forked: tqdm may start a thread
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                    bar.update(counter.value - bar.n)
                    for future in done:
                        task = futures[future]
                        try:
                            outcomes[task.index] = future.result()
                        except BrokenProcessPool as err:
                            raise WorkerError(
                                "a worker process died (killed, or out of memory?) before this shard was finished",
                                path=_shard_location(out, shard_file_name(task.index, task.shard_format)),
                            ) from err
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return outcomes


_COUNTER: Any = None


def _init_worker(counter: Any, parent: int) -> None:
    global _COUNTER
    _COUNTER = counter
    _die_with_parent(parent)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this worker when the converting process dies (Linux), so that a
    ``kill -9`` of the converter leaves no worker writing behind a resumed run."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _shard_location(out: Path | str, name: str) -> Path | str:
    """How messages name file `name` of the output: a path, or a URL (without credentials)."""
    return f"{out}/{name}" if isinstance(out, str) and is_url(out) else Path(out) / name


def _count(images: int) -> None:
    with _COUNTER.get_lock():
        _COUNTER.value += images


def _pool_task(task: Any, runner: Callable[..., tuple[dict[str, Any], bool]] = run_shard_task) -> tuple[dict[str, Any], bool]:
    return runner(task, on_image=_count)


def _finish(
    out: Path, plan: dict[str, Any], sidecars: list[dict[str, Any]], *, schema: Schema = IMAGE_CLASSIFICATION
) -> tuple[Manifest, list[dict[str, str]]]:
    """Write rejects.jsonl, then manifest.json (the commit point), then remove the work folder."""
    manifest, rejects, report = build_outputs(plan, sidecars, schema=schema)
    atomic_write_bytes(out / REJECTS_NAME, report)
    manifest.write(out)
    shutil.rmtree(out / WORK_DIR)
    fsync_directory(out)
    return manifest, rejects


def build_outputs(
    plan: dict[str, Any], sidecars: list[dict[str, Any]], *, schema: Schema = IMAGE_CLASSIFICATION
) -> tuple[Manifest, list[dict[str, str]], bytes]:
    """Return the manifest, the rejects and the bytes of rejects.jsonl of a finished conversion."""
    inputs = plan["inputs"]
    ordered: list[tuple[tuple[int, int], dict[str, str]]] = [
        ((position, 0), _reject(path, reason, detail, *key)) for position, path, reason, detail, *key in plan["scan_rejects"]
    ]
    rejected: set[int] = set()
    for sidecar in sidecars:
        for number, reason, detail in sidecar["rejects"]:
            item = inputs[number]
            sample_key = _sample_key(item)  # a sample of a tar also names its key
            key = [display_path(sample_key)] if sample_key is not None else []
            ordered.append(((number, 1), _reject(display_path(item[0]), reason, detail, *key)))
            rejected.add(number)
    ordered.sort(key=lambda pair: pair[0])
    rejects = [reject for _, reject in ordered]
    report = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rejects)
    by_reason = dict(Counter(reject["reason"] for reject in rejects))
    classes = plan["classes"]
    labels = {item[3] for number, item in enumerate(inputs) if number not in rejected}
    stats = {
        "inputs": len(inputs),
        "input_bytes": sum(item[1] for item in inputs),
        "passthrough": sum(s["passthrough"] for s in sidecars),
        "reencoded": {reason: sum(s["reencoded"][reason] for s in sidecars) for reason in REENCODE_REASONS},
        "empty_classes": len(classes) - len(labels) if classes is not None else 0,
    }
    manifest = Manifest(
        schema=schema,
        shards=tuple(_shard_entry(s) for s in sidecars if s["num_records"]),
        classes=classes,
        shard_format=plan["shard_format"],
        converter={"name": "shardfmt", "version": __version__, "input": plan["kind"], "options": plan["options"]},
        rejects={"count": len(rejects), "by_reason": by_reason, "report": REJECTS_NAME},
        stats=stats,
    )
    return manifest, rejects, report.encode()


def _sample_key(item: list[Any]) -> str | None:
    """The sample key of a planned input that is a sample of a tar, else None: item 5 of
    `convert`'s [path, size, mtime, label, offset, key], or the "sample_key" of the record
    that `fields.convert_fields` plans as [path, size, mtime, label, {...}]."""
    if len(item) == 6:
        return str(item[5])
    if len(item) == 5 and isinstance(item[4], dict):
        return item[4].get("sample_key")
    return None


def _reject(path: str, reason: str, detail: str, key: str | None = None) -> dict[str, str]:
    """A line of rejects.jsonl: path, reason, detail, and the key of a sample of a tar."""
    return {"path": path, "reason": reason, "detail": detail, **({"key": key} if key is not None else {})}


def _shard_entry(sidecar: dict[str, Any]) -> ShardEntry:
    index = sidecar.get("member_index")
    return ShardEntry(
        sidecar["path"],
        sidecar["num_records"],
        sidecar["size"],
        parse_checksum(sidecar["checksum"]),
        IndexEntry(index["path"], index["size"], parse_checksum(index["checksum"])) if index is not None else None,
    )
