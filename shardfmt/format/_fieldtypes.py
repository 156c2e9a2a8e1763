"""Field types (spec/format.md, section 7): one class per type a schema field may have.

A field type owns everything that depends on it: its record-table columns, the parameters its
schema entry takes, how `ShardWriter` encodes a value, which rules `ShardReader` checks on its
columns (vectorised, on open) and how `Record` decodes a stored value. `FIELD_TYPES` maps the
names a schema uses to them; a name it lacks is a type this reader does not know.
"""

from __future__ import annotations

import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

import numpy as np

from .._errors import FormatError, SchemaError, UnsupportedVersionError
from .._jsontext import JsonTextError, parse_json
from ._jpeg import JpegInfo, read_jpeg_info
from ._layout import (
    JPEG_CHANNELS,
    MAX_FIELD_SIZE,
    MAX_NDIM,
    NDARRAY_DTYPES,
    RAW_CHANNELS,
    column_name,
)

__all__ = [
    "FIELD_TYPES",
    "IMAGE_TYPES",
    "BytesType",
    "FieldLike",
    "FieldType",
    "Float64Type",
    "HeadedJpeg",
    "Int64Type",
    "InvalidValue",
    "JpegType",
    "JsonType",
    "NdarrayType",
    "RawType",
    "StrType",
]

Column = tuple[str, str]
"""(column, numpy format); the column "" is the field itself, others are "name.column"."""
Encoded = tuple[bytes | memoryview | None, tuple[Any, ...]]
"""What `FieldType.encode` returns: (payload, table columns). A fixed-size type has no payload
and gives all its columns; a variable-size type gives its payload and the columns that follow
its ``offset`` and ``size`` (which the writer fills in)."""

_SPAN: Final[tuple[Column, ...]] = (("offset", "<u8"), ("size", "<u8"))
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class FieldLike(Protocol):
    """What a field type reads of a schema field (`schema.Field` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def shape(self) -> tuple[int, ...] | None: ...


class RaiseFirst(Protocol):
    """The reader's reporter: raise `cls` naming the first row where `bad` is set, at `column`."""

    def __call__(self, bad: np.ndarray[Any, Any], message: str, column: str, cls: type[FormatError] = ...) -> None: ...


class InvalidValue(ValueError):
    """A stored value that does not decode (text that is not UTF-8, JSON that does not parse);
    the reader turns it into a `FormatError` that says where the value lies."""


class FieldType(ABC):
    """A field type: its name in the schema, its columns, and the rules for its values.

    Subclasses set `name` and `columns` and override what their values need; the defaults
    describe a type without schema parameters and without rules on its columns.
    """

    name: ClassVar[str]
    columns: ClassVar[tuple[Column, ...]]
    is_image: ClassVar[bool] = False
    """True for types with height, width and channels columns."""
    takes_parameters: ClassVar[bool] = False
    """True for types whose schema entry carries "dtype" and "shape"."""

    def __init__(self) -> None:
        self.is_variable = self.columns[:2] == _SPAN
        """True if values live in the payload region (the columns start with offset, size)."""

    # -- the schema entry --------------------------------------------------------------------

    def parse_parameters(self, name: str, text: str, parameters: list[str]) -> tuple[str | None, tuple[int, ...] | None]:
        """Return (dtype, shape) from the parts after the type in ``TYPE:...`` (see
        `schema.parse_field_type`).

        Raises:
            SchemaError: the type takes no such parameters.
        """
        if parameters:
            raise SchemaError(f"field {name!r}: type {text!r} takes no parameters")
        return None, None

    def json_parameters(self, item: Mapping[str, Any]) -> tuple[Any, Any]:
        """Return (dtype, shape) from a schema entry; parameters a type does not define are
        ignored, as spec/format.md says."""
        return None, None

    def parameters(self, field: FieldLike) -> dict[str, Any]:
        """Return the parameters of `field` as its schema entry stores them."""
        return {}

    def spec(self, field: FieldLike) -> str:
        """Return the type of `field` as `schema.parse_field_type` reads it."""
        return self.name

    def check_parameters(self, field: FieldLike) -> None:
        """Check the parameters of `field`.

        Raises:
            SchemaError: a parameter is missing, malformed or not defined for the type.
            UnsupportedVersionError: a parameter names something this reader does not know.
        """
        if field.dtype is not None or field.shape is not None:
            raise SchemaError(f"field {field.name!r} of type {field.type!r} takes no dtype or shape")

    def nbytes(self, field: FieldLike) -> int | None:
        """Return the payload size every value of `field` has, or None if values vary."""
        return None

    # -- values ------------------------------------------------------------------------------

    @abstractmethod
    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        """Return the payload and table columns of `value` (see `Encoded`).

        Raises:
            SchemaError: naming `where`: the value is of the wrong kind or cannot be stored.
        """

    def check_table(self, field: FieldLike, table: np.ndarray[Any, Any], raise_first: RaiseFirst) -> None:
        """Check the rules of this type on the columns of `field` in every row of `table`; the
        reader has already checked the span (offset, size) of a variable-size field."""
        return  # the default: a type whose columns have no rule beyond that span

    @abstractmethod
    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> Any:
        """Return the value of `field` in record `index` from the record `table` and the
        field's payload `data` (verified; empty for a fixed-size type).

        Raises:
            InvalidValue: the stored bytes are not a value of this type.
        """


def _bounded(data: bytes | memoryview, where: str) -> bytes | memoryview:
    if len(data) > MAX_FIELD_SIZE:
        raise SchemaError(f"{where} is {len(data)} bytes, over the limit of {MAX_FIELD_SIZE}")
    return data


def _type_name(value: Any) -> str:
    return type(value).__name__


def _byte_string(value: Any, where: str) -> memoryview:
    """Return a bytes-like `value` as a flat view, within the field size limit."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise SchemaError(f"{where} needs bytes, got {_type_name(value)}")
    data = memoryview(value).cast("B")
    _bounded(data, where)
    return data


class Int64Type(FieldType):
    """A signed 64-bit integer, stored in the table."""

    name = "int64"
    columns = (("", "<i8"),)

    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise SchemaError(f"{where} needs an int, got {_type_name(value)}")
        if not _INT64_MIN <= int(value) <= _INT64_MAX:
            raise SchemaError(f"{where} value {value} does not fit in int64")
        return None, (int(value),)

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> int:
        return int(table[index][field.name])


class Float64Type(FieldType):
    """An IEEE 754 double, stored in the table."""

    name = "float64"
    columns = (("", "<f8"),)

    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise SchemaError(f"{where} needs a float, got {_type_name(value)}")
        return None, (float(value),)

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> float:
        return float(table[index][field.name])


class BytesType(FieldType):
    """Any bytes; read back as a zero-copy memoryview."""

    name = "bytes"
    columns = _SPAN

    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        return _byte_string(value, where), ()

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> Any:
        return data


class StrType(FieldType):
    """Text, stored as UTF-8."""

    name = "str"
    columns = _SPAN

    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        if not isinstance(value, str):
            raise SchemaError(f"{where} needs a str, got {_type_name(value)}")
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise SchemaError(f"{where} is not encodable as UTF-8: {err}") from err
        return _bounded(data, where), ()

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidValue(f"is not valid UTF-8: {err}") from err


class JsonType(FieldType):
    """A JSON value, stored canonically: sorted keys, no spaces, UTF-8, no NaN."""

    name = "json"
    columns = _SPAN

    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        try:
            data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
            parse_json(data)  # what readers refuse is not written: integers beyond 64 bits, ...
        except (TypeError, ValueError) as err:
            raise SchemaError(f"{where} is not JSON-serialisable: {err}") from err
        return _bounded(data, where), ()

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> Any:
        try:
            return parse_json(data)
        except JsonTextError as err:
            raise InvalidValue(f"is not valid JSON text: {err}") from err


class _ImageType(FieldType):
    """An image: height, width and channels columns, checked on open."""

    is_image = True
    channels: ClassVar[tuple[int, ...]]
    """The channel counts a value may have."""

    def check_table(self, field: FieldLike, table: np.ndarray[Any, Any], raise_first: RaiseFirst) -> None:
        """Rules 28c to 28e: non-zero sides, a known channel count, a zero reserved column."""
        name = field.name
        height, width = table[column_name(name, "height")], table[column_name(name, "width")]
        raise_first((height == 0) | (width == 0), f"image {name!r} has a zero height or width", column_name(name, "height"))
        channels = table[column_name(name, "channels")]
        unknown = channels != self.channels[0]
        for count in self.channels[1:]:  # a comparison per count: np.isin costs 25 us a call
            unknown &= channels != count
        raise_first(
            unknown,
            f"{self.name} image {name!r} channels are not {' or '.join(map(str, self.channels))}",
            column_name(name, "channels"),
        )
        raise_first(table[column_name(name, "reserved")] != 0, f"image {name!r} reserved column is not zero", column_name(name, "reserved"))


@dataclass(frozen=True)
class HeadedJpeg:
    """JPEG bytes with the headers `read_jpeg_info` read from these very bytes: a "jpeg" field
    takes them as they are instead of parsing the headers again (the converter reads every
    file's headers before deciding to keep it; parsing them again in the writer cost about 20 us
    a record). Not for headers of other bytes: the table would state a wrong size."""

    data: bytes | bytearray | memoryview
    info: JpegInfo


class JpegType(_ImageType):
    """A JPEG file, 8-bit and not lossless, with 1 or 3 components; read back as a zero-copy
    memoryview, its size known from the table."""

    name = "jpeg"
    columns = _SPAN + (("height", "<u2"), ("width", "<u2"), ("channels", "<u2"), ("reserved", "<u2"))
    channels = JPEG_CHANNELS

    @staticmethod
    def unstorable(info: JpegInfo) -> str | None:
        """Return why a JPEG with these headers cannot be stored ("4 components, 8-bit"), or None."""
        if info.components not in JPEG_CHANNELS or info.lossless or info.precision != 8:
            return f"{info.components} components, {info.precision}-bit{', lossless' if info.lossless else ''}"
        return None

    def encode(self, field: FieldLike, value: Any, where: str) -> tuple[memoryview, tuple[int, int, int, int]]:
        if isinstance(value, HeadedJpeg):
            data, info = _byte_string(value.data, where), value.info
        else:
            data = _byte_string(value, where)
            try:
                info = read_jpeg_info(data)
            except ValueError as err:
                raise SchemaError(f"{where} is not a JPEG: {err}") from err
        problem = self.unstorable(info)
        if problem is not None:
            raise SchemaError(f"{where}: a JPEG with {problem} cannot be stored; convert it to 8-bit RGB or grayscale")
        return data, (info.height, info.width, info.components, 0)

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> Any:
        return data


class RawType(_ImageType):
    """Raw uint8 pixels, H x W x C; read back as a read-only zero-copy numpy array."""

    name = "raw"
    columns = _SPAN + (("height", "<u4"), ("width", "<u4"), ("channels", "<u4"), ("reserved", "<u4"))
    """u32 sides: raw pixels are bound by no codec's 16-bit frame header, only by MAX_FIELD_SIZE."""
    channels = RAW_CHANNELS

    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim not in (2, 3):
            kind = f"{value.dtype} array of {value.ndim} dimensions" if isinstance(value, np.ndarray) else _type_name(value)
            raise SchemaError(f"{where} needs uint8 pixels as a numpy array H x W x C or H x W, got a {kind}")
        height, width = value.shape[:2]
        channels = value.shape[2] if value.ndim == 3 else 1
        if channels not in self.channels:
            raise SchemaError(f"{where} has {channels} channels; raw pixels have {', '.join(map(str, self.channels))}")
        if height == 0 or width == 0:
            raise SchemaError(f"{where} is {height} x {width}: a raw image needs at least one pixel")
        if value.size > MAX_FIELD_SIZE:
            raise SchemaError(f"{where} is {value.size} bytes, over the limit of {MAX_FIELD_SIZE}")
        return np.ascontiguousarray(value).data.cast("B"), (height, width, channels, 0)

    def check_table(self, field: FieldLike, table: np.ndarray[Any, Any], raise_first: RaiseFirst) -> None:
        """Rules 28c to 28f: those of every image, and a payload of height x width x channels."""
        super().check_table(field, table, raise_first)
        name = field.name
        # h * w is exact in u64 (both < 2^32); bounded by the field limit before the channel
        # product, so that nothing wraps around.
        pixels = table[column_name(name, "height")].astype(np.uint64) * table[column_name(name, "width")].astype(np.uint64)
        channels = table[column_name(name, "channels")].astype(np.uint64)
        expected = np.where(pixels <= np.uint64(MAX_FIELD_SIZE), pixels * channels, np.uint64(0))
        raise_first(
            (pixels > np.uint64(MAX_FIELD_SIZE)) | (table[column_name(name, "size")] != expected),
            f"raw image {name!r} payload size is not height x width x channels",
            column_name(name, "size"),
        )

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> Any:
        row = table[index]
        shape = tuple(int(row[column_name(field.name, side)]) for side in ("height", "width", "channels"))
        return np.frombuffer(data, np.uint8).reshape(shape)


class NdarrayType(FieldType):
    """A numpy array of the dtype and fixed shape its schema entry declares; read back as a
    read-only zero-copy numpy array."""

    name = "ndarray"
    columns = _SPAN
    takes_parameters = True

    def parse_parameters(self, name: str, text: str, parameters: list[str]) -> tuple[str | None, tuple[int, ...] | None]:
        if len(parameters) != 2 or not re.fullmatch(r"[0-9]+(x[0-9]+)*", parameters[1]):
            raise SchemaError(f"field {name!r}: write an array type as ndarray:DTYPE:SHAPE, e.g. ndarray:float32:3x4, not {text!r}")
        return parameters[0], tuple(int(size) for size in parameters[1].split("x"))

    def json_parameters(self, item: Mapping[str, Any]) -> tuple[Any, Any]:
        shape = item.get("shape")
        return item.get("dtype"), tuple(shape) if isinstance(shape, list) else shape

    def parameters(self, field: FieldLike) -> dict[str, Any]:
        return {"dtype": field.dtype, "shape": list(field.shape or ())}

    def spec(self, field: FieldLike) -> str:
        if field.shape is None:
            return self.name
        return f"{self.name}:{field.dtype}:{'x'.join(map(str, field.shape))}"

    def check_parameters(self, field: FieldLike) -> None:
        where = f"ndarray field {field.name!r}"
        if not isinstance(field.dtype, str):
            raise SchemaError(f'{where} needs a string "dtype"')
        if field.dtype not in NDARRAY_DTYPES:
            raise UnsupportedVersionError(
                f"{where} has dtype {field.dtype!r}, which this reader does not know "
                f"(known: {', '.join(NDARRAY_DTYPES)}); upgrade shardfmt"
            )
        shape = field.shape
        if not isinstance(shape, tuple) or not 1 <= len(shape) <= MAX_NDIM:
            raise SchemaError(f'{where} needs a "shape" of 1 to {MAX_NDIM} sizes')
        if not all(isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_FIELD_SIZE for size in shape):
            raise SchemaError(f"{where} has a shape whose sizes are not all integers from 1 to {MAX_FIELD_SIZE}")
        nbytes = self.nbytes(field) or 0
        if nbytes > MAX_FIELD_SIZE:
            raise SchemaError(f"{where} of shape {list(shape)} holds {nbytes} bytes, over the field limit of {MAX_FIELD_SIZE}")

    def nbytes(self, field: FieldLike) -> int | None:
        if field.shape is None or field.dtype not in NDARRAY_DTYPES:
            return None
        return math.prod(field.shape) * np.dtype(NDARRAY_DTYPES[field.dtype]).itemsize

    def encode(self, field: FieldLike, value: Any, where: str) -> Encoded:
        expected = np.dtype(NDARRAY_DTYPES[field.dtype or ""])
        if not isinstance(value, np.ndarray) or value.dtype.newbyteorder("<") != expected:
            kind = f"a {value.dtype} array" if isinstance(value, np.ndarray) else _type_name(value)
            raise SchemaError(f"{where} needs a numpy {field.dtype} array, got {kind}")
        if value.shape != field.shape:
            raise SchemaError(f"{where} has shape {list(value.shape)}, the schema declares {list(field.shape or ())}")
        return np.ascontiguousarray(value, dtype=expected).data.cast("B"), ()

    def check_table(self, field: FieldLike, table: np.ndarray[Any, Any], raise_first: RaiseFirst) -> None:
        nbytes = self.nbytes(field) or 0  # never 0: the schema checked dtype and shape
        raise_first(
            table[column_name(field.name, "size")] != np.uint64(nbytes),
            f"ndarray {field.name!r} payload size is not the {nbytes} bytes of its {field.dtype} shape {list(field.shape or ())}",
            column_name(field.name, "size"),
        )

    def decode(self, field: FieldLike, table: np.ndarray[Any, Any], index: int, data: memoryview) -> Any:
        return np.frombuffer(data, NDARRAY_DTYPES[field.dtype or ""]).reshape(field.shape or ())


FIELD_TYPES: Final[Mapping[str, FieldType]] = {
    kind.name: kind
    for kind in (JpegType(), RawType(), NdarrayType(), BytesType(), StrType(), JsonType(), Int64Type(), Float64Type())
}
"""Every field type this reader knows, by the name a schema gives it."""
IMAGE_TYPES: Final = frozenset(name for name, kind in FIELD_TYPES.items() if kind.is_image)
"""Types with height, width and channels columns."""
