"""A local cache of whole remote shards: a size limit, least-recently-used eviction, and safe
sharing by every process on the machine.

Layout of the cache folder::

    .lock                                   flock'ed while room is made (eviction, reservations)
    locks/NN.lock                           64 striped locks: one download of an object at a time
    shards/<dataset>/<checksum>-<size>-<key>           complete shards, named by content
    shards/<dataset>/.<name>.<size>.tmp-<pid>-<thread> downloads in progress

A shard is downloaded under a temporary name, its XXH3-64 checked against the manifest's, then
renamed into place: a reader only ever sees complete, verified files. A corrupt download is
fetched once more; a second mismatch raises `ChecksumError` naming the object. Before a download
starts, room is made under the cache lock: the least recently used complete shards (by mtime,
which every use touches) are removed until the shards plus every download in progress (counted
at full size, from their names) fit the limit; when the downloads in progress alone leave no room,
the download waits for one of them to end. A reader maps a shard under the cache lock, so no
eviction comes between its arrival and its mapping. Removing a file that another process has
mapped is safe on POSIX: its mapping stays valid, and the space returns when the last mapping
closes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final, TypeVar

from .._checksum import file_checksum
from .._errors import ChecksumError, RemoteError
from .local import LocalFile
from .protocol import Store
from .remote import RemoteFile

__all__ = ["MAX_MAPPED_SHARDS", "CachedFile", "ShardCache"]

logger = logging.getLogger("shardfmt._storage")
LOCK_STRIPES: Final = 64
MAX_MAPPED_SHARDS: Final = 16
"""Cached shards a process keeps memory-mapped at once; older mappings close (LRU), so that
shards the cache evicted stop holding disk space."""
_T = TypeVar("_T")
_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<size>\d+)\.tmp-(?P<pid>\d+)-\d+\Z")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class ShardCache:
    """Whole shards in a local folder (see the module docstring).

    Args:
        directory: the cache folder; created if missing.
        size_limit: bytes of shards the folder may hold.
    """

    def __init__(self, directory: str | os.PathLike[str], *, size_limit: int) -> None:
        self.directory = Path(directory)
        self.size_limit = size_limit
        (self.directory / "locks").mkdir(parents=True, exist_ok=True)
        (self.directory / "shards").mkdir(exist_ok=True)
        self.downloads = 0
        """Shards this process downloaded (re-fetches included), for tests and tuning."""

    def entry_path(self, namespace: str, key: str, *, size: int, checksum: int) -> Path:
        """Where the shard `key` of dataset `namespace` lives in the cache."""
        return self.directory / "shards" / namespace / f"{checksum:016x}-{size}-{key.replace('/', '%2F')}"

    def fetch(self, store: Store, key: str, *, size: int, checksum: int, namespace: str) -> Path:
        """Return the cached copy of a shard, downloading and verifying it first if needed.

        Raises:
            ChecksumError: two downloads in a row did not match the manifest's checksum.
            RemoteError: the download failed after its retries, or the limit is below `size`.
            ShardNotFoundError: the object does not exist.
        """
        return self._get(store, key, size=size, checksum=checksum, namespace=namespace, use=lambda path: path)

    def open(self, store: Store, key: str, *, size: int, checksum: int, namespace: str) -> LocalFile:
        """Return the cached copy of a shard mapped, downloading it first if needed: it is mapped
        under the cache lock, so no eviction comes between its arrival and its mapping (an
        eviction after that leaves the mapping valid). Raises as `fetch` does."""
        return self._get(store, key, size=size, checksum=checksum, namespace=namespace, use=LocalFile)

    def _get(self, store: Store, key: str, *, size: int, checksum: int, namespace: str, use: Callable[[Path], _T]) -> _T:
        """`use` the cached copy of a shard, under .lock, downloading it first if needed."""
        dest = self.entry_path(namespace, key, size=size, checksum=checksum)
        if self._hit(dest, size):
            with _locked(self.directory / ".lock"):
                if self._hit(dest, size):
                    return use(dest)
        if size > self.size_limit:
            raise RemoteError(
                f"the shard is {size} bytes, more than the cache's size limit of {self.size_limit}: raise cache_size to at least {size}",
                path=store.describe(key),
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        stripe = self._stripe(dest.name)
        with _locked(stripe):
            with _locked(self.directory / ".lock"):
                if self._hit(dest, size):
                    return use(dest)
            for attempt in (1, 2):
                temp = dest.with_name(f".{dest.name}.{size}.tmp-{os.getpid()}-{threading.get_ident()}")
                self._reserve(temp, size, keep=dest, stripe=stripe)
                try:
                    store.get_file(key, os.fspath(temp))
                    self.downloads += 1
                    got_size, got = file_checksum(temp)
                    if got_size == size and got == checksum:
                        with _locked(self.directory / ".lock"):  # never while room is being made:
                            os.replace(temp, dest)  # a listing may miss a file renamed under it
                            return use(dest)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(temp)
                detail = f"{got_size} bytes with XXH3-64 {got:016x}, the manifest says {size} bytes with {checksum:016x}"
                if attempt == 1:
                    logger.warning("%s: downloaded %s; fetching it again", store.describe(key), detail)
        raise ChecksumError(f"downloaded twice, both times {detail}: the stored object is corrupt", path=store.describe(key))

    def _stripe(self, name: str) -> Path:
        """The lock a download of the complete shard `name` holds from start to end."""
        return self.directory / "locks" / f"{zlib.crc32(name.encode()) % LOCK_STRIPES:02d}.lock"

    def _reserve(self, temp: Path, size: int, *, keep: Path, stripe: Path) -> None:
        """Make room for `size` bytes and claim it with `temp`, the download's name (call holding
        `stripe`, the download's lock). While the downloads in progress leave no room, wait for
        one of them to end: a download holds its lock from before its name exists until after it
        is gone, so once that lock is held here, a name still there is stale and is removed."""
        while True:
            with _locked(self.directory / ".lock"):
                waiting = self._make_room(size, keep=keep)
                if waiting is None:
                    temp.touch()
                    return
            busy, name = waiting
            lock = self._stripe(name)
            with contextlib.ExitStack() as held:
                if lock != stripe:  # held here already: no download of its stripe is in progress
                    held.enter_context(_locked(lock))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(busy)

    def _hit(self, dest: Path, size: int) -> bool:
        try:
            if os.stat(dest).st_size != size:
                return False
            os.utime(dest)  # most recently used
            return True
        except FileNotFoundError:
            return False

    def _make_room(self, incoming: int, *, keep: Path) -> tuple[Path, str] | None:
        """Remove least recently used shards until `incoming` more bytes fit. Call under .lock.

        Returns:
            None if they fit now; else the file of a download in progress that takes the room
            (removing every complete shard would not make enough), and the shard's name.
        """
        complete: list[tuple[int, int, Path]] = []
        downloads: list[tuple[Path, str]] = []
        total = incoming
        for folder in (self.directory / "shards").iterdir():
            if not folder.is_dir():
                continue
            for entry in os.scandir(folder):
                temp = _TEMP.match(entry.name)
                if temp is not None:
                    if _alive(int(temp.group("pid"))):
                        total += int(temp.group("size"))
                        downloads.append((Path(entry.path), temp.group("name")))
                    else:  # left by a process that died mid-download
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
                    continue
                try:
                    status = entry.stat()
                except FileNotFoundError:
                    continue
                total += status.st_size
                if Path(entry.path) != keep:
                    complete.append((status.st_mtime_ns, status.st_size, Path(entry.path)))
        complete.sort()
        for _, size, path in complete:
            if total <= self.size_limit:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                total -= size
        return downloads[0] if total > self.size_limit and downloads else None

    def usage(self) -> int:
        """Bytes of complete shards in the cache now."""
        return sum(
            entry.stat().st_size
            for folder in (self.directory / "shards").iterdir()
            if folder.is_dir()
            for entry in os.scandir(folder)
            if not entry.name.startswith(".")
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CachedFile:
    """A remote shard read through the cache (see `ByteSource`).

    The header and table windows are fetched with range reads when it opens, so a shard can be
    validated and its table used without downloading it; the first read of a payload byte
    brings the whole shard into the cache and maps it.
    """

    zero_copy = False

    def __init__(
        self, store: Store, key: str, *, size: int, checksum: int, cache: ShardCache, namespace: str, windows: tuple[tuple[int, int], ...]
    ) -> None:
        self.path = store.describe(key)
        self.size = size
        self._store, self._key, self._checksum = store, key, checksum
        self._cache, self._namespace = cache, namespace
        opened = store.open(key, size=size, windows=windows)
        self._windows: RemoteFile | None = opened if isinstance(opened, RemoteFile) else None
        self._spans = windows  # only these are served from the windows; payload comes from the cache
        self._local: LocalFile | None = None

    def read(self, start: int, stop: int) -> memoryview:
        if self._local is None and self._windows is not None and any(a <= start and stop <= b for a, b in self._spans):
            hit = self._windows.cached(start, stop)
            if hit is not None:
                return hit
        return self.mapped().read(start, stop)

    def mapped(self) -> LocalFile:
        """The memory-mapped cached copy, fetched if needed."""
        if self._local is not None:
            _MAPPED.move_to_end(id(self))
            return self._local
        local = self._open_cached()
        self._local = local
        _MAPPED[id(self)] = self
        while len(_MAPPED) > MAX_MAPPED_SHARDS:
            _, oldest = _MAPPED.popitem(last=False)
            oldest.unmap()
        return local

    def _open_cached(self) -> LocalFile:
        return self._cache.open(self._store, self._key, size=self.size, checksum=self._checksum, namespace=self._namespace)

    def unmap(self) -> None:
        """Close the mapping of the cached copy; the next payload read maps it again."""
        _MAPPED.pop(id(self), None)
        if self._local is not None:
            self._local.close()
            self._local = None

    def close(self) -> None:
        self.unmap()
        if self._windows is not None:
            self._windows.close()


_MAPPED: OrderedDict[int, CachedFile] = OrderedDict()
"""The cached shards this process has mapped, least recently used first."""
