"""`convert`: image folders, listings, WebDataset tars or Parquet files become a dataset, in
parallel and resumably.

Inputs (`sources/` has the details). A folder is read as torchvision's ImageFolder: each
sub-folder is a class, classes sorted by name as plain strings and numbered from 0, files found
recursively (following symbolic links) in torchvision's order. A ``.csv`` (``path,label``) or
``.jsonl`` (``{"path": ..., "label": ...}``) listing names files relative to its folder; labels
are all integers (no class names) or all strings (class names sorted, label = index). A record's
key is its path relative to the source root, '/'-separated, without the last extension.
WebDataset tars (a ``.tar`` file, a brace pattern, or a folder of ``.tar`` files only) are read in
place: each sample's image member with one ``pread``, its label from its ``.cls`` member, its key
kept; classes are the labels in decimal. Parquet files (``.parquet`` files or glob patterns,
local or by URL) give a record per row: the encoded image from a binary column (or a struct
with ``bytes``), the label from an integer column (class names from the Hugging Face features
in the file's metadata, if any) or a string column (class names sorted), the key from the file
name and row number or a key column; a null image or label is a reject like any bad file.

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
  system refused (its message is the detail), or a broken symbolic link; "not-a-regular-file": a
  folder, FIFO, socket or device; "outside-root": a listed path that resolves outside the
  listing's folder (`sources.confine`);
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
`format.layout.MAX_RECORDS_PER_SHARD` inputs). The plan (`plan.ConversionPlan`: inputs with size and
mtime, options, classes) is written to ``OUT/.shardfmt-work/plan.json`` before any shard. Then
`loop.run_conversion` builds the records in chunks on every worker and writes each shard in
order, atomically, then its sidecar. At the end come ``rejects.jsonl`` and, as the commit point,
``manifest.json``; then the work folder is removed. Equal inputs and options give byte-identical
shards and manifest for any number of workers. A shard whose inputs are all rejected is not
written.

After a crash or ``kill -9`` at any moment, ``resume`` finishes the job: it refuses if inputs or
options changed, keeps every shard whose file matches its sidecar (size and re-hashed checksum),
and redoes the rest. A folder without manifest.json is never read as a dataset. A store that
stops answering is never a reject: the run stops with `RemoteError`, resumable; a reject whose
cause may pass (a read that timed out) is read again on resume.

Object storage and Ray. A source or output given by URL (``s3://bucket/prefix``) goes through
the same plan, pipeline and bytes (`destination.Output` writes into any `Store`); ``engine="ray"``
builds the chunks as Ray tasks instead of in the local process pool (`engine`). Both work for
binary and tar shards and for `fields.convert_fields`; what is not supported is refused with a
`ConvertError` naming the combination: WebDataset tars given by URL as a source (they are read
in place with ``pread``).
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._errors import ConvertError
from .._storage import RemoteOptions
from .._storage.urls import is_url
from ..format._layout import MAX_SHARD_SIZE
from ..format._writer import DEFAULT_SHARD_SIZE
from .destination import Output
from .engine import ENGINES
from .images import DEFAULT_QUALITY
from .loop import ConvertResult, already_finished, disk_full_error, run_conversion
from .plan import field_schema, from_field_scan, from_scan
from .records import builder_for
from .sources import ParquetColumns, scan_source, source_name, source_texts
from .sources.results import FieldScan, SourceScan

__all__ = ["ConvertResult", "check_not_all_rejected", "check_not_inside", "check_options", "convert", "nothing_found", "resolve_workers"]


def convert(
    src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
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
    allow_empty: bool = False,
    break_lock: bool = False,
    columns: ParquetColumns | None = None,
    members: Mapping[str, str] | None = None,
    image_root: str | os.PathLike[str] | None = None,
) -> ConvertResult:
    """Convert an ImageFolder tree or a listing into a dataset (see the module docstring).

    Args:
        src: an ImageFolder directory; a ``.csv`` / ``.jsonl`` listing; WebDataset tars, read where
            they are, nothing extracted (a ``.tar`` file, a brace pattern of them, or a folder of
            ``.tar`` files and no sub-folders); or Parquet files (a ``.parquet`` file, a glob pattern
            of them such as ``data/train-*.parquet``, or a list of those). Any of these but tars
            may be a URL (``s3://bucket/train``, ``gs://.../listing.csv``): tars must be local.
        out: the output folder; created if missing. It must be empty unless `resume` or
            `overwrite` is given, and must not lie inside an ImageFolder source. A URL
            (``s3://bucket/prefix``) writes straight to object storage, binary or tar shards.
        shard_size: target bytes of input per shard (default 256 MiB); max_side: shrink images
            whose longer side exceeds this, None keeps every size; quality: of re-encoded JPEGs, 1 to 100.
        workers: processes building records in parallel (None: every CPU; 1: this process); the output does not depend on it.
        resume: finish an interrupted conversion into `out` with the same inputs and options.
        overwrite: first remove shardfmt's files from `out` (nothing else there is touched).
        strict: raise `ConvertError` naming the first reject, after writing everything;
            progress: show a progress bar with images/s and ETA on stderr.
        shard_format: "binary" shards, or "tar": WebDataset tars with a member index each
            (spec/tar.md), same manifest otherwise.
        engine: "local" (default): a process pool on this machine; "ray": Ray tasks on the
            running Ray cluster (or a local Ray instance). The bytes written are the same.
        remote: credentials and retries for a `src` or `out` given by URL.
        allow_empty: write an empty dataset when the source holds no input, or when every input
            was rejected, rather than raising (a wrong path would otherwise silently give nothing).
        break_lock: first remove the lock object a crashed run left in an output given by URL
            (a local lock dies with its process and never needs this).
        columns: for Parquet files, the image, label and key columns (default: ``image``,
            ``label`` if present, keys from file name and row number); recorded in the manifest.
        members: for WebDataset tars, the kind ("str", "json" or "bytes") of member fields by
            name (default: txt text, json JSON, anything else bytes).
        image_root: for a listing, the folder its paths are resolved against and confined to.

    Returns:
        A `ConvertResult`.

    Raises:
        ValueError: an option is out of range.
        LockedError: another run is converting into `out`.
        ConvertError: the source is unusable or holds no input (without `allow_empty`), `out`
            is not empty (and neither `resume` nor `overwrite` was given), the inputs or
            options changed since the interrupted run, `strict` is set and an input was
            rejected, or the output's device is full (resume once there is space).
        WorkerError: a failure other than a bad input, naming the shard and the input; or a dead worker.
        RemoteError: a store stopped answering (`destination.stopped_by`): resumable, nothing rejected.
        OSError: the output cannot be written.
    """
    started = time.perf_counter()
    sources = _checked_sources(src, out, shard_format=shard_format, shard_size=shard_size, max_side=max_side, quality=quality,
                               workers=workers, resume=resume, overwrite=overwrite, engine=engine)
    with Output.open(os.fspath(out), remote=remote, resume=resume, overwrite=overwrite, break_lock=break_lock) as output, \
            output.scratch_folder("tars") as work:
        if output.finished is not None:
            return already_finished(output, started=started)
        result = _convert_into(output, work, sources, options={"max_side": max_side, "quality": quality, "shard_size": shard_size},
                               shard_format=shard_format, columns=columns, members=members, image_root=image_root, workers=workers,
                               strict=strict, progress=progress, engine=engine, remote=remote, allow_empty=allow_empty, started=started)
    check_not_all_rejected(result, allow_empty=allow_empty)
    return result


def _checked_sources(src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                     shard_format: str, shard_size: int, max_side: int | None, quality: int, workers: int | None, resume: bool,
                     overwrite: bool, engine: str) -> list[str]:
    """Refuse options out of range or in conflict, and an output inside a source; return the sources as paths or URLs."""
    check_options(
        shard_size=shard_size, max_side=max_side, quality=quality, workers=workers, resume=resume, overwrite=overwrite, engine=engine
    )
    if shard_format not in ("binary", "tar"):
        raise ValueError(f"shard_format must be 'binary' or 'tar', got {shard_format!r}")
    sources = source_texts(src)
    check_not_inside(sources, os.fspath(out))
    return sources


def _convert_into(output: Output, work: Path, sources: list[str], *, options: dict[str, Any], shard_format: str,
                  columns: ParquetColumns | None, members: Mapping[str, str] | None, image_root: str | os.PathLike[str] | None,
                  workers: int | None, strict: bool,
                  progress: bool, engine: str, remote: RemoteOptions | None, allow_empty: bool, started: float) -> ConvertResult:
    """Scan the sources, plan the shards and run the conversion into `output`."""
    try:
        scan = scan_source(sources if len(sources) > 1 else sources[0], remote=remote, columns=columns, members=members, work=work,
                           image_root=image_root)
    except OSError as err:  # decompressing tars into `work` (in the output's work folder when it is local)
        if err.errno == errno.ENOSPC:
            raise disk_full_error(output, device=f"the work folder {work}", doing=" while decompressing the compressed tars") from err
        raise
    root = os.fspath(scan.root)
    if not scan.inputs and not allow_empty:
        raise ConvertError(nothing_found(scan.kind, len(scan.rejects), Counter(r.reason for r in scan.rejects)), path=sources[0])
    if scan.kind == "parquet":
        options.update((columns or ParquetColumns()).to_options())
    named = tuple(source_name(item, remote=remote) for item in sources) if len(sources) > 1 else source_name(sources[0], remote=remote)
    if isinstance(scan, FieldScan):  # rows with further columns: records of several fields
        if shard_format == "tar":
            kept = ", ".join(c.name for c in scan.columns if c.name not in ("image", "label"))
            raise ConvertError(f"--format tar writes an image, its label and key, and the members of tars; this source has further "
                               f"columns ({kept}): convert to binary shards, or leave them out with --drop-column", path=sources[0])
        options.update(fields=[[c.name, c.kind] for c in scan.columns], scale=[1], patch=None)
        plan = from_field_scan(scan, source=named, root=root, schema=field_schema(scan.columns), options=options)
    else:
        plan = from_scan(scan, source=named, root=root, options=options, shard_format=shard_format)
    if scan.kind == "parquet":
        plan = replace(plan, stats={**plan.stats, **_column_stats(scan, columns or ParquetColumns())})
    return run_conversion(
        plan, output, builder=builder_for(plan, remote=remote), workers=resolve_workers(workers), engine=engine,
        progress=progress, strict=strict, started=started,
    )


def _column_stats(scan: SourceScan | FieldScan, columns: ParquetColumns) -> dict[str, Any]:
    """What the manifest's ``stats`` say of a Parquet source's further columns: those kept as
    fields and those dropped (nothing when it has none)."""
    kept = [c.name for c in scan.columns if c.name not in ("image", "label")] if isinstance(scan, FieldScan) else []
    if not kept and not columns.drop:
        return {}
    return {"columns_kept": kept, "columns_dropped": list(columns.drop)}


def check_not_all_rejected(result: ConvertResult, *, allow_empty: bool) -> None:
    """Refuse a finished conversion that wrote no record although inputs were rejected (unless
    `allow_empty`): the dataset is written, but the run fails with the counts per reason.

    Raises:
        ConvertError: it wrote none.
    """
    if allow_empty or result.num_records or not result.num_rejects:
        return
    by_reason = result.manifest.rejects.get("by_reason") or {}
    counts = ", ".join(f"{count} {reason}" for reason, count in sorted(by_reason.items()))
    raise ConvertError(
        f"no record was written: all {result.num_rejects} inputs were rejected ({counts}; see rejects.jsonl); "
        "pass allow_empty=True to accept an empty dataset",
        path=result.path,
    )


_LOOKED_FOR = {
    "imagefolder": "image files in class sub-folders (SRC/CLASS/IMAGE, as torchvision's ImageFolder)",
    "csv": "rows of path,label in the listing",
    "jsonl": "lines of {\"path\": ..., \"label\": ...} in the listing",
    "webdataset": "samples with an image member (.jpg, .png, .webp, ...) in the tars",
    "parquet": "rows in the Parquet files",
}


def nothing_found(kind: str, num_rejects: int, reasons: Counter[str]) -> str:
    """The message of a source that holds no input: what was looked for, what was set aside."""
    looked = _LOOKED_FOR.get(kind, "inputs")
    aside = ""
    if num_rejects:
        counts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        aside = f"; {num_rejects} entries were set aside ({counts})"
        if kind in ("csv", "jsonl") and reasons.get("outside-root"):
            aside += "; a listing reads files outside its folder only inside the folder image_root= names"
    return f"no image found: looked for {looked}{aside}; check the path, or pass allow_empty=True to write an empty dataset"


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
        raise ConvertError("resume=True and overwrite=True exclude each other: resume keeps finished shards, overwrite removes them")


def check_not_inside(sources: list[str], out: str) -> None:
    """Refuse a local output that lies inside a local source folder, where it would become a class.

    Raises:
        ConvertError: it does.
    """
    if is_url(out):
        return
    target = Path(out).resolve()
    for src in sources:
        if not is_url(src) and Path(src).is_dir():
            folder = Path(src).resolve()
            if target == folder or folder in target.parents:
                raise ConvertError("the output folder lies inside the source tree, where it would become a class; choose another", path=out)


def resolve_workers(workers: int | None) -> int:
    """The number of worker processes: `workers`, or every CPU."""
    return workers if workers is not None else os.cpu_count() or 1
