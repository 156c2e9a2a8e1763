"""Checking a whole dataset: manifest, every shard's structure, every checksum.

A full check opens every shard (which checks each structural rule, see `ShardReader`), compares
record counts and schema with the manifest, checks that labels name a class, re-hashes every
record's payload and then each whole file against the manifest. A tar shard is checked through
its index (see `tar.reader.TarShardReader`): every image member is re-hashed, then the whole tar
and the whole index against the manifest. A quick check stops before the
payload: it reads the manifest, the headers, footers and record tables only.

A dataset given by URL is checked the same way through its store: a full check fetches each shard
whole once, a quick one reads only its header and table (two range reads).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tqdm import tqdm

from .._checksum import Hasher, format_checksum
from .._errors import ChecksumError, ManifestError, ShardfmtError
from .._storage import RemoteOptions
from ..format._manifest import Manifest, ShardEntry
from ..tar._reader import TarShardReader
from .locate import DatasetLocation, locate_dataset
from .reader import check_labels, open_located_shard

__all__ = ["PROGRESS_MIN_BYTES", "VerifyReport", "verify_dataset"]

PROGRESS_MIN_BYTES: Final = 1 << 30
"""A dataset of fewer bytes is checked in moments: `verify_dataset` shows no progress bar for it."""
_PIECE: Final = 8 << 20


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of `verify_dataset`.

    Attributes:
        path: the dataset root (for a URL: the URL, without credentials).
        quick: True if payloads were not hashed.
        num_shards, num_records: what the manifest lists.
        bytes_hashed: payload and file bytes re-hashed (0 for a quick check).
        problems: the first problem of each bad shard (and of the rejects report), in manifest
            order; each names its file and, where it can, the byte offset and record.
    """

    path: Path | str
    quick: bool
    num_shards: int
    num_records: int
    bytes_hashed: int
    problems: tuple[ShardfmtError, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_dataset(
    path: str | os.PathLike[str], *, quick: bool = False, remote: RemoteOptions | None = None, progress: bool = False
) -> VerifyReport:
    """Check a dataset against its manifest and its checksums.

    Args:
        path: the dataset root or its manifest.json, a local path or a URL (``s3://...``).
        quick: check the manifest and the record tables only, without hashing payloads.
        remote: credentials and retries for a URL.
        progress: show a progress bar (bytes checked) on stderr, for a dataset of at least
            `PROGRESS_MIN_BYTES`.

    Returns:
        A `VerifyReport`; `ok` is False if any shard has a problem.

    Raises:
        DatasetNotFoundError: there is no manifest.
        ManifestError, UnsupportedVersionError: the manifest itself is invalid, so nothing can
            be checked against it.
        RemoteError: the store failed (a shard the store cannot serve is a problem of the report).
    """
    location = locate_dataset(path, remote=remote)
    manifest = location.load_manifest()
    problems: list[ShardfmtError] = []
    hashed = 0
    sizes = [entry.size + (entry.index.size if entry.index is not None else 0) for entry in manifest.shards]
    with tqdm(total=sum(sizes), unit="B", unit_scale=True, desc="verify", disable=not progress or sum(sizes) < PROGRESS_MIN_BYTES) as bar:
        for entry, size in zip(manifest.shards, sizes, strict=True):
            try:
                hashed += _verify_shard(location, entry, manifest, quick=quick)
            except ShardfmtError as err:
                problems.append(err)
            bar.update(size)
    report_problem = _check_rejects_report(location, manifest)
    if report_problem is not None:
        problems.append(report_problem)
    return VerifyReport(location.root, quick, len(manifest.shards), manifest.num_records, hashed, tuple(problems))


def _verify_shard(location: DatasetLocation, entry: ShardEntry, manifest: Manifest, *, quick: bool) -> int:
    """Check one shard (for a tar shard: the tar and its index); return the bytes hashed. Raise
    the first problem found."""
    with open_located_shard(location, entry, manifest.schema, verify=False, whole=not quick) as reader:
        if len(reader) != entry.num_records:
            raise ManifestError(f"holds {len(reader)} records but the manifest says {entry.num_records}", path=reader.path)
        if reader.schema != manifest.schema:
            raise ManifestError("its schema differs from the manifest's", path=reader.path)
        if manifest.classes is not None:
            check_labels(reader, manifest.schema, len(manifest.classes))
        reader.check_all()
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
    hasher = Hasher()
    for start in range(0, source.size, _PIECE):
        piece = source.read(start, min(source.size, start + _PIECE))
        hasher.update(piece)
        piece.release()
    digest = hasher.intdigest()
    if digest != expected:
        raise ChecksumError(
            f"whole-file checksum {format_checksum(digest)} differs from the manifest's "
            f"{format_checksum(expected)}: the file was changed or replaced",
            path=source.path,
        )
    return int(source.size)


def _check_rejects_report(location: DatasetLocation, manifest: Manifest) -> ShardfmtError | None:
    name = manifest.rejects.get("report")
    count = manifest.rejects.get("count")
    if not isinstance(name, str) or not isinstance(count, int):
        return None
    if name in ("", ".", "..") or "/" in name or "\\" in name:
        return ManifestError(f"the rejects report {name!r} is not a file name in the dataset folder", path=location.manifest_path)
    path = location.store.describe(name)
    if not location.is_remote:
        try:
            # not blocking on a FIFO in its place (a regular file reads as without the flag)
            fd = os.open(Path(location.root) / name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            with open(fd, "rb") as file:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return ManifestError("the rejects report is not a regular file", path=path)
                lines = sum(1 for _ in file)
        except (OSError, ValueError) as err:  # ValueError: a name with NUL or a lone surrogate
            return ManifestError(f"the rejects report cannot be read: {err.strerror if isinstance(err, OSError) else err}", path=path)
    else:
        try:
            lines = location.store.get(name).count(b"\n")
        except (OSError, ShardfmtError) as err:
            return ManifestError(f"the rejects report cannot be read: {getattr(err, 'message', err)}", path=path)
    if lines != count:
        return ManifestError(f"the rejects report has {lines} lines but the manifest counts {count} rejects", path=path)
    return None
