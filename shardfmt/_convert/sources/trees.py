"""Where the files of a source lie, behind one small interface (`Tree`): a local folder, walked
with ``os.scandir`` and following symbolic links (`LocalTree`), or a store prefix, seen through
one recursive LIST (`StoreTree`).

A tree answers three questions, and only these: what a folder holds (`Entry`: a folder to enter,
a file with its size and version, or something that cannot be either, with the reject reason and
detail), what one relative path names (`Tree.lookup`, for the paths a listing gives), and the
bytes of one file (a listing). The rules that decide what becomes an input (hidden names,
classes, order) are not here: `imagefolder.py` and `listing.py` apply them alike to both trees.

What only a local tree can meet is found here: a folder reached through a symbolic link that is
one of its own ancestors (same st_dev and st_ino) is "symlink-loop"; something that is not a
regular file (a FIFO, a socket, a device) is "not-a-regular-file"; a broken link, or a folder or
file the operating system refuses, is "unreadable". A walk follows links (the ImageFolder rule);
a lookup does not leave the root: a path that resolves outside it, through a link or ``..``, is
"outside-root" (`confine.resolve_inside`), unless the tree was made ``confined=False`` for files
the user named one by one; a path that names nothing is "missing-file". A store has no links
and no special files (a lookup of a folder's name is "not-a-regular-file"); an object's version
(ETag or modification time) stands in for a file's mtime, so resume notices a changed input, and
a path no object has is "missing-file" with the detail a missing local file gets.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import xxhash

from ..._errors import ConvertError, RejectError
from ..._storage import Store
from .confine import NOT_REGULAR, check_regular, not_regular_detail, resolve_inside
from .results import describe_os_error, display_path

__all__ = ["MISSING_FILE", "Entry", "LocalTree", "StoreTree", "Tree"]

MISSING_FILE = "missing-file"
"""The reject of a path that names no file, in every source (a listing, a Parquet row's path)."""
_MISSING = describe_os_error(FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT)))
_Ancestors = tuple[tuple[tuple[int, int], str], ...]


@dataclass(frozen=True)
class Entry:
    """One thing a folder holds.

    Attributes:
        name: its name in its folder; path: relative to the tree's root, platform separators.
        is_dir: a folder (a folder that cannot be entered still is one, with a `reject`).
        size, version: of a file that can be read.
        reject: (reason, detail) if it cannot be an input or cannot be entered.
        ancestors: of a local folder to enter: (st_dev, st_ino) and path of every folder from
            the root down to it, itself included.
    """

    name: str
    path: str
    is_dir: bool = False
    size: int = 0
    version: int = 0
    reject: tuple[str, str] | None = None
    ancestors: _Ancestors = ()


class Tree(Protocol):
    """The files of a source: a local folder or a store prefix."""

    @property
    def root(self) -> Path | str:
        """What entry paths are relative to, as a conversion task opens it: a `Path`, or a URL."""
        ...

    def describe(self, path: str) -> str:
        """How messages name `path` (relative to the root): a local path, or a URL without credentials."""
        ...

    def entries(self, folder: Entry | None) -> list[Entry]:
        """What `folder` (None: the root) holds, in no particular order.

        Raises:
            ConvertError: the root cannot be listed.
            OSError: a folder below the root cannot be listed.
        """
        ...

    def lookup(self, path: str) -> Entry:
        """The file that relative `path` names, or an entry whose `reject` says why there is none."""
        ...

    def read(self, path: str, *, limit: int | None = None) -> bytes:
        """The bytes of file `path` (at most `limit` of them). Raises OSError."""
        ...


class LocalTree:
    """A local folder; entries follow symbolic links, as ``os.walk(followlinks=True)`` does; a
    lookup stays inside the folder once links are resolved, unless `confined` is False."""

    def __init__(self, root: Path, *, confined: bool = True) -> None:
        self.root: Path = root
        self.confined = confined
        self._top: list[Entry] | None = None

    def describe(self, path: str) -> str:
        return os.fspath(self.root / path)

    def entries(self, folder: Entry | None) -> list[Entry]:
        if folder is not None:
            with os.scandir(self.root / folder.path) as it:
                return [self._entry(item, os.path.join(folder.path, item.name), folder.ancestors) for item in it]
        if self._top is None:
            try:
                top: _Ancestors = ((_identity(os.stat(self.root)), ""),)
                with os.scandir(self.root) as it:
                    self._top = [self._entry(item, item.name, top) for item in it]
            except OSError as err:
                raise ConvertError(f"cannot list the source folder: {describe_os_error(err)}", path=self.root) from err
        return self._top

    def _entry(self, item: os.DirEntry[str], path: str, ancestors: _Ancestors) -> Entry:
        try:
            is_dir = item.is_dir()  # follows symbolic links
        except OSError:
            is_dir = False
        try:
            st = item.stat()
        except OSError as err:
            broken = " (broken symbolic link)" if not is_dir and item.is_symlink() else ""
            return Entry(item.name, path, is_dir, reject=("unreadable", describe_os_error(err) + broken))
        if is_dir:
            identity = _identity(st)
            for ancestor, ancestor_path in ancestors:
                if ancestor == identity:
                    target = display_path(ancestor_path) if ancestor_path else "the source root"
                    return Entry(
                        item.name, path, True, reject=("symlink-loop", f"the folder is its own ancestor ({target}); not entered again")
                    )
            return Entry(item.name, path, True, ancestors=(*ancestors, (identity, path)))
        if not stat.S_ISREG(st.st_mode):
            return Entry(item.name, path, reject=(NOT_REGULAR, not_regular_detail(st.st_mode)))
        return Entry(item.name, path, size=st.st_size, version=st.st_mtime_ns)

    def lookup(self, path: str) -> Entry:
        name = os.path.basename(path)
        try:
            full = resolve_inside(self.root, path) if self.confined else os.path.join(self.root, path)
            st = os.stat(full)
            check_regular(st)
        except RejectError as err:
            return Entry(name, path, reject=(err.reason, err.message))
        except FileNotFoundError as err:
            return Entry(name, path, reject=(MISSING_FILE, describe_os_error(err)))
        except OSError as err:
            return Entry(name, path, reject=("unreadable", describe_os_error(err)))
        return Entry(name, path, size=st.st_size, version=st.st_mtime_ns)

    def read(self, path: str, *, limit: int | None = None) -> bytes:
        with open(self.root / path, "rb") as file:
            return file.read() if limit is None else file.read(limit)


class StoreTree:
    """A store prefix: folders are the '/'-separated parts of its object keys.

    Args:
        store: the store, rooted at the prefix.
        root: the prefix's URL as given (tasks open it); messages use the store's own names.
    """

    def __init__(self, store: Store, root: str) -> None:
        self.store = store
        self.root: str = root
        self._folders: dict[str, dict[tuple[str, bool], Entry]] | None = None

    def describe(self, path: str) -> str:
        return self.store.describe(_key(path))

    @property
    def folders(self) -> dict[str, dict[tuple[str, bool], Entry]]:
        """Every folder's entries by (name, is_dir), from one LIST made on first use."""
        if self._folders is None:
            self._folders = {"": {}}
            for key, info in self.store.list().items():
                parts = key.split("/")
                for depth, name in enumerate(parts[:-1]):
                    path = os.sep.join(parts[: depth + 1])
                    self._folders.setdefault(os.sep.join(parts[:depth]), {})[(name, True)] = Entry(name, path, True)
                    self._folders.setdefault(path, {})
                if parts[-1]:  # a key ending in "/" only marks a folder
                    entry = Entry(parts[-1], os.sep.join(parts), size=int(str(info["size"])), version=_version(info))
                    self._folders.setdefault(os.sep.join(parts[:-1]), {})[(parts[-1], False)] = entry
        return self._folders

    def entries(self, folder: Entry | None) -> list[Entry]:
        found = self.folders.get(folder.path if folder is not None else "", {})
        return [found[name] for name in sorted(found)]  # a file and a folder may share a name

    def lookup(self, path: str) -> Entry:
        parent, _, name = path.rpartition(os.sep)
        found = self.folders.get(parent, {})
        if (name, False) in found:
            return found[(name, False)]
        reject = (NOT_REGULAR, not_regular_detail(stat.S_IFDIR)) if (name, True) in found else (MISSING_FILE, _MISSING)
        return Entry(name, path, reject=reject)

    def read(self, path: str, *, limit: int | None = None) -> bytes:
        if limit is None:
            return self.store.get(_key(path))
        return self.store.get(_key(path), start=0, stop=limit, exact=False)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _key(path: str) -> str:
    return path.replace(os.sep, "/") if os.sep != "/" else path


def _version(info: dict[str, object]) -> int:
    """A number that changes when a stored object does (its version hashed): the mtime of resume's check."""
    return xxhash.xxh3_64_intdigest(str(info.get("version", "")).encode()) & ((1 << 63) - 1)
