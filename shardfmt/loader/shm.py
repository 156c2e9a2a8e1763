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

On POSIX the segment's name is removed from /dev/shm the moment the loader has opened it: the
loader keeps a file descriptor, maps the memory through it, and hands a copy of it to each worker
over the worker's socket (`SlotRing.attach`). So nothing is ever left in /dev/shm, whatever
process is killed and when: the memory is freed by the kernel once the last process that maps
it or holds its descriptor is gone. It still counts against /dev/shm's size while it lives (a
container's ``--shm-size``). Memory that a consumer still references stays mapped until it is
garbage-collected. Elsewhere a named `multiprocessing.shared_memory` segment serves, unlinked on
close.
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

__all__ = ["SlotArray", "SlotLayout", "SlotRing", "shared_memory_free"]

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

    Use `SlotRing.create(layout)` in the loader and `SlotRing.attach(ring.handle, layout)` in a
    worker. `owner` is what keeps the segment: its file descriptor (POSIX) or the
    `SharedMemory` object (elsewhere); None for a ring that does not own its memory.
    """

    def __init__(self, name: str, layout: SlotLayout, buffer: mmap.mmap | memoryview, owner: int | shared_memory.SharedMemory | None) -> None:
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
        with a clear error instead of killing a worker with SIGBUS later. On POSIX its name is
        unlinked at once (see the module docstring).

        Raises:
            MemoryError: the shared memory cannot be reserved.
        """
        name = f"shardfmt-{os.getpid()}-{secrets.token_hex(4)}"
        size = max(layout.total_bytes, 1)
        free = shared_memory_free()
        if free is not None and size > free:  # said before anything is allocated
            raise MemoryError(
                f"the batch slots need {size} bytes of shared memory, but /dev/shm has {free} bytes free. "
                "Lower batch_size or prefetch, or give the container more (docker run --shm-size=...)"
            )
        if os.name != "posix":
            segment = shared_memory.SharedMemory(name=name, create=True, size=size)
            return cls(segment.name, layout, segment.buf, segment)
        import _posixshmem  # the module multiprocessing.shared_memory itself uses

        fd = _posixshmem.shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
        try:
            _posixshmem.shm_unlink("/" + name)  # the descriptor keeps the memory; no name to leak
            os.ftruncate(fd, size)
            _reserve(fd, size)
            buffer = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, layout, buffer, fd)

    @property
    def handle(self) -> int | str:
        """What a worker attaches: the segment's file descriptor (POSIX; send it with
        `multiprocessing.reduction.send_handle`) or its name."""
        return self._owner if isinstance(self._owner, int) else self.name

    @classmethod
    def attach(cls, handle: int | str, layout: SlotLayout) -> SlotRing:
        """Map an existing segment: a file descriptor received from the creator (POSIX; the caller
        may close it afterwards) or a name. The creator owns the segment's lifetime."""
        if isinstance(handle, int):
            buffer = mmap.mmap(handle, max(layout.total_bytes, 1))
            _populate(buffer)
            return cls(f"fd-{handle}", layout, buffer, None)
        segment = shared_memory.SharedMemory(name=handle)
        return cls(handle, layout, segment.buf, None)

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
        """Give up the segment: close its descriptor (POSIX) or remove its name. Mappings stay
        valid until their last user goes. Idempotent."""
        owner, self._owner = self._owner, None
        if isinstance(owner, int):
            os.close(owner)
        elif owner is not None:
            owner.close()
            try:
                owner.unlink()
            except FileNotFoundError:
                pass


def shared_memory_free() -> int | None:
    """Bytes free in /dev/shm, or None where there is no such folder to ask."""
    if not os.path.isdir("/dev/shm"):
        return None
    stats = os.statvfs("/dev/shm")
    return stats.f_bavail * stats.f_frsize


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


def _reserve(fd: int, size: int) -> None:
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
