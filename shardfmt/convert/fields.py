"""`convert_fields`: records of several fields (image pairs, image and mask, listing columns), and
images stored as raw pixels, converted with the guarantees of `convert`.

The sources (`sources.scan_fields` has the details): an ImageFolder tree or ``path,label``
listing whose images are stored in another kind (``store="raw"``: decoded RGB pixels); several
parallel folders matched by file name (``LR/ HR/``); or a listing with several columns
(``image,mask,label,weight``). Each image column is stored in a kind (`pixels.IMAGE_KINDS`:
jpeg, raw, gray, rgba, mask), each value column as int64, float64, str or a label.

Image columns after the first have a stated ``scale`` relative to it (1 by default: the same
size): a record whose images do not have exactly those sizes is rejected as "size-mismatch",
read from the headers before decoding. ``max_side`` and ``patch`` reshape the first image and
every other one by the same geometry times its scale, so the relation stays exact.

Planning, the process pool (or Ray, ``engine="ray"``), sidecars, resume, rejects.jsonl and the
manifest written last are `convert`'s own (`convert.run_plan`, or `convert_remote.run_plan_in_store`
for an output given by URL): same determinism, atomicity and crash safety. One source (an
ImageFolder or a listing) may be a URL; several folders must be local.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConvertError
from ..format.schema import Field, Schema
from ..format.writer import DEFAULT_SHARD_SIZE
from ..storage import RemoteOptions
from ..storage.urls import is_url
from .fieldtask import FieldTask, run_field_task
from .normalise import DEFAULT_QUALITY
from .pixels import IMAGE_KINDS
from .run import ConvertResult, check_options, plan_shards, prepare_output, run_plan
from .sources import listing_columns, scan_fields, source_name
from .sources.results import FieldScan

__all__ = ["convert_fields", "needs_fields"]

_PLAN_VERSION = 1
_TYPES = {"jpeg": "jpeg", "int64": "int64", "label": "int64", "float64": "float64", "str": "str"}
"""Format type of each converter kind; the other image kinds are "raw"."""

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
        quality, shard_size, workers, resume, overwrite, strict, progress, engine, remote: as
            for `convert`.

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
        raise ConvertError("--patch and --max-side exclude each other: a patch has a fixed size")
    names = [os.fspath(sources)] if isinstance(sources, (str, os.PathLike)) else [os.fspath(s) for s in sources]
    paths = [Path(name) for name in names if not is_url(name)]
    to_store = is_url(os.fspath(out)) or len(paths) < len(names)  # a source given by URL goes the store's way, as in convert
    if to_store:
        from .remote import prepare_store, run_plan_in_store

        output, stored_plan = prepare_store(os.fspath(out), remote=remote, resume=resume, overwrite=overwrite)
    else:
        out = Path(out)
        for src in paths:
            if src.is_dir() and (out.resolve() == src.resolve() or src.resolve() in out.resolve().parents):
                raise ConvertError("the output folder lies inside a source folder; choose another", path=out)
        prepare_output(out, resume=resume, overwrite=overwrite)
    declared = list(fields.items()) if isinstance(fields, Mapping) else list(fields)
    scan = scan_fields(names, declared=declared, store=store, remote=remote)
    images = [column for column in scan.columns if column.is_image]
    scales = _scales(scale, len(images))
    if None in scales and (patch is not None or max_side is not None):
        raise ConvertError("--patch and --max-side reshape every image of a record alike, so they need a stated --scale")
    schema = Schema(
        tuple(Field(c.name, _TYPES.get(c.kind, "raw")) for c in scan.columns) + (Field("key", "str"),)
    )
    options = {
        "fields": [[c.name, c.kind] for c in scan.columns],
        "scale": list(scales),
        "patch": patch,
        "max_side": max_side,
        "quality": quality,
        "shard_size": shard_size,
    }
    plan = _make_plan(scan, [source_name(name, remote=remote) for name in names], options)
    tasks = [
        FieldTask(
            index=index,
            root=str(scan.root),
            out=os.fspath(out),
            schema=schema,
            columns=tuple((c.name, c.kind) for c in scan.columns),
            scales=scales,
            inputs=tuple(
                (i, tuple((path, size, *member) for path, size, _, *member in item[4]["files"]), _values(item[4]["values"]), item[4]["key"])
                for i, item in enumerate(plan["inputs"][start:stop], start)
            ),
            max_side=max_side,
            patch=patch,
            quality=quality,
            remote=remote,
        )
        for index, (start, stop) in enumerate(plan["shards"])
    ]
    if to_store:
        return run_plan_in_store(
            plan, tasks, runner=run_field_task, schema=schema, store=output, out=os.fspath(out), stored_plan=stored_plan,
            workers=workers, progress=progress, strict=strict, engine=engine, started=started,
        )
    return run_plan(
        plan, tasks, runner=run_field_task, schema=schema, out=Path(out), workers=workers,
        progress=progress, strict=strict, reject_root=Path(scan.root), started=started, engine=engine,
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


def _make_plan(scan: FieldScan, sources: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """The plan `convert.run_plan` stores: inputs keep convert's first four items (reference path,
    total size, reference mtime, label), then the files, values and key of the record."""
    value_columns = [column for column in scan.columns if not column.is_image]
    labels = [n for n, column in enumerate(value_columns) if column.kind == "label"]
    inputs = []
    for item in scan.inputs:
        # The image of a sample of a tar adds where its member's data starts.
        files = [[f.path, f.size, f.mtime_ns, *([f.offset] if f.offset is not None else [])] for f in item.files]
        label = item.values[labels[0]] if labels else 0
        extra = {"files": files, "values": [_plan_value(v) for v in item.values], "key": item.key}
        if item.files[0].sample_key is not None:
            extra["sample_key"] = item.files[0].sample_key  # named by its rejects
        inputs.append([item.files[0].path, sum(f.size for f in item.files), item.files[0].mtime_ns, label, extra])
    return {
        "version": _PLAN_VERSION,
        "source": sources,
        "kind": scan.kind,
        "options": options,
        "classes": list(scan.classes) if scan.classes is not None else None,
        "inputs": inputs,
        "shard_format": "binary",
        "scan_rejects": [[r.position, r.path, r.reason, r.detail, *([r.key] if r.key is not None else [])] for r in scan.rejects],
        "shards": [list(span) for span in plan_shards([item[1] for item in inputs], shard_size=options["shard_size"])],
    }


def _plan_value(value: Any) -> Any:
    """A value as the plan stores it: floats as their exact hex form, so that a NaN compares
    equal to itself when a resumed run checks the plan."""
    return {"float": value.hex()} if isinstance(value, float) else value


def _values(values: list[Any]) -> tuple[Any, ...]:
    return tuple(float.fromhex(v["float"]) if isinstance(v, dict) else v for v in values)
