"""Schemas: the named, typed fields of a record, their canonical JSON and their record-table dtype."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SchemaError, UnsupportedVersionError
from .jsontext import JsonTextError, parse_json
from .layout import (
    ARRAY_TYPES,
    BASE_COLUMNS,
    FIELD_COLUMNS,
    MAX_FIELD_NAME_LENGTH,
    MAX_FIELD_SIZE,
    MAX_FIELDS,
    MAX_NDIM,
    NDARRAY_DTYPES,
    TYPE_SINCE_MINOR,
    VARIABLE_TYPES,
    column_name,
)

__all__ = ["IMAGE_CLASSIFICATION", "Field", "Schema", "parse_field_type"]

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED_NAMES = frozenset(name for name, _ in BASE_COLUMNS)


@dataclass(frozen=True)
class Field:
    """One named field of a record.

    Attributes:
        name: ASCII identifier, 1 to 64 characters, not "offset", "size" or "checksum".
        type: one of "jpeg", "raw", "ndarray", "int64", "float64", "str", "bytes", "json".
        dtype, shape: the element type (a key of `layout.NDARRAY_DTYPES`) and the fixed shape
            (1 to 8 positive sizes) of an "ndarray" field; None for every other type.
    """

    name: str
    type: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shape, list):
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def is_variable(self) -> bool:
        """True if the field's bytes live in the payload region rather than in the table."""
        return self.type in VARIABLE_TYPES

    @property
    def spec(self) -> str:
        """The type as `parse_field_type` reads it: "jpeg", or "ndarray:float32:3x4"."""
        if self.type in ARRAY_TYPES and self.shape is not None:
            return f"{self.type}:{self.dtype}:{'x'.join(map(str, self.shape))}"
        return self.type

    @property
    def nbytes(self) -> int | None:
        """The payload size every value of an "ndarray" field has; None for other types."""
        if self.type not in ARRAY_TYPES or self.shape is None or self.dtype not in NDARRAY_DTYPES:
            return None
        return math.prod(self.shape) * np.dtype(NDARRAY_DTYPES[self.dtype]).itemsize

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.type in ARRAY_TYPES:
            value["dtype"] = self.dtype
            value["shape"] = list(self.shape or ())
        return value


def parse_field_type(name: str, text: str) -> Field:
    """Return the field `name` of the type written as `text`: a type name, or for an array
    ``ndarray:DTYPE:SHAPE`` with SHAPE as sizes joined by "x" (``ndarray:float32:3x4``).

    Raises:
        SchemaError: the text is not of that form (the schema checks the values themselves).
    """
    parts = text.split(":")
    if parts[0] not in ARRAY_TYPES:
        if len(parts) != 1:
            raise SchemaError(f"field {name!r}: type {text!r} takes no parameters")
        return Field(name, text)
    if len(parts) != 3 or not re.fullmatch(r"[0-9]+(x[0-9]+)*", parts[2]):
        raise SchemaError(f"field {name!r}: write an array type as ndarray:DTYPE:SHAPE, e.g. ndarray:float32:3x4, not {text!r}")
    return Field(name, parts[0], parts[1], tuple(int(size) for size in parts[2].split("x")))


def _check_array(field: Field) -> None:
    """Check the dtype and shape of an "ndarray" field (unknown dtype: UnsupportedVersionError)."""
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
    nbytes = field.nbytes or 0
    if nbytes > MAX_FIELD_SIZE:
        raise SchemaError(f"{where} of shape {list(shape)} holds {nbytes} bytes, over the field limit of {MAX_FIELD_SIZE}")


@dataclass(frozen=True)
class Schema:
    """The ordered fields of every record in a dataset."""

    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        if not self.fields:
            raise SchemaError("a schema needs at least one field")
        if len(self.fields) > MAX_FIELDS:
            raise SchemaError(f"{len(self.fields)} fields exceed the limit of {MAX_FIELDS}")
        seen: set[str] = set()
        for field in self.fields:
            if not isinstance(field.name, str) or len(field.name) > MAX_FIELD_NAME_LENGTH or not _NAME_RE.match(field.name):
                raise SchemaError(
                    f"field name {field.name!r} is not an ASCII identifier of 1 to {MAX_FIELD_NAME_LENGTH} characters"
                )
            if field.name in _RESERVED_NAMES:
                raise SchemaError(f"field name {field.name!r} is reserved for the record table")
            if field.name in seen:
                raise SchemaError(f"field name {field.name!r} appears twice")
            seen.add(field.name)
            if field.type not in FIELD_COLUMNS:
                raise UnsupportedVersionError(
                    f"field {field.name!r} has type {field.type!r}, which this reader does not know "
                    f"(known: {', '.join(sorted(FIELD_COLUMNS))}); upgrade shardfmt"
                )
            if field.type in ARRAY_TYPES:
                _check_array(field)
            elif field.dtype is not None or field.shape is not None:
                raise SchemaError(f"field {field.name!r} of type {field.type!r} takes no dtype or shape")

    @classmethod
    def of(cls, **types: str) -> Schema:
        """Build a schema from keyword arguments in order: ``Schema.of(image="jpeg", label="int64")``;
        an array type is written ``"ndarray:float32:3x4"`` (see `parse_field_type`)."""
        return cls(tuple(parse_field_type(name, type_) for name, type_ in types.items()))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(field.name for field in self.fields)

    def field(self, name: str) -> Field:
        """Return the field called `name`.

        Raises:
            SchemaError: no field has that name.
        """
        for field in self.fields:
            if field.name == name:
                return field
        raise SchemaError(f"no field {name!r} in schema (fields: {', '.join(self.names)})")

    def to_json(self) -> dict[str, Any]:
        return {"fields": [f.to_json() for f in self.fields]}

    def to_bytes(self) -> bytes:
        """Return the canonical encoding stored in shards: sorted keys, no spaces, UTF-8."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, value: Any) -> Schema:
        """Parse the JSON form.

        Raises:
            SchemaError: the value is not a schema.
            UnsupportedVersionError: a field type is unknown to this reader.
        """
        if not isinstance(value, dict) or not isinstance(value.get("fields"), list):
            raise SchemaError('a schema is an object with a "fields" list')
        fields = []
        for i, item in enumerate(value["fields"]):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("type"), str):
                raise SchemaError(f'schema field {i} needs string "name" and "type"')
            if item["type"] in ARRAY_TYPES:
                shape = item.get("shape")
                fields.append(Field(item["name"], item["type"], item.get("dtype"), tuple(shape) if isinstance(shape, list) else shape))
            else:  # parameters of other types are not defined: ignored, as the spec says
                fields.append(Field(item["name"], item["type"]))
        return cls(tuple(fields))

    @classmethod
    def from_bytes(cls, data: bytes) -> Schema:
        """Parse the encoding stored in shards: JSON text, read strictly (`jsontext.parse_json`)."""
        try:
            value = parse_json(data)
        except JsonTextError as err:
            raise SchemaError(f"schema is not valid JSON text: {err}") from err
        return cls.from_json(value)

    def check_version(self, minor: int) -> None:
        """Check that every field type exists in format version 1.`minor` (1.0 has no raw or
        ndarray fields): a file that states an older version than its types need is malformed.

        Raises:
            SchemaError: naming the first field whose type is newer than the version.
        """
        for field in self.fields:
            since = TYPE_SINCE_MINOR[field.type]
            if minor < since:
                raise SchemaError(
                    f"field {field.name!r} has type {field.type!r}, which format version 1.{since} added, "
                    f"but the version stated is 1.{minor}"
                )

    def record_dtype(self) -> np.dtype[Any]:
        """Return the packed, little-endian numpy dtype of one record-table row."""
        columns = list(BASE_COLUMNS)
        for field in self.fields:
            columns.extend((column_name(field.name, col), fmt) for col, fmt in FIELD_COLUMNS[field.type])
        return np.dtype(columns)

    @property
    def variable_fields(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.is_variable)


IMAGE_CLASSIFICATION = Schema.of(image="jpeg", label="int64", key="str")
"""The schema `shardfmt convert` writes for ImageFolder trees and listings."""
