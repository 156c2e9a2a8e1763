"""`convert`: the one public entry of a conversion, for every source and every kind of record.

``shardfmt.convert(src, out, **options)`` takes what ``shardfmt convert`` takes (the command
calls it), checks the keywords into two frozen values (`options.ConvertOptions`: how the run
goes; `options.RecordRequest`: what records are asked for) and hands them to the one internal
entry, `run.convert`, whatever the source. From Python, `src` may also be a ``datasets.Dataset`` (saved
to a temporary folder with ``save_to_disk``, which embeds its images, and read as such a folder;
a ``DatasetDict`` is refused with its splits) or an iterable of records,
mappings of field name -> value (written as a listing and image files in a temporary folder).
Sources held in memory are converted whole (`memory` makes them a temporary folder): such a
conversion cannot be resumed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from .._arguments import check_path
from .._errors import ConvertError
from .._storage import RemoteOptions, expand_user
from ..format._manifest import Manifest
from ..format._writer import DEFAULT_SHARD_SIZE
from .images import DEFAULT_QUALITY
from .loop import ConvertResult
from .memory import is_hf_dataset, is_hf_dataset_dict, spill_records
from .options import ConvertOptions, RecordRequest
from .run import convert as convert_sources

__all__ = ["ConvertSummary", "convert"]

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Iterable[Mapping[str, Any]] | Any


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion did.

    Attributes:
        path: the output folder (or URL, without credentials).
        records: records written.
        rejects: inputs rejected, by reason (every one is in the output's rejects.jsonl).
        input_bytes: bytes of input read.
        bytes: bytes of the shards written (the manifest's ``num_bytes``).
        seconds: wall time of the call.
        result: the full `ConvertResult` (manifest, inputs, shards kept on resume).
    """

    path: Path | str
    records: int
    rejects: dict[str, int]
    input_bytes: int
    bytes: int
    seconds: float
    result: ConvertResult

    @property
    def num_rejects(self) -> int:
        return sum(self.rejects.values())

    @property
    def manifest(self) -> Manifest:
        """The manifest written."""
        return self.result.manifest




def _check_paths(src: object, out: object) -> None:
    """Refuse a source or output path over the path limits (`_arguments.check_path`) by its
    keyword, before the file system answers ENAMETOOLONG."""
    for item in src if isinstance(src, (list, tuple)) else [src]:
        if isinstance(item, (str, os.PathLike)):
            check_path("src", item)
    if isinstance(out, (str, os.PathLike)):
        check_path("out", out)


def convert(
    src: Source, out: str | os.PathLike[str], *,
    fields: Sequence[tuple[str, str | None]] | Mapping[str, str | None] = (), store: str = "jpeg",
    scale: int | Sequence[int] | None = 1, patch: int | None = None, shard_format: str = "binary",
    image_column: str | None = None, label_column: str | None = None, key_column: str | None = None,
    image_root: str | os.PathLike[str] | None = None, drop_columns: Sequence[str] = (), shard_size: int = DEFAULT_SHARD_SIZE,
    max_side: int | None = None, quality: int = DEFAULT_QUALITY, workers: int | None = None, resume: bool = False,
    overwrite: bool = False, strict: bool = False, progress: bool = False, engine: str = "local",
    remote: RemoteOptions | None = None, allow_empty: bool = False, break_lock: bool = False,
) -> ConvertSummary:
    """Convert a source into a dataset of typed records in `out`; ``shardfmt convert`` calls this.

    Every source gives records of named, typed fields (the Sources page lists them); the run is
    parallel, deterministic and resumable, and every input set aside is in ``rejects.jsonl``.

    Args:
        src: a path (``~`` expanded) or URL, or a list of them: an ImageFolder folder; a ``.csv`` /
            ``.jsonl`` listing; WebDataset tars (``.tar``, ``.tar.gz``, ``.tgz``, brace patterns,
            folders of them, several of these); Parquet or Arrow files (files, a glob pattern, a
            folder of them); a ``save_to_disk`` folder; several folders of one image field each.
            Or a ``datasets.Dataset``; or an iterable of records: mappings with an ``image``
            (encoded bytes, a file path, a PIL image, an H x W x C uint8 array or a ``{"bytes",
            "path"}`` mapping), optionally a ``label`` (int or class name), a ``key`` (a relative
            path without extension) and further str, int or float values; an image path that
            names no file is a "missing-file" reject. Sources in memory cannot be resumed.
        out: the output folder (created if missing; empty unless `resume` or `overwrite`; not
            inside a source folder), or a URL (``s3://bucket/prefix``).
        fields: declared fields, a mapping name -> kind or (name, kind) pairs (kind None: the
            default); a name is an identifier of 1 to 64 characters, not "key". Several folders:
            each folder's name, in order. A listing column: "jpeg", "raw", "gray", "rgba", "mask",
            "int64", "float64", "str" or "label". A tar member: "str", "json" or "bytes", samples
            without it rejected as "missing-member". A table column: "str", "int64", "float64",
            "bytes" or "json".
        store: how undeclared image fields are stored: "jpeg" (default), "raw" (RGB pixels),
            "gray", "rgba" or "mask"; Parquet and Arrow take only "jpeg".
        scale: each further image field's size relative to the first: an int >= 1 (default 1),
            one per further field, or None (unchecked); a mismatch is a "size-mismatch" reject.
        patch: cut each first image to the centered square of this side (>= 1; the others by their scale). Excludes `max_side`.
        shard_format: "binary" (default) or "tar" (WebDataset tars with a member index each:
            image classification records and tar members only).
        image_column, label_column, key_column: a table source's (Parquet, Arrow, ``datasets``)
            image column (binary, or a struct with ``bytes`` or a ``path``; default "image"),
            label column (integers or class names; "none": no label; default the one ClassLabel
            column, else "label"; other integer columns and none chosen is an error listing
            them) and key column (default: file name and row number).
        image_root: the local folder image paths of a table or listing are resolved against and
            must stay inside (symbolic links resolved); default each file's own folder.
        drop_columns: a table source's columns left out (every other one is kept as a field).
        shard_size: input bytes per shard, in [1, 2**40] (default 256 MiB).
        max_side: shrink images whose longer side exceeds this (>= 1, aspect kept), or None (default).
        quality: JPEG quality of re-encoded images, in [1, 100] (default 90).
        workers: processes building records, in [1, 4 x CPUs], or None (default: one per CPU).
        resume, overwrite: finish an interrupted run into `out` with the same inputs and options
            (finished shards kept); or first remove shardfmt's files from `out`. Not both.
        strict, progress: raise `ConvertError` naming the first reject, after writing everything; a progress bar on stderr.
        engine: "local" (default: a process pool here) or "ray" (tasks on the Ray cluster).
        remote: credentials and retries (`RemoteOptions`) for a `src` or `out` given by URL.
        allow_empty: write an empty dataset when nothing becomes a record, rather than raise.
        break_lock: first remove the lock a crashed run left in an `out` given by URL.

    Returns:
        A `ConvertSummary`: records written, rejects by reason, bytes read and written, seconds.

    Raises:
        TypeError, ValueError: a keyword's type or range (the message names it), or a path over the system's limits.
        ConvertError: the source is none of the kinds above, missing or empty, or every input was
            rejected (without `allow_empty`; written first); the keywords do not fit the source;
            `out` is not empty; the inputs or options changed since the interrupted run; `strict`; a full disk.
        RemoteError: a store stopped answering: resumable (``resume=True``, ``break_lock=True``
            if a lock was left), nothing rejected for it.
        LockedError, WorkerError, OSError: another run holds `out`; a failure other than a bad input; `out` cannot be written.
    """
    src, out, image_root = expand_user(src), expand_user(out), expand_user(image_root)  # "~/x" as a shell reads it
    _check_paths(src, out)
    options = ConvertOptions(shard_format=shard_format, shard_size=shard_size, max_side=max_side, quality=quality, workers=workers,
                             resume=resume, overwrite=overwrite, strict=strict, progress=progress, engine=engine, remote=remote,
                             allow_empty=allow_empty, break_lock=break_lock)
    request = RecordRequest.of(fields=fields, store=store, scale=scale, patch=patch, image_column=image_column,
                               label_column=label_column, key_column=key_column, image_root=image_root, drop_columns=drop_columns)
    return _summary(_convert(src, os.fspath(out), request, options))


def _convert(src: Any, out: str, request: RecordRequest, options: ConvertOptions) -> ConvertResult:
    """Hand a source given by path to the one entry, one held in memory by way of a temporary folder."""
    paths = isinstance(src, (str, os.PathLike)) or (isinstance(src, (list, tuple)) and all(isinstance(i, (str, os.PathLike)) for i in src))
    if is_hf_dataset(src) or not paths:
        return _convert_in_memory(src, out, request, options)
    sources = [os.fspath(item) for item in src] if isinstance(src, (list, tuple)) else [os.fspath(cast(str, src))]
    return convert_sources(sources, out, request=request, options=options)


def _summary(result: ConvertResult) -> ConvertSummary:
    """What a finished conversion did, from its result and manifest."""
    manifest = result.manifest
    by_reason = manifest.rejects.get("by_reason") or {}
    return ConvertSummary(result.path, result.num_records, dict(sorted(by_reason.items())), result.input_bytes,
                          manifest.num_bytes, result.seconds, result)


def _convert_in_memory(src: Any, out: str, request: RecordRequest, options: ConvertOptions) -> ConvertResult:
    """Convert a source held in memory: saved or written to a temporary folder, then converted from there."""
    if is_hf_dataset_dict(src):
        splits = [str(name) for name in src]
        raise ConvertError(f"a DatasetDict: convert one split (src[{splits[0] if splits else 'train'!r}]; its splits: "
                           f"{', '.join(splits) or 'none'})")
    if options.resume:
        raise ConvertError("a source held in memory (a datasets.Dataset or an iterable of records) cannot be resumed: "
                           "convert it again with overwrite")
    with tempfile.TemporaryDirectory(prefix="shardfmt-source-") as folder:
        if is_hf_dataset(src):
            src.save_to_disk(os.path.join(folder, "dataset"))
            return convert_sources([os.path.join(folder, "dataset")], out, request=request, options=options)
        sources, declared = spill_records(cast(Iterable[Mapping[str, Any]], src), Path(folder), list(request.fields))
        return convert_sources(sources, out, request=replace(request, fields=tuple(declared)), options=options)
