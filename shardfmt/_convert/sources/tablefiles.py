"""Table files: which files a Parquet or Arrow source names, and how one is opened.

A table source is ``.parquet`` or ``.arrow`` files (`names_parquet`), local files and glob
patterns (`local_parquet`) or objects of a store (`store_parquet_names`), or a folder that
``datasets``' ``save_to_disk`` wrote (`saved_dataset_files`, its data files confined to it). A
file opens as a `pyarrow.parquet.ParquetFile` (`open_table`: memory-mapped when local, by range
reads from a store through `SourceReader`), an Arrow IPC file as an `ArrowFile` that reads like
one. pyarrow is an optional dependency, imported by `require_pyarrow` when a table is met.
"""

from __future__ import annotations

import fnmatch
import glob
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ..._errors import ConvertError, RejectError, RemoteError
from ..._storage import ByteSource
from ..._storage.urls import local_path
from .confine import check_regular, resolve_inside
from .results import describe_os_error
from .trees import Entry, LocalTree, StoreTree, Tree

pa: Any = None
pq: Any = None
"""pyarrow and pyarrow.parquet, imported by `require_pyarrow` when a Parquet or Arrow file is met
(an optional dependency, and a slow import that ``import shardfmt`` does not pay)."""

__all__ = [
    "ARROW_SUFFIX",
    "NO_PYARROW",
    "PARQUET_SUFFIX",
    "ArrowBatch",
    "ArrowFile",
    "SourceReader",
    "has_pattern",
    "local_parquet",
    "names_parquet",
    "open_table",
    "require_pyarrow",
    "saved_dataset_files",
    "store_outage",
    "store_parquet_names",
]

PARQUET_SUFFIX: Final = ".parquet"
ARROW_SUFFIX: Final = ".arrow"
"""An Arrow IPC file, as ``datasets``' ``save_to_disk`` writes them (``data-00000-of-00001.arrow``)."""
NO_PYARROW: Final = "reading Parquet files needs pyarrow: pip install 'shardfmt[parquet]'"
_PATTERN_CHARACTERS: Final = "*?["


def names_parquet(location: str | os.PathLike[str]) -> bool:
    """True if `location` (a path, a pattern or a URL) names Parquet or Arrow files: it ends in
    ``.parquet`` or ``.arrow``."""
    return os.fspath(location).partition("?")[0].rstrip("/").lower().endswith((PARQUET_SUFFIX, ARROW_SUFFIX))


def saved_dataset_files(folder: Path) -> list[str] | None:
    """The Arrow files of a folder that ``datasets``' ``save_to_disk`` wrote (``state.json``,
    ``dataset_info.json`` and ``data-NNNNN-of-NNNNN.arrow``), in the order ``state.json`` lists
    them; None if `folder` is not such a folder.

    Raises:
        ConvertError: the folder holds a saved ``DatasetDict`` (one sub-folder per split), or
            its ``state.json`` cannot be read.
    """
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise ConvertError(f"a saved DatasetDict: convert one split's folder ({', '.join(splits) or 'none found'})", path=folder)
    if not ((folder / "state.json").is_file() and (folder / "dataset_info.json").is_file()):
        return None
    try:
        state = json.loads((folder / "state.json").read_bytes())
        files = [str(item["filename"]) for item in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConvertError(f"state.json of a saved dataset cannot be read: {err}", path=folder) from err
    for name in files:
        _check_saved_file(folder, name)
    return files


def _check_saved_file(folder: Path, name: str) -> None:
    """Refuse a data file that ``state.json`` names unless it is a plain name of a regular file
    inside `folder`, once symbolic links are resolved.

    Raises:
        ConvertError: naming ``state.json``, the file and what is wrong with it.
    """
    where = folder / "state.json"
    if name in ("", os.curdir, os.pardir) or os.path.basename(name) != name or "/" in name or "\x00" in name:
        raise ConvertError(f"it names the data file {name!r}: a data file is a plain file name inside the folder", path=where)
    try:
        full = resolve_inside(folder, name)
        check_regular(os.stat(full))
    except RejectError as err:
        raise ConvertError(f"it names the data file {name!r}: {err.message}", path=where) from err
    except OSError as err:
        raise ConvertError(f"it names the data file {name!r}, which cannot be read: {describe_os_error(err)}", path=where) from err


def has_pattern(name: str) -> bool:
    """True if `name` is a glob pattern (holds ``*``, ``?`` or ``[``)."""
    return any(character in name for character in _PATTERN_CHARACTERS)


def local_parquet(locations: Sequence[str]) -> tuple[LocalTree, list[str]]:
    """The local Parquet files that `locations` (files or glob patterns) name: their deepest
    common folder and their paths relative to it, sorted.

    Raises:
        ConvertError: a file does not exist, or a pattern matches no file.
    """
    found: set[str] = set()
    for location in locations:
        path = local_path(location)
        if has_pattern(path):
            matched = [p for p in glob.glob(path) if os.path.isfile(p)]
            if not matched:
                raise ConvertError("no file matches the pattern", path=location)
            found.update(os.path.abspath(p) for p in matched)
        elif os.path.isfile(path):
            found.add(os.path.abspath(path))
        else:
            raise ConvertError("the source does not exist" if not os.path.exists(path) else "the source is not a file", path=location)
    root = os.path.commonpath([os.path.dirname(p) for p in found])
    # each file was named by the user, or matched by their pattern: a link among them is followed
    return LocalTree(Path(root), confined=False), sorted(os.path.relpath(p, root) for p in found)


def store_parquet_names(tree: StoreTree, name: str) -> list[str]:
    """The objects of the store folder `tree` that `name` (a file name or a pattern) names, sorted.

    Raises:
        ConvertError: the object does not exist, or the pattern matches none.
    """
    if not has_pattern(name):
        if tree.lookup(name).reject is not None:
            raise ConvertError("the source does not exist", path=tree.describe(name))
        return [name]
    names = sorted(entry.path for entry in tree.entries(None) if not entry.is_dir and fnmatch.fnmatchcase(entry.name, name))
    if not names:
        raise ConvertError("no object matches the pattern", path=tree.describe(name))
    return names


def require_pyarrow() -> None:
    """Import pyarrow; raise ConvertError (`NO_PYARROW`) when it is not installed."""
    global pa, pq
    if pq is not None:
        return
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError as err:
        raise ConvertError(NO_PYARROW) from err
    pa, pq = pyarrow, pyarrow.parquet


def open_table(tree: Tree, entry: Entry) -> Any:
    """A `pyarrow.parquet.ParquetFile` of `entry`: memory-mapped if local, range reads if stored;
    for an Arrow file an `_ArrowFile`, which reads like one."""
    if isinstance(tree, StoreTree):
        source = tree.store.open(entry.path.replace(os.sep, "/"), size=entry.size)
        return (
            ArrowFile(pa.py_buffer(source.read(0, source.size)))
            if entry.path.endswith(ARROW_SUFFIX)
            else pq.ParquetFile(SourceReader(source))
        )
    path = os.path.join(os.fspath(tree.root), entry.path)
    return ArrowFile(pa.memory_map(path)) if path.endswith(ARROW_SUFFIX) else pq.ParquetFile(path, memory_map=True)


class ArrowBatch:
    """One record batch of an Arrow file, seen as a Parquet row group's metadata."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        self.num_rows = batch.num_rows

    def image_bytes(self, column: str) -> int:
        return int(self.batch.column(column).nbytes)


class ArrowFile:
    """An Arrow IPC file (stream or file format, as ``save_to_disk`` writes it) read like a
    `pyarrow.parquet.ParquetFile`: each record batch is a row group. Reading is zero-copy from
    a memory map."""

    def __init__(self, source: Any) -> None:
        try:
            table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(source).read_all()
        self.schema_arrow = table.schema
        self._batches = table.to_batches()
        self.metadata = self

    @property
    def num_row_groups(self) -> int:
        return len(self._batches)

    def row_group(self, group: int) -> ArrowBatch:
        return ArrowBatch(self._batches[group])

    def read_row_group(self, group: int, columns: Sequence[str] | None = None) -> Any:
        table = pa.Table.from_batches([self._batches[group]])
        return table.select(list(columns)) if columns is not None else table


class SourceReader(io.RawIOBase):
    """A read-only, seekable file over a `ByteSource`, for pyarrow to read a stored file by ranges."""

    def __init__(self, source: ByteSource) -> None:
        super().__init__()
        self._source = source
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._source.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        stop = min(self._source.size, self._position + len(buffer))
        if stop <= self._position:
            return 0
        data = self._source.read(self._position, stop)
        count = stop - self._position
        memoryview(buffer).cast("B")[:count] = data
        self._position = stop
        return count

    def close(self) -> None:
        self._source.close()
        super().close()


def store_outage(err: BaseException) -> RemoteError | None:
    """The store's `RemoteError` behind `err` (raised as it is, or wrapped by pyarrow) if the
    store was unreachable (`RemoteError.transient`); else None."""
    seen: BaseException | None = err
    for _ in range(8):  # a short chain: the error, and what pyarrow wrapped
        if seen is None:
            return None
        if isinstance(seen, RemoteError):
            return seen if seen.transient else None
        seen = seen.__cause__ or seen.__context__
    return None
