"""shardfmt: image training data that loads at the JPEG decode limit.

Convert an ImageFolder tree, WebDataset tars, Parquet files, a Hugging Face dataset or records
held in memory once (`convert`, or ``shardfmt convert``), then read it with `open_dataset` or load
shuffled batches with `Loader`, from a local folder or from a URL (S3, GCS, HTTP, ... through
fsspec; see `RemoteOptions`). WebDataset tars work too: written by a `DatasetWriter` with
``shard_format="tar"``, or indexed where they lie (`index_tars`). The converter and the reader
work without torch; `Loader` and `Dataset` import it when first used and need the
``shardfmt[torch]`` extra (``pip install 'shardfmt[torch]'``), as `shardfmt.ops` does.

The public API is this package's `__all__`, `shardfmt.ops` (pipelines and augmentation steps),
and, for those who implement or inspect the format, `shardfmt.format` and `shardfmt.tar`. Every
module whose name starts with an underscore is internal and may change in any release.
"""

from __future__ import annotations

import typing

from ._convert.api import ConvertSummary, convert
from ._dataset.reader import DatasetReader, open_dataset
from ._dataset.tars import index_tars
from ._dataset.writer import DatasetWriter
from ._errors import (
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
from ._sampling.mixture import Mixture
from ._sampling.policy import Sampling
from ._storage import RemoteOptions, RetryPolicy
from ._version import __version__

if typing.TYPE_CHECKING:  # for type checkers and documentation; at run time they load lazily
    from ._loader import Dataset, ImageTransform, Loader, Output, Workers

__all__ = [
    "ChecksumError",
    "ConvertError",
    "ConvertSummary",
    "Dataset",
    "DatasetNotFoundError",
    "DatasetReader",
    "DatasetWriter",
    "DecodeError",
    "FormatError",
    "ImageTransform",
    "LimitError",
    "Loader",
    "LockedError",
    "ManifestError",
    "Mixture",
    "Output",
    "RejectError",
    "RemoteError",
    "RemoteOptions",
    "RetryPolicy",
    "Sampling",
    "SchemaError",
    "ShardNotFoundError",
    "ShardfmtError",
    "UnsupportedVersionError",
    "WorkerError",
    "Workers",
    "__version__",
    "convert",
    "index_tars",
    "open_dataset",
]


_LAZY = ("Dataset", "ImageTransform", "Loader", "Output", "Workers")
"""Public names that import torch, so they load on first access."""


def __getattr__(name: str) -> typing.Any:
    # The torch-facing names load torch only when asked for.
    if name in _LAZY:
        try:
            from . import _loader
        except ModuleNotFoundError as error:
            from ._errors import torch_missing

            if error.name != "torch" and not (error.name or "").startswith("torch."):
                raise
            raise torch_missing(f"shardfmt.{name}", error) from error
        return getattr(_loader, name)
    raise AttributeError(f"module 'shardfmt' has no attribute {name!r}")
