"""Checking a whole dataset: manifest, every shard's structure, every checksum.

A full check opens every shard (which checks each structural rule, see `ShardReader`), compares
record counts and schema with the manifest, checks that labels name a class, re-hashes every
record's payload and then each whole file against the manifest. A tar shard is checked through
its index (see `tar.reader.TarShardReader`): every image member is re-hashed, then the whole tar
and the whole index against the manifest. A quick check stops before the
payload: it reads the manifest, the headers, footers and record tables only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checksum import checksum, format_checksum
from ..errors import ChecksumError, ManifestError, ShardfmtError
from ..format.manifest import Manifest, ShardEntry
from ..tar.reader import TarShardReader
from .locate import classify_location
from .reader import check_labels, open_shard

__all__ = ["VerifyReport", "verify_dataset"]


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of `verify_dataset`.

    Attributes:
        path: the dataset root.
        quick: True if payloads were not hashed.
        num_shards, num_records: what the manifest lists.
        bytes_hashed: payload and file bytes re-hashed (0 for a quick check).
        problems: the first problem of each bad shard (and of the rejects report), in manifest
            order; each names its file and, where it can, the byte offset and record.
    """

    path: Path
    quick: bool
    num_shards: int
    num_records: int
    bytes_hashed: int
    problems: tuple[ShardfmtError, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_dataset(path: str | os.PathLike[str], *, quick: bool = False) -> VerifyReport:
    """Check a dataset against its manifest and its checksums.

    Args:
        path: the dataset root or its manifest.json.
        quick: check the manifest and the record tables only, without hashing payloads.

    Returns:
        A `VerifyReport`; `ok` is False if any shard has a problem.

    Raises:
        DatasetNotFoundError: there is no manifest.
        ManifestError, UnsupportedVersionError: the manifest itself is invalid, so nothing can
            be checked against it.
    """
    manifest_path = classify_location(path).manifest_path()
    manifest = Manifest.load(manifest_path)
    root = manifest_path.parent
    problems: list[ShardfmtError] = []
    hashed = 0
    for entry in manifest.shards:
        try:
            hashed += _verify_shard(root, entry, manifest, quick=quick)
        except ShardfmtError as err:
            problems.append(err)
    report_problem = _check_rejects_report(root, manifest)
    if report_problem is not None:
        problems.append(report_problem)
    return VerifyReport(root, quick, len(manifest.shards), manifest.num_records, hashed, tuple(problems))


def _verify_shard(root: Path, entry: ShardEntry, manifest: Manifest, *, quick: bool) -> int:
    """Check one shard (for a tar shard: the tar and its index); return the bytes hashed. Raise
    the first problem found."""
    with open_shard(root, entry, verify=False) as reader:
        if len(reader) != entry.num_records:
            raise ManifestError(f"holds {len(reader)} records but the manifest says {entry.num_records}", path=reader.path)
        if reader.schema != manifest.schema:
            raise ManifestError("its schema differs from the manifest's", path=reader.path)
        if manifest.classes is not None:
            check_labels(reader, manifest.schema, len(manifest.classes))
        if quick:
            return 0
        for index in range(len(reader)):
            reader.verify_record(index)
        hashed = int(reader.table["size"].sum()) + _check_file(reader.source, entry.checksum)
        if entry.index is None or not isinstance(reader, TarShardReader):
            return hashed
        for index in range(len(reader.index)):
            reader.index.verify_record(index)
        return hashed + _check_file(reader.index.source, entry.index.checksum)


def _check_file(source: Any, expected: int) -> int:
    """Compare the XXH3-64 of a whole file with the manifest's; return its size."""
    whole = source.read(0, source.size)
    digest = checksum(whole)
    whole.release()
    if digest != expected:
        raise ChecksumError(
            f"whole-file checksum {format_checksum(digest)} differs from the manifest's "
            f"{format_checksum(expected)}: the file was changed or replaced",
            path=source.path,
        )
    return int(source.size)


def _check_rejects_report(root: Path, manifest: Manifest) -> ShardfmtError | None:
    name = manifest.rejects.get("report")
    count = manifest.rejects.get("count")
    if not isinstance(name, str) or not isinstance(count, int):
        return None
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        return ManifestError(f"the rejects report {name!r} is not a file name in the dataset folder", path=root / "manifest.json")
    path = root / name
    try:
        with open(path, "rb") as file:
            lines = sum(1 for _ in file)
    except (OSError, ValueError) as err:  # ValueError: a name with NUL or a lone surrogate
        return ManifestError(f"the rejects report cannot be read: {err.strerror if isinstance(err, OSError) else err}", path=path)
    if lines != count:
        return ManifestError(f"the rejects report has {lines} lines but the manifest counts {count} rejects", path=path)
    return None
