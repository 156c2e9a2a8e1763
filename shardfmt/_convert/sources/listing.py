"""Listings: one CSV/JSONL parser and one set of row rules, for every listing wherever it lies.

A listing is a ``.csv`` file with a header, or a ``.jsonl`` file of one JSON object per line
(blank lines skipped, a UTF-8 byte-order mark allowed). Two readings of it:

- **path,label** (`scan_listing`, for `convert`): the header starts with ``path,label`` (further
  columns are ignored) or every object has a string ``"path"`` and a ``"label"``.
- **columns** (`scan_table`, for records of several fields): every column of the header, or the
  first object's keys, which every line must repeat. A column's kind is declared or inferred:
  ``label`` is the label; a column of integers is int64, of numbers float64; any other column
  names files, stored as the ``store`` kind. A column named ``path`` becomes the field
  ``image``, so ``path,label,weight`` keeps the fields of ``path,label`` and adds ``weight``.
  A header with neither ``path`` nor ``image`` (and no column declared an image kind) is an
  error, and so is an undeclared column
  other than the image taken for files when none of its first 16 values names a file (text such
  as a caption: the message says to declare it, ``--field caption=str``).

The same rules judge every row of both readings, and whether the listing is a local file or an
object given by URL (the `Tree` it lies in differs, nothing else):

- labels are all integers (the dataset then has no class names) or all strings (class names,
  sorted as plain strings, label = index); in a CSV, where every cell is text, the labels are
  integers when every one reads as an integer (``[+-]?[0-9]+``, spaces trimmed); an integer
  label must fit in int64; a class name must not be empty;
- paths are relative to the listing's folder and stay inside it, judged lexically (a ``..``
  that leaves it, or an absolute path, is rejected as "outside-root", the detail naming
  ``--image-root``) and, for a local listing, again once symbolic links are resolved
  (`confine.resolve_inside`: a file or folder link that leads out of the folder is rejected as
  "outside-root"); with an image root (``--image-root``, ``image_root=``, a local folder), paths
  are relative to it instead, an absolute path is taken as it is, and either is accepted if it
  lies inside the root once links are resolved ("outside-root" otherwise); the first path of a row names
  the record's reference file, so it must not be empty (a later one may be: the record is then
  rejected as "no-partner"); inputs keep the listing's order;
- a listed path that names nothing is rejected as "missing-file", one that names a folder, a
  FIFO or a device as "not-a-regular-file" (in a later path column: the record is rejected as
  "no-partner"); the hidden-file rule does not apply, since a listing names its files on purpose.

The key of a record is its first path without the last extension.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from ..._errors import ConvertError, RejectError
from .confine import OUTSIDE_ROOT, is_inside, resolve_inside
from .results import (
    IMAGE_AND_LABEL,
    RecordField,
    ScannedRecord,
    ScanReject,
    SourceFile,
    SourceScan,
    display_path,
    is_field_name,
    record_key,
)
from .trees import Entry, LocalTree, Tree

__all__ = ["LISTING_KINDS", "LISTING_SUFFIXES", "columns_of", "scan_listing", "scan_table"]

LISTING_SUFFIXES: Final = (".csv", ".jsonl")
LISTING_KINDS: Final = ("csv", "jsonl")
"""The kinds of scan a listing gives (`SourceScan.kind`): its files are read confined to its folder."""
_LABELLED: Final = ("path", "label")
_INT = re.compile(r"[+-]?[0-9]+\Z")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_LEAVES = ("{rel} leaves the listing's folder: a listing reads only inside it, or inside the folder --image-root "
           "(image_root=) names")
_PROBE = 16
"""Values of an undeclared file column looked up before the scan: if none names a file, it is text."""
_HEAD_SIZE = 1 << 20
"""Bytes read to find a listing's columns: its first line must end within them."""


@dataclass(frozen=True)
class _Listing:
    """A parsed listing: its kind ("csv" or "jsonl"), column names, and (line number, cells) rows."""

    kind: str
    names: tuple[str, ...]
    rows: list[tuple[int, list[Any]]]


def scan_listing(tree: Tree, name: str, *, files: LocalTree | None = None) -> SourceScan:
    """Find the inputs a ``path,label`` listing names (see the module docstring).

    Args:
        tree: the listing's folder; name: the listing's name in it.
        files: the image root (``--image-root``) the listed paths are resolved against and
            confined to; None: the listing's folder.

    Raises:
        ConvertError: the listing cannot be read or is malformed; the message names the line.
    """
    listing = _read(tree, name, columns=_LABELLED)
    return _scan_rows(tree, name, listing, IMAGE_AND_LABEL, image_root=files)


def scan_table(
    tree: Tree, name: str, *, declared: Mapping[str, str | None], store: str, files: LocalTree | None = None
) -> SourceScan:
    """Find the records of a listing of several columns (see the module docstring).

    Args:
        declared: kinds of the columns named; the others are inferred.
        store: the kind of file columns whose kind is not declared.
        files: the image root, as for `scan_listing`.

    Raises:
        ConvertError: the listing cannot be read or is malformed, or the declarations do not fit it.
    """
    where = tree.describe(name)
    listing = _read(tree, name, columns=None)
    for column in listing.names:
        if not is_field_name(column):
            raise ConvertError(f"line 1: column {column!r} is not a field name (an identifier, not 'key'); rename it", path=where)
    unknown = set(declared) - set(listing.names)
    if unknown:
        raise ConvertError(f"--field names columns the listing does not have: {', '.join(sorted(unknown))}", path=where)
    if "path" in listing.names and "image" in listing.names:
        raise ConvertError("line 1: columns 'path' and 'image' would both be the field image; rename one", path=where)
    found = tuple(
        RecordField(
            "image" if column == "path" else column, declared.get(column) or _infer(column, [row[i] for _, row in listing.rows], store)
        )
        for i, column in enumerate(listing.names)
    )
    if not any(column.is_image for column in found):
        raise ConvertError("no column names files: declare the image columns with --field NAME=KIND", path=where)
    if sum(column.kind == "label" for column in found) > 1:
        raise ConvertError("more than one label column", path=where)
    if "path" not in listing.names and "image" not in listing.names and not any(
        taken.is_image and taken.name in declared for taken in found
    ):
        raise ConvertError(f"line 1: the columns are {', '.join(listing.names)}; a listing names its images in a column 'path' "
                           "or 'image' (the field image): rename that column, or declare the image columns with --field "
                           "NAME=KIND", path=where)
    files_tree = files if files is not None else tree
    for i, taken in enumerate(found):
        if taken.is_image and taken.name != "image" and listing.names[i] not in declared:
            _check_names_files(files_tree, taken.name, [row[i] for _, row in listing.rows], where)
    return _scan_rows(tree, name, listing, found, image_root=files)


def _check_names_files(tree: Tree, column: str, cells: list[Any], where: str) -> None:
    """Refuse an undeclared column taken for files when none of its first `_PROBE` non-empty
    values names a file: it is text, not a second image."""
    probe = [cell for cell in cells if isinstance(cell, str) and cell and "\x00" not in cell][:_PROBE]
    if not probe or any(_leaves(os.path.normpath(cell)) for cell in probe):
        return  # paths, if outside: their rows are rejected as the module docstring says
    if any(tree.lookup(os.path.normpath(cell)).reject is None for cell in probe):
        return
    raise ConvertError(f"column {column!r} was taken for image files (an undeclared column that is not a number), but none of "
                       f"its first {len(probe)} values names a file (the first: {probe[0]!r}); if it is text, declare it: "
                       f"fields={{{column!r}: 'str'}}", path=where)


def columns_of(tree: Tree, name: str) -> list[str] | None:
    """Return the column names of a listing (its header, or its first object's keys), or None
    if it cannot be read or its first line is not a header or an object. Reads its first MiB."""
    try:
        head = tree.read(name, limit=_HEAD_SIZE)
        if len(head) == _HEAD_SIZE:
            head = head[: head.rfind(b"\n") + 1]  # whole lines only
        for line in head.decode("utf-8-sig").splitlines():
            if not line.strip():
                continue
            if name.lower().endswith(".csv"):
                return [column.strip() for column in next(csv.reader([line]))]
            value = json.loads(line)
            return list(value) if isinstance(value, dict) else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return None


def _read(tree: Tree, name: str, *, columns: Sequence[str] | None) -> _Listing:
    """Parse listing `name`: with `columns`, only those (which it must start with or hold), else all."""
    where = tree.describe(name)
    try:
        text = tree.read(name).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ConvertError(f"cannot read the listing: {err}", path=where) from err
    if name.lower().endswith(".csv"):
        names, rows = _csv_rows(text, where, columns)
        return _Listing("csv", names, rows)
    names, rows = _jsonl_rows(text, where, columns)
    return _Listing("jsonl", names, rows)


def _csv_rows(text: str, where: str, columns: Sequence[str] | None) -> tuple[tuple[str, ...], list[tuple[int, list[Any]]]]:
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if columns is not None:
        if header is None or [h.strip() for h in header[: len(columns)]] != list(columns):
            raise ConvertError(f"line 1: the header must start with '{','.join(columns)}', found {header!r}", path=where)
        names = tuple(columns)
    else:
        if not header:
            raise ConvertError("line 1: the listing has no header", path=where)
        names = tuple(h.strip() for h in header)
        if len(set(names)) != len(names):
            raise ConvertError(f"line 1: column names repeat: {list(names)}", path=where)
    rows = []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        if columns is not None and len(row) < len(columns):
            raise ConvertError(f"line {line}: expected '{','.join(columns)}', found {row!r}", path=where)
        if columns is None and len(row) != len(names):
            raise ConvertError(f"line {line}: {len(row)} cells, the header has {len(names)}", path=where)
        rows.append((line, list(row[: len(names)])))
    return names, rows


def _json_lines(text: str, where: str) -> Iterator[tuple[int, Any]]:
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield line, json.loads(raw)
        except ValueError as err:
            raise ConvertError(f"line {line}: not JSON: {err}", path=where) from err


def _jsonl_rows(text: str, where: str, columns: Sequence[str] | None) -> tuple[tuple[str, ...], list[tuple[int, list[Any]]]]:
    names: tuple[str, ...] | None = tuple(columns) if columns is not None else None
    rows = []
    for line, value in _json_lines(text, where):
        if columns is not None:
            if not isinstance(value, dict) or not isinstance(value.get("path"), str):
                raise ConvertError(f'line {line}: expected {{"path": "...", "label": ...}}', path=where)
            rows.append((line, [value.get(column) for column in columns]))
            continue
        if not isinstance(value, dict):
            raise ConvertError(f"line {line}: expected an object", path=where)
        if names is None:
            names = tuple(value)
        if set(value) != set(names):
            raise ConvertError(f"line {line}: keys {sorted(value)} differ from the first line's {sorted(names)}", path=where)
        for column in names:
            if value[column] is not None and not isinstance(value[column], (str, int, float)):
                raise ConvertError(
                    f"line {line}: {column!r} is a {type(value[column]).__name__}; values are strings or numbers", path=where
                )
        rows.append((line, [value[column] for column in names]))
    if names is None:
        raise ConvertError("the listing is empty", path=where)
    return names, rows


@dataclass(frozen=True)
class _Labels:
    """How a listing's label column reads: class names (None: integers), and from text or not."""

    classes: tuple[str, ...] | None
    index: Mapping[str, int]
    from_text: bool

    @classmethod
    def judge(cls, cells: list[tuple[int, Any]], *, kind: str, where: str) -> _Labels:
        for line, cell in cells:
            if isinstance(cell, bool) or not isinstance(cell, (int, str)):
                raise ConvertError(f"line {line}: label must be an integer or a string, found {cell!r}", path=where)
        texts = [cell for _, cell in cells if isinstance(cell, str)]
        if not cells or len(texts) != len(cells):
            return cls(None, {}, False)
        if kind == "csv" and all(_INT.match(text.strip()) for text in texts):
            return cls(None, {}, True)
        classes = tuple(sorted({text.strip() if kind == "csv" else text for text in texts}))
        return cls(classes, {name: i for i, name in enumerate(classes)}, False)

    def value(self, cell: Any, *, kind: str, line: int, where: str) -> int:
        """The label of one row: its class index, or its integer."""
        text = cell.strip() if isinstance(cell, str) and kind == "csv" else cell
        if self.from_text:
            text = int(text)
        if isinstance(text, str) != (self.classes is not None):
            raise ConvertError(f"line {line}: labels must be all integers or all strings", path=where)
        if isinstance(text, str):
            if not text:
                raise ConvertError(f"line {line}: empty label", path=where)
            return self.index[text]
        if not _INT64[0] <= text <= _INT64[1]:
            raise ConvertError(f"line {line}: label {text} does not fit in int64", path=where)
        return int(text)


def _scan_rows(
    tree: Tree, name: str, listing: _Listing, found: tuple[RecordField, ...], *, image_root: LocalTree | None
) -> SourceScan:
    """Judge every row: its values, then its files in column order (looked up in `image_root`,
    if given, else in the listing's folder)."""
    where = tree.describe(name)
    lookup = _RootLookup(image_root) if image_root is not None else None
    root = image_root.root if image_root is not None else tree.root
    images = [i for i, column in enumerate(found) if column.is_image]
    others = [i for i, column in enumerate(found) if not column.is_image]
    label = next((i for i in others if found[i].kind == "label"), None)
    labels = (
        _Labels.judge([(line, row[label]) for line, row in listing.rows], kind=listing.kind, where=where) if label is not None else None
    )
    inputs: list[ScannedRecord] = []
    rejects: list[ScanReject] = []
    for line, row in listing.rows:
        values = tuple(
            labels.value(row[i], kind=listing.kind, line=line, where=where)
            if labels is not None and i == label
            else _value(found[i], row[i], line, where)
            for i in others
        )
        files: list[SourceFile] = []
        problem: tuple[str, str, str] | None = None
        for n, i in enumerate(images):
            cell = row[i]
            if n and (not isinstance(cell, str) or not cell):
                problem = (display_path(files[0].path), "no-partner", f"line {line}: no file in column {listing.names[i]!r}")
                break
            rel = _listed_path(cell, line, where)
            if lookup is not None:
                rel, entry = lookup(rel)
            else:
                entry = tree.lookup(rel) if not _leaves(rel) else Entry(rel, rel, reject=(OUTSIDE_ROOT, _LEAVES.format(rel=rel)))
            if entry.reject is not None:
                reason, detail = entry.reject
                if n == 0:
                    problem = (display_path(rel), reason, detail)
                else:
                    problem = (display_path(files[0].path), "no-partner", f"column {listing.names[i]!r}: {display_path(rel)}: {detail}")
                break
            files.append(SourceFile(rel, entry.size, entry.version))
        if problem is not None:
            rejects.append(ScanReject(len(inputs), *problem))
            continue
        inputs.append(ScannedRecord(tuple(files), values, record_key(files[0].path)))
    columns = tuple(found[i] for i in images + others)
    classes = labels.classes if labels is not None else None
    return SourceScan(root, listing.kind, columns, classes, tuple(inputs), tuple(rejects))


class _RootLookup:
    """Looks listed paths up under an image root: a relative path against it, an absolute one as
    it is; either must lie inside it once symbolic links are resolved (`confine.resolve_inside`).
    Returns the path relative to the root (the record's key comes from it) and its entry."""

    def __init__(self, files: LocalTree) -> None:
        self.files = files
        self.lexical = os.path.abspath(files.root)
        self.real = os.path.realpath(files.root)

    def __call__(self, path: str) -> tuple[str, Entry]:
        if os.path.isabs(path):
            if is_inside(path, self.lexical):
                path = os.path.relpath(path, self.lexical)
            else:
                try:
                    full = resolve_inside(self.files.root, path)
                except RejectError as err:
                    return path, Entry(os.path.basename(path), path, reject=(err.reason, _outside(err.message)))
                path = os.path.relpath(full, self.real)
        elif _leaves(path):
            return path, Entry(os.path.basename(path), path, reject=(OUTSIDE_ROOT, f"{path} leaves the image root {self.lexical}"))
        entry = self.files.lookup(path)
        if entry.reject is not None and entry.reject[0] == OUTSIDE_ROOT:
            entry = replace(entry, reject=(OUTSIDE_ROOT, _outside(entry.reject[1])))
        return path, entry


def _outside(detail: str) -> str:
    return f"{detail}: --image-root (image_root=) names the folder listed files may be read from"


def _listed_path(path: Any, line: int, where: str) -> str:
    """Return a listed path in normal form, or fail if it is empty or not a path at all."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ConvertError(f"line {line}: path {path!r} must be a non-empty path relative to the listing's folder "
                           "(or inside --image-root)", path=where)
    return os.path.normpath(path)


def _leaves(rel: str) -> bool:
    """True if normal path `rel` is absolute, or is or goes above the listing's folder."""
    return os.path.isabs(rel) or rel == os.pardir or rel.startswith(os.pardir + os.sep)


def _infer(name: str, cells: list[Any], store: str) -> str:
    if name == "label":
        return "label"
    if cells and all(isinstance(c, int) and not isinstance(c, bool) or isinstance(c, str) and _INT.match(c.strip()) for c in cells):
        return "int64"
    if cells and all(isinstance(c, (int, float)) and not isinstance(c, bool) or isinstance(c, str) and _is_float(c) for c in cells):
        return "float64"
    return store


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _value(column: RecordField, cell: Any, line: int, where: str) -> Any:
    try:
        if column.kind == "str":
            if not isinstance(cell, str):
                raise ValueError("not a string")
            return cell
        if column.kind == "int64":
            value = int(cell.strip()) if isinstance(cell, str) and _INT.match(cell.strip()) else cell
            if isinstance(value, bool) or not isinstance(value, int) or not _INT64[0] <= value <= _INT64[1]:
                raise ValueError("not an integer that fits in int64")
            return value
        value = float(cell) if isinstance(cell, (str, int, float)) and not isinstance(cell, bool) else None
        if value is None:
            raise ValueError("not a number")
        return value
    except ValueError as err:
        raise ConvertError(f"line {line}: column {column.name!r} ({column.kind}): {cell!r} is {err}", path=where) from err
