"""Finding the inputs of a conversion whose source is a URL: an ImageFolder tree under a prefix,
or a ``.csv`` / ``.jsonl`` listing object, read with one recursive LIST (and one GET for a
listing).

The rules are those of `scan.py` for local sources, applied to object keys: the first key
component is the class (sorted as plain strings), files in torchvision's order (folders sorted
by path, files by name), "hidden" for any component starting with "." (a hidden folder is
reported once), "no-class" for objects directly under the root. Object stores have no symbolic
links, so there are no "symlink-loop" rejects. An object's version (ETag or modification time)
stands in for a file's mtime, so resume notices a changed input.
"""

from __future__ import annotations

import posixpath
from collections import defaultdict

import xxhash

from ..dataset.locate import split_manifest_url
from ..errors import ConvertError
from ..storage import RemoteOptions, Store, open_store
from .scan import (
    LISTING_SUFFIXES,
    ScanReject,
    SourceFile,
    SourceScan,
    _csv_rows,
    _jsonl_rows,
)

__all__ = ["TARS_BY_URL", "scan_remote_source"]

TARS_BY_URL = (
    "WebDataset tars given by URL cannot be a conversion source: tars are read in place with pread, "
    "so copy them to a local folder first (a folder or listing of images may be a URL)"
)


def scan_remote_source(url: str, *, remote: RemoteOptions | None = None) -> tuple[SourceScan, str]:
    """Find the inputs under `url`.

    Returns:
        The scan (its `root` is unused for remote sources) and the URL of the folder that input
        paths are relative to.

    Raises:
        ConvertError: nothing is under the URL, the store cannot list (plain HTTP), a listing
            is malformed, or the URL holds WebDataset tars (they must be local).
    """
    base = url.rstrip("/")
    listing = base.lower().endswith(LISTING_SUFFIXES)
    root, name = split_manifest_url(base) if listing else (base, "")
    store = open_store(root, remote=remote)
    if not store.supports_listing:
        raise ConvertError("a source URL must be a store that can list its objects (s3://, gs://, az://, ...), not plain HTTP", path=store.root)
    if listing:
        return _scan_listing(store, name), root
    objects = store.list()
    if not objects:
        raise ConvertError("the source holds no objects (or does not exist)", path=store.root)
    visible = [key for key in objects if not key.startswith(".")]
    if visible and all("/" not in key and key.lower().endswith(".tar") for key in visible):
        raise ConvertError(TARS_BY_URL, path=store.root)
    return _scan_tree(objects), base


def _version(info: dict[str, object]) -> int:
    return xxhash.xxh3_64_intdigest(str(info.get("version", "")).encode()) & ((1 << 63) - 1)


def _scan_tree(objects: dict[str, dict[str, object]]) -> SourceScan:
    classes = sorted({key.split("/", 1)[0] for key in objects if "/" in key and not key.startswith(".")})
    label_of = {name: label for label, name in enumerate(classes)}
    inputs: list[SourceFile] = []
    rejects: list[ScanReject] = []
    hidden_reported: set[str] = set()
    root_files = sorted(key for key in objects if "/" not in key)
    by_folder: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for key in objects:
        if "/" in key and not key.endswith("/"):
            folder, _, name = key.rpartition("/")
            by_folder[key.split("/", 1)[0]][folder].append(name)
    for name in sorted(set(root_files) | {c for c in by_folder if c.startswith(".")}):
        if name.startswith("."):
            rejects.append(ScanReject(len(inputs), name, "hidden", "hidden files and folders are skipped"))
        elif name in root_files:
            rejects.append(ScanReject(len(inputs), name, "no-class", "a file in the root folder belongs to no class"))
    for class_name in classes:
        for folder in sorted(by_folder[class_name]):
            hidden_parts = [i for i, part in enumerate(folder.split("/")) if part.startswith(".")]
            if hidden_parts:
                hidden = "/".join(folder.split("/")[: hidden_parts[0] + 1])
                if hidden not in hidden_reported:
                    hidden_reported.add(hidden)
                    rejects.append(ScanReject(len(inputs), hidden, "hidden", "hidden files and folders are skipped"))
                continue
            for name in sorted(by_folder[class_name][folder]):
                key = f"{folder}/{name}"
                if name.startswith("."):
                    rejects.append(ScanReject(len(inputs), key, "hidden", "hidden files and folders are skipped"))
                    continue
                info = objects[key]
                inputs.append(SourceFile(key, label_of[class_name], int(str(info["size"])), _version(info)))
    return SourceScan(root=None, kind="imagefolder", classes=tuple(classes), inputs=tuple(inputs), rejects=tuple(rejects))  # type: ignore[arg-type]


def _scan_listing(store: Store, name: str) -> SourceScan:
    kind = name.rsplit(".", 1)[-1].lower()
    where = store.describe(name)
    try:
        text = store.get(name).decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ConvertError(f"cannot read the listing: {err}", path=where) from err
    rows = _csv_rows(text, where) if kind == "csv" else _jsonl_rows(text, where)  # type: ignore[arg-type]
    classes: tuple[str, ...] | None = None
    if rows and all(isinstance(label, str) for _, _, label in rows):
        if kind == "csv" and all(str(label).strip().lstrip("+-").isdigit() for _, _, label in rows):
            rows = [(line, path, int(str(label))) for line, path, label in rows]
        else:
            classes = tuple(sorted({str(label) for _, _, label in rows}))
    index = {c: i for i, c in enumerate(classes or ())}
    objects = store.list()
    inputs: list[SourceFile] = []
    rejects: list[ScanReject] = []
    for line, path, label in rows:
        if isinstance(label, str) != (classes is not None):
            raise ConvertError(f"line {line}: labels must be all integers or all strings", path=where)
        if isinstance(label, str):
            if not label:
                raise ConvertError(f"line {line}: empty label", path=where)
            label = index[label]
        key = posixpath.normpath(path) if path else ""
        if not path or path.startswith("/") or "\x00" in path or key in (".", "..") or key.startswith("../"):
            raise ConvertError(f"line {line}: path {path!r} must be non-empty and relative to the listing's folder", path=where)
        info = objects.get(key)
        if info is None:
            rejects.append(ScanReject(len(inputs), key, "unreadable", "no such object"))
            continue
        inputs.append(SourceFile(key, label, int(str(info["size"])), _version(info)))
    return SourceScan(root=None, kind=kind, classes=classes, inputs=tuple(inputs), rejects=tuple(rejects))  # type: ignore[arg-type]
