"""Where a conversion task puts its shard and sidecar: a local folder, or a store given by URL.

A task writes one or more files per shard: the shard, and for a tar shard its member index too.
Each is written to `Destination.path(name)` and, once complete, handed to `Destination.commit`.

Local (`LocalDestination`): the files are written in place under a temporary name and renamed;
the sidecar sits in ``OUT/.shardfmt-work/``; a finished shard is one whose files match its
sidecar's sizes and re-hashed checksums.

Remote (`RemoteDestination`, for ``s3://bucket/prefix`` and other writable fsspec URLs): the
files are written to a local staging folder, then each is uploaded under its final name in one
atomic PUT (an object store shows an object whole or not at all), then the staging copy is
removed. The sidecar is uploaded after the files, to ``PREFIX/.shardfmt-work/``, so the resume
state lives with the output and any machine can resume. A finished shard is one whose sidecar
exists and whose objects have the sidecar's sizes; they are not downloaded to be re-hashed, since
an object under its final name is always a complete upload.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from ..checksum import file_checksum, parse_checksum
from ..storage import RemoteOptions, open_store
from ..storage.atomic import atomic_write_bytes
from ..storage.urls import is_url

__all__ = ["WORK_DIR", "Destination", "LocalDestination", "RemoteDestination", "destination_for", "sidecar_key"]

WORK_DIR: Final = ".shardfmt-work"
"""Folder inside the output that holds the plan and the sidecars until the manifest is written."""


def sidecar_key(index: int) -> str:
    """The key of shard `index`'s sidecar, relative to the output."""
    return f"{WORK_DIR}/shard-{index:05d}.json"


class LocalDestination:
    """A local output folder."""

    def __init__(self, out: str, index: int) -> None:
        self.out, self.index = Path(out), index

    def path(self, name: str) -> Path:
        """Where the task writes file `name` (here: its final place)."""
        return self.out / name

    def describe(self, name: str) -> str:
        """How messages name file `name` of the output."""
        return os.fspath(self.out / name)

    def commit(self, names: Sequence[str]) -> None:
        return  # the writers renamed them into place

    def write_sidecar(self, sidecar: dict[str, Any]) -> None:
        atomic_write_bytes(self.out / sidecar_key(self.index), json.dumps(sidecar, sort_keys=True).encode())

    def read_sidecar(self) -> dict[str, Any] | None:
        try:
            value = json.loads((self.out / sidecar_key(self.index)).read_bytes())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def files_match(self, files: Sequence[tuple[str, dict[str, Any]]]) -> bool:
        """True if each file `name` has the size and checksum its sidecar entry records."""
        for name, expected in files:
            size, digest = file_checksum(self.out / name)
            if size != expected["size"] or digest != parse_checksum(expected["checksum"]):
                return False
        return True

    def cleanup(self) -> None:
        return


class RemoteDestination:
    """An output prefix in a store (see the module docstring)."""

    def __init__(self, out: str, index: int, remote: RemoteOptions | None) -> None:
        self.store = open_store(out, remote=remote)
        self.index = index
        self.staging = Path(tempfile.mkdtemp(prefix=f"shardfmt-{index:05d}-"))

    def path(self, name: str) -> Path:
        """Where the task writes file `name`: the staging folder, until `commit` uploads it."""
        return self.staging / name

    def describe(self, name: str) -> str:
        return self.store.describe(name)

    def commit(self, names: Sequence[str]) -> None:
        """Upload the staged files, each in one atomic PUT under its final name."""
        for name in names:
            self.store.put_file(name, os.fspath(self.staging / name))

    def write_sidecar(self, sidecar: dict[str, Any]) -> None:
        self.store.put(sidecar_key(self.index), json.dumps(sidecar, sort_keys=True).encode())

    def read_sidecar(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.store.get(sidecar_key(self.index)))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def files_match(self, files: Sequence[tuple[str, dict[str, Any]]]) -> bool:
        """True if each object `name` exists with the size its sidecar entry records."""
        for name, expected in files:
            listed = self.store.list(name)
            if listed.get(name, {}).get("size") != expected["size"]:
                return False
        return True

    def cleanup(self) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(self.staging)


Destination = LocalDestination | RemoteDestination


def destination_for(out: str, index: int, remote: RemoteOptions | None) -> Destination:
    """The destination of shard `index`'s files in a conversion into `out` (a folder or a URL)."""
    return RemoteDestination(out, index, remote) if is_url(out) else LocalDestination(out, index)
