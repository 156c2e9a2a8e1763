"""Reading a tar shard through its member index, with the interface of a binary `ShardReader`.

`TarShardReader` builds, once, the record table a binary shard of the dataset's schema would
have (``image``, ``label`` if labelled, ``key`` and one field per further member, spec/tar.md
section 3), from the member index, and serves image and member bytes from a memory map of the
tar. The loader's per-record work (a table row, an optional checksum, one range read) is
therefore the same for both shard formats.
"""

from __future__ import annotations

import os
from typing import Any, Final, TypeGuard

import numpy as np

from .._checksum import checksum
from .._errors import ChecksumError, FormatError, LimitError
from .._jsontext import JsonTextError, parse_json
from .._storage import ByteSource
from ..format._fieldtypes import JpegType
from ..format._layout import MAX_CLASSES, MAX_FIELD_SIZE, MAX_IMAGE_SIDE
from ..format._reader import Record, ShardReader, ShardReaderBase, close_on_error
from ..format._schema import IMAGE_CLASSIFICATION, Schema, tar_schema_problem
from ._index import INDEX_SCHEMA, index_path_for
from ._keys import BLOCK_SIZE, MAX_MEMBER_SIZE, display_key, member_field

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


def _is_span(span: Any, tar_size: int) -> TypeGuard[list[int]]:
    """Whether `span` is ``[data offset, size]`` or ``[data offset, size, checksum]`` of integers
    inside a tar of `tar_size` bytes, the size at most MAX_FIELD_SIZE, the checksum a u64."""
    return (
        isinstance(span, list)
        and len(span) in (2, 3)
        and all(type(x) is int for x in span)
        and 0 <= span[0]
        and 0 <= span[1] <= MAX_FIELD_SIZE
        and span[0] + span[1] <= tar_size
        and (len(span) == 2 or 0 <= span[2] < 1 << 64)
    )


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
    the tar, so the loader reads it from `source` (the memory-mapped tar) as it reads a binary
    shard. ``key.offset`` and ``key.size`` locate the key in the index shard (`index`), not in the
    tar: read keys with `payload` or `key`.

    What `verify` checks: the image member against ``image_checksum``, and each member field
    (and each member `members` returns) against the XXH3-64 its span in the index carries.
    The label and the key are values of the index, whose table and records are checksummed as
    any binary shard's. An index written before member checksums existed (spans of two
    numbers) has none: its member fields are then read unchecked, only the image is checked
    (`shardfmt verify` still compares the whole tar with the manifest's checksum).

    Args:
        path: the tar.
        index: its member index; default ``NAME.tar.idx`` beside it.
        verify: check a record's image member whenever it is read (`verify_record`,
            `payload`), and a member field whenever it is read; see above.
        expected_size, expected_index_size: sizes the manifest states; a mismatch raises first.
        source, index_source: the tar and the index as byte sources (a remote object, a cached
            shard); default: memory-mapped local files.
        schema: the dataset's schema (`format.schema.tar_schema`); default image, label, key.
            Without a label field every label in the index must be -1; with one, none may be.
            A field past the key is read from the sample's member of that name
            (`keys.member_field`).

    Raises:
        ShardNotFoundError: the tar or the index does not exist.
        FormatError: the index is not a valid member index, or does not fit the tar.
        LimitError: a member field is over MAX_MEMBER_SIZE (64 MiB), checked before it is read.
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
        self._member_checksums: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
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
        (parsed here, once per record, only when the schema has member fields), and keep each
        member's checksum where the index has one."""
        index = self.index
        for name in names:
            self._member_checksums[name] = (np.zeros(len(table), np.uint64), np.zeros(len(table), bool))
        for i in range(len(table)):
            try:
                spans = parse_json(bytes(index.payload(i, "members")))
            except JsonTextError as err:
                raise FormatError(f"members is not JSON text: {err}", path=index.path, record=i) from err
            # of two extensions with one field name, the first in code-point order, as the indexer chose it
            by_field: dict[str | None, Any] = {}
            for ext in sorted(spans) if isinstance(spans, dict) else ():
                by_field.setdefault(member_field(ext), spans[ext])
            for name in names:
                span = by_field.get(name)
                if not (_is_span(span, self.source.size) and BLOCK_SIZE <= span[0] and span[0] % BLOCK_SIZE == 0):
                    raise FormatError(
                        f"members has no valid span for field {name!r} (a [data offset, size] or [data offset, size, "
                        "checksum] inside the tar)",
                        path=index.path, offset=index.locate_column(i, "members.offset")[1], record=i,
                    )
                if span[1] > MAX_MEMBER_SIZE:
                    raise LimitError(
                        f"member field {name!r} is {span[1]} bytes, over the member limit of {MAX_MEMBER_SIZE}",
                        path=index.path, offset=index.locate_column(i, "members.offset")[1], record=i,
                    )
                table[i][f"{name}.offset"], table[i][f"{name}.size"] = span[:2]
                if len(span) == 3:
                    digests, checked = self._member_checksums[name]
                    digests[i], checked[i] = span[2], True

    def locate_column(self, index: int, column: str) -> tuple[str, int]:
        """Return where `column` of record `index` is stored: in the member index."""
        return self.index.locate_column(index, _FROM_INDEX.get(column, "members.offset"))

    def payload(self, index: int, field: str) -> memoryview:
        """Return the bytes of "image" (from the tar), "key" (from the index) or a member field
        (from the tar); with `verify`, the image or member is checked against its checksum
        first (a member of an index without member checksums is not: see the class)."""
        if field == "key":
            return self.index.payload(index, "key")
        if field == "image" or field not in self.schema.names or not self.schema.field(field).is_variable:
            return super().payload(index, field)
        row = self.table[index]
        start = int(row[f"{field}.offset"])
        data = self.source.read(start, start + int(row[f"{field}.size"]))
        if self.verify:
            self._check_member(index, field, start, data)
        return data

    def verify_record(self, index: int) -> None:
        """Check record `index`'s image member, then each of its member fields that has a
        checksum in the index, against their XXH3-64.

        Raises:
            ChecksumError: naming the tar, the record (and for a member, its extension and the
                sample's key) and the first byte of the member's data.
        """
        super().verify_record(index)
        row = self.table[index]
        for name in self._member_checksums:
            start = int(row[f"{name}.offset"])
            self._check_member(index, name, start, self.source.read(start, start + int(row[f"{name}.size"])))

    def _check_member(self, index: int, name: str, start: int, data: memoryview) -> None:
        """Compare member field `name` of record `index` with its checksum, if the index has one."""
        digests, checked = self._member_checksums[name]
        if checked[index]:
            self._check_bytes(index, f"member field {name!r}", start, data, int(digests[index]))

    def _check_bytes(self, index: int, what: str, start: int, data: memoryview, expected: int) -> None:
        if checksum(data) != expected:
            raise ChecksumError(
                f"{what} of sample {display_key(self.key(index))!r} [{start}, {start + len(data)}) "
                "does not match its checksum: the tar is corrupt",
                path=self.path,
                offset=start,
                record=index,
            )

    def key(self, index: int) -> str:
        """Return record `index`'s key, decoded as tarfile decodes names (UTF-8, surrogateescape)."""
        return bytes(self.payload(index, "key")).decode("utf-8", "surrogateescape")

    def members(self, index: int) -> dict[str, memoryview]:
        """Return every member of record `index`'s sample, by lower-cased extension; with
        `verify`, each member that has a checksum in the index is checked first."""
        spans = self.index.record(index)["members"]
        if not isinstance(spans, dict):
            raise FormatError(
                f"members is a JSON {type(spans).__name__}, not an object of member spans", path=self.index.path, record=index
            )
        result = {}
        for extension, span in spans.items():
            if not _is_span(span, self.source.size):
                raise FormatError(f"member {extension!r} has no valid span in the tar", path=self.index.path, record=index)
            data = self.source.read(span[0], span[0] + span[1])
            if self.verify and len(span) == 3:
                self._check_bytes(index, f"member {extension!r}", span[0], data, span[2])
            result[extension] = data
        return result

    def close(self) -> None:
        self.index.close()
        super().close()
