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

WebDataset tars (a ``.tar`` file, a brace pattern such as ``shards-{000..009}.tar``, or a folder
that holds ``.tar`` files and no sub-folders): each tar's headers are read (nothing is extracted)
and its members grouped into samples as `tar.scan_samples` does; a sample's image is its first
member with an extension of `TAR_IMAGE_EXTENSIONS` (its content decides later, as for files), its
label the integer in its ``.cls`` member, and its key the sample key. Classes are the labels in
decimal, "0" to the largest. Found here and reported as rejects instead of inputs:
"duplicate-member", "no-image", "no-label", "bad-label" (spec/tar.md, section 6) for a sample,
"corrupt" for a tar that cannot be read as one.

The key of a record is its path relative to the source root, '/'-separated, without the last
extension (for a tar sample: its sample key). File names and keys that are not UTF-8 keep their
record; their key and report path show each undecodable byte as ``\\xNN``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConvertError, FormatError, ShardNotFoundError

__all__ = [
    "LISTING_SUFFIXES",
    "TAR_IMAGE_EXTENSIONS",
    "ScanReject",
    "SourceFile",
    "SourceScan",
    "describe_os_error",
    "display_path",
    "record_key",
    "scan_folder",
    "scan_source",
]

LISTING_SUFFIXES = (".csv", ".jsonl")
TAR_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm", "pnm")
"""Extensions of a tar sample's image member, in order of preference."""
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
        offset, sample_key: for a sample of a tar: where its image member's data starts in the
            tar `path` (`size` is the member's), and its key (undecoded bytes as surrogate
            escapes); None for a file.
    """

    path: str
    label: int
    size: int
    mtime_ns: int
    offset: int | None = None
    sample_key: str | None = None

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
        root: the folder paths are relative to (the tree, or the listing's folder).
        kind: "imagefolder", "csv", "jsonl" or "webdataset".
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
        src: an ImageFolder directory, a ``.csv`` / ``.jsonl`` listing file, or WebDataset tars
            (a ``.tar`` file, a brace pattern of them, or a folder of ``.tar`` files only).

    Returns:
        The inputs in conversion order, the classes, and the rejects found while scanning.

    Raises:
        ConvertError: `src` does not exist, is neither a folder nor a listing nor tars, or a
            listing is malformed (the message names the line).
    """
    tars = _tar_sources(src)
    if tars is not None:
        return _scan_tars(tars)
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


def jsonl_values(text: str, listing: Path) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed value) for each non-blank line of a JSONL listing.

    Raises:
        ConvertError: a line is not JSON, naming the listing and the line.
    """
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield line, json.loads(raw)
        except ValueError as err:
            raise ConvertError(f"line {line}: not JSON: {err}", path=listing) from err


def _jsonl_rows(text: str, listing: Path) -> list[tuple[int, str, Any]]:
    rows = []
    for line, value in jsonl_values(text, listing):
        if not isinstance(value, dict) or not isinstance(value.get("path"), str):
            raise ConvertError(f'line {line}: expected {{"path": "...", "label": ...}}', path=listing)
        label = value.get("label")
        if isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ConvertError(f"line {line}: label must be an integer or a string, found {label!r}", path=listing)
        rows.append((line, value["path"], label))
    return rows


def _tar_sources(src: str | os.PathLike[str]) -> list[Path] | None:
    """Return the tars `src` names: a tar path or pattern, or a folder with tars and no
    sub-folders (hidden entries aside); None for anything else."""
    from ..dataset.tars import tar_sources

    text = os.fspath(src)
    if os.path.isdir(text):
        try:
            with os.scandir(text) as it:
                entries = sorted((entry for entry in it if not entry.name.startswith(".")), key=lambda entry: entry.name)
        except OSError:
            return None  # the tree scan reports it
        tars = [Path(entry.path) for entry in entries if entry.name.endswith(".tar") and not _is_dir(entry)]
        return tars if tars and not any(_is_dir(entry) for entry in entries) else None
    try:
        return tar_sources(text)
    except ValueError as err:
        raise ConvertError(str(err), path=text) from err


def _scan_tars(tars: list[Path]) -> SourceScan:
    from ..tar.index import parse_label
    from ..tar.keys import LABEL_EXTENSION, MAX_LABEL_SIZE, display_key
    from ..tar.scan import scan_samples

    root = Path(os.path.commonpath([os.path.dirname(os.path.abspath(tar)) for tar in tars]))
    inputs: list[SourceFile] = []
    rejects: list[ScanReject] = []
    max_label = -1
    for tar in tars:
        rel = os.path.relpath(os.path.abspath(tar), root)
        try:
            mtime_ns = os.stat(tar).st_mtime_ns
            samples = scan_samples(tar)
            fd = os.open(tar, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except (ShardNotFoundError, FileNotFoundError) as err:
            raise ConvertError("the tar does not exist", path=tar) from err
        except OSError as err:
            rejects.append(ScanReject(len(inputs), display_path(rel), "unreadable", describe_os_error(err)))
            continue
        except FormatError as err:
            where = f"byte {err.offset}: " if err.offset is not None else ""
            rejects.append(ScanReject(len(inputs), display_path(rel), "corrupt", f"not a readable tar: {where}{err.message}"))
            continue
        try:
            for sample in samples:
                image = next((sample.members[ext] for ext in TAR_IMAGE_EXTENSIONS if ext in sample.members), None)
                label_member = sample.members.get(LABEL_EXTENSION)
                found: int | tuple[str, str]
                if sample.duplicate is not None:
                    found = ("duplicate-member", f"two members with extension {sample.duplicate.extension!r}")
                elif image is None:
                    found = ("no-image", "no member with an image extension (" + ", ".join(TAR_IMAGE_EXTENSIONS) + ")")
                elif label_member is None:
                    found = ("no-label", f"no member with extension {LABEL_EXTENSION!r}")
                else:
                    data = os.pread(fd, min(label_member.size, MAX_LABEL_SIZE + 1), label_member.data_offset)
                    found = parse_label(memoryview(data))
                if image is None or isinstance(found, tuple):
                    reason, detail = found if isinstance(found, tuple) else ("no-image", "")
                    rejects.append(ScanReject(len(inputs), display_path(rel), reason, detail, key=display_key(sample.key)))
                    continue
                max_label = max(max_label, found)
                inputs.append(SourceFile(rel, found, image.size, mtime_ns, offset=image.data_offset, sample_key=sample.key))
        finally:
            os.close(fd)
    classes = tuple(str(label) for label in range(max_label + 1))
    return SourceScan(root, "webdataset", classes, tuple(inputs), tuple(rejects))


def scan_folder(root: str | os.PathLike[str]) -> SourceScan:
    """Find every file under `root`, recursively, in the order and with the rejects of an
    ImageFolder class folder (hidden entries, symbolic-link loops, unreadable entries), for
    folders that hold one field of each record rather than classes. Labels are 0.

    Raises:
        ConvertError: `root` is not a folder that can be listed.
    """
    path = Path(root)
    if not path.is_dir():
        raise ConvertError("the source does not exist or is not a folder", path=path)
    scanner = _Scanner(path)
    try:
        root_id = _identity(os.stat(path))
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda entry: entry.name)
    except OSError as err:
        raise ConvertError(f"cannot list the source folder: {describe_os_error(err)}", path=path) from err
    folders = []
    for entry in entries:  # the root's own files first, as os.walk lists them
        if entry.name.startswith("."):
            scanner.emit(_Item(entry.name, entry.name, ("hidden", "hidden files and folders are skipped")))
        elif _is_dir(entry):
            folders.append(entry)
        else:
            scanner.emit(_file_item(entry, entry.name, 0))
    for entry in folders:
        scanner.walk_class(entry, label=0, root_id=root_id)
    return SourceScan(path, "folder", None, tuple(scanner.inputs), tuple(scanner.rejects))
