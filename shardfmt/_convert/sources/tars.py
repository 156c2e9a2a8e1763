"""WebDataset tars as the source of a conversion: which locations name tars, and their samples
as inputs.

Tars are a ``.tar`` file, a brace pattern such as ``shards-{000..009}.tar``, or a folder that
holds ``.tar`` files and no sub-folders (hidden entries aside). Each tar's headers are read
(nothing is extracted) and its members grouped into samples as `tar.scan.scan_samples` does; a
sample's image is its first member with an extension of `TAR_IMAGE_EXTENSIONS` (its content
decides later, as for files), its label the integer in its ``.cls`` member (when any sample has
one; otherwise records have no label), its key the sample key, and every further member that
all kept samples have a column of its own (text, JSON or bytes, read by the worker with one
``pread`` each). Classes are the labels in decimal, "0" to the largest. Found here and reported as
rejects instead of inputs: "duplicate-member", "no-image", "no-label", "bad-label"
(spec/tar.md, section 6) for a sample, "corrupt" for a tar that cannot be read as one,
"not-a-regular-file" for a FIFO or device (refused from its ``stat``, before it is opened),
"unreadable" for one the operating system refuses. A sample's members are byte ranges of its
tar, so nothing outside the tars is read.

Tars are read in place with ``pread``, so they must be local: `TARS_BY_URL` is the refusal of
tars given by URL.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, cast

from ..._dataset.tars import expand_braces, tar_sources
from ..._errors import ConvertError, FormatError, RejectError, ShardNotFoundError
from ..._storage.urls import local_path
from ...format._schema import TAR_MEMBER_TYPES
from ...tar._index import parse_label
from ...tar._keys import ANY_IMAGE_EXTENSIONS, COMPRESSED_SUFFIXES, LABEL_EXTENSION, MAX_LABEL_SIZE, display_key, member_field, member_kind
from ...tar._scan import TarMember, TarSample, scan_samples
from .confine import check_regular
from .results import IMAGE_AND_LABEL, RecordField, ScannedRecord, ScanReject, SourceFile, SourceScan, describe_os_error, display_path
from .trees import Tree

__all__ = ["TARS_BY_URL", "TAR_IMAGE_EXTENSIONS", "decompress_tars", "local_tars", "names_tars", "scan_tars", "tars_in_folder"]

TAR_IMAGE_EXTENSIONS: Final = ANY_IMAGE_EXTENSIONS
"""Extensions of a tar sample's image member, in order of preference."""
TARS_BY_URL: Final = (
    "WebDataset tars given by URL cannot be a conversion source: tars are read in place with pread, "
    "so copy them to a local folder first (a folder or listing of images may be a URL)"
)


def names_tars(location: str) -> bool:
    """True if `location` (a path or URL, without a query string) names tars: it ends in ``.tar``
    (or ``.tar.gz``, ``.tgz``)."""
    return location.rstrip("/").endswith((".tar", *COMPRESSED_SUFFIXES))


def local_tars(location: str) -> list[Path] | None:
    """The tars a local path or brace pattern names (compressed ones too), or None if it names none.

    Raises:
        ConvertError: the pattern names too many tars.
    """
    try:
        path = local_path(location)
        if path.endswith(COMPRESSED_SUFFIXES) and not os.path.isdir(path):
            return [Path(name) for name in expand_braces(path)]
        return tar_sources(location)
    except ValueError as err:
        raise ConvertError(str(err), path=location) from err


def tars_in_folder(tree: Tree) -> list[str]:
    """The ``.tar`` (and ``.tar.gz``, ``.tgz``) files of a folder that holds no sub-folders
    (hidden entries aside), sorted by name; empty if it holds a sub-folder or no tar."""
    entries = sorted((entry for entry in tree.entries(None) if not entry.name.startswith(".")), key=lambda entry: entry.name)
    if any(entry.is_dir for entry in entries):
        return []
    return [entry.path for entry in entries if entry.name.endswith((".tar", *COMPRESSED_SUFFIXES))]


def decompress_tars(tars: list[Path], folder: Path, *, threads: int | None = None) -> list[Path]:
    """Stream each compressed tar of `tars` into an uncompressed copy under `folder` (its path
    relative to the tars' common folder, ``.tar.gz`` / ``.tgz`` made ``.tar``), several files at
    once on threads (zlib lets go of the GIL), in constant memory; return the tars with each
    compressed one replaced by its copy and each uncompressed one linked into `folder` beside
    them, so that one root holds all. A copy that a previous run finished for the same source
    (size and modification time) is kept, so a resumed conversion finds the same inputs. A copy
    of a file that is not gzip, or is cut short, holds what came out, and its scan finds it corrupt.

    Raises:
        ConvertError: a tar does not exist. OSError: a copy cannot be written (its partial
            copy is removed first; ENOSPC when the disk fills, as a decompression bomb makes it).
    """
    root = Path(os.path.commonpath([os.path.dirname(os.path.abspath(tar)) for tar in tars]))

    def place(tar: Path) -> Path:
        rel = os.path.relpath(os.path.abspath(tar), root)
        for suffix in COMPRESSED_SUFFIXES:
            if rel.endswith(suffix):
                rel = rel[: -len(suffix)] + ".tar"
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            status = os.stat(tar)
        except FileNotFoundError as err:
            raise ConvertError("the tar does not exist", path=tar) from err
        if not tar.name.endswith(COMPRESSED_SUFFIXES) or not stat.S_ISREG(status.st_mode):  # the scan rejects a FIFO or device
            if not target.is_symlink():
                target.symlink_to(os.path.abspath(tar))
            return target
        stamp = json.dumps({"size": status.st_size, "mtime_ns": status.st_mtime_ns})
        marker = target.with_name(target.name + ".source")
        if target.exists() and marker.exists() and marker.read_text() == stamp:
            return target
        temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with open(temporary, "wb") as plain:  # closing flushes, which may fail too (a full disk)
                try:
                    with gzip.open(tar, "rb") as compressed:
                        shutil.copyfileobj(compressed, plain, 1 << 20)
                except (EOFError, zlib.error, gzip.BadGzipFile):
                    pass
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        os.replace(temporary, target)
        marker.write_text(stamp)
        return target

    with ThreadPoolExecutor(max(1, min(len(tars), threads or os.cpu_count() or 1))) as pool:
        return list(pool.map(place, tars))


def _scan_each(tars: list[Path], root: Path) -> list[tuple[Path, str, int, tuple[TarSample, ...]] | ScanReject]:
    """Each tar's samples from its headers (with its path relative to `root` and its mtime), or
    why it cannot be read."""
    scans: list[tuple[Path, str, int, tuple[TarSample, ...]] | ScanReject] = []
    for tar in tars:
        rel = os.path.relpath(os.path.abspath(tar), root)
        try:
            status = os.stat(tar)
            check_regular(status)  # before opening it: a FIFO would block, a device never end
            scans.append((tar, rel, status.st_mtime_ns, scan_samples(tar)))
        except (ShardNotFoundError, FileNotFoundError) as err:
            raise ConvertError("the tar does not exist", path=tar) from err
        except RejectError as err:
            scans.append(ScanReject(0, display_path(rel), err.reason, err.message))
        except OSError as err:
            scans.append(ScanReject(0, display_path(rel), "unreadable", describe_os_error(err)))
        except FormatError as err:
            where = f"byte {err.offset}: " if err.offset is not None else ""
            scans.append(ScanReject(0, display_path(rel), "corrupt", f"not a readable tar: {where}{err.message}"))
    return scans


def _read_samples(
    tar: Path, rel: str, mtime_ns: int, samples: tuple[TarSample, ...], *, labelled: bool
) -> list[tuple[str, int, TarSample, TarMember, int | None] | ScanReject]:
    """Each sample of one tar with its image member and label, or why it is rejected."""
    try:
        fd = os.open(tar, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError as err:
        return [ScanReject(0, display_path(rel), "unreadable", describe_os_error(err))]
    found: list[tuple[str, int, TarSample, TarMember, int | None] | ScanReject] = []
    try:
        for sample in samples:
            problem = _sample_problem(fd, sample, labelled)
            if isinstance(problem, tuple):
                found.append(ScanReject(0, display_path(rel), *problem, key=display_key(sample.key)))
            else:
                image = next(sample.members[ext] for ext in TAR_IMAGE_EXTENSIONS if ext in sample.members)
                found.append((rel, mtime_ns, sample, image, problem))
    finally:
        os.close(fd)
    return found


def _member_columns(
    kept: list[tuple[str, int, TarSample, TarMember, int | None]], *, labelled: bool, declared: Mapping[str, str]
) -> tuple[list[tuple[str, str, str]], dict[str, int]]:
    """(field name, kind, extension) of each further member extension that every kept sample has,
    and how many kept samples have each further extension."""
    counts: dict[str, int] = {}
    for _, _, sample, image, _ in kept:
        for ext in sample.members:
            if ext != image.extension and not (labelled and ext == LABEL_EXTENSION):
                counts[ext] = counts.get(ext, 0) + 1
    columns: list[tuple[str, str, str]] = []
    for ext in sorted(ext for ext, count in counts.items() if count == len(kept)):
        field_name = member_field(ext)
        if field_name is not None and all(field_name != taken for taken, _, _ in columns):
            columns.append((field_name, declared.get(field_name) or declared.get(ext) or member_kind(ext), ext))
    return columns, counts


def _declared_extensions(found: list[tuple[str, int, TarSample, TarMember, int | None] | ScanReject],
                         declared: Mapping[str, str]) -> dict[str, str]:
    """The member extension each declared field names (by field name or by extension), among
    the members of the samples found.

    Raises:
        ConvertError: no sample has a member that a declared field names.
    """
    extensions = {ext for item in found if not isinstance(item, ScanReject) for ext in item[2].members}
    named: dict[str, str] = {}
    for name in declared:
        ext = name if name in extensions else next((e for e in sorted(extensions) if member_field(e) == name), None)
        if ext is None:
            raise ConvertError(f"field {name!r} was declared, but no sample of the tars has a member .{name}")
        named[name] = ext
    return named


def _without_declared(found: list[tuple[str, int, TarSample, TarMember, int | None] | ScanReject],
                      declared: Mapping[str, str]) -> list[tuple[str, int, TarSample, TarMember, int | None] | ScanReject]:
    """The samples found, each that lacks a member a field was declared for made a
    "missing-member" reject: a declared field is kept, and every record has it."""
    if not declared:
        return found
    named = _declared_extensions(found, declared)
    kept: list[tuple[str, int, TarSample, TarMember, int | None] | ScanReject] = []
    for item in found:
        lacking = None if isinstance(item, ScanReject) else next((n for n, e in named.items() if e not in item[2].members), None)
        if lacking is None:
            kept.append(item)
            continue
        rel, _, sample, _, _ = cast(tuple[str, int, TarSample, TarMember, "int | None"], item)
        detail = f"no member .{named[lacking]}, which the declared field {lacking!r} needs (--field {lacking}=KIND, fields=)"
        kept.append(ScanReject(0, display_path(rel), "missing-member", detail, key=display_key(sample.key)))
    return kept


def scan_tars(tars: list[Path], *, declared: Mapping[str, str] | None = None, work: Path | None = None) -> SourceScan:
    """Find the samples of local tars, in tar order (see the module docstring).

    The records are labelled when any sample has a ``.cls`` member (then a sample without one
    is a "no-label" reject). Each further member extension that every kept sample has is a
    member column (`tar.keys.member_field` names it; `declared` may give its kind by name or
    extension, else `tar.keys.member_kind`); the other members are counted in `not_stored`. A
    declared member is a column even where some samples lack it: those samples are
    "missing-member" rejects.

    Compressed tars (``.tar.gz``, ``.tgz``) are first streamed into uncompressed copies under
    `work` (`decompress_tars`), which the conversion then reads.

    Raises:
        ConvertError: a tar does not exist, a declared kind is not str, json or bytes, or no
            sample has a member a declared field names, or compressed tars without `work`.
    """
    declared = dict(declared or {})
    if any(tar.name.endswith(COMPRESSED_SUFFIXES) for tar in tars):
        if work is None:
            raise ConvertError(f"compressed tars need a folder to be decompressed into: {COMPRESSED_SUFFIXES}", path=tars[0])
        tars = decompress_tars(tars, work)
    for name, kind in declared.items():
        if kind not in TAR_MEMBER_TYPES:
            raise ConvertError(f"field {name!r}: a member of a tar is stored as {', '.join(TAR_MEMBER_TYPES)}, not {kind!r}")
    root = Path(os.path.commonpath([os.path.dirname(os.path.abspath(tar)) for tar in tars]))
    scans = _scan_each(tars, root)
    labelled = any(LABEL_EXTENSION in sample.members for scan in scans if not isinstance(scan, ScanReject) for sample in scan[3])
    found: list[tuple[str, int, TarSample, TarMember, int | None] | ScanReject] = []
    for scan in scans:
        found.extend([scan] if isinstance(scan, ScanReject) else _read_samples(*scan, labelled=labelled))
    found = _without_declared(found, declared)
    kept = [item for item in found if not isinstance(item, ScanReject)]
    columns, counts = _member_columns(kept, labelled=labelled, declared=declared)
    inputs: list[ScannedRecord] = []
    rejects: list[ScanReject] = []
    max_label = -1
    for item in found:
        if isinstance(item, ScanReject):
            rejects.append(ScanReject(len(inputs), item.path, item.reason, item.detail, item.key))
            continue
        rel, mtime_ns, sample, image, label = item
        max_label = max(max_label, -1 if label is None else label)
        files = [SourceFile(rel, image.size, mtime_ns, offset=image.data_offset, sample_key=sample.key)]
        files.extend(SourceFile(rel, sample.members[ext].size, mtime_ns, offset=sample.members[ext].data_offset, sample_key=sample.key)
                     for _, _, ext in columns)
        inputs.append(ScannedRecord(tuple(files), () if label is None else (label,), files[0].key))
    stored = {ext for _, _, ext in columns}
    not_stored = tuple(sorted((display_key(ext), count) for ext, count in counts.items() if ext not in stored))
    classes = tuple(str(label) for label in range(max_label + 1)) if labelled else None
    members = tuple(RecordField(name, kind, member=True) for name, kind, _ in columns)
    fields = (IMAGE_AND_LABEL if labelled else IMAGE_AND_LABEL[:1]) + members
    return SourceScan(root, "webdataset", fields, classes, tuple(inputs), tuple(rejects), not_stored=not_stored)


def _sample_problem(fd: int, sample: TarSample, labelled: bool) -> int | None | tuple[str, str]:
    """The label of a sample (None if unlabelled), or (reason, detail) if it cannot be an input."""
    image = next((ext for ext in TAR_IMAGE_EXTENSIONS if ext in sample.members), None)
    if sample.duplicate is not None:
        return ("duplicate-member", f"two members with extension {sample.duplicate.extension!r}")
    if image is None:
        return ("no-image", "no member with an image extension (" + ", ".join(TAR_IMAGE_EXTENSIONS) + ")")
    if not labelled:
        return None
    label_member = sample.members.get(LABEL_EXTENSION)
    if label_member is None:
        return ("no-label", f"no member with extension {LABEL_EXTENSION!r}")
    return parse_label(memoryview(os.pread(fd, min(label_member.size, MAX_LABEL_SIZE + 1), label_member.data_offset)))
