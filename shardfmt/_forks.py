"""Forking worker processes from a large parent without copying its heap.

A forked child shares the parent's memory until it writes to a page. CPython's garbage
collector writes to every object it examines, so the child's first collection of the oldest
generation copies nearly every page of the parent's heap: with torch imported, about 11,800
page faults and 100 ms before a loader worker was ready, measured here. `gc.freeze()` in the
parent just before the fork moves its objects out of the collector's sight (in the child too), so
the child touches only what it uses: 2,400 faults and 50 ms. The parent unfreezes once its
children are started, so that its own garbage is collected as before.

A forked child also inherits the parent's Python signal handlers: a training framework's SIGTERM
handler that logs and carries on (Lightning's prints ``Received SIGTERM``) would run in a worker
that the loader terminates, and keep it alive until it is killed seconds later.
`signals_held` blocks those signals across the fork and `default_signals` puts back their
default action in the child before unblocking them, so a terminated child ends at once.

Memory that the parent and its children share (`shared_zeros`) comes, for forked children, from an
anonymous shared mapping, which the kernel fills with zeros page by page as it is first touched:
a loader's bitmap of one bit per record costs nothing to make whatever the number of records.
multiprocessing's ``RawArray`` writes every byte of its zeros at once (about 10 ms for the
1.25 MB of 10^7 records, 200 ms for 10^9, in the first batch's path); it stays for spawned
children, which need a segment they can be sent.

A child must not outlive the process that started it (a killed training job must not leave its
workers running): `Lifeline` arms Linux's parent-death signal and `parent_alive` is the check an
idle child makes everywhere else.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MAX_WORKERS",
    "MAX_WORKERS_PER_CORE",
    "Lifeline",
    "default_signals",
    "frozen_heap",
    "max_workers",
    "parent_alive",
    "shared_zeros",
    "signals_held",
]

MAX_WORKERS_PER_CORE: Final = 4
"""Worker processes a core past which more only wait for it and add memory and start-up: the
most conversion processes a core, and the loader's warning threshold."""
MAX_WORKERS: Final = 256
"""The fewest processes the hard cap of a loader's workers allows, whatever the cores: what a
DataLoader user passes (16, 64) starts, a typo (10**5) does not fork the machine to a halt."""


def max_workers() -> int:
    """A loader's hard cap of workers: `MAX_WORKERS`, or `MAX_WORKERS_PER_CORE` a core if more."""
    return max(MAX_WORKERS, MAX_WORKERS_PER_CORE * (os.cpu_count() or 1))


@contextmanager
def frozen_heap(start_method: str | None) -> Iterator[None]:
    """Freeze the collector's view of the heap while processes are forked in the block (a no-op
    for "spawn" and "forkserver", whose children start from a fresh interpreter)."""
    if start_method != "fork":
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def shared_zeros(start_method: str, size: int) -> Any:
    """`size` zero bytes (at least 1) that this process shares with the children it starts with
    `start_method`, as a writable buffer: an anonymous shared mapping for "fork" (zero pages
    made as they are first touched), a multiprocessing ``RawArray`` otherwise (sent to the child
    when it starts)."""
    size = max(1, size)
    if start_method == "fork":
        return mmap.mmap(-1, size)
    return multiprocessing.get_context(start_method).RawArray("B", size)


PR_SET_PDEATHSIG: Final = 1
"""Linux's prctl option: the signal a process gets when the thread that started it ends."""
WATCH_SECONDS: Final = 0.5
"""How often an idle child checks that its parent is still there."""


@dataclass(frozen=True)
class Lifeline:
    """What a child needs to know to die with the process that started it.

    Attributes:
        parent: the pid the child must have as its parent (None where another process, such as
            a forkserver, starts it).
        deathsig: ask Linux to kill the child when its parent ends (``prctl(PR_SET_PDEATHSIG)``).
            Set only when the parent starts it from its main thread: the kernel sends the signal
            when the starting *thread* ends, which for another thread may be long before the
            process does.
    """

    parent: int | None
    deathsig: bool

    @classmethod
    def here(cls, start_method: str) -> Lifeline:
        """The lifeline of a child that this process starts now with `start_method`."""
        return cls(os.getpid() if start_method in ("fork", "spawn") else None, threading.current_thread() is threading.main_thread())

    def hold(self) -> int:
        """In the child: arm the death signal, and exit at once if the parent is already gone.
        Returns the parent pid to watch with `parent_alive`."""
        if self.deathsig and sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            except (OSError, AttributeError):  # no libc to call: the liveness check still serves
                pass
        parent = os.getppid()
        if self.parent is not None and parent != self.parent:  # it ended before the signal was armed
            os._exit(0)
        return parent


def parent_alive(parent: int) -> bool:
    """In a child: False once the process that started it (pid `parent`) has ended."""
    if os.getppid() != parent:  # reparented: the parent is gone
        return False
    process = multiprocessing.parent_process()
    return process is None or process.is_alive()


def _python_handled() -> set[signal.Signals]:
    """The signals whose handler is Python code in this process (SIGINT always: its default
    handler raises KeyboardInterrupt)."""
    found = {signal.SIGINT}
    for number in signal.valid_signals():
        try:
            handler = signal.getsignal(number)
        except (ValueError, OSError):  # a real-time or reserved signal Python does not handle
            continue
        if callable(handler):
            found.add(signal.Signals(number))
    return found


@contextmanager
def signals_held(start_method: str | None) -> Iterator[None]:
    """Block the signals this process handles in Python while children are forked in the block,
    so that one sent to a child before `default_signals` has run waits for it instead of running
    the parent's handler (a no-op for "spawn" and "forkserver", whose children start from a
    fresh interpreter)."""
    if start_method != "fork" or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = _python_handled()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def default_signals() -> None:
    """In a child: the default action for every signal the parent handled in Python (SIGTERM ends
    it), SIGINT ignored (Ctrl-C is the parent's to handle), then those signals unblocked."""
    handled = _python_handled()
    for number in handled:
        signal.signal(number, signal.SIG_IGN if number == signal.SIGINT else signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)
