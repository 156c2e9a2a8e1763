"""Confinement: which local files a source may read, and reading one within bounds.

Every source reads only inside the roots it was given, and this module is the one place that
decides it, for the scan and for the worker alike:

- **Inside the root, after resolving.** `resolve_inside` joins a path to its root (an absolute
  path is taken as it is), resolves every symbolic link and ``..`` of both with
  ``os.path.realpath``, and only then checks that the file lies in the root's folder: a path
  that leaves it, by ``..``, by being absolute, or through a link (to a file or to a folder), is
  "outside-root". The file is then opened by its resolved path without following a link, so a
  link put in its place afterwards is refused rather than followed.
- **Regular files only.** A file is looked at with ``os.stat`` before it is opened, and again
  with ``os.fstat`` once open (opened with ``O_NONBLOCK``, so a FIFO put in its place between the
  two never blocks): a folder, FIFO, socket or device (``/dev/zero``) is "not-a-regular-file",
  and nothing of it is read.
- **Bounded.** A file over `MAX_INPUT_SIZE` bytes by its ``stat`` is "too-large" before a byte is
  read, and one that grows past it while being read is too.

Which roots a source has (the listing's folder, the Parquet file's folder or ``--image-root``,
the ``save_to_disk`` folder) is its module's business; where a source follows links by rule (an
ImageFolder tree, files a pattern matched), only the regular-file and size rules apply.
"""

from __future__ import annotations

import functools
import os
import stat
from typing import Final

from ..._errors import RejectError
from ...format._layout import MAX_FIELD_SIZE

__all__ = [
    "MAX_INPUT_SIZE",
    "NOT_REGULAR",
    "OUTSIDE_ROOT",
    "TOO_LARGE",
    "check_regular",
    "file_kind",
    "is_inside",
    "not_regular_detail",
    "open_regular",
    "read_regular",
    "resolve_inside",
]

MAX_INPUT_SIZE: Final = MAX_FIELD_SIZE
"""Largest input file read, in bytes (1 GiB, the format's field limit: a larger input could not
be stored as one value anyway); larger is "too-large", found from ``stat`` before reading."""
OUTSIDE_ROOT: Final = "outside-root"
NOT_REGULAR: Final = "not-a-regular-file"
TOO_LARGE: Final = "too-large"
_KINDS: Final = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),  # a resolved path whose last part became a link since
)
_READ_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, for a reject's detail ("a FIFO", "a folder", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def not_regular_detail(mode: int) -> str:
    """The detail of a "not-a-regular-file" reject: what the file is instead."""
    return f"{file_kind(mode)}, not a regular file"


def is_inside(path: str, root: str) -> bool:
    """True if resolved `path` is resolved `root` or lies below it (both already real paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_inside(root: str | os.PathLike[str], path: str) -> str:
    """Return the real path of `path` (relative to `root`, or absolute) if it lies inside `root`
    once every symbolic link and ``..`` of both is resolved.

    Raises:
        RejectError: "outside-root", or "unreadable" for a path no file can have (a NUL byte).
    """
    try:
        base = _real_root(os.fspath(root))
        full = _realpath_below(base, path)
    except ValueError as err:  # a NUL byte
        raise RejectError(f"no file can have the path {path!r}: {err}", reason="unreadable") from err
    if not is_inside(full, base):
        raise RejectError(f"resolves to {full}, outside the root {base}", reason=OUTSIDE_ROOT)
    return full


def _realpath_below(base: str, path: str) -> str:
    """``os.path.realpath(os.path.join(base, path))`` for a real `base`, with one ``lstat`` per
    part of `path` when none is a link or ``..`` (the common case; realpath itself is several
    times slower); anything else takes the full resolution."""
    parts = path.split(os.sep)
    if os.path.isabs(path) or os.pardir in parts:
        return os.path.realpath(os.path.join(base, path))
    current = base
    for part in parts:
        if part in ("", os.curdir):
            continue
        current = os.path.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except OSError:
            break  # nothing there (or unreadable): realpath resolves what does exist
        if stat.S_ISLNK(mode):
            break
    else:
        return current
    return os.path.realpath(os.path.join(base, path))


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    """A root's real path, resolved once per process: a conversion checks every file against it."""
    return os.path.realpath(root)


def check_regular(status: os.stat_result, *, limit: int | None = None) -> None:
    """Refuse what is not a regular file, or (with `limit`) a regular file larger than that.

    Raises:
        RejectError: "not-a-regular-file", saying what it is; "too-large".
    """
    if not stat.S_ISREG(status.st_mode):
        raise RejectError(not_regular_detail(status.st_mode), reason=NOT_REGULAR)
    if limit is not None and status.st_size > limit:
        raise RejectError(f"{status.st_size} bytes, over the input limit of {limit}", reason=TOO_LARGE)


def open_regular(path: str, *, follow: bool = True, limit: int | None = None) -> tuple[int, os.stat_result]:
    """Open a regular file for reading without ever blocking: stat it first, open it non-blocking
    (without following a last symbolic link unless `follow`), and check it again once open.
    Returns the descriptor (the caller closes it) and its ``fstat``.

    Raises:
        RejectError: "not-a-regular-file"; "too-large" (over `limit`, checked before opening).
        OSError: the operating system refused it.
    """
    check_regular(os.stat(path) if follow else os.lstat(path), limit=limit)
    fd = os.open(path, _READ_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    try:
        status = os.fstat(fd)
        check_regular(status, limit=limit)  # swapped for a FIFO, a device or more between the stat and the open
    except BaseException:
        os.close(fd)
        raise
    return fd, status


def read_regular(path: str, *, follow: bool = True, limit: int = MAX_INPUT_SIZE) -> bytes:
    """Return the bytes of the regular file `path`, at most `limit` of them (see `open_regular`).

    Raises:
        RejectError: "not-a-regular-file"; "too-large" (over `limit` by its size, checked before
            opening, or grown past it while read). OSError: the operating system refused it.
    """
    fd, status = open_regular(path, follow=follow, limit=limit)
    try:
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, max(status.st_size + 1 - total, 1 << 20)):  # normally one read, then the end
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew since its stat
                raise RejectError(f"over the input limit of {limit} bytes", reason=TOO_LARGE)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)
