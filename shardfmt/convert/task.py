"""One conversion task: the planned inputs of one shard become the shard and its sidecar.

A task reads each input with one `os.read` (a sample of a tar: its image member with one
`os.pread`, nothing extracted; an input in a store: one GET), normalises it
(`normalise.normalise_image`), and writes the records with `ShardWriter`, or `tar.TarShardWriter`
for tar shards (temporary name, fsync, rename). Only then does it write its sidecar,
``.shardfmt-work/shard-NNNNN.json``, atomically: record count, size, checksum, rejects and
statistics. A shard counts as done only when its sidecar exists and the files agree with it, so a
task killed at any moment is simply run again. For an output given by URL the shard (and a tar's
member index) is staged locally and uploaded, and the sidecar lives in the store
(`destination.py`). A shard whose inputs are all rejected gets a sidecar and no file. A record
bound for a tar shard whose key cannot be a tar key even with its dots replaced ("bad-key"),
repeats a key of the shard ("duplicate-key") or has a label outside [0, MAX_CLASSES)
("bad-label") is a reject too.

Tasks are independent and deterministic: the bytes of a shard depend only on its inputs and the
options, never on which process ran it or when.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..checksum import format_checksum
from ..errors import RejectError, SchemaError, WorkerError
from ..format.layout import MAX_CLASSES, MAX_FIELD_SIZE
from ..format.schema import IMAGE_CLASSIFICATION
from ..format.writer import ShardInfo, ShardWriter, shard_name
from ..storage import RemoteOptions, Store, open_store
from ..storage.urls import is_url
from ..tar.keys import display_key, tar_key
from ..tar.writer import TarShardInfo, TarShardWriter
from .destination import WORK_DIR, Destination, destination_for
from .normalise import REENCODE_REASONS, normalise_image
from .sources.results import describe_os_error, display_path, record_key

__all__ = [
    "MAX_INPUT_SIZE",
    "WORK_DIR",
    "ShardTask",
    "finished_sidecar",
    "read_input",
    "read_member",
    "read_remote_input",
    "run_shard_task",
    "shard_file_name",
    "sidecar_path",
]

MAX_INPUT_SIZE: Final = MAX_FIELD_SIZE
"""Largest input file read, in bytes (1 GiB, the format's field limit); larger is "too-large"."""


@dataclass(frozen=True)
class ShardTask:
    """The work of one shard.

    Attributes:
        index: the shard number; the file is `shard_file_name(index, shard_format)`.
        root: the source root that input paths are relative to (a folder or a URL).
        out: the output folder, or a URL (see `destination.py`).
        inputs: (input number, path, planned size, label) of each planned input, in order; a
            sample of a tar adds (offset of its image member's data, sample key).
        max_side, quality: normalisation options.
        shard_format: "binary" or "tar" (a tar and its member index, spec/tar.md).
        remote: credentials and retries for a `root` or `out` given by URL.
    """

    index: int
    root: str
    out: str
    inputs: tuple[tuple[Any, ...], ...]
    max_side: int | None
    quality: int
    shard_format: str = "binary"
    remote: RemoteOptions | None = None


def shard_file_name(index: int, shard_format: str) -> str:
    """Return the file name of shard `index` in `shard_format`: ``shard-00000.shard`` or ``.tar``."""
    return shard_name(index) if shard_format == "binary" else shard_name(index, suffix=".tar")


def sidecar_path(out: str | os.PathLike[str], *, index: int) -> Path:
    """Return where the sidecar of shard `index` is written."""
    return Path(out) / WORK_DIR / f"shard-{index:05d}.json"


def read_input(path: str, *, size_hint: int) -> bytes:
    """Read a whole file, normally with one `os.read` of `size_hint` + 1 bytes.

    Raises:
        RejectError: "unreadable" with the operating system's message, or "too-large" past
            `MAX_INPUT_SIZE`.
    """
    if size_hint > MAX_INPUT_SIZE:
        raise RejectError(f"{size_hint} bytes, over the input limit of {MAX_INPUT_SIZE}", reason="too-large")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise RejectError(describe_os_error(err), reason="unreadable") from err
    try:
        data = os.read(fd, size_hint + 1)
        if len(data) > size_hint:  # the file grew since it was planned: read the rest
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
                if sum(map(len, chunks)) > MAX_INPUT_SIZE:
                    raise RejectError(f"over the input limit of {MAX_INPUT_SIZE} bytes", reason="too-large")
            data = b"".join(chunks)
        return data
    except OSError as err:
        raise RejectError(describe_os_error(err), reason="unreadable") from err
    finally:
        os.close(fd)


def read_member(path: str, *, offset: int, size: int) -> bytes:
    """Read one member of a tar: `size` bytes at `offset`, with one `os.pread`.

    Raises:
        RejectError: "unreadable" with the operating system's message, or if the tar ends first.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise RejectError(describe_os_error(err), reason="unreadable") from err
    try:
        data = os.pread(fd, size, offset)
    except OSError as err:
        raise RejectError(describe_os_error(err), reason="unreadable") from err
    finally:
        os.close(fd)
    if len(data) != size:
        raise RejectError(f"the tar ends before the member's {size} bytes at byte {offset}", reason="unreadable")
    return data


class _TarOutput:
    """Checks that a record written into a tar reads back: a valid key (`tar.tar_key`), unique in
    the tar, and a label a ``.cls`` member holds. A record that fails becomes a reject."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def check(self, key: str, label: int) -> str:
        """Return the record's tar key, or raise RejectError ("bad-key", "duplicate-key", "bad-label")."""
        try:
            key = tar_key(key)
        except SchemaError as err:
            raise RejectError(err.message, reason="bad-key") from err
        if key in self.keys:
            raise RejectError(f"key {display_key(key)!r} is already in this tar shard", reason="duplicate-key")
        if not 0 <= label < MAX_CLASSES:
            raise RejectError(f"label {label} is outside [0, {MAX_CLASSES}), which a .cls member holds", reason="bad-label")
        return key


def run_shard_task(task: ShardTask, *, on_image: Callable[[int], None] | None = None) -> tuple[dict[str, Any], bool]:
    """Write the shard and sidecar of `task`, or keep them if a previous run finished them.

    Args:
        task: what to convert.
        on_image: called with a count after each input (or once with all of them when the shard
            was already done), to drive progress.

    Returns:
        The sidecar (see module docstring) and whether the existing shard was kept.

    Raises:
        WorkerError: anything other than a per-file reject, naming the shard and the input.
    """
    report = on_image if on_image is not None else _ignore
    name = shard_file_name(task.index, task.shard_format)
    destination = destination_for(task.out, task.index, task.remote)
    done = finished_sidecar(task, destination)
    if done is not None:
        destination.cleanup()
        report(len(task.inputs))
        return done, True
    source = open_store(task.root, remote=task.remote) if is_url(task.root) else None
    writer: Any = None
    tar = _TarOutput() if task.shard_format == "tar" else None
    current = "(before the first input)"
    try:
        rejects: list[list[Any]] = []
        passthrough = 0
        reencoded = dict.fromkeys(REENCODE_REASONS, 0)
        for number, path, size, label, *member in task.inputs:
            current = path if not member else f"{path}: sample {display_key(member[1])}"
            try:
                if member:
                    data = read_member(os.path.join(task.root, path), offset=member[0], size=size)
                    key = member[1] if tar is not None else display_key(member[1])
                elif source is not None:
                    data = read_remote_input(source, path, size_hint=size)
                    key = record_key(path)
                else:
                    data = read_input(os.path.join(task.root, path), size_hint=size)
                    key = record_key(path)
                if tar is not None:
                    key = tar.check(key, label)
                image = normalise_image(data, max_side=task.max_side, quality=task.quality)
            except RejectError as err:
                rejects.append([number, err.reason, err.message])
                report(1)
                continue
            if writer is None:
                output = destination.path(name)
                writer = ShardWriter(output, schema=IMAGE_CLASSIFICATION) if tar is None else TarShardWriter(output)
            if tar is None:
                writer.write({"image": image.data, "label": label, "key": key})
            else:
                writer.write(key, image=image.data, label=label)
                tar.keys.add(key)
            if image.reencoded is None:
                passthrough += 1
            else:
                reencoded[image.reencoded] += 1
            report(1)
        current = "(closing the shard)"
        info = writer.close() if writer is not None else None
        writer = None
        index: dict[str, Any] | None = None
        if isinstance(info, TarShardInfo):
            index = {"path": info.index.path.name, "size": info.index.size, "checksum": format_checksum(info.index.checksum)}
            info = info.tar
        if info is not None:
            current = "(uploading the shard)"
            destination.commit([name] if index is None else [name, index["path"]])
        sidecar = shard_sidecar(task, name=name, info=info, rejects=rejects, passthrough=passthrough, reencoded=reencoded)
        if index is not None:
            sidecar["member_index"] = index
        destination.write_sidecar(sidecar)
        return sidecar, False
    except Exception as err:
        raise WorkerError(
            f"input {display_path(current)}: {type(err).__name__}: {err}", path=destination.describe(name)
        ) from err
    finally:
        if writer is not None:  # not closed: remove its temporary file
            writer.abort()
        destination.cleanup()


def _ignore(count: int) -> None:
    pass


def shard_sidecar(
    task: Any, *, name: str, info: ShardInfo | None, rejects: list[dict[str, Any]], passthrough: int, reencoded: dict[str, int]
) -> dict[str, Any]:
    """The sidecar of a finished shard task: what the manifest and a resume need to know of it
    (a task whose inputs were all rejected writes no shard: `info` is None)."""
    return {
        "index": task.index,
        "inputs": len(task.inputs),
        "path": name if info is not None else None,
        "num_records": info.num_records if info is not None else 0,
        "size": info.size if info is not None else 0,
        "checksum": format_checksum(info.checksum) if info is not None else None,
        "rejects": rejects,
        "passthrough": passthrough,
        "reencoded": reencoded,
    }


def read_remote_input(store: Store, path: str, *, size_hint: int) -> bytes:
    """Read a whole input object from a store (retried as the store's policy says).

    Raises:
        RejectError: "unreadable" if the store refuses or fails, "too-large" past `MAX_INPUT_SIZE`.
    """
    if size_hint > MAX_INPUT_SIZE:
        raise RejectError(f"{size_hint} bytes, over the input limit of {MAX_INPUT_SIZE}", reason="too-large")
    try:
        return store.get(path.replace(os.sep, "/"))
    except OSError as err:
        raise RejectError(str(getattr(err, "message", err)), reason="unreadable") from err


def finished_sidecar(task: Any, destination: Destination) -> dict[str, Any] | None:
    """Return the sidecar of a shard a previous run finished, if the shard's files agree with it
    (`task` is a `ShardTask` or a `fieldtask.FieldTask`)."""
    sidecar = destination.read_sidecar()
    if sidecar is None or sidecar.get("index") != task.index or sidecar.get("inputs") != len(task.inputs):
        return None
    if sidecar.get("num_records") == 0:
        return sidecar
    try:
        files = [(shard_file_name(task.index, task.shard_format), sidecar)]
        if task.shard_format == "tar":
            files.append((sidecar["member_index"]["path"], sidecar["member_index"]))
        return sidecar if destination.files_match(files) else None
    except (OSError, KeyError, TypeError, ValueError):
        return None
