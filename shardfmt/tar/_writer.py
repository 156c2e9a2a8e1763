"""`TarShardWriter`: deterministic, atomic WebDataset tars with their member index (spec/tar.md,
"Writing")."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from .._checksum import Hasher, checksum
from .._errors import SchemaError
from .._storage.atomic import SYNC_EVERY, AtomicFile, Transaction
from ..format._fieldtypes import JpegType
from ..format._layout import (
    MAX_CLASSES,
    MAX_RECORDS_PER_SHARD,
    MAX_SHARD_SIZE,
    align_up,
)
from ..format._schema import IMAGE_CLASSIFICATION
from ..format._writer import ShardInfo, ShardWriter
from ._index import INDEX_SCHEMA, index_path_for
from ._keys import (
    BLOCK_SIZE,
    LABEL_EXTENSION,
    MAX_MEMBER_SIZE,
    META_EXTENSION,
    RECORD_SIZE,
    display_key,
    encode_key,
    member_field,
)

_IMAGE: Final = IMAGE_CLASSIFICATION.field("image")
_JPEG: Final = JpegType()
"""A sample's image is checked and measured as the image of a binary shard is."""
_MAX_USTAR_NAME: Final = 100
_PAX_NAME: Final = b"././@PaxHeader"


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


def encode_member(kind: str, value: Any, where: str) -> bytes:
    """Return the bytes of a member of field type `kind`: a str as UTF-8, a JSON value as
    canonical JSON (spec/format.md, section 7; ``None`` is ``null``), bytes as they are.

    Raises:
        SchemaError: the value does not fit the type.
    """
    if kind == "str":
        if not isinstance(value, str):
            raise SchemaError(f"{where} must be a str, got {type(value).__name__}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise SchemaError(f"{where} is not valid Unicode text: {err}") from err
    if kind == "json":
        try:
            return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as err:
            raise SchemaError(f"{where} is not JSON-serialisable: {err}") from err
    if kind == "bytes" and isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise SchemaError(f"{where} must be bytes for a member of type {kind!r}, got {type(value).__name__}")


@dataclass(frozen=True)
class TarShardInfo:
    """A finished tar shard: the tar (its `checksum` is of the whole file) and its member index."""

    tar: ShardInfo
    index: ShardInfo


def _sample_members(
    data: bytes | bytearray | memoryview,
    label: int | None,
    meta: Any,
    members: Mapping[str, bytes | bytearray | memoryview] | None,
    where: str,
) -> dict[str, bytes | bytearray | memoryview]:
    """Every member of one sample by extension: the JPEG, the label, the metadata, the rest."""
    members_out: dict[str, bytes | bytearray | memoryview] = {"jpg": data}
    if label is not None:
        members_out[LABEL_EXTENSION] = str(int(label)).encode("ascii")
    if meta is not None:
        members_out[META_EXTENSION] = encode_member("json", meta, f"{where}: meta")
    for extension, value in (members or {}).items():
        if extension in members_out or extension == LABEL_EXTENSION or member_field(extension) != extension:
            raise SchemaError(
                f"{where}: {extension!r} cannot be a member extension here (a lower-case identifier, not cls, jpg, or json beside meta)"
            )
        members_out[extension] = value
    for extension, value in members_out.items():
        if extension != "jpg" and len(value) > MAX_MEMBER_SIZE:  # what a reader refuses to read whole
            raise SchemaError(f"{where}: member {extension!r} is {len(value)} bytes, over the member limit of {MAX_MEMBER_SIZE}")
    return members_out


class TarShardWriter(Transaction):
    """Write samples to one WebDataset tar and its member index, both deterministic and atomic.

    Args:
        path: the tar's final path; bytes go to a hidden temporary name until `close()`.
        index: the member index's path; default ``NAME.tar.idx`` beside the tar.

        labelled: whether samples have a label (``KEY.cls``); without, the index holds label -1.

    Each sample becomes ``KEY.cls`` (if labelled), ``KEY.jpg``, ``KEY.json`` with `meta` and one
    member per entry of `members`, in sorted order of extension, with mtime 0, uid and gid 0,
    empty user and group names and mode 0644. Use as a context manager: leaving the block
    normally commits both files, an exception removes them.
    """

    def __init__(self, path: str | os.PathLike[str], *, index: str | os.PathLike[str] | None = None, labelled: bool = True) -> None:
        self.labelled = labelled
        self._file = AtomicFile(path, sync_every=SYNC_EVERY, direct=True)
        try:
            self._index = ShardWriter(index_path_for(path) if index is None else index, schema=INDEX_SCHEMA)
        except BaseException:
            self._file.abort()
            raise
        self._hasher = Hasher()
        self._keys: set[str] = set()
        self.closed = False

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

    def _emit(self, data: bytes | bytearray | memoryview) -> None:
        self._file.write(data)
        self._hasher.update(data)

    def _check_label(self, label: int | None, where: str) -> None:
        """A labelled writer takes an int label in range; an unlabelled one takes None only."""
        if not self.labelled:
            if label is not None:
                raise SchemaError(f"{where}: this tar has no labels, got label {label!r}")
        elif isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)) or not 0 <= label < MAX_CLASSES:
            raise SchemaError(f"{where}: label must be an int in [0, {MAX_CLASSES}), got {label!r}")

    def write(
        self,
        key: str,
        *,
        image: bytes | bytearray | memoryview,
        label: int | None = None,
        meta: Any = None,
        members: Mapping[str, bytes | bytearray | memoryview] | None = None,
    ) -> int:
        """Append one sample and return its record index.

        Args:
            key: the sample's key: a relative '/'-separated path whose last part has no dot.
            image: the JPEG bytes (8-bit, 1 or 3 channels, not lossless), stored unchanged.
            label: the class, 0 <= label < MAX_CLASSES, stored as ASCII decimal in ``KEY.cls``;
                None (and only None) in a writer that is not `labelled`.
            meta: if not None, a JSON-serialisable value stored canonically in ``KEY.json``.
            members: further members by extension, their bytes as given (`encode_member`); an
                extension must be its own field name (`keys.member_field`), not ``cls``,
                ``jpg``, nor ``json`` with `meta`.

        Raises:
            SchemaError: a bad or repeated key, an image that is not a storable JPEG, a label out
                of range or given to an unlabelled writer, `meta` that is not JSON, a member
                extension that cannot be, or the shard would exceed MAX_SHARD_SIZE or
                MAX_RECORDS_PER_SHARD.
        """
        if self.closed:
            raise ValueError("write() on a closed TarShardWriter")
        name = encode_key(key)
        index = self.num_records
        where = f"record {index} (key {display_key(key)!r})"
        if key in self._keys:
            raise SchemaError(f"{where}: the key was written before; its members would merge into one sample")
        if index >= MAX_RECORDS_PER_SHARD:
            raise SchemaError(f"a shard holds at most {MAX_RECORDS_PER_SHARD} records")
        self._check_label(label, where)
        data, (height, width, channels, _) = _JPEG.encode(_IMAGE, image, f"{where}: image")
        members_out = _sample_members(data, label, meta, members, where)
        pieces: list[tuple[str, bytes, bytes | bytearray | memoryview]] = []
        grown = self._file.tell()
        for extension in sorted(members_out):
            header = _member_header(name + b"." + extension.encode("ascii"), len(members_out[extension]))
            pieces.append((extension, header, members_out[extension]))
            grown += len(header) + align_up(len(members_out[extension]), BLOCK_SIZE)
        if _round_up(grown + 2 * BLOCK_SIZE, RECORD_SIZE) > MAX_SHARD_SIZE:
            raise SchemaError(f"{where} would grow the tar past the limit of {MAX_SHARD_SIZE} bytes")
        spans: dict[str, list[int]] = {}
        for extension, header, payload in pieces:
            self._emit(header)
            spans[extension] = [self._file.tell(), len(payload), checksum(payload)]
            self._emit(payload)
            self._emit(_padding(len(payload)))
        self._keys.add(key)
        digest = spans["jpg"][2]
        return self._index.write(
            {
                "key": name,
                "image_offset": spans["jpg"][0],
                "image_size": len(data),
                "image_height": height,
                "image_width": width,
                "image_channels": channels,
                "image_checksum": digest - (1 << 64) if digest >= 1 << 63 else digest,
                "label": int(label) if label is not None else -1,
                "members": spans,
            }
        )

    def close(self) -> TarShardInfo:
        """End the tar (two zero blocks, padded to 10240 bytes), commit it, then its index."""
        if self.closed:
            raise ValueError("close() on a closed TarShardWriter")
        self._emit(bytes(self.size - self._file.tell()))
        size = self._file.tell()
        try:
            self._file.commit()
        except BaseException:
            self._index.abort()
            raise
        self.closed = True
        tar = ShardInfo(self.path, self.num_records, size, self._hasher.intdigest())
        return TarShardInfo(tar, self._index.close())

    def abort(self) -> None:
        """Discard the tar and the index: remove their temporary files."""
        if not self.closed:
            self._file.abort()
            self._index.abort()
            self.closed = True


