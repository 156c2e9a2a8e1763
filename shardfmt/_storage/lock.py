"""An exclusive lock on a store, so that two jobs never write into one place at once.

In a local folder the lock is an advisory ``flock`` on a lock file, held for as long as the
`StoreLock` is: the kernel releases it when the holder exits or is killed, so a lock is never
stale, and a second holder is refused at once (never made to wait). In an object store the lock
is an object holding the identity of the run that took it (host, process, time, a random token):
taken only where no lock object exists, and read back after writing to make sure this run's token
is the one stored. An object store cannot tell a crashed holder from a live one, so such a lock
can outlive its run: `break_lock` removes it on the user's word.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import time
from typing import Any, Final

from .._errors import LockedError
from .local import LocalStore
from .protocol import Store

__all__ = ["LOCK_NAME", "StoreLock"]

LOCK_NAME: Final = ".shardfmt-lock"


class StoreLock:
    """Hold the lock of `store` (see the module docstring); release with `release()` or `with`.

    Args:
        store: the folder or bucket prefix to lock.
        purpose: what the holder does, for messages ("converting into it").
        break_lock: first remove a lock object another run left in an object store.

    Raises:
        LockedError: another run holds the lock; the message names it and how to break it.
    """

    def __init__(self, store: Store, *, purpose: str, break_lock: bool = False) -> None:
        self.store = store
        self.purpose = purpose
        self._fd: int | None = None
        self._token: str | None = None
        self.left = False
        """`release` could not remove this run's lock object (the store did not answer): it stays
        until a run with ``break_lock`` removes it."""
        if isinstance(store, LocalStore):
            self._lock_file(store)
        else:
            self._lock_object(store, break_lock=break_lock)

    def _lock_file(self, store: LocalStore) -> None:
        path = store.path / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise LockedError(
                    f"another run is {self.purpose} ({holder}); wait for it to end, or stop it first", path=store.root
                ) from None
            # The holder before us may have removed the file after we opened it: lock the file
            # that is there now, or we would hold a lock nobody else sees.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_identity()).encode())
        self._fd = fd

    def _lock_object(self, store: Store, *, break_lock: bool) -> None:
        if break_lock:
            store.delete(LOCK_NAME)
        elif store.exists(LOCK_NAME):
            raise LockedError(_held_message(store, self.purpose), path=store.root)
        identity = _identity()
        store.put(LOCK_NAME, json.dumps(identity).encode())
        try:
            stored = json.loads(store.get(LOCK_NAME))
        except (OSError, ValueError):
            stored = None
        if not isinstance(stored, dict) or stored.get("token") != identity["token"]:
            raise LockedError(_held_message(store, self.purpose), path=store.root)
        self._token = identity["token"]

    def release(self) -> None:
        """Give the lock up (and remove the lock file or object); a second call does nothing. A
        lock object the store does not let go of stays, and `left` says so."""
        if self._fd is not None:
            if isinstance(self.store, LocalStore):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.store.path / LOCK_NAME)  # still locked: a newcomer retries on a fresh file
            os.close(self._fd)
            self._fd = None
        elif self._token is not None:
            try:
                stored = json.loads(self.store.get(LOCK_NAME))
                if isinstance(stored, dict) and stored.get("token") == self._token:
                    self.store.delete(LOCK_NAME)
            except (FileNotFoundError, ValueError):
                pass  # gone, or another run's: not ours to remove
            except OSError:
                self.left = True
            self._token = None

    def __enter__(self) -> StoreLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _identity() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), "token": secrets.token_hex(16)}


def _describe(holder: Any) -> str:
    if not isinstance(holder, dict):
        return "its identity is unreadable"
    when = holder.get("time")
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when)) if isinstance(when, (int, float)) else "an unknown time"
    return f"process {holder.get('pid')} on {holder.get('host')}, since {since}"


def _read_holder(fd: int) -> str:
    try:
        return _describe(json.loads(os.pread(fd, 4096, 0) or b"null"))
    except (OSError, ValueError):
        return "its identity is unreadable"


def _held_message(store: Store, purpose: str) -> str:
    try:
        holder = _describe(json.loads(store.get(LOCK_NAME)))
    except (OSError, ValueError):
        holder = "its identity is unreadable"
    return (
        f"another run is {purpose} ({holder}, lock object {LOCK_NAME}); if that run is gone, "
        "run again with --break-lock to remove its lock"
    )
