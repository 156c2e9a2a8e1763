"""Several parallel folders (``LR/ HR/``) as the source of records of several image fields.

One image column per folder, named after it (lower-cased) or as declared. Files are found in
each folder as in an ImageFolder class folder (`imagefolder.scan_folder`) and matched by their
path relative to their folder without the extension (``LR/a/0001.png`` with ``HR/a/0001.jpg``).
Records follow the first folder's order. A file without a partner in every other folder is
rejected as "no-partner"; a key that two files of one folder share, as "ambiguous". The record
key is the first folder's file's key. The folders must be local and must not overlap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..._errors import ConvertError
from .imagefolder import scan_folder
from .results import (
    RecordField,
    ScannedRecord,
    ScanReject,
    SourceFile,
    SourceScan,
    display_path,
    is_field_name,
    record_key,
)
from .trees import LocalTree

__all__ = ["scan_folders"]


def scan_folders(roots: list[Path], declared: Sequence[tuple[str, str | None]], store: str) -> SourceScan:
    """Find the records of parallel folders (see the module docstring).

    Args:
        roots: the folders, the first being the reference.
        declared: (field name, kind or None) per folder in order, or nothing.
        store: the kind of fields whose kind is not declared.

    Raises:
        ConvertError: a folder is missing, the folders overlap, or the names do not fit.
    """
    if declared and len(declared) != len(roots):
        raise ConvertError(f"{len(roots)} folders but {len(declared)} --field names: name every folder, in order")
    resolved = [root.resolve() for root in roots]
    _check_separate(resolved)
    columns = _columns(resolved, declared, store)
    common = Path(os.path.commonpath(resolved))
    prefixes = [os.path.relpath(root, common) for root in resolved]
    for root in roots:
        if not root.is_dir():
            raise ConvertError("the source does not exist or is not a folder", path=root)
    scans = [scan_folder(LocalTree(root)) for root in roots]
    by_key = [_by_key(prefix, scan.inputs) for prefix, scan in zip(prefixes, scans, strict=True)]
    inputs: list[ScannedRecord] = []
    rejects: list[ScanReject] = []
    accepted_before = [0]  # records before each input of the first folder
    for record in scans[0].inputs:
        item = record.files[0]
        key = record_key(item.path)
        problem = _partner_problem(key, by_key[0][key], by_key[1:], prefixes)
        if problem is None:
            inputs.append(ScannedRecord(tuple(group[key][0] for group in by_key), (), key))
        else:
            rejects.append(ScanReject(len(inputs), display_path(os.path.join(prefixes[0], item.path)), *problem))
        accepted_before.append(len(inputs))
    for r in scans[0].rejects:
        rejects.append(ScanReject(accepted_before[r.position], f"{display_path(prefixes[0])}/{r.path}", r.reason, r.detail))
    end = len(inputs)
    for prefix, scan, keyed in zip(prefixes[1:], scans[1:], by_key[1:], strict=True):
        rejects.extend(ScanReject(end, f"{display_path(prefix)}/{r.path}", r.reason, r.detail) for r in scan.rejects)
        rejects.extend(_without_partner(keyed, by_key[0], prefixes[0], end))
    rejects.sort(key=lambda r: r.position)  # stable: in the order found within a position
    return SourceScan(common, "folders", columns, None, tuple(inputs), tuple(rejects), names_fields=True)


def _check_separate(resolved: list[Path]) -> None:
    """No folder is another or lies inside another."""
    for i, a in enumerate(resolved):
        for b in resolved[i + 1 :]:
            if a == b or a in b.parents or b in a.parents:
                raise ConvertError(f"the field folders {a} and {b} overlap; give separate folders")


def _columns(resolved: list[Path], declared: Sequence[tuple[str, str | None]], store: str) -> tuple[RecordField, ...]:
    """One image column per folder: as declared, else named after the folder."""
    if declared:
        columns = tuple(RecordField(name, kind or store) for name, kind in declared)
    else:
        names = [root.name.lower() for root in resolved]
        if not all(is_field_name(name) for name in names) or len(set(names)) != len(names):
            raise ConvertError(f"folder names {names} do not make distinct field names; name them with --field")
        columns = tuple(RecordField(name, store) for name in names)
    for column in columns:
        if not column.is_image:
            raise ConvertError(f"field {column.name!r}: a folder holds images; kind {column.kind!r} is not an image kind")
    return columns


def _by_key(prefix: str, inputs: Sequence[ScannedRecord]) -> dict[str, list[SourceFile]]:
    """A folder's files by record key, their paths relative to the folders' common parent."""
    keyed: dict[str, list[SourceFile]] = {}
    for record in inputs:
        item = record.files[0]
        keyed.setdefault(record_key(item.path), []).append(SourceFile(os.path.join(prefix, item.path), item.size, item.mtime_ns))
    return keyed


def _without_partner(
    keyed: dict[str, list[SourceFile]], reference: dict[str, list[SourceFile]], reference_prefix: str, end: int
) -> list[ScanReject]:
    """The files of a further folder whose key no file of the first folder has."""
    rejects: list[ScanReject] = []
    for key, files in keyed.items():
        if key not in reference:
            detail = f"no file in {display_path(reference_prefix)}/ has the key {key}"
            rejects.extend(ScanReject(end, display_path(item.path), "no-partner", detail) for item in files)
    return rejects


def _partner_problem(
    key: str, files: list[SourceFile], others: list[dict[str, list[SourceFile]]], prefixes: list[str]
) -> tuple[str, str] | None:
    if len(files) > 1:
        return "ambiguous", f"{len(files)} files in {display_path(prefixes[0])}/ have the key {key}: " + ", ".join(
            display_path(f.path) for f in files
        )
    for prefix, keyed in zip(prefixes[1:], others, strict=True):
        found = keyed.get(key, [])
        if not found:
            return "no-partner", f"no file in {display_path(prefix)}/ has the key {key}"
        if len(found) > 1:
            return "ambiguous", f"{len(found)} files in {display_path(prefix)}/ have the key {key}: " + ", ".join(
                display_path(f.path) for f in found
            )
    return None
