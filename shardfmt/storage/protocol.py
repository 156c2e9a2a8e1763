"""The protocol every byte source implements, with its capability flags."""

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
