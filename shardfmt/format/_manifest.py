"""manifest.json: the dataset's table of contents, written last as the commit point.

A directory is a dataset only once its manifest exists; the manifest names every shard with its
record count, byte size and XXH3-64, so a reader can check a shard before trusting it. The JSON is
deterministic (sorted keys, fixed indentation) so that equal inputs give byte-identical manifests.
spec/manifest.md and spec/manifest.schema.json describe the same fields.
"""

from __future__ import annotations

import json
import os
import re
import stat
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._checksum import format_checksum, parse_checksum
from .._errors import (
    DatasetNotFoundError,
    ManifestError,
    SchemaError,
    UnsupportedVersionError,
)
from .._jsontext import JsonTextError, parse_json
from .._storage.atomic import atomic_write_bytes
from ._layout import (
    FORMAT_VERSION,
    MAX_CLASSES,
    MAX_MANIFEST_SIZE,
    MAX_RECORDS_PER_SHARD,
    MAX_SHARD_SIZE,
    MAX_SHARDS,
)
from ._schema import Schema, tar_schema_problem

__all__ = ["MANIFEST_NAME", "SHARD_FORMATS", "IndexEntry", "Manifest", "ShardEntry"]

MANIFEST_NAME = "manifest.json"
SHARD_FORMATS = ("binary", "tar")
"""Shard encodings this reader implements: spec/format.md and spec/tar.md."""
_VERSION_RE = re.compile(r"(0|[1-9][0-9]{0,4})\.(0|[1-9][0-9]{0,4})")
"""ASCII digits only, at most five, no leading zero: one spelling per version ("01.1" is not one)."""


@dataclass(frozen=True)
class IndexEntry:
    """The member index of a tar shard (spec/tar.md): a binary shard, relative path with '/'."""

    path: str
    size: int
    checksum: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "checksum": format_checksum(self.checksum)}


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it; `path` is relative to the dataset root, with '/'.

    `index` is set for tar shards only: where their member index is.
    """

    path: str
    num_records: int
    size: int
    checksum: int
    index: IndexEntry | None = None

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "path": self.path,
            "num_records": self.num_records,
            "size": self.size,
            "checksum": format_checksum(self.checksum),
        }
        if self.index is not None:
            value["index"] = self.index.to_json()
        return value


@dataclass(frozen=True)
class Manifest:
    """The parsed content of manifest.json.

    `strict_jpeg`: the producer guarantees that every jpeg payload decodes without error (the
    converter strictly decodes the JPEGs it keeps and writes the others itself); written as the
    optional key ``"strict_jpeg": true``, absent otherwise (spec/manifest.md).
    """

    schema: Schema
    shards: tuple[ShardEntry, ...]
    classes: list[str] | None = None
    shard_format: str = "binary"
    format_version: tuple[int, int] = FORMAT_VERSION
    converter: dict[str, Any] = field(default_factory=dict)
    rejects: dict[str, Any] = field(default_factory=lambda: {"count": 0, "by_reason": {}, "report": None})
    stats: dict[str, Any] = field(default_factory=dict)
    strict_jpeg: bool = False

    @property
    def num_records(self) -> int:
        return sum(shard.num_records for shard in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(shard.size for shard in self.shards)

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "format": "shardfmt",
            "format_version": f"{self.format_version[0]}.{self.format_version[1]}",
            "shard_format": self.shard_format,
            "schema": self.schema.to_json(),
            "classes": self.classes,
            "num_records": self.num_records,
            "num_bytes": self.num_bytes,
            "shards": [shard.to_json() for shard in self.shards],
            "rejects": self.rejects,
            "converter": self.converter,
            "stats": self.stats,
        }
        if self.strict_jpeg:
            value["strict_jpeg"] = True
        return value

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()

    def write(self, directory: str | os.PathLike[str]) -> Path:
        """Write manifest.json atomically into `directory` and return its path."""
        path = Path(directory) / MANIFEST_NAME
        atomic_write_bytes(path, self.to_bytes())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        """Read and validate a manifest.

        Args:
            path: the manifest file, or a dataset directory holding manifest.json (which file a
                location string names is `dataset.locate.classify_location`'s to decide).

        Raises:
            DatasetNotFoundError: there is no manifest (an unfinished conversion, or not a dataset).
            ManifestError: the manifest is too large, not JSON, or breaks a rule of spec/manifest.md.
            UnsupportedVersionError: its major format version is not 1.
        """
        path = Path(path)
        if path.is_dir() and path.name != MANIFEST_NAME:  # a folder named manifest.json is refused below
            path = path / MANIFEST_NAME
        try:
            status = path.stat()  # follows symbolic links: a broken one leaves no manifest to read
        except (FileNotFoundError, NotADirectoryError) as err:
            raise DatasetNotFoundError(
                "no manifest.json: not a shardfmt dataset, or its conversion has not finished "
                "(rerun `shardfmt convert --resume`)",
                path=path.parent if path.name == MANIFEST_NAME else path,
            ) from err
        except OSError as err:
            raise ManifestError(f"cannot be read: {err.strerror}", path=path) from err
        if not stat.S_ISREG(status.st_mode):
            raise ManifestError("is not a regular file, so it cannot be a manifest", path=path)
        if status.st_size > MAX_MANIFEST_SIZE:
            raise ManifestError(f"{status.st_size} bytes exceeds the manifest limit of {MAX_MANIFEST_SIZE}", path=path)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise ManifestError(f"cannot be read: {err.strerror}", path=path) from err
        return cls.from_bytes(data, path=path)

    @classmethod
    def from_bytes(cls, data: bytes, *, path: str | os.PathLike[str] = MANIFEST_NAME) -> Manifest:
        """Parse and validate manifest bytes (see `load`)."""
        if len(data) > MAX_MANIFEST_SIZE:
            raise ManifestError(f"{len(data)} bytes exceeds the manifest limit of {MAX_MANIFEST_SIZE}", path=path)
        try:
            value = parse_json(data)
        except JsonTextError as err:
            raise ManifestError(f"not valid JSON text: {err}", path=path) from err
        return _parse(value, path)


class _Check:
    """Typed access to the manifest's JSON values: every failure is a `ManifestError` naming the
    file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def fail(self, message: str) -> ManifestError:
        return ManifestError(message, path=self.path)

    def need(self, obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
        """Return ``obj[key]``, which must be present and of `kind` (an int is never a bool)."""
        if key not in obj:
            raise self.fail(f"{where}: missing {key!r}")
        item = obj[key]
        if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
            raise self.fail(f"{where}: {key!r} has the wrong type ({type(item).__name__})")
        return item


def _parse(value: Any, path: str | os.PathLike[str]) -> Manifest:
    check = _Check(path)
    if not isinstance(value, dict):
        raise check.fail("the manifest is not a JSON object")
    major, minor = _parse_version(value, check)
    shard_format = check.need(value, "shard_format", str, "manifest")
    if shard_format not in SHARD_FORMATS:
        raise UnsupportedVersionError(f"shard_format {_show(shard_format)} is unknown to this reader", path=path)
    schema = _parse_schema(value, minor, shard_format, check)
    classes = _parse_classes(value, check)
    _check_optional(value, check.fail)
    raw_shards = check.need(value, "shards", list, "manifest")
    if len(raw_shards) > MAX_SHARDS:
        raise check.fail(f"{len(raw_shards)} shards exceed the limit of {MAX_SHARDS}")
    seen: dict[str, str] = {}
    shards = tuple(_parse_shard(raw, f"shards[{i}]", shard_format, seen, check) for i, raw in enumerate(raw_shards))
    manifest = Manifest(
        schema=schema,
        shards=shards,
        classes=classes,
        shard_format=shard_format,
        format_version=(major, minor),
        converter=_object_or_empty(value, "converter"),
        rejects=_object_or_empty(value, "rejects"),
        stats=_object_or_empty(value, "stats"),
        strict_jpeg=value.get("strict_jpeg", False),
    )
    for key, actual in (("num_records", manifest.num_records), ("num_bytes", manifest.num_bytes)):
        stated = check.need(value, key, int, "manifest")
        if stated != actual:
            raise check.fail(f'"{key}" is {stated} but the shards add up to {actual}')
    return manifest


def _parse_version(value: dict[str, Any], check: _Check) -> tuple[int, int]:
    """Manifest steps 3 and 4: "format" and "format_version", whose major version must be ours."""
    if value.get("format") != "shardfmt":
        raise check.fail(f'"format" is {_show(value.get("format"))}, expected "shardfmt"')
    version = check.need(value, "format_version", str, "manifest")
    parts = _VERSION_RE.fullmatch(version)
    if parts is None:
        raise check.fail(f'"format_version" {_show(version)} is not "MAJOR.MINOR" in decimal digits')
    major, minor = parts.groups()
    if int(major) != FORMAT_VERSION[0]:
        raise UnsupportedVersionError(
            f"format version {version} needs a reader for major version {major}; this reader knows "
            f"{FORMAT_VERSION[0]}.x",
            path=check.path,
        )
    return int(major), int(minor)


def _parse_schema(value: dict[str, Any], minor: int, shard_format: str, check: _Check) -> Schema:
    """The schema, valid for the manifest's minor version (and the tar schema for tar shards)."""
    try:
        schema = Schema.from_json(check.need(value, "schema", dict, "manifest"))
        schema.check_version(minor)
    except UnsupportedVersionError as err:
        raise UnsupportedVersionError(f"schema: {err.message}", path=check.path) from err
    except SchemaError as err:
        raise check.fail(f"schema: {err.message}") from err
    problem = tar_schema_problem(schema) if shard_format == "tar" else None
    if problem is not None:
        fields = ", ".join(f"{f.name} ({f.spec})" for f in schema.fields)
        raise check.fail(f"schema: {problem}, not {fields}")
    return schema


def _parse_classes(value: dict[str, Any], check: _Check) -> list[str] | None:
    classes = value.get("classes")
    if classes is not None:
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise check.fail('"classes" must be null or a list of strings')
        if len(classes) > MAX_CLASSES:
            raise check.fail(f"{len(classes)} classes exceed the limit of {MAX_CLASSES}")
    return classes


def _parse_shard(raw: Any, where: str, shard_format: str, seen: dict[str, str], check: _Check) -> ShardEntry:
    """One entry of "shards"; its path (and a tar's index path) joins `seen`."""
    if not isinstance(raw, dict):
        raise check.fail(f"{where} is not an object")
    shard_path = _claim_path(check.need(raw, "path", str, where), where, seen, check.fail)
    num_records = check.need(raw, "num_records", int, where)
    if not 0 <= num_records <= MAX_RECORDS_PER_SHARD:
        raise check.fail(f"{where}: num_records {num_records} is outside [0, {MAX_RECORDS_PER_SHARD}]")
    size, digest = _size_and_checksum(raw, where, check)
    index = None
    if shard_format == "tar":
        index = _parse_index(check.need(raw, "index", dict, where), f"{where}.index", seen, check)
    elif "index" in raw:
        raise check.fail(f'{where}: "index" is only for tar shards, and shard_format is {_show(shard_format)}')
    return ShardEntry(shard_path, num_records, size, digest, index)


def _object_or_empty(value: dict[str, Any], key: str) -> dict[str, Any]:
    """An optional free-form object of the manifest (already type-checked), or {} where absent."""
    item = value.get(key)
    return item if isinstance(item, dict) else {}


def _check_optional(value: dict[str, Any], fail: Callable[[str], ManifestError]) -> None:
    """Manifest step 7: the optional keys "rejects", "converter", "stats" and "strict_jpeg",
    where present, have the types spec/manifest.md gives (the objects' other members are
    free-form)."""

    def count(item: Any) -> bool:
        return isinstance(item, int) and not isinstance(item, bool) and item >= 0

    rejects = value.get("rejects", {})
    if not isinstance(rejects, dict):
        raise fail('"rejects" must be an object')
    if "count" in rejects and not count(rejects["count"]):
        raise fail('"rejects.count" must be an integer of at least 0')
    if "by_reason" in rejects and not (isinstance(rejects["by_reason"], dict) and all(map(count, rejects["by_reason"].values()))):
        raise fail('"rejects.by_reason" must be an object of integers of at least 0')
    if "report" in rejects and not (rejects["report"] is None or isinstance(rejects["report"], str)):
        raise fail('"rejects.report" must be a string or null')
    converter = value.get("converter", {})
    if not isinstance(converter, dict):
        raise fail('"converter" must be an object')
    if "name" in converter and not isinstance(converter["name"], str):
        raise fail('"converter.name" must be a string')
    if "options" in converter and not isinstance(converter["options"], dict):
        raise fail('"converter.options" must be an object')
    if not isinstance(value.get("stats", {}), dict):
        raise fail('"stats" must be an object')
    if not isinstance(value.get("strict_jpeg", False), bool):
        raise fail(f'"strict_jpeg" must be true or false, got {_show(value["strict_jpeg"])}')


def _path_identity(path: str) -> str:
    """Return the form in which two manifest paths are the same file: Unicode canonical caseless
    matching, ``NFD(casefold(NFD(path)))``, so that paths naming one file on a case-insensitive or
    normalising file system (macOS, Windows) count as one."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", path).casefold())


def _claim_path(path: str, where: str, seen: dict[str, str], fail: Callable[[str], ManifestError]) -> str:
    """Check that a listed path is safe and not listed before (up to case and Unicode
    normalisation), and remember it."""
    problem = _unsafe_path(path)
    if problem:
        raise fail(f"{where}: path {_show(path)} {problem}")
    identity = _path_identity(path)
    if identity in seen:
        earlier = seen[identity]
        same = "is listed twice"
        if earlier != path:
            same = f"names the same file as {_show(earlier)} (paths are compared ignoring case and Unicode normalisation)"
        raise fail(f"{where}: path {_show(path)} {same}")
    seen[identity] = path
    return path


def _parse_index(raw: dict[str, Any], where: str, seen: dict[str, str], check: _Check) -> IndexEntry:
    """Parse a tar shard's "index" object; its path joins `seen`, shared with the shard paths."""
    index_path = _claim_path(check.need(raw, "path", str, where), where, seen, check.fail)
    return IndexEntry(index_path, *_size_and_checksum(raw, where, check))


def _size_and_checksum(raw: dict[str, Any], where: str, check: _Check) -> tuple[int, int]:
    """The "size" (in (0, MAX_SHARD_SIZE]) and "checksum" of a shard or index entry."""
    size = check.need(raw, "size", int, where)
    if not 0 < size <= MAX_SHARD_SIZE:
        raise check.fail(f"{where}: size {size} is outside (0, {MAX_SHARD_SIZE}]")
    try:
        digest = parse_checksum(check.need(raw, "checksum", str, where))
    except ValueError as err:
        raise check.fail(f"{where}: {err}") from err
    return size, digest


def _show(value: Any, limit: int = 60) -> str:
    """Return repr(value), shortened so that a hostile manifest cannot flood an error message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _unsafe_path(text: str) -> str | None:
    """Return why a shard path could escape the dataset root, or None if it is safe."""
    if not text or "\\" in text or "\x00" in text:
        return "is empty or holds a backslash or NUL"
    parts = text.split("/")
    if text.startswith("/") or ":" in parts[0]:
        return "is absolute; shard paths are relative to the dataset root"
    if any(part in ("..", ".", "") for part in parts):
        return "has an empty, '.' or '..' component"
    return None
