"""What a test leaves behind in this process, measured before and after it: mappings of shared
memory, open file descriptors, child processes and the free space of /dev/shm.

The loader's ring segments are unlinked as soon as they are made, so a listing of /dev/shm
proves nothing: a leaked ring lives on as a mapping of a deleted file, in this process or in a
worker left running. The `no_leaks` fixture (tests/conftest.py) takes a `snapshot` before and
after a test and fails the test with every difference `leaks_between` reports.

What is not a leak, and why:

- What multiprocessing starts once and keeps for the whole session: its forkserver and resource
  tracker processes and the descriptor this process keeps to each, and the arenas of its shared
  heap (``pym-*`` files in /dev/shm, mapped, behind every ``multiprocessing.Value``; a free arena
  is kept for reuse). A test that first needs one makes it, and every later test reuses it.
- On a machine that others use too, the free space of /dev/shm moves with their processes: there
  a drop of up to `SHARED_MACHINE_SHM_TOLERANCE` is allowed. In CI (the CI variable set) the
  drop allowed is `CI_SHM_TOLERANCE`: CI runs on a machine that other work may share too, and a
  child process of a test that is still exiting holds its segments for a moment
  (``SHARDFMT_TEST_SHM_TOLERANCE`` sets another number of bytes). A leak of this process shows in its
  mappings, descriptors or children whatever the tolerance; the free space catches a segment
  that nobody maps any more but that still has a name.
"""

from __future__ import annotations

import gc
import multiprocessing.forkserver
import multiprocessing.heap
import multiprocessing.resource_tracker
import os
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

SHM = "/dev/shm"
SHARED_MACHINE_SHM_TOLERANCE = 256 * 1024 * 1024
CI_SHM_TOLERANCE = 64 * 1024 * 1024
"""Bytes of /dev/shm that other users of a shared machine may take during one test (two
default-sized loader rings of about 110 MB each)."""
_SHARED_MEMORY_PATHS = (f"{SHM}/", "/memfd:", "/SYSV")
"""How /proc/self/maps names POSIX shared memory, memfd segments and System V segments."""


@dataclass(frozen=True)
class Resources:
    """This process's resources at one moment."""

    mappings: frozenset[str]
    """Shared-memory mappings, as "PATH (inode N)": one entry per segment however many ranges map it."""
    descriptors: dict[int, str]
    """Open descriptors and what each refers to."""
    children: dict[int, str]
    """Child processes, grandchildren included, and their state (a zombie is one not waited for)."""
    shm_free: int | None
    """Bytes free in /dev/shm; None where there is none."""
    arena_bytes: int = 0
    """Bytes of /dev/shm that multiprocessing's shared-heap arenas take (they are not leaks)."""


@dataclass(frozen=True)
class Leaks:
    """What a test left behind: everything here is a failure."""

    mappings: list[str]
    descriptors: list[str]
    children: list[str]
    shm_dropped: int
    """Bytes by which the free space of /dev/shm dropped beyond the tolerance; 0 if it did not."""

    def __bool__(self) -> bool:
        return bool(self.mappings or self.descriptors or self.children or self.shm_dropped)

    def __str__(self) -> str:
        lines = [f"mapped: {m}" for m in self.mappings] + [f"descriptor {d}" for d in self.descriptors]
        lines += [f"child process {c}" for c in self.children]
        if self.shm_dropped:
            lines.append(f"/dev/shm: {self.shm_dropped} bytes fewer free (beyond the tolerance)")
        return "\n".join(lines)


def _mappings() -> frozenset[str]:
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith(_SHARED_MEMORY_PATHS):
                found.add(f"{parts[5].strip()} (inode {parts[4]})")
    return frozenset(found)


def _descriptors() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the descriptor listdir used, closed by now
            continue
    return found


def _arena_descriptors() -> list[int]:
    """The descriptors of multiprocessing's shared-heap arenas (files in /dev/shm)."""
    found = []
    for arena in multiprocessing.heap.BufferWrapper._heap._arenas:  # type: ignore[attr-defined]
        fd = getattr(arena, "fd", -1)
        if fd >= 0:
            found.append(fd)
    return found


def _session_helpers() -> tuple[set[int], set[int], set[str]]:
    """The pids of multiprocessing's session-long helpers, the descriptors this process keeps to
    them, and the files of its shared heap's arenas."""
    pids: set[int] = set()
    descriptors: set[int] = set()
    arenas = {os.readlink(f"/proc/self/fd/{fd}") for fd in _arena_descriptors()}
    server = multiprocessing.forkserver._forkserver  # type: ignore[attr-defined]
    if server._forkserver_pid is not None:
        pids.add(server._forkserver_pid)
    if server._forkserver_alive_fd is not None:
        descriptors.add(server._forkserver_alive_fd)
    tracker = multiprocessing.resource_tracker._resource_tracker  # type: ignore[attr-defined]
    if tracker._pid is not None:
        pids.add(tracker._pid)
    if tracker._fd is not None:
        descriptors.add(tracker._fd)
    return pids, descriptors, arenas


def snapshot() -> Resources:
    """This process's shared-memory mappings, descriptors, children and the free space of /dev/shm,
    once what only the garbage collector would free is freed."""
    gc.collect()
    children = {}
    for child in psutil.Process().children(recursive=True):
        try:
            children[child.pid] = f"{child.pid} {child.name()} ({child.status()})"
        except psutil.NoSuchProcess:  # it ended while being listed: not left behind
            continue
    shm_free = None
    if os.path.isdir(SHM):
        status = os.statvfs(SHM)
        shm_free = status.f_bavail * status.f_frsize
    arena_bytes = sum(os.fstat(fd).st_blocks * 512 for fd in _arena_descriptors())
    return Resources(_mappings(), _descriptors(), children, shm_free, arena_bytes)


def leaks_between(before: Resources, after: Resources, *, shm_tolerance: int) -> Leaks:
    """What `after` holds that `before` did not; a drop of free /dev/shm up to `shm_tolerance`
    bytes is allowed."""
    helper_pids, helper_descriptors, arenas = _session_helpers()
    descriptors = [
        f"{fd} -> {target}"
        for fd, target in sorted(after.descriptors.items())
        if before.descriptors.get(fd) != target and fd not in helper_descriptors and target not in arenas
    ]
    mappings = [m for m in sorted(after.mappings - before.mappings) if m.rpartition(" (inode ")[0] not in arenas]
    children = [state for pid, state in sorted(after.children.items()) if pid not in before.children and pid not in helper_pids]
    dropped = 0
    if before.shm_free is not None and after.shm_free is not None:
        arenas_grew = after.arena_bytes - before.arena_bytes
        dropped = max(0, before.shm_free - after.shm_free - arenas_grew - shm_tolerance)
    return Leaks(mappings, descriptors, children, dropped)


def shm_tolerance() -> int:
    """The drop of free /dev/shm allowed during one test (see the module docstring):
    ``SHARDFMT_TEST_SHM_TOLERANCE`` bytes if set (for CI on a host whose /dev/shm is shared)."""
    given = os.environ.get("SHARDFMT_TEST_SHM_TOLERANCE")
    if given is not None:
        return int(given)
    return CI_SHM_TOLERANCE if os.environ.get("CI") else SHARED_MACHINE_SHM_TOLERANCE


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves a shared-memory mapping, a descriptor, a child process or a drop
    of free /dev/shm behind (the module docstring says what is measured and what is allowed)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("the leak check reads Linux's /proc")
    before = snapshot()
    yield
    found = leaks_between(before, snapshot(), shm_tolerance=shm_tolerance())
    if found:
        pytest.fail(f"the test left behind:\n{found}", pytrace=False)
