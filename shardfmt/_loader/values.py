"""Fields a loader delivers as Python lists: `VALUE_TYPES` (``str``, ``json``, ``bytes``: captions,
metadata, keys).

They have no fixed size and never go through shared memory: `split_values` takes them out of the
request, and `read_values` reads them in the loader's process for the records of each batch, as
lists of one value a sample (str, the parsed JSON value, bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._dataset.concat import RecordSource
from .._errors import FormatError
from ..format._fieldtypes import InvalidValue
from ..format._layout import column_name
from ..tar._reader import TarShardReader
from .outputs import FieldRequest, normalise_request

__all__ = ["VALUE_TYPES", "read_values", "split_values"]

VALUE_TYPES = ("str", "json", "bytes")
"""Field types a loader delivers as Python lists, read in its own process (`read_values`)."""


def split_values(schema: Any, fields: FieldRequest | None) -> tuple[FieldRequest | None, tuple[str, ...]]:
    """Take the fields of `VALUE_TYPES` out of a request: (the rest, their names in order).

    Raises:
        ValueError: such a field is given options, or nothing but such fields is asked for
            (a batch needs one field of a fixed size: an image, or a number).
    """
    if fields is None:
        return None, ()
    requests = normalise_request(fields)
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

    They are read from the memory-mapped shards. A binary shard's record is not hashed again here:
    the workers check each record's checksum (which covers all its fields) when they read its
    image. A tar's member is checked against its own checksum when the dataset is opened with
    `verify` (spec/tar.md, section 7; an index without member checksums has none to check).
    Text and JSON are always checked (format.md steps 31 and 32).

    Raises:
        FormatError: a value is not valid for its type, or a shard file was truncated since it
            was opened (`format.reader.ShardReaderBase.check_file`).
        ChecksumError: a tar member does not match its checksum (with `verify`).
    """
    values: dict[str, list[Any]] = {name: [] for name in names}
    checked = set()
    for index in indices:
        shard_index, local = dataset.locate(int(index))
        shard = dataset.shard(shard_index)
        if shard_index not in checked:  # a truncated file is an error, not SIGBUS
            shard.check_file(local)
            checked.add(shard_index)
        record = shard.record(local) if isinstance(shard, TarShardReader) else None  # a tar's member is checked on its own
        for name in names:
            if record is not None:
                value = record[name]
            else:
                field = shard.schema.field(name)
                shard.check_row(local)
                row = shard.table[local]
                start = int(row[column_name(name, "offset")])
                data = shard.source.read(start, start + int(row[column_name(name, "size")]))
                try:
                    value = field.kind.decode(field, shard.table, local, data)
                except InvalidValue as err:
                    raise FormatError(f"field {name!r} {err}", path=shard.path, offset=start, record=local) from err
            values[name].append(bytes(value) if isinstance(value, memoryview) else value)
    return values

