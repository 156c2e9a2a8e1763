"""What scanning a source finds, and how inputs are named.

A scan of any source is a `SourceScan`: records of named, typed fields (`RecordField`; image
classification is the fields `IMAGE_AND_LABEL`), each a `ScannedRecord` of its files
(`SourceFile`) and values, in conversion order, and what was set aside on the way
(`ScanReject`), each reject placed by how many records come before it. A record's key and every path a report shows are built
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
    "IMAGE_AND_LABEL",
    "VALUE_KINDS",
    "RecordField",
    "ScanReject",
    "ScannedRecord",
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
    """One file a record is read from.

    Attributes:
        path: relative to the source root, with the platform's separators; undecodable bytes of
            a local file name are held as surrogate escapes, so ``root / path`` opens the file.
        size, mtime_ns: from stat (or a stored object's size and a number derived from its
            version), to plan shards and to notice changed inputs on resume.
        offset, sample_key: for a member of a sample of a tar: where its data starts in the tar
            `path` (`size` is the member's), and the sample's key (undecoded bytes as surrogate
            escapes); None for a file. For a row of a Parquet file `path`: its row within row
            group `row_group`, and its key.
        row_group, file_size: for a row of a Parquet file: its row group and the file's size
            (`size` is then the row's share of its row group's image bytes); None otherwise.
    """

    path: str
    size: int
    mtime_ns: int
    offset: int | None = None
    sample_key: str | None = None
    row_group: int | None = None
    file_size: int | None = None

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
class RecordField:
    """One named, typed field of the records.

    Attributes:
        name: the field's name.
        kind: an image kind (`images.IMAGE_KINDS`), or a value kind: "label" (a class index),
            "int64", "float64", "str", "bytes" or "json".
        member: the value is a member of a sample of a tar, read from its own file when the
            record is built (text decoded, JSON parsed); else it is found by the scan. In the
            records' schema a member comes after the key (spec/tar.md), every other field before.
    """

    name: str
    kind: str
    member: bool = False

    @property
    def is_image(self) -> bool:
        return self.kind in IMAGE_KINDS


@dataclass(frozen=True)
class ScannedRecord:
    """One record's inputs: a file per image field (the first is the reference that names it),
    then a file per member field; a value per other field (a label as its class index); its key."""

    files: tuple[SourceFile, ...]
    values: tuple[Any, ...]
    key: str


@dataclass(frozen=True)
class SourceScan:
    """What a scan of a source found: records of named, typed fields, whatever the source.

    Attributes:
        root: what input paths are relative to (the tree, or the listing's folder): a `Path`, or
            for a source given by URL the URL of that folder (as given, so tasks can open it).
        kind: "imagefolder", "folder", "csv", "jsonl", "webdataset", "parquet" or "folders".
        fields: the records' fields: image fields first, then the others in order.
        classes: class names in label order, or None (integer labels, or no label field).
        inputs: the records in conversion order.
        rejects: what was set aside while scanning, in the same order.
        not_stored: for tars, members that are no field, counted per extension.
        names_fields: the fields were asked for by name (several folders, a listing of further
            columns, declared fields, a table's further columns): the manifest's options then
            list them, and a reject's detail names the field whose file it concerns.
    """

    root: Path | str
    kind: str
    fields: tuple[RecordField, ...]
    classes: tuple[str, ...] | None
    inputs: tuple[ScannedRecord, ...]
    rejects: tuple[ScanReject, ...]
    not_stored: tuple[tuple[str, int], ...] = ()
    names_fields: bool = False


IMAGE_AND_LABEL: Final = (RecordField("image", "jpeg"), RecordField("label", "label"))
"""The fields of image classification records (the key aside): a JPEG image and its class index."""


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
