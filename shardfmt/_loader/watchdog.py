"""The loader's `timeout` for decoding in its own process (num_workers=0): `stall_alarm`.

With workers, the loader waits on their pipes and reports a stall when none answers in time.
In its own process nothing waits: the decoding itself hangs. So each chunk runs under a
real-time timer (``signal.setitimer``) whose SIGALRM handler raises `Stalled` in the main
thread, where the chunk runs. The signal interrupts a blocking system call (a ``time.sleep``, a
read from a hung file system), and Python runs the handler between two bytecodes, so any step
written in Python is stopped. Three cases run without the timer, as they did before it: code in
another thread than the main one (signals are handled only there), a process whose real-time
timer is already armed (it is the caller's), and a SIGALRM handler installed outside Python
(it could not be put back). Native code that loops without returning to Python (a C extension
spinning) is not interrupted either: the handler runs when it returns.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Stalled", "stall_alarm"]


class Stalled(BaseException):
    """Raised by the timer inside a chunk that ran past its time. A BaseException, so that a
    step's ``except Exception`` does not swallow it."""


def _ring(signum: int, frame: FrameType | None) -> None:
    raise Stalled()


def _can_arm() -> bool:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGALRM) is None:  # installed outside Python: it could not be restored
        return False
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@contextlib.contextmanager
def stall_alarm(seconds: float) -> Iterator[bool]:
    """Raise `Stalled` inside the block once it has run `seconds`; yield whether the timer is
    armed (see the module docstring for where it is not). The caller's SIGALRM handler is put
    back afterwards."""
    if not _can_arm():
        yield False
        return
    previous = signal.signal(signal.SIGALRM, _ring)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield True
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:  # even if the alarm rang just as the block ended
            signal.signal(signal.SIGALRM, previous)
