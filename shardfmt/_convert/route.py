"""Which reader a conversion's sources take, decided once, before anything is written, from
what the sources are and what the `RecordRequest` asks; then the scan by that reader.

- ``"table"``: Parquet or Arrow files (or a folder of them), or a folder ``save_to_disk``
  wrote: one record per row, its columns picked by the request's table options
  (`sources.parquet.ParquetColumns`); the rest kept as typed fields.
- ``"tars"``: several WebDataset tars, or tars with declared member fields: the image, its
  ``.cls`` label and the members (`sources.tars.scan_tars`).
- ``"fields"``: anything asking for more than an image and a label: several parallel folders, a
  listing with further columns, declared fields, images stored as pixels, a scale or a patch
  (`sources.scan_fields`).
- ``"images"``: one ImageFolder, ``path,label`` listing or set of tars, read as it is
  (`sources.scan_source`).

Each gives a `sources.results.SourceScan`, records of named, typed fields, which `run.convert`
plans the same way; the third's scan names its fields (`sources.results.SourceScan.names_fields`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .._dataset.locate import classify_location
from .._errors import ConvertError
from .._storage import RemoteOptions
from .options import RecordRequest
from .sources import SOURCE_KINDS, ParquetColumns, is_tar_source, listing_columns, names_parquet, scan_fields, scan_source
from .sources.results import SourceScan
from .sources.tablefiles import saved_dataset_files

__all__ = ["READERS", "Route", "choose_route", "scan_route"]

READERS: Final = ("table", "tars", "fields", "images")


@dataclass(frozen=True)
class Route:
    """The reader chosen for `texts` (`READERS`), with a table source's columns."""

    reader: str
    texts: tuple[str, ...]
    columns: ParquetColumns | None = None


def choose_route(texts: list[str], request: RecordRequest, *, shard_format: str, remote: RemoteOptions | None) -> Route:
    """The reader of `texts` (each local folder of Parquet or Arrow files already replaced by
    its files) for `request` (see the module docstring).

    Raises:
        ConvertError: no source is given, or the request does not fit the source (the message
            names the keywords at fault).
    """
    if not texts:
        raise ConvertError(f"no source given; a source is {SOURCE_KINDS}")
    if any(names_parquet(text) for text in texts) or (len(texts) == 1 and _saved_dataset(texts[0])):
        if not request.plain:
            raise ConvertError("a Parquet or Arrow source has one image column, stored as JPEG: it takes none of store=, scale= "
                               "or patch= (--store, --scale, --patch)")
        columns = ParquetColumns(request.image_column or "image", request.label_column, request.key_column, request.image_root,
                                 fields=request.fields, drop=request.drop_columns)
        return Route("table", tuple(texts), columns)
    if request.table_columns_given:
        raise ConvertError("image_column=, label_column=, key_column= and drop_columns= (--image-column, --label-column, "
                           "--key-column, --drop-column) are for Parquet and Arrow sources")
    if all(is_tar_source(text) for text in texts) and (len(texts) > 1 or request.fields) and request.plain:
        return Route("tars", tuple(texts))
    if _asks_fields(texts, request, remote):
        if shard_format == "tar":
            raise ConvertError("--format tar writes image classification records (an image, its label and key, and the members "
                               "of tars): it takes one SRC and none of --store, --scale or --patch, nor a listing of other columns")
        return Route("fields", tuple(texts))
    return Route("images", (texts[0],))


def _asks_fields(texts: list[str], request: RecordRequest, remote: RemoteOptions | None) -> bool:
    """True if the request needs records of several fields: several sources, a store other than
    JPEG, declared fields, a stated scale other than 1, a patch, or a listing with columns other
    than path and label (its header read here; one GET for a URL)."""
    if len(texts) != 1 or not request.plain or request.fields:
        return True
    header = listing_columns(texts[0], remote=remote)
    return header is not None and header != ["path", "label"]


def scan_route(route: Route, request: RecordRequest, *, remote: RemoteOptions | None, work: Path) -> SourceScan:
    """Scan the sources of `route` with its reader.

    Raises:
        ConvertError: a source is missing or malformed, or the request does not fit it.
        RemoteError: a store failed.
        OSError: decompressing tars into `work` failed (ENOSPC: the device is full).
    """
    texts = list(route.texts)
    one_or_all = texts if len(texts) > 1 else texts[0]
    if route.reader == "table":
        return scan_source(one_or_all, remote=remote, columns=route.columns)
    if route.reader == "tars":
        members = {name: kind for name, kind in request.fields if kind is not None}
        return scan_source(one_or_all, remote=remote, members=members, work=work, image_root=request.image_root)
    if route.reader == "fields":
        return scan_fields(texts, declared=request.fields, store=request.store, remote=remote, image_root=request.image_root)
    return scan_source(texts[0], remote=remote, work=work, image_root=request.image_root)


def _saved_dataset(text: str) -> bool:
    """True if `text` is a local folder that ``save_to_disk`` wrote (a saved DatasetDict too:
    the table reader says which split to give)."""
    if classify_location(text).is_remote or not os.path.isdir(text):
        return False
    try:
        return saved_dataset_files(Path(text)) is not None
    except ConvertError:
        return True

