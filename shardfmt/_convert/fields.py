"""`convert_fields`: records of several fields (image pairs, image and mask, listing columns), and
images stored as raw pixels, converted with the guarantees of `convert`.

The sources (`sources.scan_fields` has the details): an ImageFolder tree or ``path,label``
listing whose images are stored in another kind (``store="raw"``: decoded RGB pixels); several
parallel folders matched by file name (``LR/ HR/``); or a listing with several columns
(``image,mask,label,weight``). Each image column is stored in a kind (`images.IMAGE_KINDS`:
jpeg, raw, gray, rgba, mask), each value column as int64, float64, str or a label.

Image columns after the first have a stated ``scale`` relative to it (1 by default: the same
size): a record whose images do not have exactly those sizes is rejected as "size-mismatch",
read from the headers before decoding. ``max_side`` and ``patch`` reshape the first image and
every other one by the same geometry times its scale, so the relation stays exact.

Planning (`plan.from_field_scan`), the parallel build (`records.FieldsBuilder`), sidecars,
resume, rejects.jsonl and the manifest written last are `convert`'s own pipeline
(`loop.run_conversion`): same determinism, atomicity and crash safety, for a local output or
one given by URL. One source (an ImageFolder or a listing) may be a URL; several folders
must be local.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import ConvertError
from .._storage import RemoteOptions
from ..format._writer import DEFAULT_SHARD_SIZE
from .destination import Output
from .images import DEFAULT_QUALITY, IMAGE_KINDS
from .loop import ConvertResult, already_finished, run_conversion
from .plan import field_schema, from_field_scan
from .records import builder_for
from .run import check_not_all_rejected, check_not_inside, check_options, nothing_found, resolve_workers
from .sources import listing_columns, scan_fields, source_name

__all__ = ["convert_fields", "needs_fields"]

Declared = Sequence[tuple[str, "str | None"]] | Mapping[str, "str | None"]


def needs_fields(
    sources: Sequence[str | os.PathLike[str]], *, store: str = "jpeg", fields: Declared = (), scale: Any = None, patch: int | None = None,
    remote: RemoteOptions | None = None,
) -> bool:
    """True if the conversion asked for needs `convert_fields` rather than `convert`: several
    sources, a store other than jpeg, declared fields, a scale, a patch, or a listing with
    columns other than path and label (`remote`: for a listing given by URL)."""
    if len(sources) != 1 or store != "jpeg" or fields or scale is not None or patch is not None:
        return True
    columns = listing_columns(sources[0], remote=remote)
    return columns is not None and columns != ["path", "label"]


def convert_fields(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    fields: Declared = (),
    store: str = "jpeg",
    scale: int | Sequence[int] | None = 1,
    patch: int | None = None,
    max_side: int | None = None,
    quality: int = DEFAULT_QUALITY,
    shard_size: int = DEFAULT_SHARD_SIZE,
    workers: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = False,
    engine: str = "local",
    remote: RemoteOptions | None = None,
    allow_empty: bool = False,
    break_lock: bool = False,
    image_root: str | os.PathLike[str] | None = None,
) -> ConvertResult:
    """Convert records of several fields, or images stored as pixels (see the module docstring).

    Args:
        sources: one ImageFolder or listing (either may be a URL), or several local folders (one
            per image field).
        out: the output folder (rules as for `convert`), or a URL (``s3://bucket/prefix``).
        fields: (name, kind or None) per folder in order, or kinds of listing columns by name.
        store: the kind of image fields whose kind is not declared: "jpeg", "raw" (RGB
            pixels), "gray", "rgba" or "mask".
        scale: the size of each image field after the first, relative to the first: one int
            for all, one per field, or None to check nothing.
        patch: resize every first image so its shorter side is `patch` and keep the centered
            square (the others by their scale).
        max_side: shrink first images whose longer side exceeds this (the others by their scale).
        quality, shard_size, workers, resume, overwrite, strict, progress, engine, remote, allow_empty, break_lock: as for
            `convert`.
        image_root: for a listing, the local folder its paths are resolved against and confined to.

    Returns:
        A `ConvertResult`.

    Raises:
        ValueError, ConvertError, WorkerError, OSError: as `convert`; ConvertError also when the
            sources, declarations and scales do not fit together, or several sources are URLs.
    """
    started = time.perf_counter()
    check_options(
        shard_size=shard_size, max_side=max_side, quality=quality, workers=workers, resume=resume, overwrite=overwrite, engine=engine
    )
    if store not in IMAGE_KINDS:
        raise ValueError(f"store must be one of {', '.join(IMAGE_KINDS)}, got {store!r}")
    if patch is not None and patch < 1:
        raise ValueError(f"patch {patch} must be at least 1")
    if patch is not None and max_side is not None:
        raise ConvertError("patch= and max_side= exclude each other: a patch has a fixed size")
    names = [os.fspath(sources)] if isinstance(sources, (str, os.PathLike)) else [os.fspath(s) for s in sources]
    check_not_inside(names, os.fspath(out))
    with Output.open(out, remote=remote, resume=resume, overwrite=overwrite, break_lock=break_lock) as output:
        if output.finished is not None:
            return already_finished(output, started=started)
        result = _convert_into(output, names, fields=fields, store=store, scale=scale, patch=patch, max_side=max_side, quality=quality,
                               shard_size=shard_size, workers=workers, strict=strict, progress=progress, engine=engine, remote=remote,
                               allow_empty=allow_empty, image_root=image_root, started=started)
    check_not_all_rejected(result, allow_empty=allow_empty)
    return result


def _convert_into(output: Output, names: list[str], *, fields: Declared, store: str, scale: Any, patch: int | None,
                  max_side: int | None, quality: int, shard_size: int, workers: int | None, strict: bool, progress: bool,
                  engine: str, remote: RemoteOptions | None, allow_empty: bool, image_root: str | os.PathLike[str] | None,
                  started: float) -> ConvertResult:
    declared = list(fields.items()) if isinstance(fields, Mapping) else list(fields)
    scan = scan_fields(names, declared=declared, store=store, remote=remote, image_root=image_root)
    if not scan.inputs and not allow_empty:
        reasons = Counter(r.reason for r in scan.rejects)
        raise ConvertError(nothing_found(scan.kind, len(scan.rejects), reasons), path=names[0] if len(names) == 1 else ', '.join(names))
    images = [column for column in scan.columns if column.is_image]
    scales = _scales(scale, len(images))
    if None in scales and (patch is not None or max_side is not None):
        raise ConvertError("--patch and --max-side reshape every image of a record alike, so they need a stated --scale")
    schema = field_schema(scan.columns)
    options = {
        "fields": [[c.name, c.kind] for c in scan.columns],
        "scale": list(scales),
        "patch": patch,
        "max_side": max_side,
        "quality": quality,
        "shard_size": shard_size,
    }
    plan = from_field_scan(
        scan, source=tuple(source_name(name, remote=remote) for name in names), root=os.fspath(scan.root), schema=schema, options=options
    )
    return run_conversion(
        plan, output, builder=builder_for(plan, remote=remote), workers=resolve_workers(workers), engine=engine,
        progress=progress, strict=strict, started=started,
    )


def _scales(scale: int | Sequence[int] | None, images: int) -> tuple[int | None, ...]:
    if scale is None:
        return (1,) + (None,) * (images - 1)
    values = [scale] * (images - 1) if isinstance(scale, int) else list(scale)
    if len(values) != images - 1:
        raise ConvertError(f"{len(values)} scales for {images - 1} image fields after the first; give one, or one per field")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ConvertError(f"scales must be whole numbers of at least 1, got {values}")
    return (1, *values)
