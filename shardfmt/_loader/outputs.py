"""Which fields a `Loader` delivers: one `OutputSpec` per field, resolved from the loader's request.

`resolve_outputs` turns the loader's request (``fields=...``, or the single image and label)
into one `OutputSpec` per field: its type, the shape and dtype of one sample in a batch slot,
its kernel and, where the request leaves it open, what the record tables say: the channels of a
"raw" field, the size ratio of a further image field. Only then does it read every record table,
so a loader over a dataset of any size starts without touching one. Workers receive the specs as
plain config and build one filler per field (`fillers`).

Fields of `values.VALUE_TYPES` (``str``, ``json``, ``bytes``) have no fixed size and never go
through shared memory: `values.split_values` takes them out of the request before it comes here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Union

import numpy as np

from .._dataset.concat import RecordSource
from .._errors import SchemaError
from ..format._fieldtypes import IMAGE_TYPES
from ..format._layout import NDARRAY_DTYPES, column_name
from ..ops import ImageOutput, Pipeline
from ..ops._transform import named_pipeline
from .shm import SlotArray

__all__ = ["FieldRequest", "OutputSpec", "normalise_request", "resolve_outputs", "resolve_pipeline"]

FieldRequest = Union[Mapping[str, ImageOutput | int | tuple[int, int] | None], Sequence[str]]
"""What ``Loader(fields=...)`` takes: field name -> ImageOutput (or its size, or None for the
defaults), or a list of names, each with the defaults."""

_SCALARS = {"int64": "<i8", "float64": "<f8"}


@dataclass(frozen=True)
class OutputSpec:
    """One delivered field: `shape` and `dtype` of one sample (H x W x C uint8 for images)."""

    name: str
    type: str
    shape: tuple[int, ...]
    dtype: str
    interpolation: str = "bilinear"
    max_size: tuple[int, int] = (1, 1)

    @property
    def is_image(self) -> bool:
        return self.type in IMAGE_TYPES

    @property
    def dct_scaled(self) -> bool:
        """Whether `ImageDecoder` may decode this field at a reduced DCT scale (a bilinear or
        bicubic jpeg)."""
        return self.type == "jpeg" and self.interpolation != "nearest"

    def slot_array(self) -> SlotArray:
        return SlotArray(self.name, self.shape, self.dtype)

    def to_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "interpolation": self.interpolation,
            "max_size": list(self.max_size),
        }

    @classmethod
    def from_config(cls, value: dict[str, Any]) -> OutputSpec:
        return cls(value["name"], value["type"], tuple(value["shape"]), value["dtype"], value["interpolation"], tuple(value["max_size"]))


def resolve_pipeline(pipeline: Pipeline | str, size: int | tuple[int, int]) -> Pipeline:
    """Return the pipeline object for a name ("train", "eval", "resize") or the object itself
    (`shardfmt.ops._transform.named_pipeline`).

    Raises:
        TypeError: `pipeline` is neither a name nor a `Pipeline` (`ops._crop.check_pipeline`).
        ValueError: an unknown name.
    """
    return named_pipeline(pipeline, (size, size) if isinstance(size, int) else (size[0], size[1]))


def resolve_outputs(
    dataset: RecordSource,
    *,
    fields: FieldRequest | None,
    pipeline: Pipeline | str,
    size: int | tuple[int, int],
    image_field: str,
    label_field: str | None,
    interpolation: str = "bilinear",
) -> tuple[Pipeline, tuple[OutputSpec, ...]]:
    """Resolve what a loader delivers, in order; the first image field is the reference.

    Without `fields`: `image_field` as 3-channel images and `label_field` (int64, or zeros).
    A dataset without labels (an image-text tar dataset) gives images alone when `label_field`
    is the default "label": no label field, no zeros.
    `interpolation` is the crop's resize of every image field the loader makes the output of
    (an `ImageOutput` given in `fields` keeps its own).

    Raises:
        SchemaError: a field is missing, or of a type the loader cannot deliver (str, bytes,
            json), or the single-image form's fields are not an image and an int64.
        ValueError: the request is malformed, or the reference's size is not the pipeline's.
    """
    schema = dataset.schema
    if fields is None:
        requests, zeros = _single_request(schema, image_field=image_field, label_field=label_field, interpolation=interpolation)
    else:
        requests, zeros = normalise_request(fields, interpolation), False
    images = [name for name in requests if schema.field(name).type in IMAGE_TYPES]
    reference_size = requests[images[0]].size if images and requests[images[0]] is not None else None
    if isinstance(pipeline, str) and reference_size is not None:
        size = reference_size
    resolved = resolve_pipeline(pipeline, size)
    if reference_size not in (None, resolved.size):
        raise ValueError(
            f"the reference field {images[0]!r} has size {reference_size}, but the pipeline crops to "
            f"{resolved.size}; give the pipeline that size"
        )
    reference = images[0] if images else None
    stats = _stats_needed(dataset, requests, images)
    specs = [_field_spec(name, request, schema, stats, reference, resolved.size, interpolation) for name, request in requests.items()]
    if zeros:
        specs.append(OutputSpec(".labels", "zeros", (), "<i8"))  # not an identifier: no field has it
    return resolved, tuple(specs)


def _single_request(schema: Any, *, image_field: str, label_field: str | None, interpolation: str) -> tuple[dict[str, Any], bool]:
    """The request of the (images, labels) form, and whether it delivers zeros as its labels.

    Raises:
        SchemaError: the fields are not an image and an int64 label.
    """
    kind = schema.field(image_field).type
    if kind not in IMAGE_TYPES:
        raise SchemaError(f"field {image_field!r} is {kind!r}, the loader needs 'jpeg' or 'raw'")
    unlabelled = label_field == "label" and "label" not in schema.names
    if unlabelled:
        label_field = None
    if label_field is not None and schema.field(label_field).type != "int64":
        raise SchemaError(f"field {label_field!r} is {schema.field(label_field).type!r}, the loader needs 'int64'")
    requests: dict[str, Any] = {image_field: ImageOutput(channels=3, interpolation=interpolation)}
    if label_field is not None:
        requests[label_field] = None
    return requests, label_field is None and not unlabelled


def _stats_needed(dataset: RecordSource, requests: dict[str, Any], images: list[str]) -> dict[str, _ImageStats]:
    """The stats of every image field, read from the record tables only where the request
    leaves something open (a raw field's channels, a further field's size); else the defaults."""
    schema = dataset.schema
    reference = images[0] if images else None
    needed = [
        name for name in images
        if (schema.field(name).type == "raw" and (requests[name] is None or requests[name].channels is None))
        or (name != reference and (requests[name] is None or requests[name].size is None))
    ]
    stats = _image_stats(dataset, list(dict.fromkeys([images[0], *needed])) if needed else [])
    return {name: stats.get(name, _ImageStats()) for name in images}


def _field_spec(
    name: str,
    request: Any,
    schema: Any,
    stats: dict[str, _ImageStats],
    reference: str | None,
    base: tuple[int, int],
    interpolation: str,
) -> OutputSpec:
    """The spec of field `name` as `request` asks for it.

    Raises:
        SchemaError: the field is of a type the loader cannot deliver in a slot.
        ValueError: a field delivered as stored is given options.
    """
    field = schema.field(name)
    if field.type in IMAGE_TYPES:
        return _image_spec(
            name, field.type, request if request is not None else ImageOutput(interpolation=interpolation), stats, reference, base
        )
    if field.type == "ndarray":
        _no_options(name, field.type, request)
        return OutputSpec(name, "ndarray", tuple(field.shape or ()), NDARRAY_DTYPES[field.dtype or ""])
    if field.type in _SCALARS:
        _no_options(name, field.type, request)
        return OutputSpec(name, field.type, (), _SCALARS[field.type])
    raise SchemaError(f"field {name!r} is {field.type!r}: the loader delivers jpeg, raw, ndarray, int64 and float64 fields")


def normalise_request(fields: FieldRequest, interpolation: str = "bilinear") -> dict[str, Any]:
    """`fields` as field name -> `ImageOutput` or None, a size given as an `ImageOutput` of it."""
    if isinstance(fields, str):
        raise ValueError("fields is a mapping of field names or a list of them, not one string")
    if not isinstance(fields, (Mapping, list, tuple)):
        raise TypeError(f"fields must be a mapping from field name to ImageOutput, size or None, or a list of names, got {fields!r}")
    items = fields.items() if isinstance(fields, Mapping) else ((name, None) for name in fields)
    requests: dict[str, Any] = {}
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"fields must name fields by str, got {name!r}")
        if name in requests:
            raise ValueError(f"field {name!r} is asked for twice")
        if isinstance(value, (int, tuple)) and not isinstance(value, bool):
            value = ImageOutput(size=value, interpolation=interpolation)
        if value is not None and not isinstance(value, ImageOutput):
            raise ValueError(f"fields[{name!r}] must be an ImageOutput, a size or None, got {value!r}")
        requests[name] = value
    if not requests:
        raise ValueError("fields names no field")
    return requests


def _no_options(name: str, kind: str, request: Any) -> None:
    if request is not None:
        raise ValueError(f"field {name!r} is {kind}: it is delivered as stored, so give None rather than {request!r}")


@dataclass
class _ImageStats:
    max_height: int = 1
    max_width: int = 1
    """Largest stored size where the tables were read; else 1, and decoders grow as they go."""
    channels: set[int] = dataclass_field(default_factory=set)
    ratio: tuple[int, int, int, int] | None = None
    """(field h, reference h, field w, reference w) of the first record if every record has the
    same ratio of sizes to the reference, else None."""


def _image_stats(dataset: RecordSource, images: list[str]) -> dict[str, _ImageStats]:
    """Largest sizes, channel counts and size ratio to the reference (the first name) of each
    image field, from every record table."""
    stats = {name: _ImageStats() for name in images}
    if not images:
        return stats
    if dataset.is_remote:  # every table is read next: open the shards concurrently
        dataset.open_shards(range(dataset.num_shards))
    first: dict[str, tuple[int, int, int, int] | None] = {}
    for shard_index in range(dataset.num_shards):
        shard = dataset.shard(shard_index)
        shard.check_all()
        table = shard.table
        if not len(table):
            continue
        ref_h = table[column_name(images[0], "height")].astype(np.int64)
        ref_w = table[column_name(images[0], "width")].astype(np.int64)
        for name in images:
            h = table[column_name(name, "height")].astype(np.int64)
            w = table[column_name(name, "width")].astype(np.int64)
            item = stats[name]
            item.max_height = max(item.max_height, int(h.max()))
            item.max_width = max(item.max_width, int(w.max()))
            item.channels.update(int(c) for c in np.unique(table[column_name(name, "channels")]))
            if name not in first:
                first[name] = (int(h[0]), int(ref_h[0]), int(w[0]), int(ref_w[0]))
            ratio = first[name]
            if ratio is not None and not (np.all(h * ratio[1] == ref_h * ratio[0]) and np.all(w * ratio[3] == ref_w * ratio[2])):
                first[name] = None
    for name in images:
        stats[name].ratio = first.get(name)
    return stats


def _image_spec(
    name: str, kind: str, request: ImageOutput | None, stats: dict[str, _ImageStats], reference: str | None, base: tuple[int, int]
) -> OutputSpec:
    request = request if request is not None else ImageOutput()
    item = stats[name]
    size = request.size
    if isinstance(size, int):  # ImageOutput stores a pair; its type still admits the int it was given
        size = (size, size)
    if size is None:
        size = base
        if name != reference and item.ratio is not None:
            fh, rh, fw, rw = item.ratio
            if (base[0] * fh) % rh == 0 and (base[1] * fw) % rw == 0:
                size = (base[0] * fh // rh, base[1] * fw // rw)
    channels = request.channels
    if channels is None:
        channels = next(iter(item.channels)) if kind == "raw" and len(item.channels) == 1 else 3
    return OutputSpec(name, kind, (size[0], size[1], channels), "|u1", request.interpolation, (item.max_height, item.max_width))
