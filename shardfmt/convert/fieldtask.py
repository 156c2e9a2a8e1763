"""One multi-field conversion task: the planned records of one shard become the shard and its sidecar.

As `task.run_shard_task` does for single images, with the same sidecar and crash rules, but
per record: read each image file, read the sizes from the headers and check them against the
stated scales (a high-resolution partner must be exactly `scale` times the reference on each
side, else the record is rejected as "size-mismatch"), reshape every image alike (`Geometry`,
scaled per field), store each in its kind (`pixels.store_image`), and write the record. A
reject of any file rejects the record; its detail names the field and the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import RejectError, WorkerError
from ..format.schema import Schema
from ..format.writer import ShardWriter, shard_name
from ..storage import RemoteOptions, Store, open_store
from ..storage.urls import is_url
from .destination import destination_for
from .normalise import REENCODE_REASONS
from .pixels import IMAGE_KINDS, plan_geometry, store_image, upright_size
from .sources.results import display_path
from .task import (
    finished_sidecar,
    read_input,
    read_member,
    read_remote_input,
    shard_sidecar,
)

__all__ = ["FieldTask", "run_field_task"]


@dataclass(frozen=True)
class FieldTask:
    """The work of one shard of multi-field records.

    Attributes:
        index: the shard number; out: the output folder, or a URL (`destination.py`); root: what
            input paths are relative to (a local folder, or a URL).
        schema: the records' schema.
        columns: (field name, kind) of each column, image columns first (the first is the
            reference), then value columns.
        scales: per image column, its size relative to the reference, or None when unchecked.
        inputs: (input number, ((path, planned size), ...) per image column, values, key); the
            image of a sample of a tar adds the offset of its member's data: (path, size, offset).
        max_side, patch, quality: how images are reshaped and re-encoded.
        shard_format: always "binary": tar shards hold image classification records only.
        remote: credentials and retries for a `root` or `out` given by URL.
    """

    shard_format: ClassVar[str] = "binary"

    index: int
    root: str
    out: str
    schema: Schema
    columns: tuple[tuple[str, str], ...]
    scales: tuple[int | None, ...]
    inputs: tuple[tuple[int, tuple[tuple[Any, ...], ...], tuple[Any, ...], str], ...]
    max_side: int | None
    patch: int | None
    quality: int
    remote: RemoteOptions | None = None


def run_field_task(task: FieldTask, *, on_image: Callable[[int], None] | None = None) -> tuple[dict[str, Any], bool]:
    """Write the shard and sidecar of `task`, or keep them if a previous run finished them.

    Returns:
        The sidecar and whether the existing shard was kept.

    Raises:
        WorkerError: anything other than a per-record reject, naming the shard and the input.
    """
    report = on_image if on_image is not None else (lambda count: None)
    name = shard_name(task.index)
    destination = destination_for(task.out, task.index, task.remote)
    done = finished_sidecar(task, destination)
    if done is not None:
        destination.cleanup()
        report(len(task.inputs))
        return done, True
    source = open_store(task.root, remote=task.remote) if is_url(task.root) else None
    writer: ShardWriter | None = None
    current = "(before the first input)"
    try:
        rejects: list[list[Any]] = []
        passthrough = 0
        reencoded = dict.fromkeys(REENCODE_REASONS, 0)
        for number, files, values, key in task.inputs:
            current = files[0][0]
            try:
                record, reasons = _build_record(task, files, values, key, source)
            except RejectError as err:
                rejects.append([number, err.reason, err.message])
                report(1)
                continue
            if writer is None:
                writer = ShardWriter(destination.path(name), schema=task.schema)
            writer.write(record)
            for reason in reasons:
                if reason is None:
                    passthrough += 1
                else:
                    reencoded[reason] += 1
            report(1)
        current = "(closing the shard)"
        info = writer.close() if writer is not None else None
        writer = None
        if info is not None:
            current = "(uploading the shard)"
            destination.commit([name])
        sidecar = shard_sidecar(task, name=name, info=info, rejects=rejects, passthrough=passthrough, reencoded=reencoded)
        destination.write_sidecar(sidecar)
        return sidecar, False
    except Exception as err:
        raise WorkerError(f"input {display_path(current)}: {type(err).__name__}: {err}", path=destination.describe(name)) from err
    finally:
        if writer is not None:
            writer.abort()
        destination.cleanup()


def _build_record(
    task: FieldTask, files: tuple[tuple[Any, ...], ...], values: tuple[Any, ...], key: str, source: Store | None = None
) -> tuple[dict[str, Any], list[str | None]]:
    """Return the record and, per jpeg field, why it was re-encoded (None: kept as it was)."""
    images = [(name, kind) for name, kind in task.columns if kind in IMAGE_KINDS]
    datas, sizes = [], []
    for n, ((path, size, *member), (name, _)) in enumerate(zip(files, images)):
        try:
            if member:  # the image member of a sample of a tar
                data = read_member(os.path.join(task.root, path), offset=member[0], size=size)
            elif source is not None:  # an input in a store given by URL
                data = read_remote_input(source, path, size_hint=size)
            else:
                data = read_input(os.path.join(task.root, path), size_hint=size)
            datas.append(data)
            sizes.append(upright_size(data))
        except RejectError as err:
            raise _in_field(err, name, path, n) from err
    ref_width, ref_height = sizes[0]
    for n, ((path, *_), (name, _), scale) in enumerate(zip(files, images, task.scales)):
        if n and scale is not None and sizes[n] != (ref_width * scale, ref_height * scale):
            raise RejectError(
                f"field {name!r} ({display_path(path)}) is {sizes[n][0]}x{sizes[n][1]}, not {scale} x "
                f"{ref_width}x{ref_height} = {ref_width * scale}x{ref_height * scale} (--scale)",
                reason="size-mismatch",
            )
    geometry = plan_geometry(ref_width, ref_height, max_side=task.max_side, patch=task.patch)
    record: dict[str, Any] = {}
    reasons: list[str | None] = []
    for n, (data, (path, *_), (name, kind), scale) in enumerate(zip(datas, files, images, task.scales)):
        try:
            stored = store_image(data, kind=kind, geometry=geometry.scaled(scale or 1) if geometry is not None else None, quality=task.quality)
        except RejectError as err:
            raise _in_field(err, name, path, n) from err
        record[name] = stored.value
        if kind == "jpeg":
            reasons.append(stored.reencoded)
    value_columns = [name for name, kind in task.columns if kind not in IMAGE_KINDS]
    record.update(zip(value_columns, values))
    record["key"] = key
    return record, reasons


def _in_field(err: RejectError, name: str, path: str, n: int) -> RejectError:
    """The reject of one file, its detail naming the field (and the file, for a partner)."""
    where = f"field {name!r}" if n == 0 else f"field {name!r} ({display_path(path)})"
    return RejectError(f"{where}: {err.message}", reason=err.reason)
