"""Finding the inputs of a multi-field conversion: records of several files and values.

Three sources, each giving records of named columns in a fixed order:

- **One ImageFolder tree, ``path,label`` listing or set of WebDataset tars** (as
  `scan.scan_source` reads them): the columns ``image`` and ``label``; only the way ``image``
  is stored differs from `convert`. A sample of a tar keeps its key, and its image is read from
  the tar where it lies.
- **Several parallel folders** (``LR/ HR/``): one image column per folder, named after it (or
  as declared). Files are found as in an ImageFolder class folder and matched by their path
  relative to their folder without the extension (``LR/a/0001.png`` with ``HR/a/0001.jpg``).
  Records follow the first folder's order. A file without a partner in every other folder is
  rejected as "no-partner"; a key that two files of one folder share, as "ambiguous".
- **A listing with several columns** (``.csv`` with a header, or ``.jsonl`` objects with the
  same keys on every line), e.g. ``image,mask,label,weight``. A column's kind is declared
  (``--field mask=mask``) or inferred: ``label`` is the label (integers, or class names); a
  column of integers is int64, of numbers float64; any other column names files, stored as the
  ``store`` kind. A column named ``path`` becomes the field ``image``, as in a plain listing
  (so ``path,label,weight`` keeps the fields of ``path,label`` and adds ``weight``). Paths are
  relative to the listing's folder. A missing file in the first path
  column is "unreadable", as in a plain listing; in another path column, "no-partner".

The record key is the first image column's path relative to its folder, without the extension.
"""

from __future__ import annotations

import csv
import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..errors import ConvertError
from .images import IMAGE_KINDS
from .scan import (
    LISTING_SUFFIXES,
    ScanReject,
    SourceFile,
    _listed_path,
    describe_os_error,
    display_path,
    jsonl_values,
    record_key,
    scan_folder,
    scan_source,
)

__all__ = ["VALUE_KINDS", "FieldColumn", "FieldInput", "FieldScan", "listing_columns", "scan_fields"]

VALUE_KINDS: Final = ("int64", "float64", "str", "label")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_INT = re.compile(r"[+-]?[0-9]+\Z")
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class FieldColumn:
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
    """The inputs of a multi-field conversion (see the module docstring)."""

    root: Path
    kind: str
    columns: tuple[FieldColumn, ...]
    classes: tuple[str, ...] | None
    inputs: tuple[FieldInput, ...]
    rejects: tuple[ScanReject, ...]


def listing_columns(path: str | os.PathLike[str]) -> list[str] | None:
    """Return the column names of a .csv or .jsonl listing (header, or first object's keys),
    or None if `path` is not a readable listing."""
    path = Path(path)
    if not path.is_file() or path.suffix.lower() not in LISTING_SUFFIXES:
        return None
    try:
        with open(path, encoding="utf-8-sig") as file:
            for line in file:
                if not line.strip():
                    continue
                if path.suffix.lower() == ".csv":
                    return [name.strip() for name in next(csv.reader([line]))]
                value = json.loads(line)
                return list(value) if isinstance(value, dict) else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return None


def scan_fields(sources: Sequence[str | os.PathLike[str]], *, declared: Sequence[tuple[str, str | None]] = (), store: str = "jpeg") -> FieldScan:
    """Find the records of a multi-field conversion.

    Args:
        sources: one ImageFolder or listing, or several parallel folders.
        declared: (field name, kind or None) pairs: for folders, the name (and kind) of each
            folder in order; for a listing, the kind of the columns named; for an ImageFolder,
            at most the kind of "image".
        store: the kind of image columns whose kind is not declared.

    Raises:
        ConvertError: a source is missing or malformed, or the declarations do not fit it.
    """
    for name, kind in declared:
        if not _NAME.match(name) or name == "key":
            raise ConvertError(f"field name {name!r} is not an identifier of 1 to 64 characters, or is the reserved 'key'")
        if kind is not None and kind not in IMAGE_KINDS + VALUE_KINDS:
            raise ConvertError(f"field {name!r}: kind {kind!r} is none of {', '.join(IMAGE_KINDS + VALUE_KINDS)}")
    paths = [Path(source) for source in sources]
    if not paths:
        raise ConvertError("no source given")
    if len(paths) > 1:
        for path in paths:
            if path.suffix.lower() == ".tar" or "{" in path.name:
                raise ConvertError("several sources are folders of one image field each; give WebDataset tars as one source "
                                   "(a .tar file, a brace pattern or their folder)", path=path)
        return _scan_folders(paths, declared, store)
    columns = listing_columns(paths[0])
    if columns is not None and columns != ["path", "label"]:
        return _scan_table(paths[0], dict(declared), store)
    return _scan_single(paths[0], dict(declared), store)


def _scan_single(source: Path, declared: dict[str, str | None], store: str) -> FieldScan:
    extra = set(declared) - {"image"}
    if extra:
        raise ConvertError(f"an ImageFolder or path,label listing has the fields image and label; cannot declare {', '.join(sorted(extra))}")
    kind = declared.get("image") or store
    if kind not in IMAGE_KINDS:
        raise ConvertError(f"field 'image' must be stored as an image kind ({', '.join(IMAGE_KINDS)}), not {kind!r}")
    scan = scan_source(source)
    inputs = tuple(FieldInput((item,), (item.label,), item.key) for item in scan.inputs)
    columns = (FieldColumn("image", kind), FieldColumn("label", "label"))
    return FieldScan(scan.root, scan.kind, columns, scan.classes, inputs, scan.rejects)


def _scan_folders(roots: list[Path], declared: Sequence[tuple[str, str | None]], store: str) -> FieldScan:
    if declared and len(declared) != len(roots):
        raise ConvertError(f"{len(roots)} folders but {len(declared)} --field names: name every folder, in order")
    resolved = [root.resolve() for root in roots]
    for i, a in enumerate(resolved):
        for b in resolved[i + 1 :]:
            if a == b or a in b.parents or b in a.parents:
                raise ConvertError(f"the field folders {a} and {b} overlap; give separate folders")
    if declared:
        columns = tuple(FieldColumn(name, kind or store) for name, kind in declared)
    else:
        names = [root.name.lower() for root in resolved]
        if not all(_NAME.match(name) and name != "key" for name in names) or len(set(names)) != len(names):
            raise ConvertError(f"folder names {names} do not make distinct field names; name them with --field")
        columns = tuple(FieldColumn(name, store) for name in names)
    for column in columns:
        if not column.is_image:
            raise ConvertError(f"field {column.name!r}: a folder holds images; kind {column.kind!r} is not an image kind")
    common = Path(os.path.commonpath(resolved))
    prefixes = [os.path.relpath(root, common) for root in resolved]
    scans = [scan_folder(root) for root in roots]
    by_key: list[dict[str, list[SourceFile]]] = []
    for prefix, scan in zip(prefixes, scans):
        keyed: dict[str, list[SourceFile]] = {}
        for item in scan.inputs:
            keyed.setdefault(record_key(item.path), []).append(SourceFile(os.path.join(prefix, item.path), 0, item.size, item.mtime_ns))
        by_key.append(keyed)
    inputs: list[FieldInput] = []
    rejects: list[ScanReject] = []
    accepted_before = [0]  # records before each input of the first folder
    for item in scans[0].inputs:
        key = record_key(item.path)
        problem = _partner_problem(key, by_key[0][key], by_key[1:], prefixes)
        if problem is None:
            inputs.append(FieldInput(tuple(group[key][0] for group in by_key), (), key))
        else:
            rejects.append(ScanReject(len(inputs), display_path(os.path.join(prefixes[0], item.path)), *problem))
        accepted_before.append(len(inputs))
    for r in scans[0].rejects:
        rejects.append(ScanReject(accepted_before[r.position], f"{display_path(prefixes[0])}/{r.path}", r.reason, r.detail))
    end = len(inputs)
    for prefix, scan, keyed in zip(prefixes[1:], scans[1:], by_key[1:]):
        rejects.extend(ScanReject(end, f"{display_path(prefix)}/{r.path}", r.reason, r.detail) for r in scan.rejects)
        for key, files in keyed.items():
            if key not in by_key[0]:
                detail = f"no file in {display_path(prefixes[0])}/ has the key {key}"
                rejects.extend(ScanReject(end, display_path(item.path), "no-partner", detail) for item in files)
    rejects.sort(key=lambda r: r.position)  # stable: in the order found within a position
    return FieldScan(common, "folders", columns, None, tuple(inputs), tuple(rejects))


def _partner_problem(key: str, files: list[SourceFile], others: list[dict[str, list[SourceFile]]], prefixes: list[str]) -> tuple[str, str] | None:
    if len(files) > 1:
        return "ambiguous", f"{len(files)} files in {display_path(prefixes[0])}/ have the key {key}: " + ", ".join(display_path(f.path) for f in files)
    for prefix, keyed in zip(prefixes[1:], others):
        found = keyed.get(key, [])
        if not found:
            return "no-partner", f"no file in {display_path(prefix)}/ has the key {key}"
        if len(found) > 1:
            return "ambiguous", f"{len(found)} files in {display_path(prefix)}/ have the key {key}: " + ", ".join(display_path(f.path) for f in found)
    return None


def _scan_table(listing: Path, declared: dict[str, str | None], store: str) -> FieldScan:
    kind = listing.suffix.lower().lstrip(".")
    try:
        text = listing.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ConvertError(f"cannot read the listing: {err}", path=listing) from err
    names, rows = _csv_table(text, listing) if kind == "csv" else _jsonl_table(text, listing)
    for name in names:
        if not _NAME.match(name) or name == "key":
            raise ConvertError(f"line 1: column {name!r} is not a field name (an identifier, not 'key'); rename it", path=listing)
    unknown = set(declared) - set(names)
    if unknown:
        raise ConvertError(f"--field names columns the listing does not have: {', '.join(sorted(unknown))}", path=listing)
    if "path" in names and "image" in names:
        raise ConvertError("line 1: columns 'path' and 'image' would both be the field image; rename one", path=listing)
    found = tuple(
        FieldColumn("image" if name == "path" else name, declared.get(name) or _infer(name, [row[i] for _, row in rows], store))
        for i, name in enumerate(names)
    )
    images = [i for i, column in enumerate(found) if column.is_image]
    others = [i for i, column in enumerate(found) if not column.is_image]
    if not images:
        raise ConvertError("no column names files: declare the image columns with --field NAME=KIND", path=listing)
    labels = [i for i in others if found[i].kind == "label"]
    if len(labels) > 1:
        raise ConvertError("more than one label column", path=listing)
    classes = _classes(rows, labels, listing)
    columns = tuple(found[i] for i in images + others)
    root = listing.parent
    inputs: list[FieldInput] = []
    rejects: list[ScanReject] = []
    index = {name: i for i, name in enumerate(classes or ())}
    for line, row in rows:
        values = tuple(_value(found[i], row[i], line, listing, index) for i in others)
        files: list[SourceFile] = []
        problem: tuple[str, str, str] | None = None
        for n, i in enumerate(images):
            cell = row[i]
            if not isinstance(cell, str) or not cell:
                shown = display_path(str(files[0].path)) if files else f"line {line}"
                problem = (shown, "no-partner", f"line {line}: no file in column {names[i]!r}")
                break
            rel = _listed_path(cell, line, listing)
            try:
                st = os.stat(root / rel)
                problem_text = None if stat.S_ISREG(st.st_mode) else "not a regular file"
            except OSError as err:
                problem_text = describe_os_error(err)
            if problem_text is not None:
                reason = "unreadable" if n == 0 else "no-partner"
                shown = display_path(rel) if n == 0 else display_path(files[0].path)
                detail = problem_text if n == 0 else f"column {names[i]!r}: {display_path(rel)}: {problem_text}"
                problem = (shown, reason, detail)
                break
            files.append(SourceFile(rel, 0, st.st_size, st.st_mtime_ns))
        if problem is not None:
            rejects.append(ScanReject(len(inputs), *problem))
            continue
        inputs.append(FieldInput(tuple(files), values, record_key(files[0].path)))
    return FieldScan(root, kind, columns, classes, tuple(inputs), tuple(rejects))


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


def _classes(rows: list[tuple[int, list[Any]]], labels: list[int], listing: Path) -> tuple[str, ...] | None:
    if not labels:
        return None
    cells = [row[labels[0]] for _, row in rows]
    if all(isinstance(c, int) and not isinstance(c, bool) or isinstance(c, str) and _INT.match(c.strip()) for c in cells):
        return None
    if all(isinstance(c, str) and c for c in cells):
        return tuple(sorted(set(cells)))
    raise ConvertError("labels must be all integers or all non-empty strings (class names)", path=listing)


def _value(column: FieldColumn, cell: Any, line: int, listing: Path, classes: dict[str, int]) -> Any:
    try:
        if column.kind == "str":
            if not isinstance(cell, str):
                raise ValueError("not a string")
            return cell
        if column.kind == "label" and classes:
            return classes[cell]
        if column.kind in ("int64", "label"):
            value = int(cell.strip()) if isinstance(cell, str) and _INT.match(cell.strip()) else cell
            if isinstance(value, bool) or not isinstance(value, int) or not _INT64[0] <= value <= _INT64[1]:
                raise ValueError("not an integer that fits in int64")
            return value
        value = float(cell) if isinstance(cell, (str, int, float)) and not isinstance(cell, bool) else None
        if value is None:
            raise ValueError("not a number")
        return value
    except (ValueError, KeyError) as err:
        raise ConvertError(f"line {line}: column {column.name!r} ({column.kind}): {cell!r} is {err}", path=listing) from err


def _csv_table(text: str, listing: Path) -> tuple[list[str], list[tuple[int, list[Any]]]]:
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if not header:
        raise ConvertError("line 1: the listing has no header", path=listing)
    names = [name.strip() for name in header]
    if len(set(names)) != len(names):
        raise ConvertError(f"line 1: column names repeat: {names}", path=listing)
    rows = []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != len(names):
            raise ConvertError(f"line {line}: {len(row)} cells, the header has {len(names)}", path=listing)
        rows.append((line, list(row)))
    return names, rows


def _jsonl_table(text: str, listing: Path) -> tuple[list[str], list[tuple[int, list[Any]]]]:
    names: list[str] | None = None
    rows = []
    for line, value in jsonl_values(text, listing):
        if not isinstance(value, dict):
            raise ConvertError(f"line {line}: expected an object", path=listing)
        if names is None:
            names = list(value)
        if set(value) != set(names):
            raise ConvertError(f"line {line}: keys {sorted(value)} differ from the first line's {sorted(names)}", path=listing)
        for name in names:
            if value[name] is not None and not isinstance(value[name], (str, int, float)):
                raise ConvertError(f"line {line}: {name!r} is a {type(value[name]).__name__}; values are strings or numbers", path=listing)
        rows.append((line, [value[name] for name in names]))
    if names is None:
        raise ConvertError("the listing is empty", path=listing)
    return names, rows
