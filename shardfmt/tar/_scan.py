"""Streaming scan of a tar's members and samples, compressed or not (spec/tar.md, "Reading")."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import FormatError, LimitError, ShardfmtError
from .._storage import ByteSource, open_source
from ..format._layout import (
    MAX_RECORDS_PER_SHARD,
    MAX_SHARD_SIZE,
)
from ._keys import BLOCK_SIZE, COMPRESSED_ADVICE, display_key, is_meta, split_key


@dataclass(frozen=True)
class TarMember:
    """A regular member of a tar: its name, lower-cased extension and where its data lies."""

    name: str
    extension: str
    offset: int
    data_offset: int
    size: int


@dataclass
class TarSample:
    """A sample of a tar: its key, its members by lower-cased extension, and the first member
    whose extension repeated one already seen (such a sample cannot be read unambiguously)."""

    key: str
    members: dict[str, TarMember] = field(default_factory=dict)
    duplicate: TarMember | None = None


@dataclass
class MemberScan:
    """The samples of a tar, grouped by key in order of first appearance, from its headers only."""

    source: ByteSource
    samples: list[TarSample]
    skipped: int
    end: int


class _Reader:
    """A file object over a memoryview for tarfile: a read never returns, or allocates, more
    than the file holds, whatever size a corrupt header asks for."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._position = 0

    def read(self, size: int = -1) -> bytes:
        stop = len(self._view) if size < 0 else min(len(self._view), self._position + size)
        data = bytes(self._view[self._position : stop])
        self._position = max(self._position, stop)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._position, len(self._view))[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def write(self, data: bytes) -> int:
        """Refused: tarfile's file objects may write, this one only reads."""
        raise io.UnsupportedOperation("write")

    def close(self) -> None:
        """Nothing to release: the view belongs to the caller."""


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def scan_members(source: ByteSource) -> MemberScan:
    """Parse every header of the tar in `source` and group its members into samples.

    Raises:
        FormatError: not an uncompressed tar, a malformed header, a member of negative size or
            past the end of the file or whose size disagrees with where the next header is, or
            non-zero bytes where the end-of-archive blocks should be.
        LimitError: the tar is over MAX_SHARD_SIZE or has over MAX_RECORDS_PER_SHARD samples.
    """
    path, size = source.path, source.size
    if size > MAX_SHARD_SIZE:
        raise LimitError(f"file is {size} bytes, over the shard limit of {MAX_SHARD_SIZE}", path=path, offset=0)
    if size == 0:
        raise FormatError("file is empty: not a tar (an empty tar is 1024 zero bytes)", path=path, offset=0)
    view = source.read(0, size)
    for magic, kind in _COMPRESSED.items():
        if bytes(view[: len(magic)]) == magic:
            raise FormatError(f"is {kind}-compressed: {COMPRESSED_ADVICE}", path=path, offset=0)
    samples: dict[str, TarSample] = {}
    skipped = 0
    position = 0
    try:
        archive = tarfile.open(fileobj=_Reader(view), mode="r:", encoding="utf-8", errors="surrogateescape")
        while True:
            position = archive.offset
            info = archive.next()
            if info is None:
                break
            archive.members.clear()  # type: ignore[attr-defined]  # (not in typeshed) keep memory flat over millions of members
            if info.issparse():
                raise FormatError(
                    f"member {display_key(info.name)!r} is a GNU sparse file, which a tar shard cannot hold", path=path, offset=info.offset
                )
            if not info.isreg():
                continue
            _check_member(info, next_header=archive.offset, size=size, path=path)
            skipped += not _add_member(samples, info, path=path)
        end = archive.offset
    except ShardfmtError:
        raise
    except Exception as err:  # tarfile raises ReadError, ValueError, UnicodeError, ... on bad headers
        raise FormatError(f"malformed tar header: {type(err).__name__}: {err}", path=path, offset=position) from err
    _check_end(view, end, path=path)
    return MemberScan(source, list(samples.values()), skipped, end)


def _check_member(info: tarfile.TarInfo, *, next_header: int, size: int, path: str) -> None:
    """A regular member's size is not negative, places the next header, and stays in the file."""
    if info.size < 0:  # tarfile takes a PAX "GNU.sparse.realsize" record for the size
        raise FormatError(f"member {display_key(info.name)!r} has a negative size ({info.size})", path=path, offset=info.offset)
    if next_header != info.offset_data + -(-info.size // BLOCK_SIZE) * BLOCK_SIZE:
        # tarfile takes the size from a PAX "GNU.sparse.realsize" record, or from a global
        # "size" record, but finds the next header by the size in the member's own header
        raise FormatError(
            f"member {display_key(info.name)!r} has a size ({info.size}) that a PAX record sets, "
            f"but its data ends where the next header is found ({next_header})",
            path=path,
            offset=info.offset,
        )
    if info.offset_data + info.size > size:
        raise FormatError(
            f"member {display_key(info.name)!r} data [{info.offset_data}, {info.offset_data + info.size}) "
            f"runs past the end of the file ({size}): truncated tar",
            path=path,
            offset=info.offset,
        )


def _add_member(samples: dict[str, TarSample], info: tarfile.TarInfo, *, path: str) -> bool:
    """Add a regular member to the sample of its key; False if its name gives no key."""
    parts = None if is_meta(info.name) else split_key(info.name)
    if parts is None:
        return False
    key, extension = parts[0], parts[1].lower()
    sample = samples.get(key)
    if sample is None:
        if len(samples) >= MAX_RECORDS_PER_SHARD:
            raise LimitError(f"more than {MAX_RECORDS_PER_SHARD} samples in one tar", path=path, offset=info.offset)
        sample = samples[key] = TarSample(key)
    member = TarMember(info.name, extension, info.offset, info.offset_data, info.size)
    if extension in sample.members:
        sample.duplicate = sample.duplicate or member
    else:
        sample.members[extension] = member
    return True


def _check_end(view: memoryview, end: int, *, path: str) -> None:
    """Only zero bytes follow the last member: the end-of-archive blocks and their padding."""
    tail = np.frombuffer(view[end:], np.uint8)
    if tail.any():
        first = end + int(np.argmax(tail != 0))
        if first < end + BLOCK_SIZE:
            raise FormatError("not a valid tar header, and not the zero blocks that end an archive", path=path, offset=end)
        raise FormatError(
            "non-zero bytes after the end-of-archive zero block (tar and webdataset ignore them; is this a concatenation of tars?)",
            path=path,
            offset=first,
        )


def scan_samples(path: str | os.PathLike[str]) -> tuple[TarSample, ...]:
    """Return the samples of a tar from its headers alone (no member data is read): members
    grouped by key as `iter_tar_samples` groups them, with their offsets and sizes.

    Raises:
        ShardNotFoundError, FormatError, LimitError: as `index_tar`.
    """
    source = open_source(os.fspath(path))
    try:
        return tuple(scan_members(source).samples)
    finally:
        source.close()


def iter_tar_samples(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the samples of a tar without extracting it: its headers are parsed first, then each
    sample is yielded with zero-copy views of its members' bytes.

    Members are grouped by key (`split_key`) over the whole tar, so members of one sample need not
    be adjacent; samples come in the order of their first member. Extensions are lower-cased.
    Non-regular members, names without a key and webdataset metadata (``__x__/...``) are skipped.

    Yields:
        ``{"__key__": key, "__url__": path, extension: memoryview, ...}`` as webdataset's
        samples, except that the values are views of the memory-mapped tar: bytes() them to keep
        them past the iteration.

    Raises:
        ShardNotFoundError: the file does not exist.
        FormatError: the tar is malformed (see `index_tar`), or a sample has two members with
            the same extension (webdataset raises ValueError for those).
    """
    source = open_source(os.fspath(path))
    try:
        scan = scan_members(source)
        for sample in scan.samples:
            if sample.duplicate is not None:
                raise FormatError(
                    f"sample {display_key(sample.key)!r} has two members with extension {sample.duplicate.extension!r}",
                    path=source.path,
                    offset=sample.duplicate.offset,
                )
            result: dict[str, Any] = {"__key__": sample.key, "__url__": source.path}
            for extension, member in sample.members.items():
                result[extension] = source.read(member.data_offset, member.data_offset + member.size)
            yield result
    finally:
        source.close()
