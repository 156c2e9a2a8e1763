"""The ring of batch slots in shared memory: created by the loader, attached by its workers.

One segment holds every slot. A slot holds one page-aligned array per output field,
``arrays[s][name]`` of shape (batch_size, *shape) and the field's dtype: for the single-image
form an image array (batch_size x H x W x C uint8) and a label array (batch_size int64); with
several fields, one per field. Size in bytes::

    num_slots * sum over the arrays of align(batch_size * prod(shape) * itemsize, 4096)

which for the single-image form is
``num_slots * (align(batch_size * H * W * C, 4096) + align(8 * batch_size, 4096))``.

A ring made for one layout serves a smaller one too (`SlotRing.with_layout`): after a change of
output size the loader keeps its segment unless the new slots need more bytes than it has.

The loader unlinks the segment on close, so /dev/shm holds nothing afterwards; memory that a
consumer still references stays mapped until it is garbage-collected. If the loader process is
killed, multiprocessing's resource tracker unlinks the segment when it notices.
"""

from __future__ import annotations

import mmap
import os
import secrets
import sys
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

__all__ = ["SlotArray", "SlotLayout", "SlotRing"]

_PAGE = 4096


def _align(value: int) -> int:
    return (value + _PAGE - 1) // _PAGE * _PAGE


@dataclass(frozen=True)
class SlotArray:
    """One array of every slot: `shape` and numpy `dtype` (a string such as "|u1") of one sample."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def sample_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_config(self) -> list[Any]:
        return [self.name, list(self.shape), self.dtype]

    @classmethod
    def from_config(cls, value: list[Any]) -> SlotArray:
        return cls(value[0], tuple(value[1]), value[2])


@dataclass(frozen=True)
class SlotLayout:
    """Geometry of the ring: how many slots of how many samples, and the arrays of a slot."""

    num_slots: int
    batch_size: int
    arrays: tuple[SlotArray, ...]

    def array_bytes(self, array: SlotArray) -> int:
        return _align(self.batch_size * array.sample_bytes)

    @property
    def slot_bytes(self) -> int:
        return sum(self.array_bytes(array) for array in self.arrays)

    @property
    def total_bytes(self) -> int:
        return self.num_slots * self.slot_bytes


class SlotRing:
    """Numpy views of every slot over one shared-memory segment.

    Use `SlotRing.create(layout)` in the loader and `SlotRing.attach(name, layout)` in a worker.
    """

    def __init__(self, name: str, layout: SlotLayout, buffer: mmap.mmap | memoryview, owner: shared_memory.SharedMemory | None) -> None:
        self.name = name
        self.layout = layout
        self._owner = owner
        self._buffer = buffer
        self.capacity = len(buffer)
        """Bytes of the mapping: at least `layout.total_bytes`."""
        memory = np.frombuffer(buffer, np.uint8, count=layout.total_bytes)
        self.arrays: list[dict[str, np.ndarray]] = []
        for slot in range(layout.num_slots):
            start = slot * layout.slot_bytes
            views = {}
            for array in layout.arrays:
                view = memory[start : start + layout.batch_size * array.sample_bytes].view(array.dtype)
                views[array.name] = view.reshape(layout.batch_size, *array.shape)
                start += layout.array_bytes(array)
            self.arrays.append(views)

    @classmethod
    def create(cls, layout: SlotLayout) -> SlotRing:
        """Create the segment and reserve its pages now, so that a too-small /dev/shm fails here
        with a clear error instead of killing a worker with SIGBUS later.

        Raises:
            MemoryError: the shared memory cannot be reserved.
        """
        name = f"shardfmt-{os.getpid()}-{secrets.token_hex(4)}"
        owner = shared_memory.SharedMemory(name=name, create=True, size=max(layout.total_bytes, 1))
        try:
            if os.name == "posix":
                _reserve(owner.name, layout.total_bytes)
            buffer = _map(owner.name, layout.total_bytes) if os.name == "posix" else owner.buf
        except BaseException:
            owner.close()
            owner.unlink()
            raise
        if os.name == "posix":
            owner.close()  # our own mapping stays; the owner object is kept only to unlink
        return cls(owner.name, layout, buffer, owner)

    @classmethod
    def attach(cls, name: str, layout: SlotLayout) -> SlotRing:
        """Map an existing segment without registering it with a resource tracker (the creator
        owns its lifetime)."""
        if os.name == "posix":
            buffer = _map(name, layout.total_bytes)
            _populate(buffer)
            return cls(name, layout, buffer, None)
        segment = shared_memory.SharedMemory(name=name)
        return cls(name, layout, segment.buf, None)

    def with_layout(self, layout: SlotLayout) -> SlotRing:
        """Views of the same segment for another layout that fits in it; the new ring takes over
        unlinking the segment.

        Raises:
            ValueError: the layout needs more bytes than the segment has.
        """
        if layout.total_bytes > self.capacity:
            raise ValueError(f"a layout of {layout.total_bytes} bytes does not fit in a ring of {self.capacity}")
        ring = SlotRing(self.name, layout, self._buffer, self._owner)
        self._owner = None
        return ring

    def unlink(self) -> None:
        """Remove the segment's name; mappings stay valid until their last user goes."""
        if self._owner is not None:
            try:
                self._owner.unlink()
            except FileNotFoundError:
                pass
            self._owner = None


_POPULATE_WRITE = 23
"""Linux's MADV_POPULATE_WRITE (5.14 and later)."""


def _populate(buffer: mmap.mmap) -> None:
    """Map every page of `buffer` now, in one call, instead of one page fault at a time as the
    first epoch writes each slot: two workers took 69,000 page faults in their first epoch and
    2,800 in the next, 13,000 in the first once populated, measured here (a worker is ready some
    20 ms later). Nothing happens where the kernel lacks the advice."""
    if sys.platform.startswith("linux"):
        try:
            buffer.madvise(_POPULATE_WRITE)
        except (OSError, ValueError, AttributeError):
            pass


def _map(name: str, size: int) -> mmap.mmap:
    import _posixshmem  # the module multiprocessing.shared_memory itself uses

    fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, max(size, 1))
    finally:
        os.close(fd)


def _reserve(name: str, size: int) -> None:
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name.lstrip("/"), os.O_RDWR, mode=0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, max(size, 1))
    except OSError as err:
        free = ""
        if os.path.isdir("/dev/shm"):
            stats = os.statvfs("/dev/shm")
            free = f"; /dev/shm has {stats.f_bavail * stats.f_frsize} bytes free"
        raise MemoryError(
            f"cannot reserve {size} bytes of shared memory for the batch slots ({err.strerror}){free}. "
            "Lower batch_size or prefetch, or give the container more (docker run --shm-size=...)"
        ) from err
    finally:
        os.close(fd)
