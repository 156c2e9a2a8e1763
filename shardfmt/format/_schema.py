"""Schemas: the named, typed fields of a record, their canonical JSON and their record-table dtype."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import SchemaError, UnsupportedVersionError
from .._jsontext import JsonTextError, parse_json
from ._fieldtypes import FIELD_TYPES, FieldType
from ._layout import (
    BASE_COLUMNS,
    MAX_FIELD_NAME_LENGTH,
    MAX_FIELDS,
    TYPE_SINCE_MINOR,
    column_name,
)

__all__ = ["IMAGE_CLASSIFICATION", "TAR_MEMBER_TYPES", "Field", "Schema", "parse_field_type", "tar_schema", "tar_schema_problem"]

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

    What depends on the type (columns, parameters, encoding, checks, decoding) is in its
    `fieldtypes.FieldType`, `kind`.
    """

    name: str
    type: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shape, list):
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def kind(self) -> FieldType:
        """The field's type, from `fieldtypes.FIELD_TYPES`.

        Raises:
            UnsupportedVersionError: this reader does not know the type.
        """
        kind = FIELD_TYPES.get(self.type)
        if kind is None:
            raise UnsupportedVersionError(
                f"field {self.name!r} has type {self.type!r}, which this reader does not know "
                f"(known: {', '.join(sorted(FIELD_TYPES))}); upgrade shardfmt"
            )
        return kind

    @property
    def is_variable(self) -> bool:
        """True if the field's bytes live in the payload region rather than in the table."""
        kind = FIELD_TYPES.get(self.type)
        return kind is not None and kind.is_variable

    @property
    def spec(self) -> str:
        """The type as `parse_field_type` reads it: "jpeg", or "ndarray:float32:3x4"."""
        kind = FIELD_TYPES.get(self.type)
        return kind.spec(self) if kind is not None else self.type

    @property
    def nbytes(self) -> int | None:
        """The payload size every value of the field has ("ndarray"); None if values vary."""
        kind = FIELD_TYPES.get(self.type)
        return kind.nbytes(self) if kind is not None else None

    def to_json(self) -> dict[str, Any]:
        kind = FIELD_TYPES.get(self.type)
        return {"name": self.name, "type": self.type, **(kind.parameters(self) if kind is not None else {})}


def parse_field_type(name: str, text: str) -> Field:
    """Return the field `name` of the type written as `text`: a type name, or for an array
    ``ndarray:DTYPE:SHAPE`` with SHAPE as sizes joined by "x" (``ndarray:float32:3x4``).

    Raises:
        SchemaError: the text is not of that form (the schema checks the values themselves).
    """
    parts = text.split(":")
    kind = FIELD_TYPES.get(parts[0])
    if kind is None:
        if len(parts) != 1:
            raise SchemaError(f"field {name!r}: type {text!r} takes no parameters")
        return Field(name, text)  # the schema refuses the unknown type by name
    dtype, shape = kind.parse_parameters(name, text, parts[1:])
    return Field(name, parts[0], dtype, shape)


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
            field.kind.check_parameters(field)

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
            kind = FIELD_TYPES.get(item["type"])
            dtype, shape = kind.json_parameters(item) if kind is not None else (None, None)
            fields.append(Field(item["name"], item["type"], dtype, shape))
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
            columns.extend((column_name(field.name, col), fmt) for col, fmt in field.kind.columns)
        return np.dtype(columns)

    @property
    def variable_fields(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.is_variable)


IMAGE_CLASSIFICATION = Schema.of(image="jpeg", label="int64", key="str")
"""The schema `shardfmt convert` writes for ImageFolder trees and listings."""


TAR_MEMBER_TYPES = ("str", "json", "bytes")
"""Types a field of a tar dataset may have besides its image, label and key: one per member."""


def tar_schema(*, labelled: bool = True, members: tuple[tuple[str, str], ...] = ()) -> Schema:
    """The schema of a tar dataset (spec/tar.md, section 3): ``image`` (jpeg), ``label`` (int64)
    when the samples are labelled, ``key`` (str), then one field per further member, as (name,
    type) pairs with a type of `TAR_MEMBER_TYPES`."""
    fields = [Field("image", "jpeg")] + ([Field("label", "int64")] if labelled else []) + [Field("key", "str")]
    return Schema(tuple(fields + [Field(name, kind) for name, kind in members]))


def tar_schema_problem(schema: Schema) -> str | None:
    """None if `schema` is one `tar_schema` makes, else what is wrong with it."""
    names = list(schema.names)
    head = ["image", "label", "key"] if names[1:2] == ["label"] else ["image", "key"]
    if names[: len(head)] != head or any(
        schema.field(name) != Field(name, {"image": "jpeg", "label": "int64", "key": "str"}[name]) for name in head
    ):
        return "tar shards hold image (jpeg), then label (int64) or no label, then key (str), then member fields"
    for field in schema.fields[len(head) :]:
        if field.type not in TAR_MEMBER_TYPES:
            return f"field {field.name!r} is {field.spec}: a member of a tar shard is {', '.join(TAR_MEMBER_TYPES)}"
        if field.name in ("label",):
            return "label comes right after image"
    return None
