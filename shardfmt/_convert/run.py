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
binary and tar shards and for records of every kind of fields; what is not supported is refused with a
`ConvertError` naming the combination: WebDataset tars given by URL as a source (they are read
in place with ``pread``).
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._errors import ConvertError
from .._storage.urls import is_url
from ..format._schema import tar_schema_problem
from .destination import Output
from .loop import ConvertResult, already_finished, disk_full_error, run_conversion
from .options import ConvertOptions, RecordRequest
from .plan import ConversionPlan, from_scan, record_schema
from .records import builder_for
from .route import Route, choose_route, scan_route
from .sources import ParquetColumns, parquet_folders, source_name
from .sources.results import SourceScan

__all__ = ["ConvertResult", "check_not_all_rejected", "check_not_inside", "convert", "nothing_found"]


def convert(sources: Sequence[str], out: str, *, request: RecordRequest, options: ConvertOptions) -> ConvertResult:
    """Convert `sources` into a dataset in `out` (see the module docstring): the one entry of
    every conversion, behind `shardfmt.convert` and ``shardfmt convert``.

    Args:
        sources: paths or URLs (``~`` already expanded): one source, or several that make one
            (tars, Parquet files, parallel folders).
        out: the output folder or URL; created if missing. It must be empty unless resuming or
            overwriting, and must not lie inside a local source folder.
        request: what records the sources should give.
        options: how the conversion runs and writes.

    Returns:
        A `ConvertResult`.

    Raises:
        ConvertError: the sources are unusable, do not fit the request, or hold no input
            (without ``allow_empty``); `out` is not empty (neither resume nor overwrite given);
            the inputs or options changed since an interrupted run; ``strict`` and an input was
            rejected; or the output's device is full (resume once there is space).
        LockedError: another run is converting into `out`.
        WorkerError: a failure other than a bad input, naming the shard and the input; or a dead worker.
        RemoteError: a store stopped answering (`destination.stopped_by`): resumable, nothing rejected.
        OSError: the output cannot be written.
    """
    started = time.perf_counter()
    if request.patch is not None and options.max_side is not None:
        raise ConvertError("patch= and max_side= exclude each other: a patch has a fixed size")
    route = choose_route(parquet_folders(list(sources)), request, shard_format=options.shard_format, remote=options.remote)
    check_not_inside(list(route.texts), out)
    with Output.open(out, remote=options.remote, resume=options.resume, overwrite=options.overwrite,
                     break_lock=options.break_lock) as output, output.scratch_folder("tars") as work:
        if output.finished is not None:
            return already_finished(output, started=started)
        plan = _plan(output, work, route, request, options)
        result = run_conversion(plan, output, builder=builder_for(plan, remote=options.remote), workers=options.num_workers,
                                engine=options.engine, progress=options.progress, strict=options.strict, started=started)
    check_not_all_rejected(result, allow_empty=options.allow_empty)
    return result


def _plan(output: Output, work: Path, route: Route, request: RecordRequest, options: ConvertOptions) -> ConversionPlan:
    """Scan the sources of `route` and plan the shards: the records of the scan, of whatever fields."""
    try:
        scan = scan_route(route, request, remote=options.remote, work=work)
    except OSError as err:  # decompressing tars into `work` (in the output's work folder when it is local)
        if err.errno == errno.ENOSPC:
            raise disk_full_error(output, device=f"the work folder {work}", doing=" while decompressing the compressed tars") from err
        raise
    texts = route.texts
    if not scan.inputs and not options.allow_empty:
        reasons = Counter(r.reason for r in scan.rejects)
        raise ConvertError(nothing_found(scan.kind, len(scan.rejects), reasons), path=texts[0] if len(texts) == 1 else ", ".join(texts))
    settings: dict[str, Any] = {"max_side": options.max_side, "quality": options.quality, "shard_size": options.shard_size}
    columns = route.columns or ParquetColumns()
    if route.reader == "table":
        settings.update(columns.to_options())
    if options.shard_format == "tar" and tar_schema_problem(record_schema(scan.fields)) is not None:  # a table's further columns
        kept = ", ".join(f.name for f in scan.fields if f.name not in ("image", "label"))
        raise ConvertError(f"--format tar writes an image, its label and key, and the members of tars; this source has further "
                           f"columns ({kept}): convert to binary shards, or leave them out with --drop-column", path=texts[0])
    scales = _scales(request.scale, sum(f.is_image for f in scan.fields))
    if None in scales and (request.patch is not None or options.max_side is not None):
        raise ConvertError("--patch and --max-side reshape every image of a record alike, so they need a stated --scale")
    if scan.names_fields:  # the manifest of records asked for by field lists them
        settings = {**settings, "fields": [[f.name, f.kind] for f in scan.fields], "scale": list(scales), "patch": request.patch}
    named = tuple(source_name(text, remote=options.remote) for text in texts)
    plan = from_scan(scan, source=named if len(named) > 1 else named[0], root=os.fspath(scan.root),
                     options=settings, shard_format=options.shard_format, scales=scales, patch=request.patch)
    if route.reader == "table":
        plan = replace(plan, stats={**plan.stats, **_column_stats(scan, columns)})
    return plan


def _scales(scale: int | Sequence[int] | None, images: int) -> tuple[int | None, ...]:
    """The scale of each image field, the first 1 (None: unchecked) from the request's `scale`.

    Raises:
        ConvertError: not one scale or one per image field after the first, or one below 1.
    """
    if scale is None:
        return (1,) + (None,) * (images - 1)
    values = [scale] * (images - 1) if isinstance(scale, int) else list(scale)
    if len(values) != images - 1:
        raise ConvertError(f"{len(values)} scales for {images - 1} image fields after the first; give one, or one per field")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ConvertError(f"scales must be whole numbers of at least 1, got {values}")
    return (1, *values)


def _column_stats(scan: SourceScan, columns: ParquetColumns) -> dict[str, Any]:
    """What the manifest's ``stats`` say of a table source's further columns: those kept as
    fields and those dropped (nothing when it has none)."""
    kept = [c.name for c in scan.fields if c.name not in ("image", "label")]
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

