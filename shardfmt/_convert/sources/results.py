"""What scanning a source finds, and how inputs are named.

A scan of a source for `convert` is a `SourceScan`: candidate inputs (`SourceFile`) in
conversion order and what was set aside on the way (`ScanReject`), each reject placed by how many
inputs come before it. A scan for records of several fields is a `FieldScan` of `FieldInput`
records with typed `RecordField` fields. A record's key and every path a report shows are built
by `record_key` and `display_path`, an operating system's refusal reads as `describe_os_error`
says, wherever the input lies (`is_transient_os_error` tells a refusal that may pass), and
`is_field_name` says which names a field may have.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..images import IMAGE_KINDS

__all__ = [
    "VALUE_KINDS",
    "FieldInput",
    "FieldScan",
    "RecordField",
    "ScanReject",
    "SourceFile",
    "SourceScan",
    "describe_os_error",
    "display_path",
    "is_field_name",
    "is_transient_os_error",
    "record_key",
]

VALUE_KINDS: Final = ("int64", "float64", "str", "label")
"""Kinds of the fields of a record that are values rather than images."""
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_TRANSIENT_ERRNOS: Final = frozenset(
    getattr(errno, name) for name in (
        "EAGAIN", "EINTR", "ETIMEDOUT", "ECONNABORTED", "ECONNREFUSED", "ECONNRESET", "EHOSTDOWN", "EHOSTUNREACH",
        "ENETDOWN", "ENETRESET", "ENETUNREACH", "ENOLINK", "ESTALE",
    ) if hasattr(errno, name)
)


@dataclass(frozen=True)
class SourceFile:
    """One candidate input.

    Attributes:
        path: relative to the source root, with the platform's separators; undecodable bytes of
            a local file name are held as surrogate escapes, so ``root / path`` opens the file.
        label: its class index (or the listing's integer label).
        size, mtime_ns: from stat (or a stored object's size and a number derived from its
            version), to plan shards and to notice changed inputs on resume.
        offset, sample_key: for a sample of a tar: where its image member's data starts in the
            tar `path` (`size` is the member's), and its key (undecoded bytes as surrogate
            escapes); None for a file. For a row of a Parquet file `path`: its row within row
            group `row_group`, and its key.
        row_group, file_size: for a row of a Parquet file: its row group and the file's size
            (`size` is then the row's share of its row group's image bytes); None otherwise.
        members: for a sample of a tar, (data offset, size) of its member for each member
            column of the scan (`SourceScan.members`), in that order.
    """

    path: str
    label: int
    size: int
    mtime_ns: int
    offset: int | None = None
    sample_key: str | None = None
    row_group: int | None = None
    file_size: int | None = None
    members: tuple[tuple[int, int], ...] = ()

    @property
    def key(self) -> str:
        return record_key(self.path) if self.sample_key is None else display_path(self.sample_key)


@dataclass(frozen=True)
class ScanReject:
    """A file or folder found while scanning that cannot be an input.

    Attributes:
        position: how many inputs come before it, to merge rejects into input order.
        path: display form of its path relative to the source root (see `display_path`).
        reason: the reject code; detail: what was found.
        key: for a sample of a tar, the display form of its key; else None.
    """

    position: int
    path: str
    reason: str
    detail: str
    key: str | None = None


@dataclass(frozen=True)
class SourceScan:
    """The inputs of a conversion.

    Attributes:
        root: what input paths are relative to (the tree, or the listing's folder): a `Path`, or
            for a source given by URL the URL of that folder (as given, so tasks can open it).
        kind: "imagefolder", "csv", "jsonl", "webdataset", "parquet" or "folder".
        classes: class names in label order, or None for a listing with integer labels.
        inputs: the candidates in conversion order.
        rejects: what was set aside while scanning, in the same order.
        labelled: whether records have a label (tars without ``.cls`` members have none).
        members: for tars, (field name, kind: "str", "json" or "bytes") of each member column.
        not_stored: for tars, members that are no column, counted per extension.
    """

    root: Path | str
    kind: str
    classes: tuple[str, ...] | None
    inputs: tuple[SourceFile, ...]
    rejects: tuple[ScanReject, ...]
    labelled: bool = True
    members: tuple[tuple[str, str], ...] = ()
    not_stored: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class RecordField:
    """One column of the records: its field name and kind (an image kind or a value kind)."""

    name: str
    kind: str

    @property
    def is_image(self) -> bool:
        return self.kind in IMAGE_KINDS


@dataclass(frozen=True)
class FieldInput:
    """One record's inputs: a file per image column (the first is the reference), a value per
    value column (a label as its index), and its key."""

    files: tuple[SourceFile, ...]
    values: tuple[Any, ...]
    key: str


@dataclass(frozen=True)
class FieldScan:
    """The inputs of a multi-field conversion: `fields` (image fields first), `classes` as in
    `SourceScan`, the records in order and the rejects found while scanning; `root` and `kind`
    as in `SourceScan` ("folders" for several parallel folders)."""

    root: Path | str
    kind: str
    fields: tuple[RecordField, ...]
    classes: tuple[str, ...] | None
    inputs: tuple[FieldInput, ...]
    rejects: tuple[ScanReject, ...]


def display_path(path: str) -> str:
    """Return `path` '/'-separated and valid UTF-8: an undecodable byte becomes ``\\xNN``."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return text.replace(os.sep, "/") if os.sep != "/" else text


def record_key(path: str) -> str:
    """Return the record key of an input path: `display_path` without the last extension."""
    return display_path(os.path.splitext(path)[0])


def describe_os_error(err: OSError) -> str:
    """Return the reject detail for an OS error: its message and errno, without the path."""
    return f"{err.strerror or err}" + (f" (errno {err.errno})" if err.errno else "")


def is_transient_os_error(err: OSError) -> bool:
    """True if reading again later may succeed: a time-out, an interrupted call or a network
    file system whose server went away (ETIMEDOUT, EAGAIN, ECONNRESET, ESTALE, ...)."""
    return err.errno in _TRANSIENT_ERRNOS


def is_field_name(name: str) -> bool:
    """True if `name` may name a field of a record: an identifier of 1 to 64 characters, not "key"."""
    return bool(_FIELD_NAME.match(name)) and name != "key"
