"""Reading a tar shard through its member index, with the interface of a binary `ShardReader`.

`TarShardReader` builds, once, the record table a binary shard of the ``IMAGE_CLASSIFICATION``
schema would have, from the member index (spec/tar.md), and serves image bytes from a memory map
of the tar. The loader's per-record work (a table row, an optional checksum, one range read) is
therefore the same for both shard formats.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..checksum import checksum
from ..errors import ChecksumError, FormatError, SchemaError
from ..format.layout import (
    JPEG_CHANNELS,
    MAX_CLASSES,
    MAX_FIELD_SIZE,
    MAX_IMAGE_SIDE,
    column_name,
)
from ..format.reader import ImageInfo, Record, ShardReader
from ..format.schema import IMAGE_CLASSIFICATION
from ..storage import ByteSource, open_source
from .index import INDEX_SCHEMA, index_path_for
from .keys import BLOCK_SIZE

__all__ = ["TarRecord", "TarShardReader"]


class TarShardReader:
    """A tar shard read through its member index, with the interface of `ShardReader`.

    `table` has the columns and dtypes of a binary shard's record table for the
    ``IMAGE_CLASSIFICATION`` schema, built once from the index: a record's span (``offset``,
    ``size``, ``checksum``) and its ``image.*`` columns are those of the image member's data in
    the tar, so `verify_record` hashes exactly that member and the loader reads it from `source`
    (the memory-mapped tar) as it reads a binary shard. ``key.offset`` and ``key.size`` locate the
    key in the index shard (`index`), not in the tar: read keys with `payload` or `key`.

    Args:
        path: the tar.
        index: its member index; default ``NAME.tar.idx`` beside it.
        verify: check a record's image checksum whenever its image is read.
        expected_size, expected_index_size: sizes the manifest states; a mismatch raises first.
        source, index_source: the tar and the index as byte sources (a remote object, a cached
            shard); default: memory-mapped local files.

    Raises:
        ShardNotFoundError: the tar or the index does not exist.
        FormatError: the index is not a valid member index, or does not fit the tar.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        index: str | os.PathLike[str] | None = None,
        verify: bool = True,
        expected_size: int | None = None,
        expected_index_size: int | None = None,
        source: ByteSource | None = None,
        index_source: ByteSource | None = None,
    ) -> None:
        self.source = source if source is not None else open_source(os.fspath(path))
        self.path = self.source.path
        self.verify = verify
        self.schema = IMAGE_CLASSIFICATION
        try:
            if expected_size is not None and self.source.size != expected_size:
                raise FormatError(f"file is {self.source.size} bytes but the manifest says {expected_size}", path=self.path)
            self.index = ShardReader(
                index_path_for(path) if index is None else index, verify=verify, expected_size=expected_index_size, source=index_source
            )
        except BaseException:
            self.source.close()
            raise
        try:
            self.table: np.ndarray[Any, Any] = self._build_table()
        except BaseException:
            self.close()
            raise

    def _build_table(self) -> np.ndarray[Any, Any]:
        """Check the index against the tar, all records at once, and build the record table."""
        index = self.index
        if index.schema != INDEX_SCHEMA:
            raise FormatError(f"is not a tar member index: its fields are {', '.join(index.schema.names)}", path=index.path)
        rows = index.table
        offsets, sizes = rows["image_offset"], rows["image_size"]
        heights, widths, channels = rows["image_height"], rows["image_width"], rows["image_channels"]

        def check(bad: np.ndarray[Any, Any], message: str, column: str) -> None:
            if bad.any():
                i = int(np.argmax(bad))
                at = index.table_offset + i * index.dtype.itemsize + index.dtype.fields[column][1]  # type: ignore[index]
                raise FormatError(f"{message} (tar {self.path}, {self.source.size} bytes)", path=index.path, offset=at, record=i)

        check((offsets < BLOCK_SIZE) | (offsets % BLOCK_SIZE != 0), "image data does not start on a 512-byte block after a header", "image_offset")
        check(offsets > self.source.size, "image data starts past the end of the tar", "image_offset")
        check((sizes < 0) | (sizes > MAX_FIELD_SIZE), f"image size is outside [0, {MAX_FIELD_SIZE}]", "image_size")
        check(offsets + sizes > self.source.size, "image data runs past the end of the tar", "image_size")
        check((heights < 1) | (heights > MAX_IMAGE_SIDE) | (widths < 1) | (widths > MAX_IMAGE_SIDE), "image height or width is outside [1, 65535]", "image_height")
        check(~np.isin(channels, JPEG_CHANNELS), "image channels are not 1 or 3", "image_channels")
        check((rows["label"] < 0) | (rows["label"] >= MAX_CLASSES), f"label is outside [0, {MAX_CLASSES})", "label")
        order = np.argsort(offsets, kind="stable")
        ends = (offsets[order] + sizes[order] + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
        overlap = np.zeros(len(rows), bool)
        overlap[order[1:]] = offsets[order[1:]] < ends[:-1] + BLOCK_SIZE
        check(overlap, "image data overlaps another record's image or leaves no room for its header", "image_offset")

        table = np.zeros(len(rows), IMAGE_CLASSIFICATION.record_dtype())
        table["offset"] = table[column_name("image", "offset")] = offsets
        table["size"] = table[column_name("image", "size")] = sizes
        table["checksum"] = rows["image_checksum"].view(np.uint64)
        table[column_name("image", "height")] = heights
        table[column_name("image", "width")] = widths
        table[column_name("image", "channels")] = channels
        table["label"] = rows["label"]
        table[column_name("key", "offset")] = rows[column_name("key", "offset")]
        table[column_name("key", "size")] = rows[column_name("key", "size")]
        table.flags.writeable = False
        return table

    def __len__(self) -> int:
        return len(self.table)

    def verify_record(self, index: int) -> None:
        """Check record `index`'s image member against its XXH3-64.

        Raises:
            ChecksumError: naming the tar, the record and the member's first byte.
        """
        row = self.table[index]
        start, size = int(row["offset"]), int(row["size"])
        if checksum(self.source.read(start, start + size)) != int(row["checksum"]):
            raise ChecksumError(
                f"image member [{start}, {start + size}) does not match its checksum: the tar is corrupt",
                path=self.path,
                offset=start,
                record=index,
            )

    def payload(self, index: int, field: str) -> memoryview:
        """Return the bytes of "image" (from the tar, verified) or "key" (from the index)."""
        if field == "key":
            return self.index.payload(index, "key")
        if field != "image":
            raise SchemaError(f"no variable-size field {field!r} in a tar shard (fields: image, key)")
        if self.verify:
            self.verify_record(index)
        row = self.table[index]
        start = int(row["offset"])
        return self.source.read(start, start + int(row["size"]))

    def key(self, index: int) -> str:
        """Return record `index`'s key, decoded as tarfile decodes names (UTF-8, surrogateescape)."""
        return bytes(self.index.payload(index, "key")).decode("utf-8", "surrogateescape")

    def members(self, index: int) -> dict[str, memoryview]:
        """Return every member of record `index`'s sample, by lower-cased extension, unverified."""
        spans = self.index.record(index)["members"]
        if not isinstance(spans, dict):
            raise FormatError(f"members is a JSON {type(spans).__name__}, not an object of member spans", path=self.index.path, record=index)
        result = {}
        for extension, span in spans.items():
            if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)
                    and 0 <= span[0] and 0 <= span[1] and span[0] + span[1] <= self.source.size):
                raise FormatError(f"member {extension!r} has no valid span in the tar", path=self.index.path, record=index)
            result[extension] = self.source.read(span[0], span[0] + span[1])
        return result

    def image_info(self, index: int, field: str = "image") -> ImageInfo:
        row = self.table[index]
        return ImageInfo(
            int(row[column_name(field, "height")]), int(row[column_name(field, "width")]), int(row[column_name(field, "channels")])
        )

    def record(self, index: int) -> Record:
        """Return record `index`: image (memoryview), label (int), key (str)."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"record {index} out of range for a shard of {len(self)}")
        return TarRecord(self, index % len(self))

    def __iter__(self) -> Iterator[Record]:
        for i in range(len(self)):
            yield TarRecord(self, i)

    def close(self) -> None:
        self.index.close()
        self.source.close()

    def __enter__(self) -> TarShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TarRecord(Record):
    """A record of a tar shard; its key keeps bytes that are not UTF-8 (as surrogate escapes)."""

    __slots__ = ()

    def __getitem__(self, name: str) -> Any:
        if name == "key":
            return self._shard.key(self.index)  # type: ignore[attr-defined]
        return super().__getitem__(name)
