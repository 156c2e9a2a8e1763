"""shardfmt: image training data that loads at the JPEG decode limit.

Convert an ImageFolder tree once (`shardfmt convert`), then read it with `open_dataset` or load
shuffled batches with `Loader`, from a local folder or from a URL (S3, GCS, HTTP, ... through
fsspec; see `RemoteOptions`). WebDataset tars work too: written by `TarShardWriter` or by a
`DatasetWriter` with ``shard_format="tar"``, or indexed where they lie (`index_tars`). The
converter and the reader work without torch; `Loader` and `Dataset` import it when first used.
"""

from __future__ import annotations

import typing

from .errors import (
    ChecksumError,
    ConvertError,
    DatasetNotFoundError,
    DecodeError,
    FormatError,
    LimitError,
    ManifestError,
    RejectError,
    RemoteError,
    SchemaError,
    ShardfmtError,
    ShardNotFoundError,
    UnsupportedVersionError,
    WorkerError,
)
from .layout import FORMAT_VERSION
from .manifest import Manifest, ShardEntry
from .reader import DatasetReader, ImageInfo, Record, ShardReader, open_dataset
from .schema import IMAGE_CLASSIFICATION, Field, Schema
from .storage import RemoteOptions, RetryPolicy
from .tar import TarShardWriter, index_tar, iter_tar_samples
from .tarindex import index_tars
from .tarreader import TarShardReader
from .writer import DatasetWriter, ShardInfo, ShardWriter

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "IMAGE_CLASSIFICATION",
    "ChecksumError",
    "ConvertError",
    "Dataset",
    "DatasetNotFoundError",
    "DatasetReader",
    "DatasetWriter",
    "DecodeError",
    "Field",
    "FormatError",
    "ImageInfo",
    "LimitError",
    "Loader",
    "Manifest",
    "ManifestError",
    "Record",
    "RejectError",
    "RemoteError",
    "RemoteOptions",
    "RetryPolicy",
    "Schema",
    "SchemaError",
    "ShardEntry",
    "ShardInfo",
    "ShardNotFoundError",
    "ShardReader",
    "ShardWriter",
    "ShardfmtError",
    "TarShardReader",
    "TarShardWriter",
    "UnsupportedVersionError",
    "WorkerError",
    "__version__",
    "index_tar",
    "index_tars",
    "iter_tar_samples",
    "open_dataset",
]


_LAZY = ("Dataset", "Loader")
"""Public names that import torch, so they load on first access."""


def __getattr__(name: str) -> typing.Any:
    # The torch-facing names load torch only when asked for.
    if name in _LAZY:
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'shardfmt' has no attribute {name!r}")
