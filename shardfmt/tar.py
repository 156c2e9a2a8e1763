"""WebDataset-compatible tar shards: the key/extension rule, a deterministic writer, a streaming
member scanner and the member index that lets a tar be read like a binary shard.

A tar shard holds samples as members named ``KEY.EXTENSION`` (``split_key`` is the one rule that
splits a name, exactly as webdataset's ``base_plus_ext`` does); shardfmt writes ``KEY.cls`` (the
label in ASCII decimal), ``KEY.jpg`` and optionally ``KEY.json``. Next to each tar lies its member
index ``NAME.tar.idx``: a binary shard (spec/format.md) with one record per sample that says where
the image member's bytes are, its size, checksum and label. `tarreader.TarShardReader` turns that
index into the same record table a `ShardReader` has, over a memory map of the tar, so the loader
reads a tar exactly as it reads a binary shard. spec/tar.md describes the same bytes in prose.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from .checksum import Hasher, checksum
from .errors import FormatError, LimitError, SchemaError, ShardfmtError
from .fileio import AtomicFile
from .jpeg import is_jpeg, read_jpeg_info
from .layout import JPEG_CHANNELS, MAX_CLASSES, MAX_FIELD_SIZE, MAX_RECORDS_PER_SHARD, MAX_SHARD_SIZE, align_up
from .schema import Schema
from .storage import ByteSource, open_source
from .writer import ShardInfo, ShardWriter, jpeg_columns

__all__ = [
    "BLOCK_SIZE",
    "IMAGE_EXTENSIONS",
    "INDEX_SCHEMA",
    "INDEX_SUFFIX",
    "LABEL_EXTENSION",
    "REJECT_REASONS",
    "TarIndexInfo",
    "TarReject",
    "TarShardInfo",
    "TarMember",
    "TarSample",
    "TarShardWriter",
    "display_key",
    "index_path_for",
    "index_tar",
    "iter_tar_samples",
    "parse_label",
    "scan_samples",
    "split_key",
    "tar_key",
]

BLOCK_SIZE: Final = 512
"""Tar headers and member data start on multiples of this."""
RECORD_SIZE: Final = 20 * BLOCK_SIZE
"""The writer pads a finished tar to a multiple of this, as tar and Python's tarfile do."""
INDEX_SUFFIX: Final = ".idx"
IMAGE_EXTENSIONS: Final = ("jpg", "jpeg")
"""Extensions of the image member, in order of preference, compared after lower-casing."""
LABEL_EXTENSION: Final = "cls"
META_EXTENSION: Final = "json"
MAX_LABEL_SIZE: Final = 64
"""A ``.cls`` member longer than this is not a label (an int64 needs at most 20 characters)."""
REJECT_REASONS: Final = (
    "duplicate-member",
    "no-image",
    "empty",
    "too-large",
    "not-a-jpeg",
    "corrupt",
    "unsupported-jpeg",
    "no-label",
    "bad-label",
)
"""Why `index_tar` leaves a sample out, in the order the checks run (spec/tar.md, section 6)."""
_MAX_USTAR_NAME: Final = 100
_PAX_NAME: Final = b"././@PaxHeader"
_META_NAME = re.compile(r"__[^/]*__($|/)")
"""Member names webdataset skips as metadata (its ``tar_file_iterator`` ``skip_meta``)."""

INDEX_SCHEMA: Final = Schema.of(
    key="bytes",
    image_offset="int64",
    image_size="int64",
    image_height="int64",
    image_width="int64",
    image_channels="int64",
    image_checksum="int64",
    label="int64",
    members="json",
)
"""The schema of a member index: one record per sample, in the order samples first appear.

`key` holds the key's bytes as they are in the member names; `image_offset` and `image_size` the
span of the image member's data in the tar; `image_checksum` its XXH3-64 as a two's-complement
int64; `members` every member of the sample as ``{extension: [data offset, size]}``."""


def split_key(name: str) -> tuple[str, str] | None:
    """Split a member name into (key, extension) exactly as webdataset's ``base_plus_ext`` does.

    The extension is everything after the first dot of the base name (the part after the last
    "/"), further dots included; the key is everything before that dot, directories included:
    ``a/b.c.d.jpg`` -> ``("a/b", "c.d.jpg")``. Case is kept: webdataset lower-cases extensions
    only when it groups members into samples. A name has no key when its base name has no dot, or
    when the text just before that dot, back to the start or to an earlier "/" (one that is not
    the character right before the dot, and that no newline precedes), is empty or holds a dot:
    ``README``, ``.x.jpg`` and ``a.b/.x.jpg`` have no key, while ``a/.x.jpg`` gives
    ``("a/", "x.jpg")`` because webdataset's pattern lets a key end in "/".

    Returns:
        (key, extension), or None if the name is not a sample member (webdataset skips it).
    """
    dot = name.find(".", name.rfind("/") + 1)
    if dot <= 0:
        return None
    newline = name.find("\n")
    stop = dot - 1 if newline < 0 else min(dot - 1, newline)
    start = name.rfind("/", 0, stop) + 1
    if "." in name[start:dot]:
        return None
    return name[:dot], name[dot + 1 :]


def display_key(key: str) -> str:
    """Return `key` printable: bytes that were not UTF-8 in the tar appear as ``\\xNN``."""
    return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def index_path_for(tar_path: str | os.PathLike[str]) -> Path:
    """Return where the member index of `tar_path` lies by default: ``NAME.tar.idx`` beside it."""
    tar_path = Path(tar_path)
    return tar_path.with_name(tar_path.name + INDEX_SUFFIX)


def _is_meta(name: str) -> bool:
    return _META_NAME.match(name) is not None


def _encode_key(key: Any) -> bytes:
    """Check that a writer key survives the round trip through a member name; return its bytes."""
    if not isinstance(key, str):
        raise SchemaError(f"a key must be a str, got {type(key).__name__}")
    try:
        raw = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:
        raise SchemaError(f"key {key!r} cannot be encoded: {err}") from err
    parts = key.split("/")
    if not key or "\x00" in key or any(part in ("", ".", "..") for part in parts):
        raise SchemaError(f"key {display_key(key)!r} must be a relative path without empty, '.' or '..' parts or NUL")
    if split_key(key + ".jpg") != (key, "jpg") or _is_meta(key + ".jpg"):
        raise SchemaError(
            f"key {display_key(key)!r} would not read back: its last part must not start with or contain a "
            "'.', and a first part like '__x__' marks webdataset metadata"
        )
    return raw


def tar_key(name: str) -> str:
    """Return `name` as a key that reads back from a tar: each dot of its last part becomes "_"
    (``n01/img.001`` -> ``n01/img_001``), since there a dot would start the extension.

    Raises:
        SchemaError: the name cannot be a key even so (an empty, "." or ".." part, NUL, or a
            first part that marks webdataset metadata).
    """
    head, slash, last = name.rpartition("/")
    key = head + slash + last.replace(".", "_")
    _encode_key(key)
    return key


def _ustar_header(name: bytes, size: int, typeflag: bytes) -> bytes:
    """One 512-byte USTAR header with shardfmt's fixed fields (spec/tar.md, "Writing")."""
    header = bytearray(BLOCK_SIZE)
    header[0 : len(name)] = name
    header[100:108] = b"0000644\x00"
    header[108:116] = b"0000000\x00"
    header[116:124] = b"0000000\x00"
    header[124:136] = b"%011o\x00" % size
    header[136:148] = b"00000000000\x00"
    header[148:156] = b" " * 8
    header[156:157] = typeflag
    header[257:263] = b"ustar\x00"
    header[263:265] = b"00"
    header[329:337] = b"0000000\x00"
    header[337:345] = b"0000000\x00"
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)


def _pax_record(keyword: bytes, value: bytes) -> bytes:
    """One "LENGTH keyword=value\\n" record; LENGTH counts the whole record, its own digits too."""
    body = b" " + keyword + b"=" + value + b"\n"
    length = len(body) + 1
    while len(body) + len(str(length)) != length:
        length = len(body) + len(str(length))
    return str(length).encode("ascii") + body


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _padding(size: int) -> bytes:
    return bytes(align_up(size, BLOCK_SIZE) - size)


def _member_header(name: bytes, size: int) -> bytes:
    """Return the header blocks of a regular member: USTAR when the name is ASCII and fits in
    100 bytes, else a PAX extended header with its "path" (and "hdrcharset=BINARY" for a name
    that is not UTF-8) followed by a USTAR header holding the name made ASCII and cut to 100."""
    if len(name) <= _MAX_USTAR_NAME and name.isascii():
        return _ustar_header(name, size, b"0")
    records = b""
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        records += _pax_record(b"hdrcharset", b"BINARY")
    records += _pax_record(b"path", name)
    fallback = bytes(c if c < 0x80 else 0x3F for c in name[:_MAX_USTAR_NAME])
    return _ustar_header(_PAX_NAME, len(records), b"x") + records + _padding(len(records)) + _ustar_header(fallback, size, b"0")


@dataclass(frozen=True)
class TarShardInfo:
    """A finished tar shard: the tar (its `checksum` is of the whole file) and its member index."""

    tar: ShardInfo
    index: ShardInfo


class TarShardWriter:
    """Write samples to one WebDataset tar and its member index, both deterministic and atomic.

    Args:
        path: the tar's final path; bytes go to a hidden temporary name until `close()`.
        index: the member index's path; default ``NAME.tar.idx`` beside the tar.

    Each sample becomes ``KEY.cls``, ``KEY.jpg`` and, with `meta`, ``KEY.json``, in that (sorted)
    order, with mtime 0, uid and gid 0, empty user and group names and mode 0644. Use as a context
    manager: leaving the block normally commits both files, an exception removes them.
    """

    def __init__(self, path: str | os.PathLike[str], *, index: str | os.PathLike[str] | None = None) -> None:
        self._file = AtomicFile(path)
        try:
            self._index = ShardWriter(index_path_for(path) if index is None else index, schema=INDEX_SCHEMA)
        except BaseException:
            self._file.abort()
            raise
        self._hasher = Hasher()
        self._keys: set[str] = set()
        self._closed = False

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def index_path(self) -> Path:
        return self._index.path

    @property
    def num_records(self) -> int:
        return self._index.num_records

    @property
    def size(self) -> int:
        """Bytes the tar would have if closed now (members, end-of-archive blocks, padding)."""
        return _round_up(self._file.tell() + 2 * BLOCK_SIZE, RECORD_SIZE)

    def _emit(self, data: bytes | memoryview) -> None:
        self._file.write(data)
        self._hasher.update(data)

    def write(self, key: str, *, image: bytes | bytearray | memoryview, label: int, meta: Any = None) -> int:
        """Append one sample and return its record index.

        Args:
            key: the sample's key: a relative '/'-separated path whose last part has no dot.
            image: the JPEG bytes (8-bit, 1 or 3 channels, not lossless), stored unchanged.
            label: the class, 0 <= label < MAX_CLASSES, stored as ASCII decimal in ``KEY.cls``.
            meta: if not None, a JSON-serialisable value stored canonically in ``KEY.json``.

        Raises:
            SchemaError: a bad or repeated key, an image that is not a storable JPEG, a label out
                of range, `meta` that is not JSON, or the shard would exceed MAX_SHARD_SIZE or
                MAX_RECORDS_PER_SHARD.
        """
        if self._closed:
            raise ValueError("write() on a closed TarShardWriter")
        name = _encode_key(key)
        index = self.num_records
        where = f"record {index} (key {display_key(key)!r})"
        if key in self._keys:
            raise SchemaError(f"{where}: the key was written before; its members would merge into one sample")
        if index >= MAX_RECORDS_PER_SHARD:
            raise SchemaError(f"a shard holds at most {MAX_RECORDS_PER_SHARD} records")
        if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)) or not 0 <= label < MAX_CLASSES:
            raise SchemaError(f"{where}: label must be an int in [0, {MAX_CLASSES}), got {label!r}")
        if not isinstance(image, (bytes, bytearray, memoryview)):
            raise SchemaError(f"{where}: image needs bytes, got {type(image).__name__}")
        data = memoryview(image).cast("B")
        if len(data) > MAX_FIELD_SIZE:
            raise SchemaError(f"{where}: image is {len(data)} bytes, over the limit of {MAX_FIELD_SIZE}")
        height, width, channels, _ = jpeg_columns(data, f"{where}: image")
        members: dict[str, bytes | memoryview] = {LABEL_EXTENSION: str(int(label)).encode("ascii"), "jpg": data}
        if meta is not None:
            try:
                members[META_EXTENSION] = json.dumps(
                    meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
                ).encode()
            except (TypeError, ValueError) as err:
                raise SchemaError(f"{where}: meta is not JSON-serialisable: {err}") from err
        pieces: list[tuple[str, bytes, bytes | memoryview]] = []
        grown = self._file.tell()
        for extension in sorted(members):
            header = _member_header(name + b"." + extension.encode("ascii"), len(members[extension]))
            pieces.append((extension, header, members[extension]))
            grown += len(header) + align_up(len(members[extension]), BLOCK_SIZE)
        if _round_up(grown + 2 * BLOCK_SIZE, RECORD_SIZE) > MAX_SHARD_SIZE:
            raise SchemaError(f"{where} would grow the tar past the limit of {MAX_SHARD_SIZE} bytes")
        spans: dict[str, list[int]] = {}
        for extension, header, payload in pieces:
            self._emit(header)
            spans[extension] = [self._file.tell(), len(payload)]
            self._emit(payload)
            self._emit(_padding(len(payload)))
        self._keys.add(key)
        digest = checksum(data)
        return self._index.write(
            {
                "key": name,
                "image_offset": spans["jpg"][0],
                "image_size": len(data),
                "image_height": height,
                "image_width": width,
                "image_channels": channels,
                "image_checksum": digest - (1 << 64) if digest >= 1 << 63 else digest,
                "label": int(label),
                "members": spans,
            }
        )

    def close(self) -> TarShardInfo:
        """End the tar (two zero blocks, padded to 10240 bytes), commit it, then its index."""
        if self._closed:
            raise ValueError("close() on a closed TarShardWriter")
        self._emit(bytes(self.size - self._file.tell()))
        size = self._file.tell()
        try:
            self._file.commit()
        except BaseException:
            self._index.abort()
            raise
        self._closed = True
        tar = ShardInfo(self.path, self.num_records, size, self._hasher.intdigest())
        return TarShardInfo(tar, self._index.close())

    def abort(self) -> None:
        """Discard the tar and the index: remove their temporary files."""
        if not self._closed:
            self._file.abort()
            self._index.abort()
            self._closed = True

    def __enter__(self) -> TarShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()


# -- scanning --------------------------------------------------------------------------------


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
class _Scan:
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


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _scan(source: ByteSource) -> _Scan:
    """Parse every header of the tar in `source` and group its members into samples.

    Raises:
        FormatError: not an uncompressed tar, a malformed header, a member past the end of the
            file, or non-zero bytes where the end-of-archive blocks should be.
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
            raise FormatError(f"a {kind}-compressed tar cannot be memory-mapped; decompress it first", path=path, offset=0)
    samples: dict[str, TarSample] = {}
    skipped = 0
    position = 0
    try:
        archive = tarfile.open(fileobj=_Reader(view), mode="r:", encoding="utf-8", errors="surrogateescape")  # type: ignore[call-overload]
        while True:
            position = archive.offset
            info = archive.next()
            if info is None:
                break
            archive.members.clear()  # keep memory flat over millions of members
            if info.issparse():
                raise FormatError(f"member {display_key(info.name)!r} is a GNU sparse file, which a tar shard cannot hold", path=path, offset=info.offset)
            if not info.isreg():
                continue
            if info.offset_data + info.size > size:
                raise FormatError(
                    f"member {display_key(info.name)!r} data [{info.offset_data}, {info.offset_data + info.size}) "
                    f"runs past the end of the file ({size}): truncated tar",
                    path=path,
                    offset=info.offset,
                )
            parts = None if _is_meta(info.name) else split_key(info.name)
            if parts is None:
                skipped += 1
                continue
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
        end = archive.offset
    except ShardfmtError:
        raise
    except Exception as err:  # tarfile raises ReadError, ValueError, UnicodeError, ... on bad headers
        raise FormatError(f"malformed tar header: {type(err).__name__}: {err}", path=path, offset=position) from err
    tail = np.frombuffer(view[end:], np.uint8)
    if tail.any():
        first = end + int(np.argmax(tail != 0))
        if first < end + BLOCK_SIZE:
            raise FormatError("not a valid tar header, and not the zero blocks that end an archive", path=path, offset=end)
        raise FormatError(
            "non-zero bytes after the end-of-archive zero block (tar and webdataset ignore them; "
            "is this a concatenation of tars?)",
            path=path,
            offset=first,
        )
    return _Scan(source, list(samples.values()), skipped, end)


def scan_samples(path: str | os.PathLike[str]) -> tuple[TarSample, ...]:
    """Return the samples of a tar from its headers alone (no member data is read): members
    grouped by key as `iter_tar_samples` groups them, with their offsets and sizes.

    Raises:
        ShardNotFoundError, FormatError, LimitError: as `index_tar`.
    """
    source = open_source(os.fspath(path))
    try:
        return tuple(_scan(source).samples)
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
        scan = _scan(source)
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


# -- indexing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TarReject:
    """A sample of a tar that the index leaves out, and why (reason codes in spec/tar.md)."""

    path: str
    key: str
    reason: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "key": display_key(self.key), "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class TarIndexInfo:
    """What `index_tar` found: the tar (size, whole-file XXH3-64, records), the index written,
    the samples left out, the largest label (-1 without records) and the members skipped."""

    tar: ShardInfo
    index: ShardInfo
    rejects: tuple[TarReject, ...]
    max_label: int
    skipped_members: int


def _image_problem(data: memoryview) -> tuple[str, str] | tuple[int, int, int]:
    """Return (height, width, channels) of a storable JPEG, or (reason, detail)."""
    if len(data) == 0:
        return ("empty", "the image member is empty")
    if len(data) > MAX_FIELD_SIZE:
        return ("too-large", f"the image member is {len(data)} bytes, over the limit of {MAX_FIELD_SIZE}")
    if not is_jpeg(data):
        return ("not-a-jpeg", "the image member does not start with a JPEG start-of-image marker")
    try:
        info = read_jpeg_info(data)
    except ValueError as err:
        return ("corrupt", str(err))
    if info.components not in JPEG_CHANNELS or info.lossless or info.precision != 8:
        return ("unsupported-jpeg", f"{info.components} components, {info.precision}-bit{', lossless' if info.lossless else ''}")
    return (info.height, info.width, info.components)


def parse_label(data: memoryview) -> int | tuple[str, str]:
    """Return the label a ``.cls`` member holds (Python int() of its bytes, as webdataset decodes
    it), or (reason, detail)."""
    if len(data) > MAX_LABEL_SIZE:
        return ("bad-label", f"the label member is {len(data)} bytes, over {MAX_LABEL_SIZE}")
    try:
        value = int(bytes(data))
    except ValueError:
        return ("bad-label", f"{bytes(data)!r} is not a decimal integer")
    if not 0 <= value < MAX_CLASSES:
        return ("bad-label", f"label {value} is outside [0, {MAX_CLASSES})")
    return value


def index_tar(
    path: str | os.PathLike[str],
    *,
    index: str | os.PathLike[str] | None = None,
    name: str | None = None,
    image_extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
    label_extension: str = LABEL_EXTENSION,
) -> TarIndexInfo:
    """Build the member index of a tar (ours or anyone's), reading every byte of it once.

    The headers are parsed first (USTAR, PAX and GNU long names, through Python's tarfile, on a
    memory map: nothing is extracted); then one sequential pass hashes the whole file and, on the
    way, each sample's image member (XXH3-64 and JPEG header) and label member.

    A sample is left out, as a `TarReject`, when it has two members with one extension
    ("duplicate-member"), no member with an extension of `image_extensions` ("no-image"), an
    image member that is empty, too large, not a JPEG, damaged in its headers or not storable
    ("empty", "too-large", "not-a-jpeg", "corrupt", "unsupported-jpeg"), or no valid label
    member ("no-label", "bad-label").

    Args:
        path: the tar file, uncompressed.
        index: where to write the index; default ``NAME.tar.idx`` beside the tar.
        name: how rejects name the tar (default: `path` as given).
        image_extensions: image member extensions, lower-case, in order of preference.
        label_extension: the label member's extension, lower-case.

    Returns:
        A `TarIndexInfo`.

    Raises:
        ShardNotFoundError: the tar does not exist.
        FormatError: the tar is malformed: not a tar, compressed, a bad header, a member past the
            end of the file, or non-zero bytes after the end-of-archive blocks.
        LimitError: the tar is over MAX_SHARD_SIZE or has over MAX_RECORDS_PER_SHARD samples.
    """
    source = open_source(os.fspath(path))
    try:
        scan = _scan(source)
        shown = source.path if name is None else name
        problems: dict[int, tuple[str, str]] = {}
        roles: list[tuple[TarMember, int, str]] = []
        for number, sample in enumerate(scan.samples):
            image_ext = next((ext for ext in image_extensions if ext in sample.members), None)
            if sample.duplicate is not None:
                problems[number] = ("duplicate-member", f"two members with extension {display_key(sample.duplicate.extension)!r}")
            elif len({display_key(ext) for ext in sample.members}) < len(sample.members):
                problems[number] = ("duplicate-member", "two extensions that read the same once bytes that are not UTF-8 are written as \\xNN")
            elif image_ext is None:
                problems[number] = ("no-image", f"no member with extension {' or '.join(image_extensions)}")
            else:
                roles.append((sample.members[image_ext], number, "image"))
                if label_extension in sample.members:
                    roles.append((sample.members[label_extension], number, "label"))
        roles.sort(key=lambda role: role[0].data_offset)
        images: dict[int, tuple[TarMember, tuple[str, str] | tuple[int, int, int], int]] = {}
        labels: dict[int, int | tuple[str, str]] = {}
        hasher = Hasher()
        hashed = 0
        for member, number, role in roles:  # in file order: one sequential pass over the tar
            stop = member.data_offset + member.size
            hasher.update(source.read(hashed, stop))
            hashed = stop
            data = source.read(member.data_offset, stop)
            if role == "label":
                labels[number] = parse_label(data)
            else:
                images[number] = (member, _image_problem(data), checksum(data))
        hasher.update(source.read(hashed, source.size))
        for number in images:  # image problems come before label problems
            found = images[number][1]
            if isinstance(found[0], str):
                problems[number] = (str(found[0]), str(found[1]))
            elif number not in labels:
                problems[number] = ("no-label", f"no member with extension {label_extension!r}")
            elif not isinstance(labels[number], int):
                problems[number] = labels[number]  # type: ignore[assignment]
        index_path = index_path_for(path) if index is None else Path(index)
        max_label = -1
        with ShardWriter(index_path, schema=INDEX_SCHEMA) as writer:
            for number, sample in enumerate(scan.samples):
                if number in problems:
                    continue
                image, (height, width, channels), digest = images[number]  # type: ignore[misc]
                label = int(labels[number])  # type: ignore[arg-type]
                max_label = max(max_label, label)
                writer.write(
                    {
                        "key": sample.key.encode("utf-8", "surrogateescape"),
                        "image_offset": image.data_offset,
                        "image_size": image.size,
                        "image_height": height,
                        "image_width": width,
                        "image_channels": channels,
                        "image_checksum": digest - (1 << 64) if digest >= 1 << 63 else digest,
                        "label": label,
                        # the index's JSON is UTF-8: an extension's bytes that are not are written as \xNN
                        "members": {display_key(ext): [m.data_offset, m.size] for ext, m in sample.members.items()},
                    }
                )
            index_info = writer.close()
        tar = ShardInfo(Path(source.path), index_info.num_records, source.size, hasher.intdigest())
        rejects = tuple(TarReject(shown, scan.samples[n].key, *problems[n]) for n in sorted(problems))
        return TarIndexInfo(tar, index_info, rejects, max_label, scan.skipped)
    finally:
        source.close()
