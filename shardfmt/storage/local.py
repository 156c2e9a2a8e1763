"""Local files, memory-mapped read-only: range reads are zero-copy views of the page cache."""

from __future__ import annotations

import mmap
import os
import stat

from ..errors import ShardNotFoundError


class LocalFile:
    """A memory-mapped local file (see `ByteSource`).

    Raises:
        ShardNotFoundError: the file does not exist, or is not a regular file.
    """

    zero_copy = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError as err:
            raise ShardNotFoundError("shard file does not exist", path=self.path) from err
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise ShardNotFoundError("is not a regular file, so it cannot be a shard", path=self.path)
            self.size = status.st_size
            self._map: mmap.mmap | None = (
                mmap.mmap(fd, self.size, access=mmap.ACCESS_READ) if self.size else None
            )
        finally:
            os.close(fd)
        self._view = memoryview(self._map) if self._map is not None else memoryview(b"")

    def read(self, start: int, stop: int) -> memoryview:
        return self._view[start:stop]

    def close(self) -> None:
        """Unmap the file, unless views handed out are still alive: then it unmaps when they go."""
        try:
            self._view.release()
            if self._map is not None:
                self._map.close()
        except BufferError:
            pass
