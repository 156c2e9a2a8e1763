"""Which fields a `Loader` delivers, and the step that fills one field of one slot row.

`resolve_outputs` turns the loader's request (``fields=...``, or the single image and label)
into one `OutputSpec` per field: its type, the shape and dtype of one sample in a batch slot,
its kernel and, where the request leaves it open, what the record tables say: the channels of a
"raw" field, the size ratio of a further image field. Only then does it read every record table,
so a loader over a dataset of any size starts without touching one. Workers receive the specs as
plain config and build one filler per field with `make_filler`:

- "jpeg": decoded at a reduced DCT scale where the box allows, cropped, resized (`ImageDecoder`,
  made again larger whenever an image exceeds its buffer);
- "raw": the box is cut from a view of the memory-mapped shard, its channels matched, and
  resized straight into the slot, or copied when it already has the output size: no other copy;
- "ndarray", "int64", "float64": copied as stored; "zeros": the labels of a loader without a
  label field.

A spec of type "index" (``Loader(return_indices=True)``, `options.index_output`) has no filler:
the worker writes the chunk's dataset indices into it at once.

Fields of `VALUE_TYPES` (``str``, ``json``, ``bytes``: captions, metadata, keys) have no fixed
size and never go through shared memory: `split_values` takes them out of the request, and
`read_values` reads them in the loader's process for the records of each batch, as lists of one
value a sample (str, the parsed JSON value, bytes).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Union

import numpy as np
import torch

from .._dataset.concat import RecordSource
from .._errors import FormatError, SchemaError
from ..format._fieldtypes import IMAGE_TYPES, InvalidValue
from ..format._layout import NDARRAY_DTYPES, column_name
from ..format._reader import ShardReaderBase
from ..ops import CenterCrop, ImageOutput, Pipeline, RandomCrop, RandomResizedCrop, Resize
from ..ops._decode import ImageDecoder
from ..ops._resize import Resizer, match_channels
from ..tar._reader import TarShardReader
from .shm import SlotArray

__all__ = ["VALUE_TYPES", "FieldRequest", "OutputSpec", "make_filler", "read_values", "resolve_outputs", "resolve_pipeline", "split_values"]

FieldRequest = Union[Mapping[str, ImageOutput | int | tuple[int, int] | None], Sequence[str]]
"""What ``Loader(fields=...)`` takes: field name -> ImageOutput (or its size, or None for the
defaults), or a list of names, each with the defaults."""

_SCALARS = {"int64": "<i8", "float64": "<f8"}
VALUE_TYPES = ("str", "json", "bytes")
"""Field types a loader delivers as Python lists, read in its own process (`read_values`)."""


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
    """Return the pipeline object for a name ("train", "eval", "resize") or the object itself.

    Raises:
        TypeError: `pipeline` is neither a name nor one of `ops`' pipelines.
        ValueError: an unknown name.
    """
    if isinstance(pipeline, (RandomResizedCrop, RandomCrop, CenterCrop, Resize)):
        return pipeline
    if not isinstance(pipeline, str):
        raise TypeError(
            (
                "pipeline must be 'train', 'eval', 'resize' or a pipeline of shardfmt.ops (RandomResizedCrop, RandomCrop, CenterCrop, "
                f"Resize), got {pipeline!r}"
            )
        )
    pair = (size, size) if isinstance(size, int) else (size[0], size[1])
    if pipeline == "train":
        return RandomResizedCrop(pair)
    if pipeline == "eval":
        return CenterCrop(pair, resize=round(max(pair) / 0.875))
    if pipeline == "resize":
        return Resize(pair)
    raise ValueError(f"pipeline must be 'train', 'eval', 'resize' or a pipeline object, got {pipeline!r}")


def resolve_outputs(  # noqa: C901
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
    unlabelled = False
    if fields is None:
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
    else:
        requests = _normalise_request(fields, interpolation)
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
    needed = [
        name for name in images
        if (schema.field(name).type == "raw" and (requests[name] is None or requests[name].channels is None))
        or (name != reference and (requests[name] is None or requests[name].size is None))
    ]
    stats = _image_stats(dataset, list(dict.fromkeys([images[0], *needed])) if needed else [])
    stats = {name: stats.get(name, _ImageStats()) for name in images}
    specs = []
    for name, request in requests.items():
        field = schema.field(name)
        if field.type in IMAGE_TYPES:
            specs.append(
                _image_spec(
                    name,
                    field.type,
                    request if request is not None else ImageOutput(interpolation=interpolation),
                    stats,
                    reference,
                    resolved.size,
                )
            )
        elif field.type == "ndarray":
            _no_options(name, field.type, request)
            specs.append(OutputSpec(name, "ndarray", tuple(field.shape or ()), NDARRAY_DTYPES[field.dtype or ""]))
        elif field.type in _SCALARS:
            _no_options(name, field.type, request)
            specs.append(OutputSpec(name, field.type, (), _SCALARS[field.type]))
        else:
            raise SchemaError(f"field {name!r} is {field.type!r}: the loader delivers jpeg, raw, ndarray, int64 and float64 fields")
    if fields is None and label_field is None and not unlabelled:
        specs.append(OutputSpec(".labels", "zeros", (), "<i8"))  # not an identifier: no field has it
    return resolved, tuple(specs)


def split_values(schema: Any, fields: FieldRequest | None) -> tuple[FieldRequest | None, tuple[str, ...]]:
    """Take the fields of `VALUE_TYPES` out of a request: (the rest, their names in order).

    Raises:
        ValueError: such a field is given options, or nothing but such fields is asked for
            (a batch needs one field of a fixed size: an image, or a number).
    """
    if fields is None:
        return None, ()
    requests = _normalise_request(fields)
    values = tuple(name for name in requests if name in schema.names and schema.field(name).type in VALUE_TYPES)
    for name in values:
        if requests[name] is not None:
            raise ValueError(f"field {name!r} is {schema.field(name).type!r}: it takes no options (give None)")
    if values and len(values) == len(requests):
        raise ValueError(f"fields {', '.join(values)} come as lists beside a field of fixed size: ask for an image or a number too")
    return ({name: request for name, request in requests.items() if name not in values} if values else fields), values


def read_values(dataset: RecordSource, names: Sequence[str], indices: Sequence[int] | np.ndarray) -> dict[str, list[Any]]:
    """The values of fields `names` (of `VALUE_TYPES`) of dataset records `indices`, one list per
    field in the order of `indices`: a str, the parsed JSON value, or bytes (a copy).

    They are read from the memory-mapped shards without hashing the records again: the workers
    check each record's checksum when they read its image, and a tar's further members have no
    checksum of their own (spec/tar.md, section 7). Text and JSON are still checked (format.md
    steps 31 and 32).

    Raises:
        FormatError: a value is not valid for its type.
    """
    values: dict[str, list[Any]] = {name: [] for name in names}
    for index in indices:
        shard_index, local = dataset.locate(int(index))
        shard = dataset.shard(shard_index)
        record = shard.record(local) if isinstance(shard, TarShardReader) else None  # a tar's members are read unhashed
        for name in names:
            if record is not None:
                value = record[name]
            else:
                field = shard.schema.field(name)
                row = shard.table[local]
                start = int(row[column_name(name, "offset")])
                data = shard.source.read(start, start + int(row[column_name(name, "size")]))
                try:
                    value = field.kind.decode(field, shard.table, local, data)
                except InvalidValue as err:
                    raise FormatError(f"field {name!r} {err}", path=shard.path, offset=start, record=local) from err
            values[name].append(bytes(value) if isinstance(value, memoryview) else value)
    return values


def _normalise_request(fields: FieldRequest, interpolation: str = "bilinear") -> dict[str, Any]:
    if isinstance(fields, str):
        raise ValueError("fields is a mapping of field names or a list of them, not one string")
    items = fields.items() if isinstance(fields, Mapping) else ((name, None) for name in fields)
    requests: dict[str, Any] = {}
    for name, value in items:
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
        table = dataset.shard(shard_index).table
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


# -- the worker side: one filler per delivered field --------------------------------------------


class _Filler:
    """Fills one field of one slot row from a record's table row (and payload)."""

    reads_payload = True

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec
        self.name = spec.name

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        """Write the field of the record in `row` into row `index` of `out`: for an image field
        a list of (1, C, H, W) views of the slot's images (`shardfmt.ops._decode.as_target`), for
        the others the slot's numpy array. `trusted`: this loader has read the record before and
        decoded it without error, or its checksum has just matched in a dataset whose converter
        strictly decoded every JPEG (see `ImageDecoder.decode_box`)."""
        raise NotImplementedError

    def payload(self, reader: ShardReaderBase, row: Any) -> memoryview:
        start = int(row[column_name(self.name, "offset")])
        return reader.source.read(start, start + int(row[column_name(self.name, "size")]))


class _JpegFiller(_Filler):
    def __init__(self, spec: OutputSpec, *, fast: bool, partial: bool) -> None:
        super().__init__(spec)
        self.fast, self.partial = fast, partial
        self.capacity = (0, 0)
        self._make_decoder(*spec.max_size)

    def _make_decoder(self, max_height: int, max_width: int) -> None:
        height, width, channels = self.spec.shape
        previous = getattr(self, "decoder", None)
        self.decoder = ImageDecoder(
            max_height=max_height,
            max_width=max_width,
            output_size=(height, width),
            fast=self.fast,
            channels=channels,
            interpolation=self.spec.interpolation,
            partial=self.partial,
        )
        if previous is not None:  # a grown decoder keeps the flag a loader worker shares with its pool
            self.decoder.in_partial_decode = previous.in_partial_decode
        self.capacity = (max_height, max_width)

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        if box is None:
            raise ValueError(f"image field {self.name!r} is filled without a crop box")
        top, left, box_height, box_width, flip = box
        height, width = int(row[column_name(self.name, "height")]), int(row[column_name(self.name, "width")])
        if height > self.capacity[0] or width > self.capacity[1]:
            self._make_decoder(max(height, self.capacity[0]), max(width, self.capacity[1]))
        self.decoder.decode_box(
            self.payload(reader, row),
            height=height,
            width=width,
            top=top,
            left=left,
            box_height=box_height,
            box_width=box_width,
            flip=flip,
            out=out[index],
            trusted=trusted,
        )


class _RawFiller(_Filler):
    def __init__(self, spec: OutputSpec) -> None:
        super().__init__(spec)
        height, width, channels = spec.shape
        self.channels = channels
        self.resizer = Resizer(output_size=(height, width), channels=channels, interpolation=spec.interpolation)
        self._columns = tuple(column_name(self.name, c) for c in ("offset", "height", "width", "channels"))
        self._files: dict[str, torch.Tensor] = {}

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        if box is None:
            raise ValueError(f"image field {self.name!r} is filled without a crop box")
        top, left, box_height, box_width, flip = box
        values, names = row.item(), row.dtype.names  # one tuple of the row: cheaper than four reads by name
        offset, height, width, channels = (values[names.index(column)] for column in self._columns)
        if reader.source.zero_copy:
            whole = self._files.get(reader.path)
            if whole is None:
                whole = self._files[reader.path] = _tensor(reader.source.read(0, reader.source.size))
        else:
            whole = _tensor(reader.source.read(offset, offset + height * width * channels))
            offset = 0
        # The box as one strided view of the mapped pixels: rows of width * channels bytes.
        start = offset + (top * width + left) * channels
        if channels == self.channels:  # (1, C, h, w) at once
            row_bytes = width * channels
            source = whole.as_strided((1, channels, box_height, box_width), (box_height * row_bytes, 1, row_bytes, channels), start)
        else:
            region = whole.as_strided((box_height, box_width, channels), (width * channels, channels, 1), start)
            source = match_channels(region, self.channels).permute(2, 0, 1).unsqueeze(0)
        self.resizer.resize(source, flip=flip, out=out[index])


def _tensor(buffer: memoryview) -> torch.Tensor:
    """A uint8 tensor over read-only bytes, without a copy (the loader never writes through it)."""
    if not len(buffer):
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given buffer is not writable"
        return torch.frombuffer(buffer, dtype=torch.uint8)


class _ArrayFiller(_Filler):
    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        out[index] = np.frombuffer(self.payload(reader, row), self.spec.dtype).reshape(self.spec.shape)


class _ScalarFiller(_Filler):
    reads_payload = False

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        out[index] = row[self.name]


class _ZerosFiller(_Filler):
    reads_payload = False

    def fill(
        self, reader: ShardReaderBase, row: Any, box: tuple[int, int, int, int, bool] | None, out: Any, index: int, *, trusted: bool = False
    ) -> None:
        out[index] = 0


def make_filler(spec: OutputSpec, *, fast_decode: bool, partial: bool = False) -> _Filler:
    """Return the step that fills `spec`'s field of a slot row; `partial` lets a jpeg field
    decode only the crop box of trusted records (in worker processes only: see `ops.jpegcrop`)."""
    if spec.type == "jpeg":
        return _JpegFiller(spec, fast=fast_decode, partial=partial)
    if spec.type == "raw":
        return _RawFiller(spec)
    if spec.type == "ndarray":
        return _ArrayFiller(spec)
    if spec.type == "zeros":
        return _ZerosFiller(spec)
    return _ScalarFiller(spec)
