"""shardfmt: image training data that loads at the JPEG decode limit.

Convert an ImageFolder tree once (`shardfmt convert`), then read it with `open_dataset` or load
shuffled batches with `Loader`, from a local folder or from a URL (S3, GCS, HTTP, ... through
fsspec; see `RemoteOptions`). WebDataset tars work too: written by `TarShardWriter` or by a
`DatasetWriter` with ``shard_format="tar"``, or indexed where they lie (`index_tars`). The
converter and the reader work without torch; `Loader` and `Dataset` import it when first used.
"""

from __future__ import annotations

import typing

from ._version import __version__
from .dataset.reader import DatasetReader, open_dataset
from .dataset.tars import index_tars
from .dataset.writer import DatasetWriter
from .errors import (
    ChecksumError,
    ConvertError,
    DatasetNotFoundError,
    DecodeError,
    FormatError,
    LimitError,
    LockedError,
    ManifestError,
    RejectError,
    RemoteError,
    SchemaError,
    ShardfmtError,
    ShardNotFoundError,
    UnsupportedVersionError,
    WorkerError,
)
from .format.layout import FORMAT_VERSION
from .format.manifest import Manifest, ShardEntry
from .format.reader import ImageInfo, Record, ShardReader
from .format.schema import IMAGE_CLASSIFICATION, Field, Schema
from .format.writer import ShardInfo, ShardWriter
from .mixture import Mixture
from .storage import RemoteOptions, RetryPolicy
from .tar.index import index_tar
from .tar.reader import TarShardReader
from .tar.scan import iter_tar_samples
from .tar.writer import TarShardWriter

if typing.TYPE_CHECKING:  # for type checkers and documentation; at run time they load lazily
    from .loader import Dataset, Loader

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
    "LockedError",
    "Manifest",
    "ManifestError",
    "Mixture",
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
