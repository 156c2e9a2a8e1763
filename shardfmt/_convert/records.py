"""Worker side of a conversion: planned records become storable records, one chunk at a time.

A chunk is a few consecutive records of one shard. For each record a worker reads its files (a
local file with one `os.read`, the image member of a sample of a tar with one `os.pread`, an
object of a store with one GET, a row of a Parquet file with the rest of its row group), checks
and normalises the images, and returns the record's fields, or the reason it is rejected. One
`RecordBuilder` does the middle part for records of any fields (`sources.results.RecordField`):
image classification is the fields image and label, and needs nothing else. A builder is a small
frozen value, so it reaches worker processes and Ray tasks as it is; the result depends only on
the record and the options, never on the process.

A worker process of the local pool also gets scratch memory that the converting process shares
(`engine.imap_ordered`'s `scratch`): `build_chunk` copies the byte values of the chunk's records
there (the JPEG bytes, kept or re-encoded) and returns where they are (`Placed`), so that the
bytes the worker checked are the bytes written, and none goes through a pipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .._errors import RejectError, RemoteError, SchemaError, ShardfmtError, WorkerError
from .._jsontext import JsonTextError, parse_json
from .._storage import RemoteOptions, Store, open_store
from .._storage.urls import is_url
from ..format._fieldtypes import HeadedJpeg
from ..format._jpeg import JpegInfo
from ..tar._keys import MAX_MEMBER_SIZE, key_problem, tar_key
from .images import plan_geometry, read_header, store_image
from .plan import ConversionPlan, InputFile, PlannedRecord
from .sources.confine import MAX_INPUT_SIZE, open_regular, read_regular, resolve_inside
from .sources.listing import LISTING_KINDS
from .sources.results import RecordField, describe_os_error, display_path, is_transient_os_error
from .sources.rowgroups import RowGroupReader

__all__ = [
    "MAX_INPUT_SIZE",
    "Built",
    "Chunk",
    "InputReader",
    "Placed",
    "RecordBuilder",
    "build_chunk",
    "builder_for",
    "unplace",
]

@dataclass(frozen=True)
class Chunk:
    """Consecutive records of one shard: (record number, planned record) each."""

    shard: int
    records: tuple[tuple[int, PlannedRecord], ...]


@dataclass(frozen=True)
class Built:
    """A record ready to write, or why it is rejected.

    Attributes:
        number: the record's number in the plan.
        fields: the record's fields (None if rejected).
        reencoded: per JPEG field, why it was re-encoded (None: stored as it was).
        reject: (reason, detail) if rejected.
        transient: the reject's cause may pass (`RejectError.transient`): a resumed run reads
            the input again.
    """

    number: int
    fields: dict[str, Any] | None
    reencoded: tuple[str | None, ...] = ()
    reject: tuple[str, str] | None = None
    transient: bool = False


@dataclass(frozen=True)
class Placed:
    """A field's bytes, copied into the chunk's scratch memory instead of sent back in the result.

    Attributes:
        offset: where they start in the scratch memory.
        size: their length.
        info: a JPEG's headers, when the value was a `HeadedJpeg`.
    """

    offset: int
    size: int
    info: JpegInfo | None = None


@dataclass(frozen=True)
class InputReader:
    """Reads planned files relative to `root`: a local folder, or a URL (a store). A row of a
    Parquet file (an `InputFile` with a row group) is the value of `image_column` in that row,
    read with the rest of its row group (`sources.rowgroups.RowGroupReader`). Local files are
    read as `sources.confine` says: regular files only, within `MAX_INPUT_SIZE`, and with
    `confined` (a listing's files) only inside `root` once symbolic links are resolved."""

    root: str
    remote: RemoteOptions | None = None
    image_column: str | None = None
    image_root: str | None = None
    confined: bool = False
    _store: list[Store] = field(default_factory=list, compare=False, repr=False)
    _rows: list[RowGroupReader] = field(default_factory=list, compare=False, repr=False)

    def read(self, file: InputFile) -> bytes:
        """Return the bytes of `file`.

        Raises:
            RejectError: "unreadable" (the operating system's or the store's message, or a tar
                that ends early), "too-large" (over `MAX_INPUT_SIZE`), "not-a-regular-file",
                "outside-root" (`confined`, or a Parquet row's path), or for a Parquet row
                "no-image" (its image is null) or "missing-file" (the file its path names is not there).
            RemoteError: the store did not answer within its retries (`RemoteError.transient`):
                an outage, not a property of the input.
        """
        if file.size > MAX_INPUT_SIZE:
            raise RejectError(f"{file.size} bytes, over the input limit of {MAX_INPUT_SIZE}", reason="too-large")
        if file.row_group is not None:
            return self._read_row(file)
        if is_url(self.root):
            return self._read_object(file)
        try:
            if self.confined:  # a listing's files: inside its folder once links are resolved
                path, follow = resolve_inside(self.root, file.path), False
            else:
                path, follow = os.path.join(self.root, file.path), True
            if file.offset is None:
                return read_regular(path, follow=follow)
            fd, _ = open_regular(path, follow=follow)
        except OSError as err:
            raise _unreadable(err) from err
        try:
            data = os.pread(fd, file.size, file.offset)
            if len(data) != file.size:
                raise RejectError(f"the tar ends before the member's {file.size} bytes at byte {file.offset}", reason="unreadable")
            return data
        except OSError as err:
            raise _unreadable(err) from err
        finally:
            os.close(fd)

    def _read_object(self, file: InputFile) -> bytes:
        if not self._store:
            self._store.append(open_store(self.root, remote=self.remote))
        try:
            return self._store[0].get(file.path.replace(os.sep, "/"))
        except RemoteError as err:
            if err.transient:
                raise  # the store is unreachable, the object is not bad: `build_chunk` stops the run
            raise RejectError(err.message, reason="unreadable") from err
        except OSError as err:
            raise RejectError(str(getattr(err, "message", err)), reason="unreadable") from err

    def _read_row(self, file: InputFile) -> bytes:
        if not self._rows:
            self._rows.append(RowGroupReader(self.root, self.image_column or "image", self.remote, self.image_root))
        data = self._rows[0].image(file.path, row_group=file.row_group or 0, row=file.offset or 0, file_size=file.file_size or 0)
        if len(data) > MAX_INPUT_SIZE:
            raise RejectError(f"{len(data)} bytes, over the input limit of {MAX_INPUT_SIZE}", reason="too-large")
        return data

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "remote": self.remote, "image_column": self.image_column, "image_root": self.image_root,
                "confined": self.confined, "_store": [], "_rows": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def _unreadable(err: OSError) -> RejectError:
    """The "unreadable" reject of a local file the operating system refused, marked transient
    when a later read may succeed (`sources.results.is_transient_os_error`)."""
    return RejectError(describe_os_error(err), reason="unreadable", transient=is_transient_os_error(err))


@dataclass(frozen=True)
class RecordBuilder:
    """Records of `fields`, in four steps:

    1. The key must obey the key rule of every output (`tar.keys.key_problem`), and for a tar
       shard (`tar_keys`) also read back as a tar key (`tar.keys.tar_key`), or the record is a
       "bad-key" reject before any read; a member of a tar over `tar.keys.MAX_MEMBER_SIZE` is
       "too-large", also before any read.
    2. Each image file is read and its headers judged; its upright size must be its stated
       scale (`scales`, None: unchecked) times the first image's, or the record is a
       "size-mismatch" reject, before anything is decoded.
    3. Each image is reshaped by one geometry (`images.plan_geometry`: `max_side` or `patch`,
       scaled per field) and stored in its kind (`images.store_image`).
    4. The value fields take their planned values; each member of a tar is read and decoded
       (`member_value`), and the key is added.

    With `names_fields` a reject of an image names its field (and for a further image its file),
    as the manifest of such a conversion lists the fields; without, the detail is the image's own.
    """

    reader: InputReader
    fields: tuple[RecordField, ...]
    max_side: int | None
    quality: int
    scales: tuple[int | None, ...] = (1,)
    patch: int | None = None
    tar_keys: bool = False
    names_fields: bool = False

    def build(self, record: PlannedRecord) -> tuple[dict[str, Any], tuple[str | None, ...]]:
        key = record.key
        if self.tar_keys:
            try:
                key = tar_key(key)
            except SchemaError as err:
                raise RejectError(err.message, reason="bad-key") from err
        _check_key(key)
        images = [item for item in self.fields if item.is_image]
        members = [item for item in self.fields if item.member]
        image_files, member_files = record.files[: len(images)], record.files[len(images) :]
        for item, file in zip(members, member_files, strict=True):
            if file.size > MAX_MEMBER_SIZE:
                raise RejectError(f"member {item.name!r} is {file.size} bytes, over the member limit of {MAX_MEMBER_SIZE}",
                                  reason="too-large")
        fields, reasons = self._images(images, image_files)
        values = [item.name for item in self.fields if not item.is_image and not item.member]
        fields.update(zip(values, record.values, strict=True))
        fields["key"] = key
        for item, file in zip(members, member_files, strict=True):
            fields[item.name] = member_value(self.reader.read(file), item.kind, item.name)
        return fields, reasons

    def _images(self, images: list[RecordField], files: tuple[InputFile, ...]) -> tuple[dict[str, Any], tuple[str | None, ...]]:
        """The stored images of a record, and per JPEG field why it was re-encoded (steps 2 and 3)."""
        datas, headers = [], []
        for n, (file, item) in enumerate(zip(files, images, strict=True)):
            try:
                data = self.reader.read(file)
                datas.append(data)
                headers.append(read_header(data))
            except RejectError as err:
                raise self._in_field(err, item.name, file.path, n) from err
        ref_width, ref_height = headers[0].upright
        for n, (file, item, scale) in enumerate(zip(files, images, self.scales, strict=True)):
            size = headers[n].upright
            if n and scale is not None and size != (ref_width * scale, ref_height * scale):
                raise RejectError(
                    f"field {item.name!r} ({display_path(file.path)}) is {size[0]}x{size[1]}, not {scale} x "
                    f"{ref_width}x{ref_height} = {ref_width * scale}x{ref_height * scale} (--scale)",
                    reason="size-mismatch",
                )
        geometry = plan_geometry(ref_width, ref_height, max_side=self.max_side, patch=self.patch)
        fields: dict[str, Any] = {}
        reasons: list[str | None] = []
        for n, (data, header, file, item, scale) in enumerate(zip(datas, headers, files, images, self.scales, strict=True)):
            try:
                stored = store_image(data, kind=item.kind, geometry=geometry.scaled(scale or 1) if geometry is not None else None,
                                     quality=self.quality, header=header)
            except RejectError as err:
                raise self._in_field(err, item.name, file.path, n) from err
            value = stored.value
            fields[item.name] = HeadedJpeg(value, stored.info) if stored.info is not None and isinstance(value, bytes) else value
            if item.kind == "jpeg":
                reasons.append(stored.reencoded)
        return fields, tuple(reasons)

    def _in_field(self, err: RejectError, name: str, path: str, n: int) -> RejectError:
        """The reject of one image file: with `names_fields`, its detail names the field (and the
        file, for a further image); else as it is."""
        if not self.names_fields:
            return err
        where = f"field {name!r}" if n == 0 else f"field {name!r} ({display_path(path)})"
        return RejectError(f"{where}: {err.message}", reason=err.reason, transient=err.transient)


def member_value(data: bytes, kind: str, name: str) -> Any:
    """The value of a member of `kind` ("str", "json" or "bytes") from its bytes.

    Raises:
        RejectError: "bad-member": text that is not UTF-8, or JSON that is not strict JSON text.
    """
    if kind == "str":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RejectError(f"member {name!r} is not UTF-8 text: {err}", reason="bad-member") from err
    if kind == "json":
        try:
            return parse_json(data)
        except JsonTextError as err:
            raise RejectError(f"member {name!r} is not JSON text: {err}", reason="bad-member") from err
    return data


def _check_key(key: str) -> None:
    """Reject a record whose key breaks the key rule of every output (`tar.keys.key_problem`)."""
    problem = key_problem(key)
    if problem is not None:
        raise RejectError(problem, reason="bad-key")


def builder_for(plan: ConversionPlan, *, remote: RemoteOptions | None) -> RecordBuilder:
    """The record builder of `plan`'s fields, reading inputs from its root."""
    reader = InputReader(plan.root, remote, plan.options.get("image_column"), plan.options.get("image_root"),
                         confined=plan.kind in LISTING_KINDS and not is_url(plan.root))
    return RecordBuilder(reader, plan.fields, plan.options["max_side"], plan.options["quality"], plan.scales, plan.patch,
                         tar_keys=plan.shard_format == "tar", names_fields=plan.names_fields)


def build_chunk(builder: RecordBuilder, chunk: Chunk, scratch: memoryview | None = None) -> list[Built]:
    """Build every record of `chunk` (this runs in a worker process, a Ray task or inline).

    Args:
        builder: the plan's record builder.
        chunk: the records.
        scratch: memory shared with the converting process, where the records' byte values go
            while they fit (`Placed`); None sends them back in the result.

    Raises:
        RemoteError: a store did not answer within its retries, naming the input.
        WorkerError: anything else other than a per-record reject, naming the input.
    """
    built = []
    used = 0
    for number, record in chunk.records:
        try:
            fields, reasons = builder.build(record)
        except RejectError as err:
            built.append(Built(number, None, reject=(err.reason, err.message), transient=err.transient))
            continue
        except RemoteError:  # the store is unreachable (its message names the object): the run stops, nothing is rejected
            raise
        except Exception as err:
            where = _where(record)
            message = err.message if isinstance(err, ShardfmtError) else str(err)
            raise WorkerError(f"input {where}: {type(err).__name__}: {message}") from err
        if scratch is not None:
            fields, used = _place(fields, scratch, used)
        built.append(Built(number, fields, reasons))
    return built


def _where(record: PlannedRecord) -> str:
    return display_path(record.path) + (f": sample {record.sample_key}" if record.sample_key is not None else "")


def _place(fields: dict[str, Any], scratch: memoryview, used: int) -> tuple[dict[str, Any], int]:
    """The fields with each byte value copied into `scratch` from `used` on, while it fits."""
    placed = dict(fields)
    for name, value in fields.items():
        data, info = (value.data, value.info) if isinstance(value, HeadedJpeg) else (value, None)
        if not isinstance(data, (bytes, bytearray)) or used + len(data) > len(scratch):
            continue
        scratch[used : used + len(data)] = data
        placed[name] = Placed(used, len(data), info)
        used += len(data)
    return placed, used


def unplace(fields: dict[str, Any], scratch: memoryview | None) -> dict[str, Any]:
    """The fields with each `Placed` value replaced by a view of its bytes in `scratch` (a
    `HeadedJpeg` where the headers came along); the views are valid until the scratch memory
    is handed to the next chunk."""
    if scratch is None:
        return fields
    out = dict(fields)
    for name, value in fields.items():
        if isinstance(value, Placed):
            data = scratch[value.offset : value.offset + value.size]
            out[name] = data if value.info is None else HeadedJpeg(data, value.info)
    return out
