"""Every exception shardfmt raises.

The hierarchy::

    ShardfmtError
    ├── FormatError (ValueError)            a shard breaks a structural rule of the format
    │   ├── ChecksumError                   bytes do not match their stored checksum
    │   ├── LimitError                      a stored value exceeds a stated limit
    │   └── UnsupportedVersionError         unknown major version, flag or field type
    ├── SchemaError (ValueError)            a schema is malformed or a record does not fit it
    ├── ManifestError (ValueError)          manifest.json is missing a field, malformed or inconsistent
    ├── DatasetNotFoundError (FileNotFoundError)   no manifest.json: not a (finished) dataset
    ├── ShardNotFoundError (FileNotFoundError)     a shard named by the manifest is missing
    ├── DecodeError (ValueError)            an image payload cannot be decoded
    ├── ConvertError                        a conversion cannot start or continue
    │   └── LockedError                     another run holds the output's lock
    ├── RemoteError (OSError)               a remote store failed, after retrying what was transient
    ├── RejectError (ValueError)            one input file cannot become a record (`.reason` says why)
    └── WorkerError (RuntimeError)          a loader worker raised or died

A failure inside a loader worker reaches the training process as an instance of both
`WorkerError` and the class the worker raised (`worker_error_class`): ``except ChecksumError``
and ``except WorkerError`` both catch a corrupt record found by a worker. Only the class's name
crosses the process boundary, looked up in a closed set (the classes above and common builtin
ones), never unpickled; the worker's traceback is attached as the ``__cause__``
(`WorkerTraceback`).

Without torch (installed by the ``shardfmt[torch]`` extra), `Loader`, `Dataset` and
`shardfmt.ops` raise the builtin `ModuleNotFoundError` that `torch_missing` words, naming the extra.

A reader error carries ``.path``, ``.offset`` and ``.record`` (each may be None) and renders as
``shards/shard-00003.shard: byte 81920: record 17: payload [81920, 99008) runs past end of file``.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "ChecksumError",
    "ConvertError",
    "DatasetNotFoundError",
    "DecodeError",
    "FormatError",
    "LimitError",
    "LockedError",
    "ManifestError",
    "RejectError",
    "RemoteError",
    "SchemaError",
    "ShardNotFoundError",
    "ShardfmtError",
    "UnsupportedVersionError",
    "WorkerError",
    "WorkerTraceback",
    "torch_missing",
    "worker_error_class",
    "worker_error_kind",
]


class ShardfmtError(Exception):
    """Root of every error shardfmt raises on purpose.

    Args:
        message: what was expected and what was found.
        path: the file concerned, if any.
        offset: the byte offset in that file, if known.
        record: the record index in that shard, if known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        record: int | None = None,
    ) -> None:
        self.message = message
        self.path = os.fspath(path) if path is not None else None
        self.offset = offset
        self.record = record
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.path is not None:
            parts.append(self.path)
        if self.offset is not None:
            parts.append(f"byte {self.offset}")
        if self.record is not None:
            parts.append(f"record {self.record}")
        parts.append(self.message)
        return ": ".join(parts)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep keyword-only context when an error crosses a process boundary.
        return (_rebuild, (type(self), self.message, self.path, self.offset, self.record))


def _rebuild(
    cls: type[ShardfmtError], message: str, path: str | None, offset: int | None, record: int | None
) -> ShardfmtError:
    return cls(message, path=path, offset=offset, record=record)


class FormatError(ShardfmtError, ValueError):
    """A shard breaks a structural rule of the format."""


class ChecksumError(FormatError):
    """Bytes do not match the checksum stored for them: the file is corrupt."""


class LimitError(FormatError):
    """A stored size or count exceeds a limit stated in the spec; nothing was allocated for it."""


class UnsupportedVersionError(FormatError):
    """The file needs a newer reader: unknown major version, required flag or field type."""


class SchemaError(ShardfmtError, ValueError):
    """A schema is malformed, or a record does not fit its schema."""


class ManifestError(ShardfmtError, ValueError):
    """manifest.json is malformed, incomplete or disagrees with the shards."""


class DatasetNotFoundError(ShardfmtError, FileNotFoundError):
    """The path holds no manifest.json, so it is not a finished dataset."""


class ShardNotFoundError(ShardfmtError, FileNotFoundError):
    """A shard named by the manifest does not exist."""


class DecodeError(ShardfmtError, ValueError):
    """An image payload could not be decoded."""


class ConvertError(ShardfmtError):
    """A conversion cannot start or continue (output not empty, options changed on resume, ...)."""


class LockedError(ConvertError):
    """Another run holds the lock of the output: two runs never write one dataset."""


class RemoteError(ShardfmtError, OSError):
    """A remote store (S3, GCS, HTTP, ...) failed: the message says what was asked, how many
    attempts were made and what the store answered, with every credential replaced by ``***``.

    Args:
        message: what was asked and what the store answered.
        path: the object or store concerned, if any.
        transient: the last failure was one that trying again later may cure (a connection
            refused, reset or timed out, HTTP 408, 429, 5xx): the store was unreachable rather
            than the object bad. A conversion stops on such an error instead of rejecting the input.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        record: int | None = None,
        transient: bool = False,
    ) -> None:
        self.transient = transient
        super().__init__(message, path=path, offset=offset, record=record)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_remote, (self.message, self.path, self.offset, self.record, self.transient))


def _rebuild_remote(message: str, path: str | None, offset: int | None, record: int | None, transient: bool) -> RemoteError:
    return RemoteError(message, path=path, offset=offset, record=record, transient=transient)


class RejectError(ShardfmtError, ValueError):
    """One input file cannot become a record; the conversion skips it and lists it in its report.

    Args:
        message: what was found, e.g. the decoder's or the operating system's message.
        reason: the reject code: "empty", "corrupt", "not-an-image", "unreadable", "too-large",
            "not-a-regular-file", "outside-root", "hidden", "symlink-loop" or "no-class"; for records of several fields also
            "no-partner", "ambiguous", "size-mismatch" or "unsupported".
        path: the input file, if known.
        transient: the cause may pass (an "unreadable" input whose read timed out or whose
            server went away): a resumed conversion reads the input again instead of keeping
            the reject.
    """

    def __init__(self, message: str, *, reason: str, path: str | os.PathLike[str] | None = None, transient: bool = False) -> None:
        self.reason = reason
        self.transient = transient
        super().__init__(message, path=path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_reject, (self.message, self.reason, self.path, self.transient))


def _rebuild_reject(message: str, reason: str, path: str | None, transient: bool = False) -> RejectError:
    return RejectError(message, reason=reason, path=path, transient=transient)


class WorkerError(ShardfmtError, RuntimeError):
    """A loader worker raised or died; the message holds its traceback, shard and record."""

    kind: str = "WorkerError"
    """The name of the class the worker raised (each class `worker_error_class` makes sets it)."""


class WorkerTraceback(Exception):
    """The traceback of a failure in a loader worker, as text: the ``__cause__`` of the error the
    loader raises, so that Python prints it above that error."""

    def __init__(self, trace: str) -> None:
        super().__init__(trace)
        self.trace = trace

    def __str__(self) -> str:
        return f'\n"""\n{self.trace.rstrip()}\n"""'


_BUILTIN_KINDS = (
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "EOFError",
    "FileNotFoundError",
    "ImportError",
    "IndexError",
    "KeyError",
    "LookupError",
    "MemoryError",
    "NotImplementedError",
    "OSError",
    "OverflowError",
    "PermissionError",
    "RuntimeError",
    "TypeError",
    "ValueError",
    "ZeroDivisionError",
)
"""Builtin exception classes a worker's failure keeps (with every ShardfmtError class but
RejectError, which is the converter's)."""

_worker_classes: dict[str, type[WorkerError]] = {}


def _kept_class(kind: str) -> type[BaseException] | None:
    """The class of the closed set named `kind`, or None."""
    if kind in _BUILTIN_KINDS:
        found: type[BaseException] = getattr(builtins, kind)
        return found
    value = globals().get(kind)
    if isinstance(value, type) and issubclass(value, ShardfmtError) and value not in (ShardfmtError, WorkerError, RejectError):
        return value
    return None


def worker_error_kind(error: BaseException) -> str:
    """Return the name a worker sends for `error`: that of the first class in its method
    resolution order that the loader keeps (a user's ``class Bad(ValueError)`` is sent as
    "ValueError"), or its own name if none is."""
    for cls in type(error).__mro__:
        if cls.__module__ in ("builtins", __name__) and _kept_class(cls.__name__) is cls:
            return cls.__name__
    return type(error).__name__


def worker_error_class(kind: str) -> type[WorkerError]:
    """Return the class the loader raises for a worker's failure of class `kind` (its name): a
    subclass of both `WorkerError` and that class, made once per name; `WorkerError` itself for
    a name outside the closed set (a user's own exception class, say).

    Args:
        kind: a name from `worker_error_kind`.
    """
    cached = _worker_classes.get(kind)
    if cached is not None:
        return cached
    original = _kept_class(kind)
    if original is None:
        return WorkerError
    # shardfmt classes first, so their own methods win; builtins after WorkerError, so that the
    # message renders as every ShardfmtError's does (KeyError would quote it).
    bases = (original, WorkerError) if issubclass(original, ShardfmtError) else (WorkerError, original)
    made = type(
        f"WorkerError[{kind}]",
        bases,
        {
            "__module__": __name__,
            "__doc__": f"A loader worker raised {kind}; an instance of both {kind} and WorkerError.",
            "__str__": Exception.__str__,
            "__reduce__": _reduce_worker_error,
            "kind": kind,
        },
    )
    _worker_classes[kind] = made
    return made


def _reduce_worker_error(self: WorkerError) -> tuple[Callable[..., WorkerError], tuple[str, str, str | None, int | None, int | None]]:
    return (_rebuild_worker_error, (self.kind, self.message, self.path, self.offset, self.record))


def _rebuild_worker_error(kind: str, message: str, path: str | None, offset: int | None, record: int | None) -> WorkerError:
    return worker_error_class(kind)(message, path=path, offset=offset, record=record)


TORCH_EXTRA = "shardfmt[torch]"
"""The extra that installs torch, which `Loader`, `Dataset` and `shardfmt.ops` need."""


def torch_missing(what: str, error: ModuleNotFoundError) -> ModuleNotFoundError:
    """Return the error to raise when `what` (``"shardfmt.Loader"``) is used without torch.

    Args:
        what: the name the user asked for.
        error: the `ModuleNotFoundError` the import of torch raised; re-raise it (``raise error``)
            when it is about another module.

    Returns:
        A `ModuleNotFoundError` (an `ImportError`) whose ``name`` is ``"torch"`` and whose
        message names the extra to install; raise it ``from error``.
    """
    return ModuleNotFoundError(
        f"{what} needs torch ({error}): pip install '{TORCH_EXTRA}' installs it; "
        "converting, reading and verifying work without it",
        name="torch",
    )
