"""Atomic file writes: a temporary name in the same directory, fsync, rename, fsync the directory.

Two ways for a large file's bytes to reach the disk while it is still being written:

- **Direct** (`AtomicFile`'s `direct`, Linux): the bytes are gathered in two page-aligned blocks
  of `DIRECT_BLOCK` bytes, and a background thread writes each full block with ``O_DIRECT``,
  from this process's memory to the device, while the next block fills. Nothing goes through the
  page cache: no page to allocate, copy into and write back later, and a conversion of a dataset
  larger than memory does not push its own inputs out of the cache. Measured here on 463 MB
  written in 92 KB pieces, each read from a file first (`resource.getrusage`, three runs):
  0.15 to 0.17 s of CPU, against 0.26 to 0.31 s for the buffered writes below. The tail (less
  than a block) is written through the page cache at the commit. A file system that refuses
  ``O_DIRECT`` (on opening, or on the first write) gets the buffered writes instead.
- **Buffered, synced as it goes** (`sync_every`): each time that many more bytes have been
  written, a background thread calls ``fdatasync`` on what is there, so the fsync of the commit
  has only the tail left to wait for. Measured on a 185 MB shard here: the commit's fsync went
  from about 90 ms, during which nothing else happens, to a few.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import threading
from pathlib import Path
from typing import IO, Final, TypeVar

try:
    import fcntl
except ImportError:  # not a POSIX system: no O_DIRECT either
    fcntl = None  # type: ignore[assignment]

_O_DIRECT: Final = getattr(os, "O_DIRECT", 0) if fcntl is not None else 0

__all__ = ["DIRECT_BLOCK", "SYNC_EVERY", "AtomicFile", "atomic_write_bytes", "fsync_directory", "temp_path"]

SYNC_EVERY = 16 * 1024 * 1024
"""Bytes of a large file written between two background fdatasyncs (see the module docstring)."""
DIRECT_BLOCK: Final = 4 * 1024 * 1024
"""Bytes of a direct write (a multiple of every device's block size); two such blocks per file."""

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

    Args:
        path: the final path.
        sync_every: with buffered writes, start an fdatasync in the background each time this
            many more bytes have been written (None: only the commit's fsync).
        direct: write full blocks with ``O_DIRECT`` where the file system allows it (see the
            module docstring); `sync_every` then serves only where opening with ``O_DIRECT`` is
            refused.
    """

    def __init__(self, path: str | os.PathLike[str], *, sync_every: int | None = None, direct: bool = False) -> None:
        self.path = Path(path)
        self.temp = temp_path(self.path)
        self._direct = _DirectFile.open(self.temp) if direct else None
        self.file: IO[bytes] | _DirectFile = open(self.temp, "wb") if self._direct is None else self._direct
        self._sync_every = sync_every
        self._unsynced = 0
        self._syncing: threading.Thread | None = None

    @property
    def is_direct(self) -> bool:
        """Whether full blocks go to the device with ``O_DIRECT`` (False once it was refused)."""
        return self._direct is not None and not self._direct.refused

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._direct is not None:
            return self._direct.write(data)
        written = self.file.write(data)
        if self._sync_every is not None:
            self._unsynced += written
            if self._unsynced >= self._sync_every and (self._syncing is None or not self._syncing.is_alive()):
                self._unsynced = 0
                self.file.flush()
                self._syncing = threading.Thread(target=_quiet_datasync, args=(self.file.fileno(),), name="shardfmt-writeback", daemon=True)
                self._syncing.start()
        return written

    def tell(self) -> int:
        return self.file.tell()  # a _DirectFile counts what it was given

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self.file.closed

    def close(self) -> None:
        self.commit()

    def commit(self) -> None:
        self._wait_for_writeback()
        if self._direct is not None:
            self._direct.finish()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temp, self.path)
        fsync_directory(self.path.parent)

    def abort(self) -> None:
        self._wait_for_writeback()
        if not self.file.closed:
            self.file.close()
        try:
            os.unlink(self.temp)
        except FileNotFoundError:
            pass

    def _wait_for_writeback(self) -> None:
        if self._syncing is not None:
            self._syncing.join()
            self._syncing = None


class _DirectFile:
    """A file written in whole `DIRECT_BLOCK` blocks with ``O_DIRECT`` by a background thread,
    and its tail through the page cache by `finish()` (see the module docstring). An error of the
    background write is raised by the next `write` or by `finish`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.direct = True  # O_DIRECT is set on the file
        self.refused = False  # the file system refused a direct write
        self.closed = False
        self._blocks = [_take_block(), _take_block()]
        self._views = [memoryview(block) for block in self._blocks]
        self._current = 0
        self._fill = 0
        self._handed = 0  # bytes handed to the thread: whole blocks
        self._in_flight = False
        self._jobs: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, path: Path) -> _DirectFile | None:
        """Create `path` for direct writes; None where this system or file system has no
        ``O_DIRECT``."""
        if not _O_DIRECT:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | _O_DIRECT, 0o666)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            return None
        return cls(fd)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if not isinstance(data, (bytes, bytearray)):
            data = memoryview(data).cast("B")
        size = len(data)
        if self._fill + size < DIRECT_BLOCK:  # the usual case: it fits in the block being filled
            self._views[self._current][self._fill : self._fill + size] = data
            self._fill += size
            return size
        view = memoryview(data)
        done = 0
        while done < size:
            take = min(size - done, DIRECT_BLOCK - self._fill)
            self._views[self._current][self._fill : self._fill + take] = view[done : done + take]
            self._fill += take
            done += take
            if self._fill == DIRECT_BLOCK:
                self._hand_over()
        return size

    def tell(self) -> int:
        return self._handed + self._fill

    def fileno(self) -> int:
        return self._fd

    def flush(self) -> None:
        """Nothing to do: whole blocks are on their way, and `finish` writes the tail."""

    def finish(self) -> None:
        """Wait for the blocks handed over, then write the tail through the page cache."""
        self._stop_thread()
        if self._fill:
            self._drop_direct()
            self._write_at(self._views[self._current][: self._fill], self._handed)

    def close(self) -> None:
        """Close the file; a block still being written is waited for, an error of it dropped."""
        if self.closed:
            return
        self.closed = True
        try:
            self._stop_thread()
        except OSError:
            pass
        finally:
            os.close(self._fd)
            for view in self._views:
                view.release()
            for block in self._blocks:
                _give_block(block)
            self._views, self._blocks = [], []

    def _hand_over(self) -> None:
        if self._in_flight:  # the other block is still being written: it is the next to fill
            self._collect()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shardfmt-direct", daemon=True)
            self._thread.start()
        self._jobs.put((self._current, self._handed))
        self._in_flight = True
        self._handed += DIRECT_BLOCK
        self._current ^= 1
        self._fill = 0

    def _collect(self) -> None:
        self._in_flight = False
        error = self._done.get()
        if error is not None:
            raise error

    def _stop_thread(self) -> None:
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
        if self._in_flight:
            self._collect()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            index, offset = job
            try:
                self._write_at(self._views[index], offset)
            except BaseException as err:  # raised again by the next write, or by finish()
                self._done.put(err)
            else:
                self._done.put(None)

    def _write_at(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            try:
                done += os.pwrite(self._fd, view[done:], offset + done)
            except OSError as err:
                if err.errno != errno.EINVAL or not self.direct:
                    raise
                self.refused = True
                self._drop_direct()  # the file system took O_DIRECT on opening, not on writing

    def _drop_direct(self) -> None:
        if self.direct:
            fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
            self.direct = False


_spare_blocks: list[mmap.mmap] = []
_spare_lock = threading.Lock()


def _take_block() -> mmap.mmap:
    """A page-aligned block of `DIRECT_BLOCK` bytes, reused from a finished file when there is one
    (its pages are already mapped: a fresh block costs a page fault each 4 KiB on first use)."""
    with _spare_lock:
        if _spare_blocks:
            return _spare_blocks.pop()
    return mmap.mmap(-1, DIRECT_BLOCK)


def _give_block(block: mmap.mmap) -> None:
    with _spare_lock:
        if len(_spare_blocks) < 2:
            _spare_blocks.append(block)
            return
    try:
        block.close()
    except BufferError:  # a view of it outlives the file (in a traceback): let it go with that
        pass


def _quiet_datasync(fd: int) -> None:
    """fdatasync in the background: an error here (the disk full, say) shows again in the
    commit's own fsync, which raises it."""
    try:
        getattr(os, "fdatasync", os.fsync)(fd)
    except OSError:
        pass


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically: readers see the old file or the whole new one."""
    with AtomicFile(path) as out:
        out.write(data)
