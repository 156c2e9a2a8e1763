"""`convert`: the one public entry of a conversion, for every source and every kind of record.

``shardfmt.convert(src, out, **options)`` takes what ``shardfmt convert`` takes (the command
calls it) and decides, once, which conversion the source and options ask for: image
classification records (`run.convert`: an ImageFolder, a ``path,label`` listing, WebDataset
tars with their members, Parquet or Arrow files, a ``save_to_disk`` folder; Parquet and Arrow rows
with further columns become records of several fields there, `sources.columns` says how) or
records of several fields (`fields.convert_fields`: parallel folders, a listing of several
columns, images stored as pixels). From Python, `src` may also be a ``datasets.Dataset`` (saved
to a temporary folder with ``save_to_disk``, which embeds its images, and read as such a folder;
a ``DatasetDict`` is refused with its splits) or an iterable of records,
mappings of field name -> value (written as a listing and image files in a temporary folder).
Sources held in memory are converted whole: such a conversion cannot be resumed.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from .._arguments import check_path
from .._errors import ConvertError, RejectError
from .._forks import MAX_WORKERS_PER_CORE
from .._storage import RemoteOptions, expand_user
from ..format._manifest import Manifest
from ..format._writer import DEFAULT_SHARD_SIZE
from .fields import convert_fields, needs_fields
from .images import DEFAULT_QUALITY
from .loop import ConvertResult
from .run import convert as convert_images
from .sources import SOURCE_KINDS, ParquetColumns, is_tar_source, names_parquet, parquet_folders
from .sources.confine import read_regular
from .sources.parquet import saved_dataset_files

__all__ = ["ConvertSummary", "convert"]

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Iterable[Mapping[str, Any]] | Any


@dataclass(frozen=True)
class ConvertSummary:
    """What a conversion did.

    Attributes:
        path: the output folder (or URL, without credentials).
        records: records written.
        rejects: inputs rejected, by reason (every one is in the output's rejects.jsonl).
        input_bytes: bytes of input read.
        bytes: bytes of the shards written (the manifest's ``num_bytes``).
        seconds: wall time of the call.
        result: the full `ConvertResult` (manifest, inputs, shards kept on resume).
    """

    path: Path | str
    records: int
    rejects: dict[str, int]
    input_bytes: int
    bytes: int
    seconds: float
    result: ConvertResult

    @property
    def num_rejects(self) -> int:
        return sum(self.rejects.values())

    @property
    def manifest(self) -> Manifest:
        """The manifest written."""
        return self.result.manifest



def max_workers() -> int:
    """The most conversion processes this machine takes (`MAX_WORKERS_PER_CORE` per core)."""
    return MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)


def _check_arguments(src: object, out: object, workers: object) -> None:
    """Refuse a source or output path over the path limits (`_arguments.check_path`) by its
    keyword, before the file system answers ENAMETOOLONG, and `workers` (`check_workers`)."""
    check_workers(workers)
    for item in src if isinstance(src, (list, tuple)) else [src]:
        if isinstance(item, (str, os.PathLike)):
            check_path("src", item)
    if isinstance(out, (str, os.PathLike)):
        check_path("out", out)


def check_workers(workers: object) -> None:
    """Refuse a `workers` that is not None or an int in [1, `max_workers()`].

    Raises:
        TypeError, ValueError: with the allowed range.
    """
    if workers is None:
        return
    allowed = f"an int in [1, {max_workers()}] ({MAX_WORKERS_PER_CORE} per core; this machine has {os.cpu_count() or 1})"
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"workers must be {allowed}, got {workers!r}")
    if not 1 <= workers <= max_workers():
        raise ValueError(f"workers must be {allowed}, got {workers}")

def convert(
    src: Source,
    out: str | os.PathLike[str],
    *,
    fields: Sequence[tuple[str, str | None]] | Mapping[str, str | None] = (),
    store: str = "jpeg",
    scale: int | Sequence[int] | None = 1,
    patch: int | None = None,
    shard_format: str = "binary",
    image_column: str | None = None,
    label_column: str | None = None,
    key_column: str | None = None,
    image_root: str | os.PathLike[str] | None = None,
    drop_columns: Sequence[str] = (),
    shard_size: int = DEFAULT_SHARD_SIZE,
    max_side: int | None = None,
    quality: int = DEFAULT_QUALITY,
    workers: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = False,
    engine: str = "local",
    remote: RemoteOptions | None = None,
    allow_empty: bool = False,
    break_lock: bool = False,
) -> ConvertSummary:
    """Convert a source into a dataset in `out` (the options of ``shardfmt convert``).

    Args:
        src: a path (``~`` expanded) or URL, or a list of them: an ImageFolder folder, a ``.csv`` /
            ``.jsonl`` listing, WebDataset tars (``.tar``, ``.tar.gz`` or ``.tgz`` files, a brace
            pattern, or folders of them), Parquet or Arrow files (a glob pattern, a folder), a folder that
            ``datasets``' ``save_to_disk`` wrote, several folders of one image field each; or a
            ``datasets.Dataset``; or an iterable of records, each a mapping with an ``image``
            (encoded bytes, a file path, a PIL image, an H x W x C uint8 array, or a Hugging
            Face ``{"bytes": ..., "path": ...}``), optionally a ``label`` (int or class name), a
            ``key`` (a relative path without extension) and further values (str, int, float);
            a record whose image path names no file is a "missing-file" reject.
        out: the output folder, or a URL.
        fields: (name, kind) pairs or a mapping: a folder's field name, a listing column's kind,
            the kind of a tar member ("str", "json" or "bytes": kept, and samples without it
            rejected as "missing-member"), or of a Parquet or Arrow column ("str", "int64",
            "float64", "bytes" or "json").
        store, scale, patch, shard_format: how images are stored and related (several fields);
            "binary" shards, or "tar" (WebDataset tars with a member index each).
        image_column, label_column, key_column, image_root, drop_columns: for Parquet and Arrow
            files (and a ``datasets.Dataset``): the columns; the folder image paths (of a listing
            too) are resolved against and must stay inside once symbolic links are resolved
            (default: the folder of each file); and the columns left out. ``label_column="none"``:
            no label; the default and the other columns' kinds: `sources.columns`.
        shard_size, max_side, quality, workers, resume, overwrite, strict, progress, engine, remote, allow_empty, break_lock: as
            for ``shardfmt convert``.

    Returns:
        A `ConvertSummary`.

    Raises:
        ConvertError: the source is none of the kinds above (the message lists them), holds no
            input, or every input was rejected (without `allow_empty`; the output is written
            first), or the options do not fit the source.
        RemoteError: a store stopped answering: the run stopped, nothing was rejected for it, and
            the message says how to resume (``resume=True``, with ``break_lock=True`` if a lock was left).
        ValueError, LockedError, WorkerError, OSError: as ``shardfmt convert`` reports them.
    """
    src, out, image_root = expand_user(src), expand_user(out), expand_user(image_root)  # "~/x" as a shell reads it
    _check_arguments(src, out, workers)
    common: dict[str, Any] = dict(shard_size=shard_size, max_side=max_side, quality=quality, workers=workers, resume=resume,
                                  overwrite=overwrite, strict=strict, progress=progress, engine=engine, remote=remote,
                                  allow_empty=allow_empty, break_lock=break_lock)
    declared = list(fields.items()) if isinstance(fields, Mapping) else [tuple(item) for item in fields]
    table = _table_options(image_column=image_column, label_column=label_column, key_column=key_column, image_root=image_root,
                           drop_columns=drop_columns)
    paths = isinstance(src, (str, os.PathLike)) or (isinstance(src, (list, tuple)) and all(isinstance(i, (str, os.PathLike)) for i in src))
    if _is_hf_dataset(src) or not paths:
        result = _convert_in_memory(src, out, declared, store, scale, patch, shard_format, table, common)
    else:
        sources = [os.fspath(item) for item in src] if isinstance(src, (list, tuple)) else [os.fspath(cast(str, src))]
        result = _convert_path(sources, out, declared, store, scale, patch, shard_format, table, common)
    return _summary(result)


def _table_options(**options: Any) -> dict[str, Any]:
    """The options of Parquet and Arrow sources, `drop_columns` as a tuple.

    Raises:
        TypeError: `drop_columns` is one str rather than a sequence of names.
    """
    if isinstance(options["drop_columns"], str):
        raise TypeError(f"drop_columns must be a sequence of column names, got the str {options['drop_columns']!r}")
    return {**options, "drop_columns": tuple(options["drop_columns"])}


def _summary(result: ConvertResult) -> ConvertSummary:
    """What a finished conversion did, from its result and manifest."""
    manifest = result.manifest
    by_reason = manifest.rejects.get("by_reason") or {}
    return ConvertSummary(result.path, result.num_records, dict(sorted(by_reason.items())), result.input_bytes,
                          manifest.num_bytes, result.seconds, result)


def _convert_in_memory(src: Any, out: str | os.PathLike[str], declared: list[Any], store: str, scale: Any, patch: int | None,
                       shard_format: str, table: dict[str, Any], common: dict[str, Any]) -> ConvertResult:
    """Convert a source held in memory: saved or written to a temporary folder, then converted from there."""
    if _is_hf_dataset_dict(src):
        splits = [str(name) for name in src]
        raise ConvertError(f"a DatasetDict: convert one split (src[{splits[0] if splits else 'train'!r}]; its splits: "
                           f"{', '.join(splits) or 'none'})")
    if common["resume"]:
        raise ConvertError("a source held in memory (a datasets.Dataset or an iterable of records) cannot be resumed: "
                           "convert it again with overwrite")
    with tempfile.TemporaryDirectory(prefix="shardfmt-source-") as folder:
        if _is_hf_dataset(src):
            src.save_to_disk(os.path.join(folder, "dataset"))
            return _convert_path([os.path.join(folder, "dataset")], out, declared, store, scale, patch, shard_format, table, common)
        sources, declared = _spill_records(cast(Iterable[Mapping[str, Any]], src), Path(folder), declared)
        return _convert_path(sources, out, declared, store, scale, patch, shard_format, table, common)


def _convert_path(sources: list[str], out: str | os.PathLike[str], declared: list[Any], store: str, scale: Any,
                  patch: int | None, shard_format: str, table: dict[str, Any], common: dict[str, Any]) -> ConvertResult:
    """Convert sources given by path: the choice the command makes."""
    if not sources:
        raise ConvertError(f"no source given; a source is {SOURCE_KINDS}")
    remote = common["remote"]
    sources = parquet_folders(sources)
    tabular = any(names_parquet(source) for source in sources) or (
        len(sources) == 1 and os.path.isdir(sources[0]) and _saved_dataset(sources[0]))
    if tabular:
        if store != "jpeg" or scale != 1 or patch is not None:
            raise ConvertError("a Parquet or Arrow source has one image column, stored as JPEG: it takes none of store=, scale= "
                               "or patch= (--store, --scale, --patch)")
        root = table["image_root"]
        columns = ParquetColumns(table["image_column"] or "image", table["label_column"], table["key_column"],
                                 os.path.abspath(os.fspath(root)) if root is not None else None,
                                 fields=tuple((name, kind) for name, kind in declared), drop=tuple(table["drop_columns"]))
        return convert_images(sources if len(sources) > 1 else sources[0], out, shard_format=shard_format, columns=columns, **common)
    if any(value is not None and value != () for name, value in table.items() if name != "image_root"):
        raise ConvertError("image_column=, label_column=, key_column= and drop_columns= (--image-column, --label-column, "
                           "--key-column, --drop-column) are for Parquet and Arrow sources")
    image_root = table["image_root"]
    tars = all(is_tar_source(source) for source in sources)
    if tars and (len(sources) > 1 or declared) and store == "jpeg" and scale == 1 and patch is None:
        kinds = {name: kind for name, kind in declared if kind is not None}
        return convert_images(sources if len(sources) > 1 else sources[0], out, shard_format=shard_format, members=kinds,
                              image_root=image_root, **common)
    stated = "any" if scale is None else None if scale == 1 else scale  # needs_fields: was a scale stated?
    if needs_fields(sources, store=store, fields=declared, scale=stated, patch=patch, remote=remote):
        if shard_format == "tar":
            raise ConvertError("--format tar writes image classification records (an image, its label and key, and the members "
                               "of tars): it takes one SRC and none of --store, --scale or --patch, nor a listing of other columns")
        return convert_fields(sources, out, fields=declared, store=store, scale=scale, patch=patch, image_root=image_root, **common)
    return convert_images(sources[0], out, shard_format=shard_format, image_root=image_root, **common)


def _saved_dataset(folder: str) -> bool:
    try:
        return saved_dataset_files(Path(folder)) is not None
    except ConvertError:
        return True  # a saved DatasetDict: the Parquet path says which split to give


def _is_hf_dataset_dict(value: Any) -> bool:
    """True for a ``datasets.DatasetDict`` (checked by type, so ``datasets`` need not be installed)."""
    return any(cls.__module__.startswith("datasets.") and cls.__name__ in ("DatasetDict", "IterableDatasetDict")
               for cls in type(value).__mro__)


def _is_hf_dataset(value: Any) -> bool:
    """True for a ``datasets.Dataset`` (checked by type, so ``datasets`` need not be installed)."""
    return any(cls.__module__.startswith("datasets.") and cls.__name__ == "Dataset" for cls in type(value).__mro__)


def _spill_records(records: Iterable[Mapping[str, Any]], folder: Path, declared: list[Any]) -> tuple[list[str], list[Any]]:
    """Write records held in memory as image files and a listing ``records.jsonl`` in `folder`;
    return the listing as the source, and the declared kinds with those of its str columns."""
    lines: list[str] = []
    kinds: dict[str, str] = {}
    names: list[str] | None = None
    for number, record in enumerate(records):
        if not isinstance(record, Mapping) or "image" not in record:
            raise ConvertError(f"record {number} is not a mapping with an 'image'; a source is {SOURCE_KINDS}")
        if names is None:
            names = list(record)
        elif list(record) != names:
            raise ConvertError(f"record {number} has the fields {', '.join(record)}, record 0 has {', '.join(names)}")
        data = _image_bytes(record["image"], number)
        key = record.get("key", f"{number:09d}")
        if not isinstance(key, str) or not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")) or "\x00" in key:
            raise ConvertError(f"record {number}: key {key!r} is not a relative path without '.' or '..' parts")
        path = folder / "records" / (key + ".img")
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:  # else the listing names a file that is not there: a "missing-file" reject
            path.write_bytes(data)
        row: dict[str, Any] = {"path": f"{key}.img"}
        for name, value in record.items():
            if name in ("image", "key"):
                continue
            if isinstance(value, str) and name != "label":
                kinds[name] = "str"
            elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ConvertError(f"record {number}: field {name!r} is {type(value).__name__}; further values are str, int or float")
            row[name] = value
        lines.append(json.dumps(row, ensure_ascii=False))
    (folder / "records").mkdir(exist_ok=True)
    (folder / "records" / "records.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    given = {name for name, _ in declared}
    return [str(folder / "records" / "records.jsonl")], declared + [(name, kind) for name, kind in kinds.items() if name not in given]


def _image_bytes(value: Any, number: int) -> bytes | None:
    """The encoded bytes of a record's image value (see `convert`); None for a path that names
    no file (the record becomes a "missing-file" reject, as a missing file of a listing does)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (str, os.PathLike)):
        try:
            return read_regular(os.fspath(value))  # a regular file within the input limit: never a FIFO or /dev/zero
        except FileNotFoundError:
            return None
        except RejectError as err:
            raise ConvertError(f"record {number}: the image file cannot be read: {err.message}", path=os.fspath(value)) from err
        except OSError as err:
            raise ConvertError(f"record {number}: the image file cannot be read: {err.strerror or err}", path=os.fspath(value)) from err
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        if value.get("bytes") is not None:
            return bytes(value["bytes"])
        if value.get("path") is not None:
            return _image_bytes(value["path"], number)
    from PIL import Image

    if hasattr(value, "__array_interface__") and not isinstance(value, Image.Image):
        value = Image.fromarray(value)
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, "PNG")  # lossless: the converter encodes the JPEG once
        return buffer.getvalue()
    raise ConvertError(f"record {number}: image is {type(value).__name__}; an image is bytes, a path, a PIL image, "
                       "a uint8 array or a {'bytes', 'path'} mapping")
