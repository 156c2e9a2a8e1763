"""Atomic files: nothing under the final name before the commit, and a large file synced in the
background while it is written (`AtomicFile(sync_every=...)`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardfmt.storage import atomic
from shardfmt.storage.atomic import AtomicFile, temp_path


def test_background_syncs_run_while_writing_and_the_commit_waits_for_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = getattr(os, "fdatasync", os.fsync)

    def counting(fd: int) -> None:
        synced.append(os.fstat(fd).st_size)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting, raising=False)
    monkeypatch.setattr(os, "fsync", counting)
    path = tmp_path / "big.bin"
    out = AtomicFile(path, sync_every=1000)
    for n in range(10):
        out.write(bytes([n]) * 700)
        out._wait_for_writeback()  # one at a time here, so that each threshold starts one
    assert not path.exists()
    out.commit()
    assert path.read_bytes() == b"".join(bytes([n]) * 700 for n in range(10))
    assert not temp_path(path).exists()
    # a sync each time 1000 more bytes were written, each seeing everything written so far, then
    # the commit's fsync of the file and of its directory
    assert synced[:-1] == [1400, 2800, 4200, 5600, 7000, 7000]
    assert len(synced) == 7


def test_an_abort_waits_for_a_background_sync_and_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gone.bin"
    out = AtomicFile(path, sync_every=10)
    out.write(b"x" * 100)
    out.abort()
    assert out._syncing is None
    assert not path.exists() and not temp_path(path).exists()


def test_a_failed_background_sync_is_left_to_the_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", failing, raising=False)
    atomic._quiet_datasync(-1)  # no exception in the background thread
    monkeypatch.setattr(os, "fsync", failing)
    path = tmp_path / "full.bin"
    out = AtomicFile(path, sync_every=10)
    out.write(b"x" * 100)  # starts a background sync, which fails quietly
    with pytest.raises(OSError, match="No space left"):
        out.commit()  # the commit's own fsync reports it
    assert not path.exists()
    out.abort()
    assert not temp_path(path).exists()
