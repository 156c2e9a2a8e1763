"""The ring of batch slots in shared memory: created by the loader, attached by its workers.

Each slot is one segment (a slot still referenced by the caller when its turn to be refilled
comes is replaced by a fresh one: see `SlotRing.replace`). A slot holds one page-aligned array per output field,
``arrays[s][name]`` of shape (batch_size, *shape) and the field's dtype: for the single-image
form an image array (batch_size x H x W x C uint8) and a label array (batch_size int64); with
several fields, one per field. Size in bytes::

    num_slots * sum over the arrays of align(batch_size * prod(shape) * itemsize, 4096)

which for the single-image form is
``num_slots * (align(batch_size * H * W * C, 4096) + align(8 * batch_size, 4096))``.

A ring made for one layout serves a smaller one too (`SlotRing.with_layout`): after a change of
output size the loader keeps its segments unless the new slots need more bytes than they have.

On POSIX a segment's name is removed from /dev/shm the moment the loader has opened it: the
loader keeps a file descriptor, maps the memory through it, and sends a copy of it to each worker
over the worker's pipe before the first task that names it (`map_segment`). So nothing is ever
left in /dev/shm, whatever process is killed and when: the kernel frees a segment once the last
process that maps it or holds its descriptor is gone. A segment still counts against /dev/shm's
size while it lives (a container's ``--shm-size``), and the loader checks the free space before
it makes one (`shared_memory_free`). `SlotRing.close` unmaps every slot at once but those a
batch of the caller still views: that memory stays valid and is unmapped with the batch's last
reference. Elsewhere named `multiprocessing.shared_memory` segments serve, each
unlinked when its slot is set aside for the caller or on close.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import sys
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

if sys.platform != "win32":
    import resource

__all__ = [
    "Slot",
    "SlotArray",
    "SlotLayout",
    "SlotRing",
    "attach",
    "check_slot_memory",
    "descriptor_error",
    "map_segment",
    "segment_name",
    "shared_memory_free",
    "slot_arrays",
]

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


class Slot:
    """One slot's memory: a shared-memory segment (or a bytearray in the loader's own process)
    and the numpy views of its arrays. `owner` keeps the segment: its file descriptor (POSIX),
    the `SharedMemory` object (elsewhere), or None."""

    def __init__(
        self, name: str | None, layout: SlotLayout, buffer: mmap.mmap | memoryview, owner: int | shared_memory.SharedMemory | None
    ) -> None:
        self.name = name
        self._owner = owner
        self.buffer = buffer
        self.capacity = len(buffer)
        """Bytes of the mapping: at least `SlotLayout.slot_bytes`."""
        self.arrays = slot_arrays(buffer, layout)

    def with_layout(self, layout: SlotLayout) -> Slot:
        """Views of the same memory for a layout whose slot fits in it; the new slot takes over
        unlinking the segment."""
        slot = Slot(self.name, layout, self.buffer, self._owner)
        self._owner = None
        return slot

    @property
    def handle(self) -> int | None:
        """The segment's file descriptor, which a worker maps (`map_segment`); None where the
        segment is attached by name (`attach`) or there is none."""
        return self._owner if isinstance(self._owner, int) else None

    def unlink(self) -> None:
        """Give up the segment: close its descriptor (POSIX) or remove its name. Mappings (in
        workers, in tensors a caller holds) stay valid until their last user goes, and then the
        memory is released. Idempotent."""
        owner, self._owner = self._owner, None
        if isinstance(owner, int):
            os.close(owner)
        elif owner is not None:
            try:
                owner.unlink()
            except FileNotFoundError:
                pass

    def close(self) -> bool:
        """Give up the segment (`unlink`) and unmap it now unless a caller's batch still views
        it; such memory stays valid and is unmapped with the batch's last reference. Returns
        whether it was unmapped. Idempotent."""
        self.unlink()
        self.arrays = {}  # this slot's own views: what is left are the caller's
        try:
            if isinstance(self.buffer, mmap.mmap):
                self.buffer.close()
            else:
                self.buffer.release()
        except BufferError:  # exported to an array the caller holds
            return False
        return True


def slot_arrays(buffer: mmap.mmap | memoryview, layout: SlotLayout) -> dict[str, np.ndarray]:
    """The arrays of one slot, page-aligned one after the other from the start of `buffer`."""
    memory = np.frombuffer(buffer, np.uint8, count=layout.slot_bytes)
    views = {}
    start = 0
    for array in layout.arrays:
        view = memory[start : start + layout.batch_size * array.sample_bytes].view(array.dtype)
        views[array.name] = view.reshape(layout.batch_size, *array.shape)
        start += layout.array_bytes(array)
    return views


def segment_name(base: str, serial: int) -> str:
    """The name of segment number `serial` of the ring called `base`."""
    return f"{base}-{serial}"


class SlotRing:
    """The slots of a loader, one shared-memory segment each (`shared`), or bytearrays for a
    loader that decodes in its own process.

    A slot can be replaced by a fresh one (`replace`): the old one's name is unlinked and its
    memory left to whoever still references it. Slot `s` is segment ``serials[s]``; a worker maps
    it by `segment_name` (`attach`) when a task names a serial it has not mapped yet.
    """

    def __init__(self, layout: SlotLayout, *, shared: bool) -> None:
        self.layout = layout
        self.shared = shared
        self.name = f"shardfmt-{os.getpid()}-{secrets.token_hex(4)}"
        """The base of the segments' names."""
        self.slots: list[Slot] = []
        self.serials: list[int] = []
        self._next_serial = 0
        try:
            for _ in range(layout.num_slots):
                serial, slot = self._new_slot(layout)
                self.serials.append(serial)
                self.slots.append(slot)
        except BaseException:
            self.close()  # nothing of a ring that failed stays mapped
            raise

    @classmethod
    def create(cls, layout: SlotLayout) -> SlotRing:
        """Create and reserve every slot's segment now, so that a too-small /dev/shm fails here
        with a clear error instead of killing a worker with SIGBUS later.

        Raises:
            MemoryError: the shared memory cannot be reserved.
        """
        return cls(layout, shared=True)

    @classmethod
    def in_process(cls, layout: SlotLayout) -> SlotRing:
        """Slots in this process's own memory (num_workers=0)."""
        return cls(layout, shared=False)

    @property
    def arrays(self) -> list[dict[str, np.ndarray]]:
        return [slot.arrays for slot in self.slots]

    @property
    def capacity(self) -> int:
        """Bytes the slots hold: the smallest slot's times their number (what a layout may use)."""
        return min(slot.capacity for slot in self.slots) * len(self.slots) if self.slots else 0

    def _new_slot(self, layout: SlotLayout) -> tuple[int, Slot]:
        serial = self._next_serial
        self._next_serial += 1
        size = layout.slot_bytes
        if not self.shared:
            return serial, Slot(None, layout, memoryview(bytearray(max(size, 1))), None)
        name = segment_name(self.name, serial)
        free = shared_memory_free()
        if free is not None and size > free:  # said before anything is allocated
            raise MemoryError(
                f"a batch slot needs {size} bytes of shared memory, but /dev/shm has {free} bytes free. "
                "Lower batch_size or prefetch, or give the container more (docker run --shm-size=...)"
            )
        if os.name != "posix":
            segment = shared_memory.SharedMemory(name=name, create=True, size=max(size, 1))
            if segment.buf is None:
                raise MemoryError(f"shared-memory segment {name} could not be mapped")
            return serial, Slot(name, layout, segment.buf, segment)
        import _posixshmem  # the module multiprocessing.shared_memory itself uses

        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
            try:
                _posixshmem.shm_unlink("/" + name)  # the descriptor keeps the memory; no name to leak
                os.ftruncate(fd, max(size, 1))
                _reserve(fd, size)
                buffer = _map(fd, max(size, 1))
            except BaseException:
                os.close(fd)
                raise
        except OSError as err:
            limit = descriptor_error(err, "make a batch slot")
            if limit is None:
                raise
            raise limit from err
        return serial, Slot(name, layout, buffer, fd)

    def replace(self, index: int) -> None:
        """Put a fresh slot in place of slot `index`, whose memory is left to those who still
        reference it (its name is unlinked now; the memory goes with the last reference)."""
        self.slots[index].unlink()
        self.serials[index], self.slots[index] = self._new_slot(self.layout)

    def with_layout(self, layout: SlotLayout) -> SlotRing:
        """The same slots for another layout of as many slots that fit in them; the new ring
        takes over unlinking the segments.

        Raises:
            ValueError: the layout needs more slots or bytes than the ring has.
        """
        if layout.num_slots != len(self.slots) or any(slot.capacity < layout.slot_bytes for slot in self.slots):
            raise ValueError(
                (
                    f"a layout of {layout.num_slots} slots of {layout.slot_bytes} bytes does not fit in a ring of {len(self.slots)} of "
                    f"{self.capacity // max(1, len(self.slots))}"
                )
            )
        ring = object.__new__(SlotRing)
        ring.layout, ring.shared, ring.name = layout, self.shared, self.name
        ring.slots = [slot.with_layout(layout) for slot in self.slots]
        ring.serials, ring._next_serial = list(self.serials), self._next_serial
        return ring

    def fits(self, layout: SlotLayout) -> bool:
        return layout.num_slots == len(self.slots) and all(slot.capacity >= layout.slot_bytes for slot in self.slots)

    def unlink(self) -> None:
        """Remove the names of every slot's segment; mappings stay valid until their last user goes."""
        for slot in self.slots:
            slot.unlink()

    def close(self) -> None:
        """Give up every slot and unmap those no batch of the caller views (`Slot.close`): the
        ring holds no memory afterwards. Idempotent."""
        for slot in self.slots:
            slot.close()
        self.slots, self.serials = [], []


def map_segment(fd: int, layout: SlotLayout) -> mmap.mmap:
    """Map a segment whose file descriptor a worker received from the loader (POSIX); the caller
    may close the descriptor afterwards."""
    buffer = _map(fd, max(layout.slot_bytes, 1))
    _populate(buffer)
    return buffer


MAPPING_HOLDS_DESCRIPTOR = sys.version_info < (3, 13)
"""Whether a slot's mapping keeps a file descriptor of its own until it is unmapped: Python's mmap
duplicates the descriptor it maps, unless told not to (``trackfd=False``, Python 3.13 and later).
Then each batch a caller holds past the next one costs the loader's process one descriptor."""


def _map(fd: int, size: int) -> mmap.mmap:
    """Map `size` bytes of the segment `fd`, shared and writable, keeping no descriptor where
    Python allows (`MAPPING_HOLDS_DESCRIPTOR`)."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, size, trackfd=False)
    return mmap.mmap(fd, size)


def descriptor_error(err: OSError, doing: str) -> OSError | None:
    """The error to raise instead of `err` when it says that no file descriptor was left
    (EMFILE: this process's limit; ENFILE: the system's) as the loader tried `doing`: it names
    the errno, the limit, what holds descriptors and the fix. None for any other error."""
    if err.errno not in (errno.EMFILE, errno.ENFILE):
        return None
    if err.errno == errno.ENFILE:
        reached = "the system's table of open files is full (ENFILE)"
    else:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if sys.platform != "win32" else None
        reached = f"this process has no file descriptor left (EMFILE: its limit, ulimit -n, is {limit})"
    held = (
        "Each batch of a Loader held past the next one keeps one descriptor (and its shared memory) until its last "
        "reference goes, so a program that keeps many batches runs out of them. "
        if MAPPING_HOLDS_DESCRIPTOR
        else ""
    )
    return OSError(
        err.errno,
        f"the loader could not {doing}: {reached}. {held}Release the batches you keep (keep clones, or pass output=Output(copy=True)), "
        "or raise the limit (ulimit -n, or resource.setrlimit(resource.RLIMIT_NOFILE, ...) at start)",
    )


def attach(base: str, serial: int, layout: SlotLayout) -> dict[str, np.ndarray]:
    """Map segment `serial` of the ring `base` by name in a worker (where segments have names:
    not POSIX), without registering it with a resource tracker (the loader owns its lifetime),
    and return the slot's arrays."""
    segment = shared_memory.SharedMemory(name=segment_name(base, serial))
    if segment.buf is None:
        raise MemoryError(f"shared-memory segment {segment_name(base, serial)} could not be mapped")
    return slot_arrays(segment.buf, layout)


def check_slot_memory(layout: SlotLayout, *, batch_size: int, shared: bool) -> None:
    """Refuse, before anything is allocated, slots that cannot fit: in /dev/shm's free space
    (`shared`: the slots of worker processes) or in this machine's memory (in-process slots).

    Raises:
        ValueError: saying the bytes needed, the bytes there are, and the largest batch_size that fits.
    """
    if shared:
        room, where = shared_memory_free(), "/dev/shm has {room} bytes free"
    else:
        room, where = _physical_memory(), "this machine has {room} bytes of memory"
    need = layout.total_bytes
    if room is None or need <= room:
        return
    per_sample = sum(array.sample_bytes for array in layout.arrays)
    overhead = layout.num_slots * _PAGE * len(layout.arrays)  # each array rounds up to a page
    largest = max(0, (room - overhead) // max(1, layout.num_slots * per_sample))
    raise ValueError(
        f"batch_size={batch_size} needs {need} bytes for its {layout.num_slots} batch slots (prefetch + 1), but "
        f"{where.format(room=room)}: batch_size must be at most {largest} here; lower it or prefetch"
        + (", or give the container more shared memory (docker run --shm-size=...)" if shared else "")
    )


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


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
        free = shared_memory_free()
        raise MemoryError(
            f"cannot reserve {size} bytes of shared memory for a batch slot ({err.strerror})"
            f"{'' if free is None else f'; /dev/shm has {free} bytes free'}. "
            "Lower batch_size or prefetch, or give the container more (docker run --shm-size=...)"
        ) from err
