"""Finding the inputs of a conversion, in a fixed order: an ImageFolder tree or a listing file.

ImageFolder (a directory): every sub-folder of the root is a class; classes are sorted by name
as plain strings and numbered from 0, as torchvision's ``find_classes`` does. Files are found
recursively in each class folder, following symbolic links, in the order of torchvision's
``make_dataset``: directories sorted by their path, the files of each sorted by name. Every regular
file is a candidate; its content, not its name, decides later whether it is an image. Found here
and reported as rejects instead of inputs:

- "hidden": a file or folder whose name starts with "." (a hidden folder is not entered and a
  hidden folder at the root is not a class);
- "symlink-loop": a folder that is one of its own ancestors (same st_dev and st_ino), reached
  through a symbolic link; it is not entered again;
- "unreadable": a broken symbolic link, something that is not a regular file (a FIFO, a
  device), or a folder or file the operating system refuses to stat or list;
- "no-class": a file directly in the root, which belongs to no class.

A class folder with no images keeps its class, so labels stay those torchvision would give.

Listing (a ``.csv`` file with the header ``path,label``, or ``.jsonl`` with one
``{"path": ..., "label": ...}`` object per line): paths are relative to the listing's folder and
stay inside it; inputs keep the listing's order. Labels are all integers (the dataset then has
no class names) or all strings (class names, sorted as above, label = index). The hidden-file
rule does not apply to listed paths: a listing names its files on purpose.

The key of a record is its path relative to the source root, '/'-separated, without the last
extension. File names that are not UTF-8 keep their record; their key and report path show each
undecodable byte as ``\\xNN``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConvertError

__all__ = [
    "LISTING_SUFFIXES",
    "ScanReject",
    "SourceFile",
    "SourceScan",
    "describe_os_error",
    "display_path",
    "record_key",
    "scan_source",
]

LISTING_SUFFIXES = (".csv", ".jsonl")
_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class SourceFile:
    """One candidate input.

    Attributes:
        path: relative to the source root, with the platform's separators; undecodable bytes of
            the file name are held as surrogate escapes, so ``root / path`` opens the file.
        label: its class index (or the listing's integer label).
        size, mtime_ns: from stat, to plan shards and to notice changed inputs on resume.
    """

    path: str
    label: int
    size: int
    mtime_ns: int

    @property
    def key(self) -> str:
        return record_key(self.path)


@dataclass(frozen=True)
class ScanReject:
    """A file or folder found while scanning that cannot be an input.

    Attributes:
        position: how many inputs come before it, to merge rejects into input order.
        path: display form of its path relative to the source root (see `display_path`).
        reason: the reject code; detail: what was found.
    """

    position: int
    path: str
    reason: str
    detail: str


@dataclass(frozen=True)
class SourceScan:
    """The inputs of a conversion.

    Attributes:
        root: the folder paths are relative to (the tree, or the listing's folder).
        kind: "imagefolder", "csv" or "jsonl".
        classes: class names in label order, or None for a listing with integer labels.
        inputs: the candidates in conversion order.
        rejects: what was set aside while scanning, in the same order.
    """

    root: Path
    kind: str
    classes: tuple[str, ...] | None
    inputs: tuple[SourceFile, ...]
    rejects: tuple[ScanReject, ...]


def display_path(path: str) -> str:
    """Return `path` '/'-separated and valid UTF-8: an undecodable byte becomes ``\\xNN``."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return text.replace(os.sep, "/") if os.sep != "/" else text


def record_key(path: str) -> str:
    """Return the record key of an input path: `display_path` without the last extension."""
    return display_path(os.path.splitext(path)[0])


def scan_source(src: str | os.PathLike[str]) -> SourceScan:
    """Find the inputs of a conversion.

    Args:
        src: an ImageFolder directory, or a ``.csv`` / ``.jsonl`` listing file.

    Returns:
        The inputs in conversion order, the classes, and the rejects found while scanning.

    Raises:
        ConvertError: `src` does not exist, is neither a folder nor a listing, or a listing is
            malformed (the message names the line).
    """
    path = Path(src)
    if path.is_dir():
        return _Scanner(path).scan_tree()
    if path.is_file() and path.suffix.lower() in LISTING_SUFFIXES:
        return _scan_listing(path)
    if not path.exists():
        raise ConvertError("the source does not exist", path=path)
    raise ConvertError(
        f"the source is neither a folder (ImageFolder) nor a listing ({', '.join(LISTING_SUFFIXES)})", path=path
    )


def describe_os_error(err: OSError) -> str:
    """Return the reject detail for an OS error: its message and errno, without the path."""
    return f"{err.strerror or err}" + (f" (errno {err.errno})" if err.errno else "")


@dataclass
class _Item:
    name: str
    path: str
    reject: tuple[str, str] | None = None
    source: SourceFile | None = None


@dataclass
class _Scanner:
    root: Path
    inputs: list[SourceFile] = field(default_factory=list)
    rejects: list[ScanReject] = field(default_factory=list)

    def emit(self, item: _Item) -> None:
        if item.source is not None:
            self.inputs.append(item.source)
        elif item.reject is not None:
            reason, detail = item.reject
            self.rejects.append(ScanReject(len(self.inputs), display_path(item.path), reason, detail))

    def scan_tree(self) -> SourceScan:
        try:
            root_id = _identity(os.stat(self.root))
            with os.scandir(self.root) as it:
                entries = sorted(it, key=lambda entry: entry.name)
        except OSError as err:
            raise ConvertError(f"cannot list the source folder: {describe_os_error(err)}", path=self.root) from err
        classes: list[str] = []
        for entry in entries:
            if entry.name.startswith("."):
                self.emit(_Item(entry.name, entry.name, ("hidden", "hidden files and folders are skipped")))
            elif _is_dir(entry):
                self.walk_class(entry, label=len(classes), root_id=root_id)
                classes.append(display_path(entry.name))
            else:
                item = _file_item(entry, entry.name, -1)
                if item.source is not None:
                    item = _Item(entry.name, entry.name, ("no-class", "a file in the root folder belongs to no class"))
                self.emit(item)
        return SourceScan(self.root, "imagefolder", tuple(classes), tuple(self.inputs), tuple(self.rejects))

    def walk_class(self, class_entry: os.DirEntry[str], *, label: int, root_id: tuple[int, int]) -> None:
        """Emit the files of one class folder in torchvision's order: folders sorted by path."""
        found: list[tuple[str, list[_Item]]] = []
        pending: list[_Folder] = []
        start = _enter(class_entry, class_entry.name, ((root_id, ""),))
        if isinstance(start, _Folder):
            pending.append(start)
        else:
            found.append((class_entry.name, [start]))
        while pending:
            folder = pending.pop()
            items: list[_Item] = []
            try:
                with os.scandir(self.root / folder.path) as it:
                    entries = list(it)
            except OSError as err:
                reject = ("unreadable", f"cannot list the folder: {describe_os_error(err)}")
                found.append((folder.path, [_Item(folder.path, folder.path, reject)]))
                continue
            for entry in entries:
                child = os.path.join(folder.path, entry.name)
                if entry.name.startswith("."):
                    items.append(_Item(entry.name, child, ("hidden", "hidden files and folders are skipped")))
                elif _is_dir(entry):
                    sub = _enter(entry, child, folder.ancestors)
                    if isinstance(sub, _Folder):
                        pending.append(sub)
                    else:
                        items.append(sub)
                else:
                    items.append(_file_item(entry, child, label))
            items.sort(key=lambda item: item.name)
            found.append((folder.path, items))
        found.sort(key=lambda pair: pair[0])
        for _, items in found:
            for item in items:
                self.emit(item)


@dataclass(frozen=True)
class _Folder:
    path: str
    ancestors: tuple[tuple[tuple[int, int], str], ...]
    """(st_dev, st_ino) and path of every folder from the root down to this one, itself included."""


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symbolic links, as os.walk(followlinks=True) does
    except OSError:
        return False


def _enter(entry: os.DirEntry[str], rel: str, ancestors: tuple[tuple[tuple[int, int], str], ...]) -> _Folder | _Item:
    """Return the folder to walk, or a reject if it is one of its own ancestors or cannot be stat'ed."""
    try:
        identity = _identity(entry.stat())
    except OSError as err:
        return _Item(entry.name, rel, ("unreadable", describe_os_error(err)))
    for ancestor, ancestor_rel in ancestors:
        if ancestor == identity:
            target = display_path(ancestor_rel) if ancestor_rel else "the source root"
            return _Item(entry.name, rel, ("symlink-loop", f"the folder is its own ancestor ({target}); not entered again"))
    return _Folder(rel, (*ancestors, (identity, rel)))


def _file_item(entry: os.DirEntry[str], rel: str, label: int) -> _Item:
    try:
        st = entry.stat()
    except OSError as err:
        broken = " (broken symbolic link)" if entry.is_symlink() else ""
        return _Item(entry.name, rel, ("unreadable", describe_os_error(err) + broken))
    if not stat.S_ISREG(st.st_mode):
        return _Item(entry.name, rel, ("unreadable", "not a regular file"))
    return _Item(entry.name, rel, source=SourceFile(rel, label, st.st_size, st.st_mtime_ns))


def _scan_listing(listing: Path) -> SourceScan:
    kind = listing.suffix.lower().lstrip(".")
    try:
        text = listing.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ConvertError(f"cannot read the listing: {err}", path=listing) from err
    rows = _csv_rows(text, listing) if kind == "csv" else _jsonl_rows(text, listing)
    classes: tuple[str, ...] | None = None
    if rows and all(isinstance(label, str) for _, _, label in rows):
        if kind == "csv" and all(_INT_RE.match(str(label).strip()) for _, _, label in rows):
            rows = [(line, path, int(str(label))) for line, path, label in rows]
        else:
            classes = tuple(sorted({str(label) for _, _, label in rows}))
    index = {name: i for i, name in enumerate(classes or ())}
    root = listing.parent
    scanner = _Scanner(root)
    for line, path, label in rows:
        if isinstance(label, str) != (classes is not None):
            raise ConvertError(f"line {line}: labels must be all integers or all strings", path=listing)
        if isinstance(label, str):
            if not label:
                raise ConvertError(f"line {line}: empty label", path=listing)
            label = index[label]
        elif not -_INT64_MAX - 1 <= label <= _INT64_MAX:
            raise ConvertError(f"line {line}: label {label} does not fit in int64", path=listing)
        rel = _listed_path(path, line, listing)
        try:
            st = os.stat(root / rel)
        except OSError as err:
            scanner.emit(_Item(rel, rel, ("unreadable", describe_os_error(err))))
            continue
        if not stat.S_ISREG(st.st_mode):
            scanner.emit(_Item(rel, rel, ("unreadable", "not a regular file")))
            continue
        scanner.emit(_Item(rel, rel, source=SourceFile(rel, label, st.st_size, st.st_mtime_ns)))
    return SourceScan(root, kind, classes, tuple(scanner.inputs), tuple(scanner.rejects))


def _listed_path(path: str, line: int, listing: Path) -> str:
    """Return a listed path in normal form, or fail if it is empty, absolute or leaves the folder."""
    if not path or os.path.isabs(path) or "\x00" in path:
        raise ConvertError(f"line {line}: path {path!r} must be non-empty and relative to the listing's folder", path=listing)
    rel = os.path.normpath(path)
    if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise ConvertError(f"line {line}: path {path!r} leaves the listing's folder", path=listing)
    return rel


def _csv_rows(text: str, listing: Path) -> list[tuple[int, str, Any]]:
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None or [h.strip() for h in header[:2]] != ["path", "label"]:
        raise ConvertError(f"line 1: the header must start with 'path,label', found {header!r}", path=listing)
    rows = []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) < 2:
            raise ConvertError(f"line {line}: expected 'path,label', found {row!r}", path=listing)
        rows.append((line, row[0], row[1].strip()))
    return rows


def _jsonl_rows(text: str, listing: Path) -> list[tuple[int, str, Any]]:
    rows = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError as err:
            raise ConvertError(f"line {line}: not JSON: {err}", path=listing) from err
        if not isinstance(value, dict) or not isinstance(value.get("path"), str):
            raise ConvertError(f'line {line}: expected {{"path": "...", "label": ...}}', path=listing)
        label = value.get("label")
        if isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ConvertError(f"line {line}: label must be an integer or a string, found {label!r}", path=listing)
        rows.append((line, value["path"], label))
    return rows
