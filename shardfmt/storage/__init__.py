"""Byte sources behind one small protocol: a size, range reads, and (locally) a zero-copy map."""

from __future__ import annotations

from .local import LocalFile
from .protocol import ByteSource

__all__ = ["ByteSource", "LocalFile", "open_source"]


def open_source(path: str) -> ByteSource:
    """Open `path` for range reads. Local paths are memory-mapped."""
    return LocalFile(path)
