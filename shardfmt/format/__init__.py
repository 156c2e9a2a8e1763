"""The binary shard, byte for byte (spec/format.md), for those who implement or inspect the
format: write and read single shards, parse schemas and manifests.

Most users need none of this: `shardfmt.open_dataset`, `shardfmt.DatasetWriter` and
`shardfmt.Loader` read and write whole datasets. The modules of this package (`_layout` with
every limit, `_fieldtypes` with one class per field type, `_schema`, `_manifest`, `_jpeg`,
`_writer`, `_reader`) are internal; what is public is listed in `__all__`. Knows nothing of tars,
datasets of many shards, conversion or loading.
"""

from __future__ import annotations

from ._layout import FORMAT_VERSION
from ._manifest import IndexEntry, Manifest, ShardEntry
from ._reader import ImageInfo, Record, ShardReader
from ._schema import IMAGE_CLASSIFICATION, Field, Schema
from ._writer import ShardInfo, ShardWriter

__all__ = [
    "FORMAT_VERSION",
    "IMAGE_CLASSIFICATION",
    "Field",
    "ImageInfo",
    "IndexEntry",
    "Manifest",
    "Record",
    "Schema",
    "ShardEntry",
    "ShardInfo",
    "ShardReader",
    "ShardWriter",
]
