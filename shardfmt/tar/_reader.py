"""Reading a tar shard through its member index, with the interface of a binary `ShardReader`.

`TarShardReader` builds, once, the record table a binary shard of the dataset's schema would
have (``image``, ``label`` if labelled, ``key`` and one field per further member, spec/tar.md
section 3), from the member index, and serves image and member bytes from a memory map of the
tar. The loader's per-record work (a table row, an optional checksum, one range read) is
therefore the same for both shard formats.
"""

from __future__ import annotations

import os
from typing import Any, Final

import numpy as np

from .._errors import FormatError
from .._jsontext import JsonTextError, parse_json
from .._storage import ByteSource
from ..format._fieldtypes import JpegType
from ..format._layout import MAX_CLASSES, MAX_FIELD_SIZE, MAX_IMAGE_SIDE
from ..format._reader import Record, ShardReader, ShardReaderBase, close_on_error
from ..format._schema import IMAGE_CLASSIFICATION, Schema, tar_schema_problem
from ._index import INDEX_SCHEMA, index_path_for
from ._keys import BLOCK_SIZE, member_field

__all__ = ["TarRecord", "TarShardReader"]

_FROM_INDEX: Final = {
    "offset": "image_offset",
    "size": "image_size",
    "checksum": "image_checksum",
    "image.offset": "image_offset",
    "image.size": "image_size",
    "image.height": "image_height",
    "image.width": "image_width",
    "image.channels": "image_channels",
    "label": "label",
    "key.offset": "key.offset",
    "key.size": "key.size",
}
"""Each column of the record table and the member index column it is copied from. The record's
span is its image member, so a record's checksum is the image's; ``image.reserved`` stays zero."""


class TarRecord(Record):
    """A record of a tar shard; its key keeps bytes that are not UTF-8 (as surrogate escapes)."""

    __slots__ = ()
    _shard: TarShardReader

    def __getitem__(self, name: str) -> Any:
        if name == "key":
            return self._shard.key(self.index)
        return super().__getitem__(name)


class TarShardReader(ShardReaderBase):
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
        schema: the dataset's schema (`format.schema.tar_schema`); default image, label, key.
            Without a label field every label in the index must be -1; with one, none may be.
            A field past the key is read from the sample's member of that name
            (`keys.member_field`), unverified: only the image member has a checksum.

    Raises:
        ShardNotFoundError: the tar or the index does not exist.
        FormatError: the index is not a valid member index, or does not fit the tar.
    """

    _record_type = TarRecord
    _span_noun = "image member"
    _file_noun = "tar"

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
        schema: Schema = IMAGE_CLASSIFICATION,
    ) -> None:
        super().__init__(path, verify=verify, source=source)
        problem = tar_schema_problem(schema)
        if problem is not None:
            self.source.close()
            raise FormatError(f"cannot be read with this schema: {problem}", path=self.path)
        self.schema = schema
        with close_on_error(self.source):
            if expected_size is not None and self.source.size != expected_size:
                raise FormatError(f"file is {self.source.size} bytes but the manifest says {expected_size}", path=self.path)
            self.index = ShardReader(
                index_path_for(path) if index is None else index, verify=verify, expected_size=expected_index_size, source=index_source
            )
        with close_on_error(self):
            self.table = self._build_table()
            self._start_checks()

    def _build_table(self) -> np.ndarray[Any, Any]:
        """Check the index against the tar, all records at once, and build the record table."""
        index = self.index
        if index.schema != INDEX_SCHEMA:
            raise FormatError(f"is not a tar member index: its fields are {', '.join(index.schema.names)}", path=index.path)
        index.check_all()
        rows = index.table
        offsets, sizes = rows["image_offset"], rows["image_size"]
        heights, widths, channels = rows["image_height"], rows["image_width"], rows["image_channels"]

        def check(bad: np.ndarray[Any, Any], message: str, column: str) -> None:
            if bad.any():
                i = int(np.argmax(bad))
                raise FormatError(
                    f"{message} (tar {os.path.basename(self.path)}, {self.source.size} bytes)",
                    path=index.path, offset=index.locate_column(i, column)[1], record=i,
                )

        check(
            (offsets < BLOCK_SIZE) | (offsets % BLOCK_SIZE != 0),
            "image data does not start on a 512-byte block after a header",
            "image_offset",
        )
        check(offsets > self.source.size, "image data starts past the end of the tar", "image_offset")
        check((sizes < 0) | (sizes > MAX_FIELD_SIZE), f"image size is outside [0, {MAX_FIELD_SIZE}]", "image_size")
        check(offsets + sizes > self.source.size, "image data runs past the end of the tar", "image_size")
        check(
            (heights < 1) | (heights > MAX_IMAGE_SIDE) | (widths < 1) | (widths > MAX_IMAGE_SIDE),
            "image height or width is outside [1, 65535]",
            "image_height",
        )
        check(~np.isin(channels, JpegType.channels), f"image channels are not {' or '.join(map(str, JpegType.channels))}", "image_channels")
        check((rows["label"] < -1) | (rows["label"] >= MAX_CLASSES), f"label is outside [-1, {MAX_CLASSES})", "label")
        if "label" in self.schema.names:
            check(rows["label"] == -1, "label is -1 (no label member) in a labelled dataset", "label")
        else:
            check(rows["label"] != -1, "label is not -1 in a dataset without labels", "label")
        order = np.argsort(offsets, kind="stable")
        ends = (offsets[order] + sizes[order] + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
        overlap = np.zeros(len(rows), bool)
        overlap[order[1:]] = offsets[order[1:]] < ends[:-1] + BLOCK_SIZE
        check(overlap, "image data overlaps another record's image or leaves no room for its header", "image_offset")

        table = np.zeros(len(rows), self.schema.record_dtype())
        for column, source in _FROM_INDEX.items():
            if column != "label" or "label" in self.schema.names:
                table[column] = rows[source]  # the checksum's int64 bits become its u64 value
        members = self.schema.fields[self.schema.names.index("key") + 1 :]
        if members:
            self._fill_members(table, [field.name for field in members])
        table.flags.writeable = False
        return table

    def _fill_members(self, table: np.ndarray[Any, Any], names: list[str]) -> None:
        """Set the offset and size columns of each member field from the index's `members`
        (parsed here, once per record, only when the schema has member fields)."""
        index = self.index
        for i in range(len(table)):
            try:
                spans = parse_json(bytes(index.payload(i, "members")))
            except JsonTextError as err:
                raise FormatError(f"members is not JSON text: {err}", path=index.path, record=i) from err
            by_field = {member_field(ext): span for ext, span in spans.items()} if isinstance(spans, dict) else {}
            for name in names:
                span = by_field.get(name)
                if not (isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span)
                        and BLOCK_SIZE <= span[0] and span[0] % BLOCK_SIZE == 0 and 0 <= span[1] <= MAX_FIELD_SIZE
                        and span[0] + span[1] <= self.source.size):
                    raise FormatError(
                        f"members has no valid span for field {name!r} (a [data offset, size] inside the tar)",
                        path=index.path, offset=index.locate_column(i, "members.offset")[1], record=i,
                    )
                table[i][f"{name}.offset"], table[i][f"{name}.size"] = span

    def locate_column(self, index: int, column: str) -> tuple[str, int]:
        """Return where `column` of record `index` is stored: in the member index."""
        return self.index.locate_column(index, _FROM_INDEX.get(column, "members.offset"))

    def payload(self, index: int, field: str) -> memoryview:
        """Return the bytes of "image" (from the tar, verified), "key" (from the index) or a
        member field (from the tar; a member other than the image has no checksum)."""
        if field == "key":
            return self.index.payload(index, "key")
        if field == "image" or field not in self.schema.names or not self.schema.field(field).is_variable:
            return super().payload(index, field)
        row = self.table[index]
        start = int(row[f"{field}.offset"])
        return self.source.read(start, start + int(row[f"{field}.size"]))

    def key(self, index: int) -> str:
        """Return record `index`'s key, decoded as tarfile decodes names (UTF-8, surrogateescape)."""
        return bytes(self.payload(index, "key")).decode("utf-8", "surrogateescape")

    def members(self, index: int) -> dict[str, memoryview]:
        """Return every member of record `index`'s sample, by lower-cased extension, unverified."""
        spans = self.index.record(index)["members"]
        if not isinstance(spans, dict):
            raise FormatError(
                f"members is a JSON {type(spans).__name__}, not an object of member spans", path=self.index.path, record=index
            )
        result = {}
        for extension, span in spans.items():
            if not (
                isinstance(span, list)
                and len(span) == 2
                and all(isinstance(x, int) for x in span)
                and 0 <= span[0]
                and 0 <= span[1]
                and span[0] + span[1] <= self.source.size
            ):
                raise FormatError(f"member {extension!r} has no valid span in the tar", path=self.index.path, record=index)
            result[extension] = self.source.read(span[0], span[0] + span[1])
        return result

    def close(self) -> None:
        self.index.close()
        super().close()
