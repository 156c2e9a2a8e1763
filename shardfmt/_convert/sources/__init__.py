"""The sources of a conversion: given where a source is (a local path or a URL), what its
inputs are, in a fixed order, and what was set aside while finding them.

Every scan gives one kind of result, a `results.SourceScan`: records of named, typed fields.
Two ways in, which the one conversion entry picks between (``route.py``, in the package above):
`scan_source` reads a source as it is (an ImageFolder or ``path,label`` listing gives the fields
`results.IMAGE_AND_LABEL`; tars add their members; a table every column), and `scan_fields`
reads it for fields asked for by name (`results.SourceScan.names_fields`). Each decides here,
once, what a location is, then hands it to the module that owns its rules:

- a folder: an ImageFolder tree (`imagefolder.py`), the same rules for a local folder and for a
  store prefix given by URL (`trees.py` holds the two);
- a ``.csv`` / ``.jsonl`` file: a listing (`listing.py`), one parser and one set of row rules
  for a local file and for an object given by URL; its columns decide between ``path,label``
  and a listing of several fields;
- WebDataset tars: a ``.tar`` file, a brace pattern, or a local folder of ``.tar`` files only
  (`tars.py`); they must be local;
- Parquet or Arrow files: ``.parquet`` / ``.arrow`` files, glob patterns or folders of them,
  local or by URL, or a ``save_to_disk`` folder (`parquet.py`: rows, labels, column kinds;
  `tablefiles.py`: which files, and opening them), one record per row;
- for records of several fields, several parallel local folders (`folders.py`).

What a scan finds, and how inputs and rejects are named, is `results.py`. What a source may
read at all (inside its roots once links are resolved, regular files only, at most
`confine.MAX_INPUT_SIZE` bytes) is `confine.py`, which every source and the worker use.

The key of a record is its path relative to the source root, '/'-separated, without the last
extension (for a tar sample: its sample key). File names and keys that are not UTF-8 keep their
record; their key and report path show each undecodable byte as ``\\xNN``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

from ..._dataset.locate import classify_location
from ..._errors import ConvertError
from ..._storage import RemoteOptions, open_store
from ..images import IMAGE_KINDS
from .folders import scan_folders
from .imagefolder import scan_imagefolder
from .listing import LISTING_SUFFIXES, columns_of, scan_listing, scan_table
from .parquet import ParquetColumns, scan_parquet
from .results import (
    VALUE_KINDS,
    RecordField,
    SourceScan,
    is_field_name,
)
from .tablefiles import has_pattern, local_parquet, names_parquet, saved_dataset_files, store_parquet_names
from .tars import TARS_BY_URL, local_tars, names_tars, scan_tars, tars_in_folder
from .trees import LocalTree, StoreTree, Tree

__all__ = [
    "SOURCE_KINDS",
    "ParquetColumns",
    "is_tar_source",
    "listing_columns",
    "names_parquet",
    "parquet_folders",
    "scan_fields",
    "scan_source",
    "source_name",
    "source_texts",
]

Location = str | os.PathLike[str]

SOURCE_KINDS = (
    "an ImageFolder folder; a .csv or .jsonl listing; WebDataset tars (.tar, .tar.gz or .tgz files, a brace pattern, "
    "or a folder of them); Parquet files (.parquet, or a glob pattern); Arrow files (.arrow) or a folder that "
    "datasets' save_to_disk wrote; several folders of one image field each; from Python also a datasets.Dataset "
    "or an iterable of records"
)
"""Every kind of source, as messages list them."""


def source_texts(location: Location | Sequence[Location]) -> list[str]:
    """The paths or URLs a source names: each item of a list or tuple, else the one given."""
    if isinstance(location, (list, tuple)):
        return [os.fspath(item) for item in location]
    # anything but a list or tuple is one path: os.fspath refuses what is not, as it always has
    return [os.fspath(cast(Location, location))]


def scan_source(
    location: Location | Sequence[Location], *, remote: RemoteOptions | None = None, columns: ParquetColumns | None = None,
    members: Mapping[str, str] | None = None, work: Path | None = None, image_root: Location | None = None,
) -> SourceScan:
    """Find the records of a source read as it is.

    Args:
        location: an ImageFolder folder, a ``.csv`` / ``.jsonl`` listing, WebDataset tars (a
            ``.tar`` file, a brace pattern of them, or a folder of ``.tar`` files only), or
            Parquet files (a ``.parquet`` file or a glob pattern of them, or a list of those);
            a folder (a store prefix), a listing or Parquet files (one URL) may be a URL.
        remote: credentials and retries for a URL.
        columns: for Parquet files, which columns make a record (default `ParquetColumns()`).
        members: for tars, the kind ("str", "json" or "bytes") of member fields by name.
        work: where compressed tars are decompressed to (streamed, in parallel across files).
        image_root: for a listing, the local folder its paths are resolved against and confined to.

    Returns:
        The records in conversion order, their fields, the classes, and the rejects found
        while scanning.

    Raises:
        ConvertError: the source does not exist, is none of these, names tars by URL, is a URL
            of a store that cannot list (plain HTTP), a listing is malformed (the message names
            the line), Parquet columns are missing or of the wrong type, or `columns` is given
            for a source that is not Parquet.
        RemoteError: the store failed.
    """
    texts = parquet_folders(source_texts(location))
    if len(texts) > 1 and all(is_tar_source(text) for text in texts):
        return scan_tars(_several_tars(texts), declared=members, work=work)
    if any(names_parquet(text) for text in texts):
        return _scan_parquet(texts, columns or ParquetColumns(), remote)
    saved = saved_dataset_files(Path(texts[0])) if len(texts) == 1 and not classify_location(texts[0]).is_remote else None
    if saved is not None:
        return scan_parquet(LocalTree(Path(texts[0])), saved, columns=columns or ParquetColumns())
    if columns is not None:
        raise ConvertError("the image, label and key columns and the image root are options of Parquet and Arrow sources", path=texts[0])
    if len(texts) != 1:
        raise ConvertError("several sources are tars, Parquet files, or folders of one image field each (several fields)", path=texts[0])
    text = texts[0]
    listing = _listing(text, remote)
    if listing is not None:
        return scan_listing(*listing, files=image_tree(image_root))
    if image_root is not None:
        raise ConvertError("image_root= is for listings, Parquet and Arrow sources", path=text)
    if classify_location(text).is_remote:
        tree = _store_tree(text, remote)
        if not tree.folders[""]:
            raise ConvertError("the source holds no objects (or does not exist)", path=tree.store.root)
        if tars_in_folder(tree):
            raise ConvertError(TARS_BY_URL, path=tree.store.root)
        return scan_imagefolder(tree)
    return _scan_local(text, members=members, work=work)


def _scan_local(text: str, *, members: Mapping[str, str] | None, work: Path | None) -> SourceScan:
    """A local source that is neither a listing nor Parquet: tars, a folder of tars, or an
    ImageFolder tree."""
    tars = local_tars(text)
    if tars is not None:
        return scan_tars(tars, declared=members, work=work)
    path = Path(text)
    if path.is_dir():
        local = LocalTree(path)
        names = tars_in_folder(local)
        if names:
            return scan_tars([path / name for name in names], declared=members, work=work)
    if members:
        raise ConvertError("--field NAME=KIND names a member of WebDataset tars here, and the source holds none", path=text)
    if path.is_dir():
        return scan_imagefolder(local)
    if not path.exists():
        raise ConvertError("the source does not exist", path=path)
    raise ConvertError(f"the source is none of the kinds a conversion reads: {SOURCE_KINDS}", path=path)


def scan_fields(
    sources: Sequence[Location],
    *,
    declared: Sequence[tuple[str, str | None]] = (),
    store: str = "jpeg",
    remote: RemoteOptions | None = None,
    image_root: Location | None = None,
) -> SourceScan:
    """Find the records of a conversion whose fields are asked for by name (a scan that
    `results.SourceScan.names_fields`).

    Args:
        sources: one ImageFolder, listing or set of tars (as `scan_source` takes them; a folder
            or listing may be a URL), or several local parallel folders.
        declared: (field name, kind or None) pairs: for folders, the name (and kind) of each
            folder in order; for a listing, the kind of the columns named; for an ImageFolder,
            at most the kind of "image".
        store: the kind of image columns whose kind is not declared.
        remote: credentials and retries for a URL.
        image_root: for a listing, the local folder its paths are resolved against and confined to.

    Raises:
        ConvertError: a source is missing or malformed, or the declarations do not fit it.
    """
    for name, kind in declared:
        if not is_field_name(name):
            raise ConvertError(f"field name {name!r} is not an identifier of 1 to 64 characters, or is the reserved 'key'")
        if kind is not None and kind not in IMAGE_KINDS + VALUE_KINDS:
            raise ConvertError(f"field {name!r}: kind {kind!r} is none of {', '.join(IMAGE_KINDS + VALUE_KINDS)}")
    names = [os.fspath(source) for source in sources]
    if not names:
        raise ConvertError("no source given")
    if len(names) > 1:
        for name in names:
            if classify_location(name).is_remote:
                raise ConvertError(
                    "several sources are folders of one image field each, and must be local: copy them from "
                    "object storage first (one folder or listing may be a URL)",
                    path=name.partition("?")[0],
                )
            if classify_location(name).is_tars or "{" in Path(name).name:
                raise ConvertError(
                    "several sources are folders of one image field each; give WebDataset tars as one source "
                    "(a .tar file, a brace pattern or their folder)",
                    path=name,
                )
        return scan_folders([Path(name) for name in names], declared, store)  # names its fields
    listing = _listing(names[0], remote)
    header = columns_of(*listing) if listing is not None else None
    if listing is not None and header is not None and header != ["path", "label"]:
        return replace(scan_table(*listing, declared=dict(declared), store=store, files=image_tree(image_root)), names_fields=True)
    extra = {name for name, _ in declared} - {"image"}
    if extra:
        raise ConvertError(
            f"an ImageFolder or path,label listing has the fields image and label; cannot declare {', '.join(sorted(extra))}"
        )
    kind = dict(declared).get("image") or store
    if kind not in IMAGE_KINDS:
        raise ConvertError(f"field 'image' must be stored as an image kind ({', '.join(IMAGE_KINDS)}), not {kind!r}")
    # an ImageFolder, a path,label listing or tars: never Parquet here; the image stored as asked
    scan = scan_source(names[0], remote=remote, image_root=image_root)
    return replace(scan, fields=(RecordField("image", kind), *scan.fields[1:]), names_fields=True)


def image_tree(image_root: Location | None) -> LocalTree | None:
    """The tree of a listing's image root (None: none given, the listing's folder).

    Raises:
        ConvertError: the root is a URL, or not a folder.
    """
    if image_root is None:
        return None
    text = os.path.expanduser(os.fspath(image_root))
    if classify_location(text).is_remote:
        raise ConvertError("a listing's image root (image_root=) is a local folder", path=text.partition("?")[0])
    if not os.path.isdir(text):
        raise ConvertError("the image root (image_root=) is not a folder", path=text)
    return LocalTree(Path(os.path.abspath(text)))


def parquet_folders(texts: list[str]) -> list[str]:
    """`texts` with each local folder of Parquet or Arrow files (no sub-folders, at least one
    ``.parquet`` or ``.arrow`` file; other files aside) replaced by those files, sorted."""
    found: list[str] = []
    for text in texts:
        path = os.path.expanduser(text)
        if classify_location(text).is_remote or not os.path.isdir(path) or saved_dataset_files(Path(path)) is not None:
            found.append(text)
            continue
        entries = [entry for entry in os.scandir(path) if not entry.name.startswith(".")]
        files = sorted(entry.path for entry in entries if entry.is_file() and names_parquet(entry.name))
        found.extend(files if files and not any(entry.is_dir() for entry in entries) else [text])
    return found


def _several_tars(texts: list[str]) -> list[Path]:
    """The tars of several local tar sources (files, brace patterns, folders of tars), in order.

    Raises:
        ConvertError: a tar is named twice.
    """
    tars: list[Path] = []
    for text in texts:
        named = local_tars(text)
        if named is None:
            folder = Path(os.path.expanduser(text))
            named = [folder / name for name in tars_in_folder(LocalTree(folder))]
        tars.extend(named)
    seen: set[str] = set()
    for tar in tars:
        if os.path.abspath(tar) in seen:
            raise ConvertError("this tar is named twice among the sources", path=tar)
        seen.add(os.path.abspath(tar))
    return tars


def is_tar_source(location: Location) -> bool:
    """True if `location` names local WebDataset tars: a ``.tar`` file or brace pattern, or a
    folder of ``.tar`` files only."""
    text = os.fspath(location)
    if classify_location(text).is_remote:
        return False
    if classify_location(text).is_tars:
        return True
    path = Path(text)
    return path.is_dir() and bool(tars_in_folder(LocalTree(path)))


def listing_columns(location: Location, *, remote: RemoteOptions | None = None) -> list[str] | None:
    """Return the column names of a listing (its header, or its first object's keys), or None
    if `location` is not a readable listing. Reads its first MiB (one GET for a URL)."""
    listing = _listing(os.fspath(location), remote)
    return columns_of(*listing) if listing is not None else None


def source_name(location: Location, *, remote: RemoteOptions | None = None) -> str:
    """How a plan names a source: its resolved path, or its URL without credentials."""
    text = os.fspath(location)
    return open_store(text, remote=remote).root if classify_location(text).is_remote else str(Path(text).resolve())


def _scan_parquet(texts: list[str], columns: ParquetColumns, remote: RemoteOptions | None) -> SourceScan:
    """Scan Parquet files: local files and patterns, or one URL of a file or a pattern of file names."""
    others = [text for text in texts if not names_parquet(text)]
    if others:
        raise ConvertError("a Parquet source is .parquet files (or patterns of them) only", path=others[0])
    urls = [text for text in texts if classify_location(text).is_remote]
    if not urls:
        tree, names = local_parquet(texts)
        return scan_parquet(tree, names, columns=columns)
    if len(texts) != 1:
        raise ConvertError(
            "Parquet files by URL are one URL: a file, or a pattern of file names (s3://bucket/data/train-*.parquet)",
            path=urls[0].partition("?")[0],
        )
    base, question, query = texts[0].partition("?")
    folder, _, name = base.rstrip("/").rpartition("/")
    if has_pattern(folder):
        raise ConvertError("a pattern in a URL may match file names only, not folders", path=folder)
    store_tree = _store_tree(folder + question + query, remote)
    return scan_parquet(store_tree, store_parquet_names(store_tree, name), columns=columns)


def _listing(text: str, remote: RemoteOptions | None) -> tuple[Tree, str] | None:
    """The folder and name of the listing `text` names, or None if it names none. A URL names a
    listing by its suffix; a local path must also be a file."""
    where = classify_location(text)
    if where.is_remote:
        folder, name = where.split_url()
        if not name.lower().endswith(LISTING_SUFFIXES):
            return None
        return _store_tree(folder, remote), name
    path = Path(text)
    if path.is_file() and path.suffix.lower() in LISTING_SUFFIXES:
        return LocalTree(path.parent), path.name
    return None


def _store_tree(url: str, remote: RemoteOptions | None) -> StoreTree:
    """The store prefix at `url`, or a refusal if it names tars or its store cannot list."""
    if names_tars(url.partition("?")[0]):
        raise ConvertError(TARS_BY_URL, path=open_store(url, remote=remote).root)
    store = open_store(url, remote=remote)
    if not store.supports_listing:
        raise ConvertError(
            "a source URL must be a store that can list its objects (s3://, gs://, az://, ...), not plain HTTP", path=store.root
        )
    return StoreTree(store, url.rstrip("/"))
