"""The ring of batch slots in shared memory: created by the loader, attached by its workers.

One segment holds every slot. Slot s is ``images[s]`` (batch_size x H x W x C uint8, page
aligned) and ``labels[s]`` (batch_size int64). Size in bytes::

    num_slots * (align(batch_size * H * W * C, 4096) + align(8 * batch_size, 4096))

The loader unlinks the segment on close, so /dev/shm holds nothing afterwards; memory that a
consumer still references stays mapped until it is garbage-collected. If the loader process is
killed, multiprocessing's resource tracker unlinks the segment when it notices.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

__all__ = ["SlotLayout", "SlotRing"]

_PAGE = 4096


def _align(value: int) -> int:
    return (value + _PAGE - 1) // _PAGE * _PAGE


@dataclass(frozen=True)
class SlotLayout:
    """Geometry of the ring: how many slots of how many images of which shape."""

    num_slots: int
    batch_size: int
    image_shape: tuple[int, int, int]

    @property
    def image_bytes(self) -> int:
        return _align(self.batch_size * int(np.prod(self.image_shape)))

    @property
    def label_bytes(self) -> int:
        return _align(8 * self.batch_size)

    @property
    def slot_bytes(self) -> int:
        return self.image_bytes + self.label_bytes

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
        array = np.frombuffer(buffer, np.uint8, count=layout.total_bytes)
        self.images = []
        self.labels = []
        for slot in range(layout.num_slots):
            base = slot * layout.slot_bytes
            images = array[base : base + layout.batch_size * int(np.prod(layout.image_shape))]
            self.images.append(images.reshape(layout.batch_size, *layout.image_shape))
            start = base + layout.image_bytes
            self.labels.append(array[start : start + 8 * layout.batch_size].view(np.int64))

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
            return cls(name, layout, _map(name, layout.total_bytes), None)
        segment = shared_memory.SharedMemory(name=name)
        return cls(name, layout, segment.buf, None)

    def unlink(self) -> None:
        """Remove the segment's name; mappings stay valid until their last user goes."""
        if self._owner is not None:
            try:
                self._owner.unlink()
            except FileNotFoundError:
                pass
            self._owner = None


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
