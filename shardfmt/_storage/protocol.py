"""The protocols every byte source and every store implements, with their capability flags."""

from __future__ import annotations

from typing import Protocol


class ByteSource(Protocol):
    """A read-only file that serves byte ranges.

    Attributes:
        path: how errors name the file.
        size: its length in bytes.
        zero_copy: True if `read` returns views of a mapping rather than fresh copies.
    """

    path: str
    size: int
    zero_copy: bool

    def read(self, start: int, stop: int) -> memoryview:
        """Return bytes [start, stop); the caller has checked 0 <= start <= stop <= size."""
        ...

    def close(self) -> None:
        ...


class Store(Protocol):
    """Objects under one root, named by '/'-separated keys relative to it: a local folder or a
    bucket prefix. A dataset lives in one store; conversions write into one.

    Capability flags:
        supports_writes: `put` and `put_file` work (False for plain HTTP servers).
        supports_listing: `list` works (False for plain HTTP servers).
        atomic_writes: an object written with `put` or `put_file` appears whole under its key or
            not at all (true of object stores and of the local store's rename).

    Attributes:
        root: how messages name the store; never holds credentials.
    """

    root: str
    supports_writes: bool
    supports_listing: bool
    atomic_writes: bool

    def describe(self, key: str) -> str:
        """Return how messages name object `key` (no credentials)."""
        ...

    def get(self, key: str, *, start: int | None = None, stop: int | None = None, exact: bool = True) -> bytes:
        """Return the object's bytes, or bytes [start, stop) of it, in one request. With `exact`
        (the default) fewer bytes than asked for are an error, retried as a dropped connection;
        without, `stop` may lie past the end."""
        ...

    def open(self, key: str, *, size: int, windows: tuple[tuple[int, int], ...] = ()) -> ByteSource:
        """Open object `key` of `size` bytes for range reads; `windows` are ranges the caller is
        about to read, which a remote store fetches at once (and no more than once)."""
        ...

    def get_file(self, key: str, path: str) -> None:
        """Download the whole object into local file `path`."""
        ...

    def put(self, key: str, data: bytes) -> None:
        ...

    def put_file(self, key: str, path: str) -> None:
        """Upload local file `path` as object `key`."""
        ...

    def delete(self, key: str) -> None:
        """Remove object `key`; no error if it is missing."""
        ...

    def list(self, prefix: str = "") -> dict[str, dict[str, object]]:
        """Return every object under `prefix` (recursively): key -> {"size": int, "version": str}."""
        ...

    def exists(self, key: str) -> bool:
        ...
