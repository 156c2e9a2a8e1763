"""The two frozen values a conversion is asked with, each checked where it is made.

`ConvertOptions`: how every conversion runs and writes, whatever its source (shard format and
size, image normalisation, workers, resume, progress, engine, store credentials, what an empty
result means). `RecordRequest`: what records the source should give: the typed fields declared
(`fields`), how images are stored and related (store, scale, patch), and for a table source
(Parquet, Arrow, ``save_to_disk``) which of its columns are the image, label and key, which are
dropped, and where image paths (of a table or a listing) are resolved. Both are what
`shardfmt.convert` and ``shardfmt convert`` take as keywords and flags; a wrong value is refused
by its keyword with its allowed range, before anything is read or written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

from .._arguments import check_int
from .._errors import ConvertError
from .._forks import MAX_WORKERS_PER_CORE
from .._storage import RemoteOptions
from ..format._layout import MAX_SHARD_SIZE
from ..format._writer import DEFAULT_SHARD_SIZE
from .engine import ENGINES
from .images import DEFAULT_QUALITY, IMAGE_KINDS

__all__ = ["SHARD_FORMATS", "ConvertOptions", "RecordRequest", "max_workers"]

SHARD_FORMATS: Final = ("binary", "tar")
"""What shards a conversion writes: shardfmt's binary shards, or WebDataset tars with a member index each."""


def max_workers() -> int:
    """The most conversion processes this machine takes (`MAX_WORKERS_PER_CORE` per core)."""
    return MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)


def _check_workers(workers: object) -> None:
    """Refuse a `workers` that is not None or an int in [1, `max_workers()`], with that range."""
    if workers is None:
        return
    allowed = f"an int in [1, {max_workers()}] ({MAX_WORKERS_PER_CORE} per core; this machine has {os.cpu_count() or 1}) or None"
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"workers must be {allowed}, got {workers!r}")
    if not 1 <= workers <= max_workers():
        raise ValueError(f"workers must be {allowed}, got {workers}")


@dataclass(frozen=True)
class ConvertOptions:
    """How a conversion runs and writes, for every source (see `shardfmt.convert` for each).

    Attributes:
        shard_format: "binary" or "tar".
        shard_size: input bytes per shard, in [1, `format.layout.MAX_SHARD_SIZE`].
        max_side: shrink images whose longer side exceeds this (at least 1), or None.
        quality: JPEG quality of re-encoded images, in [1, 100].
        workers: processes building records, in [1, `max_workers()`], or None for one per CPU.
        resume, overwrite: finish an interrupted run; first remove shardfmt's files (not both).
        strict: fail after writing everything if any input was rejected.
        progress: show a progress bar on stderr.
        engine: "local" or "ray".
        remote: credentials and retries for a source or output given by URL.
        allow_empty: write an empty dataset rather than fail when nothing becomes a record.
        break_lock: first remove a lock a crashed run left in an output given by URL.

    Raises:
        TypeError, ValueError: an option is of the wrong type or out of its range (by keyword).
        ConvertError: `resume` and `overwrite` are both given.
    """

    shard_format: str = "binary"
    shard_size: int = DEFAULT_SHARD_SIZE
    max_side: int | None = None
    quality: int = DEFAULT_QUALITY
    workers: int | None = None
    resume: bool = False
    overwrite: bool = False
    strict: bool = False
    progress: bool = False
    engine: str = "local"
    remote: RemoteOptions | None = None
    allow_empty: bool = False
    break_lock: bool = False

    def __post_init__(self) -> None:
        if self.shard_format not in SHARD_FORMATS:
            raise ValueError(f"shard_format must be 'binary' or 'tar', got {self.shard_format!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        check_int("shard_size", self.shard_size, 1, MAX_SHARD_SIZE)
        if self.max_side is not None:
            check_int("max_side", self.max_side, 1, 2**31 - 1, note=" or None")
        check_int("quality", self.quality, 1, 100)
        _check_workers(self.workers)
        for name in ("resume", "overwrite", "strict", "progress", "allow_empty", "break_lock"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.remote is not None and not isinstance(self.remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions or None, got {type(self.remote).__name__}")
        if self.resume and self.overwrite:
            raise ConvertError("resume=True and overwrite=True exclude each other: resume keeps finished shards, overwrite removes them")

    @property
    def num_workers(self) -> int:
        """The number of worker processes: `workers`, or every CPU."""
        return self.workers if self.workers is not None else os.cpu_count() or 1


@dataclass(frozen=True)
class RecordRequest:
    """What records a conversion asks of its source (see `shardfmt.convert` for each).

    Attributes:
        fields: (name, kind or None) of each declared field: a folder's field (in order), a
            listing or table column's kind, or a tar member's kind.
        store: the kind of image fields whose kind is not declared (`images.IMAGE_KINDS`).
        scale: each further image field's size relative to the first: an int (at least 1) for
            all, a tuple of them (one per field), or None (unchecked).
        patch: the side of the centered square every first image is cut to (at least 1), or None.
        image_column, label_column, key_column: a table source's columns (None: its defaults;
            ``label_column="none"``: no label).
        image_root: the absolute folder the image paths of a table or listing are resolved
            against and confined to, or None (each file's own folder).
        drop_columns: a table source's columns left out.

    Raises:
        TypeError, ValueError: a value is of the wrong type or out of its range (by keyword).
    """

    fields: tuple[tuple[str, str | None], ...] = ()
    store: str = "jpeg"
    scale: int | tuple[int, ...] | None = 1
    patch: int | None = None
    image_column: str | None = None
    label_column: str | None = None
    key_column: str | None = None
    image_root: str | None = None
    drop_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.store not in IMAGE_KINDS:
            raise ValueError(f"store must be one of {', '.join(IMAGE_KINDS)}, got {self.store!r}")
        if self.patch is not None:
            check_int("patch", self.patch, 1, 2**31 - 1, note=" or None")
        for name, value in (("image_column", self.image_column), ("label_column", self.label_column),
                            ("key_column", self.key_column)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a column name (str) or None, got {value!r}")

    @classmethod
    def of(cls, *, fields: Any = (), scale: Any = 1, image_root: str | os.PathLike[str] | None = None,
           drop_columns: Any = (), **others: Any) -> RecordRequest:
        """The request of `shardfmt.convert`'s keywords: `fields` a mapping or (name, kind)
        pairs, `scale` a sequence or an int, `image_root` any path (made absolute),
        `drop_columns` a sequence of names.

        Raises:
            TypeError: `drop_columns` is one str rather than a sequence of names, or `fields` is
                not (name, kind) pairs.
        """
        if isinstance(drop_columns, str):
            raise TypeError(f"drop_columns must be a sequence of column names, got the str {drop_columns!r}")
        pairs = list(fields.items()) if hasattr(fields, "items") else list(fields)
        if not all(isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in pairs):
            raise TypeError(f"fields must be a mapping of name -> kind or (name, kind) pairs, got {fields!r}")
        scales = scale if scale is None or isinstance(scale, int) else tuple(scale)
        root = os.path.abspath(os.fspath(image_root)) if image_root is not None else None
        return cls(fields=tuple((str(name), kind) for name, kind in pairs), scale=scales, image_root=root,
                   drop_columns=tuple(drop_columns), **others)

    @property
    def plain(self) -> bool:
        """True if the request asks nothing of a source's images but the default: JPEG, one
        size, no patch (a table source takes only this)."""
        return self.store == "jpeg" and self.scale == 1 and self.patch is None

    @property
    def table_columns_given(self) -> bool:
        """True if a column of a table source is named (image, label, key or dropped)."""
        return any(v is not None for v in (self.image_column, self.label_column, self.key_column)) or bool(self.drop_columns)
