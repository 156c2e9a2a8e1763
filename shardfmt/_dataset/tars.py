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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .._checksum import checksum, format_checksum, parse_checksum
from .._errors import ConvertError, ShardNotFoundError
from .._storage.atomic import atomic_write_bytes
from ..format._manifest import MANIFEST_NAME, IndexEntry, Manifest, ShardEntry
from ..format._schema import TAR_MEMBER_TYPES, Schema, tar_schema
from ..format._writer import ShardInfo
from ..tar._index import TarIndexInfo, TarReject, index_tar
from ..tar._keys import COMPRESSED_ADVICE, COMPRESSED_SUFFIXES, INDEX_SUFFIX, display_key, member_field, member_kind
from .locate import Location, classify_location

__all__ = ["CACHE_NAME", "cache_dirs", "expand_braces", "index_tars", "member_fields", "open_tars", "tar_sources"]

CACHE_NAME: Final = ".shardfmt-index"
"""The cache folder beside tars that are opened directly."""
REJECTS_NAME: Final = "rejects.jsonl"
_CACHE_VERSION: Final = 3
"""3: member indexes carry each member's checksum (an entry of an older version is indexed again)."""
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
        if location.path is not None and location.path.endswith(COMPRESSED_SUFFIXES):
            raise ValueError(f"{location.path}: {COMPRESSED_ADVICE}")
        if not location.is_tars:
            return None
        items = [_local(location)]
    compressed = [item for item in items if item.endswith(COMPRESSED_SUFFIXES)]
    if compressed:
        raise ValueError(f"{compressed[0]}: {COMPRESSED_ADVICE}")
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
        ValueError: a source is not local.
        ConvertError: no tar is found, or a source is a compressed tar (or a folder of them).
    """
    sources = list(sources)
    found: dict[str, Path] = {}
    for source in sources:
        text = _local(source)
        if text.endswith(COMPRESSED_SUFFIXES):
            raise ConvertError(COMPRESSED_ADVICE, path=text)
        if os.path.isdir(text):
            root = Path(text)
            if not any(root.rglob("*.tar")) and any(p for suffix in COMPRESSED_SUFFIXES for p in root.rglob("*" + suffix)):
                raise ConvertError(f"holds compressed tars only: {COMPRESSED_ADVICE}", path=text)
            below = sorted(
                (path for path in root.rglob("*.tar") if not any(part.startswith(".") for part in path.relative_to(root).parts)),
                key=lambda path: path.relative_to(root).as_posix(),
            )
        else:
            below = [Path(name) for name in expand_braces(text)]
        for path in below:
            found.setdefault(os.path.abspath(path), path)
    if not found:
        raise ConvertError("no .tar files found (a folder is searched for *.tar below it)", path=", ".join(os.fspath(s) for s in sources))
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
    fields: Mapping[str, str] | None = None,
) -> Manifest:
    """Index existing WebDataset tars and write a manifest: the tars become a tar dataset.

    Each tar's index is written to ``OUT/PATH.idx`` where PATH is the tar's path relative to
    `out`; samples left out (see `tar.index_tar`) are listed in ``OUT/rejects.jsonl`` (path, key,
    reason, detail) and counted in the manifest, which is written last.

    The dataset is labelled when any sample of any tar has a ``.cls`` member (then a sample
    without one is a "no-label" reject); otherwise it has no label field. Every further member
    extension that every kept sample has becomes a field (`member_fields`): ``txt`` a str,
    ``json`` JSON, anything else bytes, unless `fields` declares its type. Members of other
    extensions stay in the tars and are counted per extension in the manifest's
    ``stats.members_not_stored``.

    Args:
        sources: tar files, brace patterns, or directories (every ``*.tar`` below, sorted).
        out: the dataset root, which must contain every tar; default their deepest common folder.
        classes: class names by label; default the labels in decimal, "0" to the largest label.
        overwrite: replace an existing manifest.json in `out`.
        fields: field type ("str", "json" or "bytes") by field name or extension.

    Returns:
        The `Manifest` written.

    Raises:
        ConvertError: a tar lies outside `out`, `out` already holds a manifest, a label has
            no name in `classes` (or classes are given for unlabelled tars), or a declared field
            is not a member of every kept sample.
        FormatError, LimitError, ShardNotFoundError: a tar is malformed or missing.
    """
    tars = _find_tars(sources)
    root = _output_root(tars, out)
    if (root / MANIFEST_NAME).exists() and not overwrite:
        raise ConvertError("already holds manifest.json; pass overwrite to replace it", path=root)
    infos = [index_tar(path, index=root / (_relative(path, root) + INDEX_SUFFIX), name=_relative(path, root)) for path in tars]
    if any(info.labelled for info in infos):  # a tar without labels among labelled ones: its samples are "no-label"
        infos = [info if info.labelled else index_tar(path, index=root / (_relative(path, root) + INDEX_SUFFIX),
                                                      name=_relative(path, root), labelled=True)
                 for path, info in zip(tars, infos, strict=True)]
    rejects = [reject for info in infos for reject in info.rejects]
    _write_rejects(root, rejects)
    max_label = max((info.max_label for info in infos), default=-1)
    labelled = any(info.labelled for info in infos)
    if classes is not None and not labelled:
        raise ConvertError("classes were given, but no sample has a .cls label member", path=root)
    if classes is not None and len(classes) <= max_label:
        raise ConvertError(f"label {max_label} has no name: {len(classes)} classes were given", path=root)
    try:
        schema, not_stored = member_fields(infos, declared=fields or {})
    except ValueError as err:
        raise ConvertError(str(err), path=root) from err
    manifest = _manifest(
        [(_relative(path, root), info) for path, info in zip(tars, infos, strict=True)],
        schema=schema,
        not_stored=not_stored,
        classes=list(classes) if classes is not None else _decimal_classes(max_label) if labelled else None,
        rejects=[r.reason for r in rejects],
        report=REJECTS_NAME if rejects else None,
        command="index",
    )
    manifest.write(root)
    return manifest


def _output_root(tars: Sequence[Path], out: str | os.PathLike[str] | None) -> Path:
    """Make the dataset root (`out`, or the tars' deepest common folder) and check that it holds every tar."""
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
    return root


def _write_rejects(root: Path, rejects: Sequence[TarReject]) -> None:
    """Write the rejects report, or remove a stale one when nothing was left out."""
    if rejects:
        lines = "".join(json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False) + "\n" for r in rejects)
        atomic_write_bytes(root / REJECTS_NAME, lines.encode())
    elif (root / REJECTS_NAME).exists():
        (root / REJECTS_NAME).unlink()


def _decimal_classes(max_label: int) -> list[str] | None:
    return [str(label) for label in range(max_label + 1)] if max_label >= 0 else None


def member_fields(infos: Sequence[TarIndexInfo], *, declared: Mapping[str, str]) -> tuple[Schema, dict[str, int]]:
    """The schema of a tar dataset from what its tars' indexes found, and the members it leaves
    out, counted per extension (spec/tar.md, section 3).

    Labelled if any tar is. A member extension becomes a field when every kept sample of every
    tar has it and it has a field name (`tar.keys.member_field`; of two extensions with one
    name, the first in sorted order); its type is `declared` (by field name or extension), else
    `tar.keys.member_kind`.

    Raises:
        ValueError: a declared type is not one a member can have, or a declared field is not a
            member of every kept sample.
    """
    kept = [info for info in infos if info.tar.num_records]
    common: set[str] | None = None
    for info in kept:
        full = {ext for ext, count in info.member_counts if count == info.tar.num_records}
        common = full if common is None else common & full
    members: list[tuple[str, str]] = []
    stored: set[str] = set()
    for ext in sorted(common or ()):
        name = member_field(ext)
        if name is None or any(name == taken for taken, _ in members):
            continue
        kind = declared.get(name) or declared.get(ext) or member_kind(ext)
        if kind not in TAR_MEMBER_TYPES:
            raise ValueError(f"field {name!r}: a member of a tar is stored as {', '.join(TAR_MEMBER_TYPES)}, not {kind!r}")
        members.append((name, kind))
        stored.add(ext)
    names = {name for name, _ in members}
    missing = [name for name in declared if name not in names and member_field(name) not in names]
    if missing:
        raise ValueError(f"field {missing[0]!r} was declared, but not every sample has a member .{missing[0]}")
    not_stored: Counter[str] = Counter()
    for info in infos:
        for ext, count in info.member_counts:
            if ext not in stored:
                not_stored[ext] += count
    schema = tar_schema(labelled=any(info.labelled for info in infos), members=tuple(members))
    return schema, dict(sorted(not_stored.items()))


def _manifest(
    entries: Sequence[tuple[str, TarIndexInfo]], *, schema: Schema, not_stored: dict[str, int], classes: list[str] | None,
    rejects: list[str], report: str | None, command: str
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
        schema=schema,
        shards=shards,
        classes=classes,
        shard_format="tar",
        converter={"name": "shardfmt", "options": {"command": command}},
        rejects={"count": len(rejects), "by_reason": dict(sorted(Counter(rejects).items())), "report": report},
        stats={"skipped_members": sum(info.skipped_members for _, info in entries), "members_not_stored": not_stored},
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
        counts = tuple((str(ext), int(count)) for ext, count in value["member_counts"])
        return TarIndexInfo(tar, index, rejects, int(value["max_label"]), int(value["skipped_members"]), bool(value["labelled"]),
                            counts, bool(value["has_labels"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _index_into(cache: Path, path: Path, relative: str, stamp: dict[str, int], labelled: bool | None = None) -> TarIndexInfo:
    target = cache / (relative + INDEX_SUFFIX)
    target.parent.mkdir(parents=True, exist_ok=True)
    info = index_tar(path, index=target, name=relative, labelled=labelled)
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
        "labelled": info.labelled,
        "has_labels": info.has_labels,
        "member_counts": [list(pair) for pair in info.member_counts],
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
    modification time is not noticed (its members' checksums still are, on read).

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
    if any(info.has_labels for info in infos):  # labelled: a tar without labels has "no-label" samples
        infos = [
            info if info.labelled else _index_into(chosen, path, relative, stamp, labelled=True)
            for info, path, relative, stamp in zip(infos, tars, relatives, stamps, strict=True)
        ]
    else:  # unlabelled: a cached index made while other tars had labels is made again
        infos = [
            _index_into(chosen, path, relative, stamp) if info.labelled else info
            for info, path, relative, stamp in zip(infos, tars, relatives, stamps, strict=True)
        ]
    max_label = max((info.max_label for info in infos), default=-1)
    schema, not_stored = member_fields(infos, declared={})
    manifest = _manifest(
        list(zip(relatives, infos, strict=True)),
        schema=schema,
        not_stored=not_stored,
        classes=_decimal_classes(max_label) if schema.names[1] == "label" else None,
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

