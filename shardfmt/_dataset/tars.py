"""WebDataset tars from elsewhere as datasets: indexed ahead of time (`index_tars`, behind
``shardfmt index``) into a manifest, or opened directly and indexed on first open (`open_tars`).

Ahead of time, the manifest and the indexes are written into a folder that holds the tars (their
paths in the manifest must stay inside it). Opened directly, a tar's index lives in a cache: the
``.shardfmt-index`` folder beside the tars where that can be written, else the user's cache
folder. spec/tar.md states both rules.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from .._checksum import checksum, format_checksum, parse_checksum
from .._errors import ConvertError, ShardNotFoundError
from .._storage.atomic import atomic_write_bytes
from ..format._manifest import MANIFEST_NAME, IndexEntry, Manifest, ShardEntry
from ..format._schema import IMAGE_CLASSIFICATION
from ..format._writer import ShardInfo
from ..tar._index import TarIndexInfo, TarReject, index_tar
from ..tar._keys import INDEX_SUFFIX, display_key
from .locate import Location, classify_location

__all__ = ["CACHE_NAME", "cache_dirs", "expand_braces", "index_tars", "open_tars", "tar_sources"]

CACHE_NAME: Final = ".shardfmt-index"
"""The cache folder beside tars that are opened directly."""
REJECTS_NAME: Final = "rejects.jsonl"
_CACHE_VERSION: Final = 1
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")
_MAX_EXPANSION: Final = 1 << 20
"""Brace patterns name at most MAX_SHARDS tars."""


def expand_braces(pattern: str) -> list[str]:
    """Expand a webdataset-style brace pattern: ``{000..099}`` (numbers, zero-padded to the
    longer bound when a bound has a leading zero), ``{a,b}`` (alternatives), nested and repeated.
    Braces that are neither stay as they are.

    Raises:
        ValueError: the pattern names more than 2^20 paths.
    """
    depth, start = 0, -1
    for i, char in enumerate(pattern):
        if char == "{":
            if depth == 0:
                start = i
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                inner, head, tail = pattern[start + 1 : i], pattern[:start], pattern[i + 1 :]
                choices = _choices(inner)
                if choices is None:
                    return [head + "{" + inner + "}" + rest for rest in expand_braces(tail)]
                tails = expand_braces(tail)
                if len(choices) * len(tails) > _MAX_EXPANSION:
                    raise ValueError(f"pattern {pattern[:80]!r} names more than {_MAX_EXPANSION} paths")
                return [head + middle + rest for choice in choices for middle in expand_braces(choice) for rest in tails]
    return [pattern]


def _choices(inner: str) -> list[str] | None:
    parts, depth, last = [], 0, 0
    for i, char in enumerate(inner):
        depth += (char == "{") - (char == "}")
        if char == "," and depth == 0:
            parts.append(inner[last:i])
            last = i + 1
    if parts:
        return parts + [inner[last:]]
    match = _RANGE.fullmatch(inner)
    if match is None:
        return None
    low, high = match.groups()
    if abs(int(high) - int(low)) >= _MAX_EXPANSION:
        raise ValueError(f"range {{{inner}}} names more than {_MAX_EXPANSION} paths")
    padded = any(len(bound.lstrip("-")) > 1 and bound.lstrip("-").startswith("0") for bound in (low, high))
    width = max(len(low), len(high)) if padded else 0
    step = 1 if int(high) >= int(low) else -1
    return [f"{value:0{width}d}" for value in range(int(low), int(high) + step, step)]


def tar_sources(path: Any) -> list[Path] | None:
    """Return the tars `path` names when it names tars rather than a dataset, else None.

    Tars are: a list or tuple (each item a path or brace pattern), or one location that
    `classify_location` finds to be tars (a path or pattern ending in ``.tar`` that is not a
    folder). ``file://`` is stripped; tars by URL are refused (tars opened directly are indexed
    and memory-mapped, so they must be local).

    Raises:
        ValueError: tars named by URL, or a list that expands to nothing.
    """
    if isinstance(path, (list, tuple)):
        items = [_local(item) for item in path]
    else:
        location = classify_location(path)
        if not location.is_tars:
            return None
        items = [_local(location)]
    tars = [Path(name) for item in items for name in expand_braces(item)]
    if not tars:
        raise ValueError("no tars given")
    return tars


def _local(item: str | os.PathLike[str] | Location) -> str:
    """Return the local path or pattern of a location; refuse one that is remote."""
    location = item if isinstance(item, Location) else classify_location(item)
    if location.path is None:
        raise ValueError(
            f"{location.text[:80]!r}: only local tars can be opened directly (they are indexed and memory-mapped here); "
            "index them into a dataset (shardfmt index), put it in the store and open the dataset's URL"
        )
    return location.path


def _find_tars(sources: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Return the tars that `sources` name, each once, in order: a directory gives every
    ``*.tar`` below it (hidden files and folders skipped) sorted by relative path; a file or
    brace pattern gives itself.

    Raises:
        ValueError: a source is not local, or no tar is found.
    """
    sources = list(sources)
    found: dict[str, Path] = {}
    for source in sources:
        text = _local(source)
        if os.path.isdir(text):
            root = Path(text)
            below = sorted(
                (path for path in root.rglob("*.tar") if not any(part.startswith(".") for part in path.relative_to(root).parts)),
                key=lambda path: path.relative_to(root).as_posix(),
            )
        else:
            below = [Path(name) for name in expand_braces(text)]
        for path in below:
            found.setdefault(os.path.abspath(path), path)
    if not found:
        raise ValueError("no tars found in " + ", ".join(os.fspath(s) for s in sources))
    return list(found.values())


def _common_root(tars: Sequence[Path]) -> Path:
    return Path(os.path.commonpath([os.path.dirname(os.path.abspath(path)) for path in tars]))


def _relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(os.path.abspath(path), root)).as_posix()


def index_tars(
    sources: Iterable[str | os.PathLike[str]],
    *,
    out: str | os.PathLike[str] | None = None,
    classes: Sequence[str] | None = None,
    overwrite: bool = False,
) -> Manifest:
    """Index existing WebDataset tars and write a manifest: the tars become a tar dataset.

    Each tar's index is written to ``OUT/PATH.idx`` where PATH is the tar's path relative to
    `out`; samples left out (see `tar.index_tar`) are listed in ``OUT/rejects.jsonl`` (path, key,
    reason, detail) and counted in the manifest, which is written last.

    Args:
        sources: tar files, brace patterns, or directories (every ``*.tar`` below, sorted).
        out: the dataset root, which must contain every tar; default their deepest common folder.
        classes: class names by label; default the labels in decimal, "0" to the largest label.
        overwrite: replace an existing manifest.json in `out`.

    Returns:
        The `Manifest` written.

    Raises:
        ConvertError: a tar lies outside `out`, `out` already holds a manifest, or a label has
            no name in `classes`.
        FormatError, LimitError, ShardNotFoundError: a tar is malformed or missing.
    """
    tars = _find_tars(sources)
    root = Path(out) if out is not None else _common_root(tars)
    root.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.abspath(root))
    for path in tars:
        if _relative(path, root).startswith("../"):
            raise ConvertError(
                f"tar {path} lies outside the output folder; a manifest names shards inside its folder, "
                "so choose an --out that contains every tar",
                path=root,
            )
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise ConvertError("already holds manifest.json; pass overwrite to replace it", path=root)
    infos = [index_tar(path, index=root / (_relative(path, root) + INDEX_SUFFIX), name=_relative(path, root)) for path in tars]
    rejects = [reject for info in infos for reject in info.rejects]
    if rejects:
        lines = "".join(json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False) + "\n" for r in rejects)
        atomic_write_bytes(root / REJECTS_NAME, lines.encode())
    elif (root / REJECTS_NAME).exists():
        (root / REJECTS_NAME).unlink()
    max_label = max((info.max_label for info in infos), default=-1)
    if classes is not None and len(classes) <= max_label:
        raise ConvertError(f"label {max_label} has no name: {len(classes)} classes were given", path=root)
    manifest = _manifest(
        [(_relative(path, root), info) for path, info in zip(tars, infos, strict=True)],
        classes=list(classes) if classes is not None else _decimal_classes(max_label),
        rejects=[r.reason for r in rejects],
        report=REJECTS_NAME if rejects else None,
        command="index",
    )
    manifest.write(root)
    return manifest


def _decimal_classes(max_label: int) -> list[str] | None:
    return [str(label) for label in range(max_label + 1)] if max_label >= 0 else None


def _manifest(
    entries: Sequence[tuple[str, TarIndexInfo]], *, classes: list[str] | None, rejects: list[str], report: str | None, command: str
) -> Manifest:
    shards = tuple(
        ShardEntry(
            path,
            info.tar.num_records,
            info.tar.size,
            info.tar.checksum,
            IndexEntry(path + INDEX_SUFFIX, info.index.size, info.index.checksum),
        )
        for path, info in entries
    )
    manifest = Manifest(
        schema=IMAGE_CLASSIFICATION,
        shards=shards,
        classes=classes,
        shard_format="tar",
        converter={"name": "shardfmt", "options": {"command": command}},
        rejects={"count": len(rejects), "by_reason": dict(sorted(Counter(rejects).items())), "report": report},
        stats={"skipped_members": sum(info.skipped_members for _, info in entries)},
    )
    return Manifest.from_bytes(manifest.to_bytes())  # the same checks as any manifest read


# -- the cache of tars opened directly -------------------------------------------------------


def cache_dirs(root: Path) -> tuple[Path, Path]:
    """Return the two cache folders for tars below `root`, in the order they are tried: the
    ``.shardfmt-index`` folder in `root`, and ``$XDG_CACHE_HOME/shardfmt/tar-index/HASH`` (default
    ``~/.cache``) where HASH is the XXH3-64 of `root`'s absolute path."""
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = f"{checksum(os.fsencode(os.path.abspath(root))):016x}"
    return root / CACHE_NAME, user / "shardfmt" / "tar-index" / digest


def _stamp(path: Path) -> dict[str, int]:
    status = path.stat()
    return {"size": status.st_size, "mtime_ns": status.st_mtime_ns}


def _load_entry(cache: Path, relative: str, stamp: dict[str, int]) -> TarIndexInfo | None:
    """Return the cached index of a tar if it is there and the tar has not changed, else None."""
    try:
        value = json.loads((cache / (relative + ".json")).read_bytes())
        if value.get("version") != _CACHE_VERSION or value.get("source") != stamp:
            return None
        index_path = cache / (relative + INDEX_SUFFIX)
        if index_path.stat().st_size != value["index"]["size"]:
            return None
        tar = ShardInfo(Path(relative), int(value["num_records"]), stamp["size"], parse_checksum(value["checksum"]))
        index = ShardInfo(index_path, int(value["num_records"]), int(value["index"]["size"]), parse_checksum(value["index"]["checksum"]))
        rejects = tuple(TarReject(relative, r["key"], r["reason"], r["detail"]) for r in value["rejects"])
        return TarIndexInfo(tar, index, rejects, int(value["max_label"]), int(value["skipped_members"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _index_into(cache: Path, path: Path, relative: str, stamp: dict[str, int]) -> TarIndexInfo:
    target = cache / (relative + INDEX_SUFFIX)
    target.parent.mkdir(parents=True, exist_ok=True)
    info = index_tar(path, index=target, name=relative)
    if info.rejects:
        counts = Counter(reject.reason for reject in info.rejects)
        warnings.warn(f"{path}: {len(info.rejects)} samples left out of the index ({dict(sorted(counts.items()))})", stacklevel=2)
    entry = {
        "version": _CACHE_VERSION,
        "source": stamp,
        "checksum": format_checksum(info.tar.checksum),
        "num_records": info.tar.num_records,
        "index": {"size": info.index.size, "checksum": format_checksum(info.index.checksum)},
        "max_label": info.max_label,
        "skipped_members": info.skipped_members,
        "rejects": [{"key": display_key(r.key), "reason": r.reason, "detail": r.detail} for r in info.rejects],
    }
    atomic_write_bytes(cache / (relative + ".json"), json.dumps(entry, sort_keys=True).encode())
    return info


def open_tars(tars: Sequence[Path]) -> tuple[Manifest, Path, Path]:
    """Index tars on first open, or find their indexes in the cache: the rule of spec/tar.md.

    The tars' deepest common folder is the dataset root. Each tar's index is looked up in the
    two folders of `cache_dirs` and used if its entry records the tar's current size and
    modification time; otherwise the tar is indexed into the first of those folders that can be
    written. A changed tar is therefore indexed again; a tar rewritten with the same size and
    modification time is not noticed (its image checksums still are, on read).

    Returns:
        (manifest, root of the tars, root of the indexes) for `DatasetReader`.

    Raises:
        ShardNotFoundError: a tar does not exist.
        FormatError, LimitError: a tar is malformed.
        OSError: no cache folder can be written.
    """
    root = _common_root(tars)
    caches = cache_dirs(root)
    stamps, relatives = [], []
    for path in tars:
        try:
            stamps.append(_stamp(path))
        except FileNotFoundError as err:
            raise ShardNotFoundError("tar does not exist", path=path) from err
        relatives.append(_relative(path, root))
    for chosen in caches:
        found = [_load_entry(chosen, rel, stamp) for rel, stamp in zip(relatives, stamps, strict=True)]
        if all(info is not None for info in found):
            break
    else:
        chosen = _writable(caches)
        found = [_load_entry(chosen, rel, stamp) for rel, stamp in zip(relatives, stamps, strict=True)]
    infos = [
        info if info is not None else _index_into(chosen, path, relative, stamp)
        for info, path, relative, stamp in zip(found, tars, relatives, stamps, strict=True)
    ]
    max_label = max((info.max_label for info in infos), default=-1)
    manifest = _manifest(
        list(zip(relatives, infos, strict=True)),
        classes=_decimal_classes(max_label),
        rejects=[r.reason for info in infos for r in info.rejects],
        report=None,
        command="open",
    )
    return manifest, root, chosen


def _writable(caches: Sequence[Path]) -> Path:
    errors = []
    for candidate in caches:
        try:
            candidate.mkdir(parents=True, exist_ok=True)
            probe = candidate / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
            return candidate
        except OSError as err:
            errors.append(f"{candidate}: {err.strerror or err}")
    raise OSError("no cache folder for tar indexes can be written: " + "; ".join(errors))

