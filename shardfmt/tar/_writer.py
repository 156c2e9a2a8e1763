"""`TarShardWriter`: deterministic, atomic WebDataset tars with their member index (spec/tar.md,
"Writing")."""

from __future__ import annotations

import json
import os
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
    META_EXTENSION,
    RECORD_SIZE,
    display_key,
    encode_key,
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


@dataclass(frozen=True)
class TarShardInfo:
    """A finished tar shard: the tar (its `checksum` is of the whole file) and its member index."""

    tar: ShardInfo
    index: ShardInfo


class TarShardWriter(Transaction):
    """Write samples to one WebDataset tar and its member index, both deterministic and atomic.

    Args:
        path: the tar's final path; bytes go to a hidden temporary name until `close()`.
        index: the member index's path; default ``NAME.tar.idx`` beside the tar.

    Each sample becomes ``KEY.cls``, ``KEY.jpg`` and, with `meta`, ``KEY.json``, in that (sorted)
    order, with mtime 0, uid and gid 0, empty user and group names and mode 0644. Use as a context
    manager: leaving the block normally commits both files, an exception removes them.
    """

    def __init__(self, path: str | os.PathLike[str], *, index: str | os.PathLike[str] | None = None) -> None:
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
        if self.closed:
            raise ValueError("write() on a closed TarShardWriter")
        name = encode_key(key)
        index = self.num_records
        where = f"record {index} (key {display_key(key)!r})"
        if key in self._keys:
            raise SchemaError(f"{where}: the key was written before; its members would merge into one sample")
        if index >= MAX_RECORDS_PER_SHARD:
            raise SchemaError(f"a shard holds at most {MAX_RECORDS_PER_SHARD} records")
        if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)) or not 0 <= label < MAX_CLASSES:
            raise SchemaError(f"{where}: label must be an int in [0, {MAX_CLASSES}), got {label!r}")
        data, (height, width, channels, _) = _JPEG.encode(_IMAGE, image, f"{where}: image")
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


