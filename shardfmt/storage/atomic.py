"""Atomic file writes: a temporary name in the same directory, fsync, rename, fsync the directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, TypeVar

__all__ = ["AtomicFile", "atomic_write_bytes", "fsync_directory", "temp_path"]

_T = TypeVar("_T", bound="Transaction")


def temp_path(path: Path) -> Path:
    """Return the temporary name `path` is written under: hidden, in the same directory."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Transaction:
    """A writer used as a context manager: leaving the block normally commits it (`close`), an
    exception discards it (`abort`). Subclasses set `closed` once committed or discarded."""

    closed: bool = False

    def close(self) -> object:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self.closed:
            self.close()


class AtomicFile(Transaction):
    """A binary file that appears under its final name only once `commit()` has run.

    Until then its bytes live under `temp_path(path)`; `abort()` (or leaving a `with` block by an
    exception) removes them. After `commit()` the file is fsynced, renamed and its directory fsynced.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.temp = temp_path(self.path)
        self.file: IO[bytes] = open(self.temp, "wb")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self.file.write(data)

    def tell(self) -> int:
        return self.file.tell()

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self.file.closed

    def close(self) -> None:
        self.commit()

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temp, self.path)
        fsync_directory(self.path.parent)

    def abort(self) -> None:
        if not self.file.closed:
            self.file.close()
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically: readers see the old file or the whole new one."""
    with AtomicFile(path) as out:
        out.write(data)
