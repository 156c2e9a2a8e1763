"""Reading the images of a table source's rows in a conversion's worker, one row group at a
time (`RowGroupReader`): a row's image is its bytes, or the file its ``path`` names, read only
inside the image root (`confine`); a store that stops answering stops the run, a row group
that cannot be read rejects its rows."""

from __future__ import annotations

import os

from ..._errors import RejectError
from ..._storage import RemoteOptions, open_store
from ..._storage.urls import is_url, local_path
from . import tablefiles
from .confine import read_regular, resolve_inside
from .results import is_transient_os_error
from .tablefiles import ARROW_SUFFIX, ArrowFile, SourceReader, require_pyarrow, store_outage

__all__ = ["RowGroupReader"]


class _ImagePath(str):
    """An image that a row names by path instead of holding its bytes."""


class RowGroupReader:
    """The images of Parquet rows, one row group at a time (in a conversion's worker).

    Args:
        root: what the rows' file paths are relative to: a local folder, or a URL.
        column: the image column.
        remote: credentials and retries for a URL.
        image_root: the folder relative image paths are resolved against; None: the folder of
            the row's file. An image given by path (a struct with a null ``bytes``) is read
            from that file; only local files are read so.
    """

    def __init__(self, root: str, column: str, remote: RemoteOptions | None, image_root: str | None = None) -> None:
        self.root, self.column, self.remote, self.image_root = root, column, remote, image_root
        self._group: tuple[str, int] | None = None
        self._images: list[bytes | _ImagePath | None] | RejectError = []
        self._first_row = 0

    def image(self, path: str, *, row_group: int, row: int, file_size: int) -> bytes:
        """The image bytes of row `row` of row group `row_group` of file `path`.

        Raises:
            RejectError: "no-image" (null), or "unreadable" (the file, or the row group, cannot be read).
        """
        if self._group != (path, row_group):
            self._images, self._first_row = self._load(path, row_group, file_size)
            self._group = (path, row_group)
        if isinstance(self._images, RejectError):
            raise RejectError(self._images.message, reason=self._images.reason, transient=self._images.transient)
        if row >= len(self._images):
            raise RejectError(f"row group {row_group} has {len(self._images)} rows, not {row + 1}: the file changed", reason="unreadable")
        data = self._images[row]
        where = f"row {self._first_row + row} (row group {row_group})"
        if isinstance(data, _ImagePath):
            return self._read_path(data, path, where)
        if data is None:
            raise RejectError(f"{where}: the image is null (neither bytes nor a path)", reason="no-image")
        return data

    def _read_path(self, name: str, parquet_path: str, where: str) -> bytes:
        """The bytes of the image file a row names by path, confined to the image root (see `confine`)."""
        if is_url(self.root) and self.image_root is None:
            raise RejectError(f"{where}: the image is a path ({name}), and paths are read from local files only: pass --image-root",
                              reason="missing-file")
        base = local_path(self.image_root if self.image_root is not None else os.path.dirname(os.path.join(self.root, parquet_path)))
        full = os.path.join(base, name)
        try:
            return read_regular(resolve_inside(base, name), follow=False)
        except RejectError as err:
            raise RejectError(f"{where}: the image file {name}: {err.message}", reason=err.reason) from err
        except FileNotFoundError as err:
            against = "--image-root" if self.image_root is not None else "the folder of its Parquet file; --image-root sets another"
            raise RejectError(f"{where}: the image file {full} does not exist (a relative path is resolved against {against})",
                              reason="missing-file") from err
        except OSError as err:
            raise RejectError(f"{where}: the image file {full}: {err.strerror or err}", reason="unreadable",
                              transient=is_transient_os_error(err)) from err

    def _load(self, path: str, row_group: int, file_size: int) -> tuple[list[bytes | _ImagePath | None] | RejectError, int]:
        """The images of a row group (or why they cannot be read), and the file's row number of its first row."""
        require_pyarrow()
        pa, pq = tablefiles.pa, tablefiles.pq
        try:
            if is_url(self.root):
                source = open_store(self.root, remote=self.remote).open(path.replace(os.sep, "/"), size=file_size)
                parquet = (ArrowFile(pa.py_buffer(source.read(0, source.size))) if path.endswith(ARROW_SUFFIX)
                           else pq.ParquetFile(SourceReader(source)))
            elif path.endswith(ARROW_SUFFIX):
                parquet = ArrowFile(pa.memory_map(os.path.join(self.root, path)))
            else:
                parquet = pq.ParquetFile(os.path.join(self.root, path), memory_map=True)
            first = sum(parquet.metadata.row_group(n).num_rows for n in range(row_group))
            array = parquet.read_row_group(row_group, columns=[self.column]).column(0).combine_chunks()
        except (OSError, pa.ArrowException) as err:
            outage = store_outage(err)  # the store is unreachable, the file is not bad: the conversion stops
            if outage is err:
                raise
            if outage is not None:
                raise outage from err
            transient = isinstance(err, OSError) and is_transient_os_error(err)
            return RejectError(f"row group {row_group} cannot be read: {getattr(err, 'message', err)}", reason="unreadable",
                               transient=transient), 0
        if pa.types.is_struct(array.type):
            present = array.is_valid().to_pylist()
            names = array.field("path").to_pylist() if array.type.get_field_index("path") >= 0 else [None] * len(array)
            return [
                data if data is not None or not valid or name is None else _ImagePath(name)
                for data, name, valid in zip(array.field("bytes").to_pylist(), names, present, strict=True)
            ], first
        values: list[bytes | _ImagePath | None] = array.to_pylist()
        return values, first
