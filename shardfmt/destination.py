"""Where a conversion task puts its shard and sidecar: a local folder, or a store given by URL.

Local (`LocalDestination`): the shard is written in place under a temporary name and renamed;
the sidecar sits in ``OUT/.shardfmt-work/``; a finished shard is one whose file matches its
sidecar's size and re-hashed checksum.

Remote (`RemoteDestination`, for ``s3://bucket/prefix`` and other writable fsspec URLs): the
shard is written to a local staging folder, then uploaded under its final name in one atomic PUT
(an object store shows an object whole or not at all), then the staging copy is removed. The
sidecar is uploaded after the shard, to ``PREFIX/.shardfmt-work/``, so the resume state lives
with the output and any machine can resume. A finished shard is one whose sidecar exists and
whose object has the sidecar's size; it is not downloaded to be re-hashed, since an object
under its final name is always a complete upload.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

from .checksum import file_checksum, parse_checksum
from .fileio import atomic_write_bytes
from .storage import RemoteOptions, open_store
from .storage.urls import is_url

__all__ = ["WORK_DIR", "Destination", "LocalDestination", "RemoteDestination", "destination_for", "sidecar_key"]

WORK_DIR: Final = ".shardfmt-work"
"""Folder inside the output that holds the plan and the sidecars until the manifest is written."""


def sidecar_key(index: int) -> str:
    """The key of shard `index`'s sidecar, relative to the output."""
    return f"{WORK_DIR}/shard-{index:05d}.json"


class LocalDestination:
    """A local output folder."""

    def __init__(self, out: str, index: int, name: str) -> None:
        self.out, self.index, self.name = Path(out), index, name
        self.shard_path = self.out / name
        self.display = os.fspath(self.shard_path)

    def commit_shard(self) -> None:
        return  # ShardWriter renamed it into place

    def write_sidecar(self, sidecar: dict[str, Any]) -> None:
        atomic_write_bytes(self.out / sidecar_key(self.index), json.dumps(sidecar, sort_keys=True).encode())

    def read_sidecar(self) -> dict[str, Any] | None:
        try:
            value = json.loads((self.out / sidecar_key(self.index)).read_bytes())
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def shard_matches(self, sidecar: dict[str, Any]) -> bool:
        size, digest = file_checksum(self.shard_path)
        return size == sidecar["size"] and digest == parse_checksum(sidecar["checksum"])

    def cleanup(self) -> None:
        return


class RemoteDestination:
    """An output prefix in a store (see the module docstring)."""

    def __init__(self, out: str, index: int, name: str, remote: RemoteOptions | None) -> None:
        self.store = open_store(out, remote=remote)
        self.index, self.name = index, name
        self.staging = Path(tempfile.mkdtemp(prefix=f"shardfmt-{index:05d}-"))
        self.shard_path = self.staging / name
        self.display = self.store.describe(name)

    def commit_shard(self) -> None:
        self.store.put_file(self.name, os.fspath(self.shard_path))

    def write_sidecar(self, sidecar: dict[str, Any]) -> None:
        self.store.put(sidecar_key(self.index), json.dumps(sidecar, sort_keys=True).encode())

    def read_sidecar(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.store.get(sidecar_key(self.index)))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def shard_matches(self, sidecar: dict[str, Any]) -> bool:
        listed = self.store.list(self.name)
        return bool(listed.get(self.name, {}).get("size") == sidecar["size"])

    def cleanup(self) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(self.staging)


Destination = LocalDestination | RemoteDestination


def destination_for(out: str, index: int, name: str, remote: RemoteOptions | None) -> Destination:
    """The destination of shard `index` (file name `name`) of a conversion into `out`."""
    return RemoteDestination(out, index, name, remote) if is_url(out) else LocalDestination(out, index, name)
