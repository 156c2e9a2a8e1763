"""Atomic files: nothing under the final name before the commit; a large file synced in the
background while it is written (`AtomicFile(sync_every=...)`), or written in blocks with O_DIRECT
(`AtomicFile(direct=True)`), buffered where the file system refuses it."""

from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path

import numpy as np
import pytest

from shardfmt._storage import atomic
from shardfmt._storage.atomic import DIRECT_BLOCK, AtomicFile, temp_path


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


def _pieces(seed: int) -> list[bytes]:
    """Pieces of every size that matters to the blocks: small, page-sized, a block, more."""
    rng = random.Random(seed)
    sizes = [1, 7, 4096, 92_000, DIRECT_BLOCK - 1, DIRECT_BLOCK, DIRECT_BLOCK + 3, 3 * DIRECT_BLOCK // 2]
    return [rng.randbytes(rng.choice(sizes)) for _ in range(24)]


def _direct_or_skip(path: Path) -> AtomicFile:
    out = AtomicFile(path, direct=True)
    if not out.is_direct:
        out.abort()
        pytest.skip(f"the file system of {path.parent} refuses O_DIRECT")
    return out


def test_a_direct_file_holds_every_byte_written_and_appears_only_at_the_commit(tmp_path: Path) -> None:
    path = tmp_path / "direct.bin"
    out = _direct_or_skip(path)
    pieces = _pieces(1)
    for piece in pieces[:-1]:
        out.write(piece)
    out.write(memoryview(np.frombuffer(pieces[-1][: len(pieces[-1]) // 4 * 4], dtype="<u4")))  # any buffer
    expected = b"".join(pieces[:-1]) + pieces[-1][: len(pieces[-1]) // 4 * 4]
    assert out.tell() == len(expected)
    assert not path.exists()
    out.commit()
    assert out.is_direct  # every whole block went with O_DIRECT
    assert path.read_bytes() == expected
    assert not temp_path(path).exists()


def test_a_file_system_that_refuses_o_direct_on_opening_gets_buffered_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def refusing(path: str, flags: int, *args: int) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    path = tmp_path / "buffered.bin"
    out = AtomicFile(path, direct=True)
    assert not out.is_direct
    pieces = _pieces(2)
    for piece in pieces:
        out.write(piece)
    out.commit()
    assert path.read_bytes() == b"".join(pieces)


def test_a_file_system_that_refuses_a_direct_write_gets_it_again_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fcntl = pytest.importorskip("fcntl")
    path = tmp_path / "late.bin"
    out = _direct_or_skip(path)
    real = os.pwrite
    refused: list[int] = []

    def refusing(fd: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refusing)
    pieces = _pieces(3)
    for piece in pieces:
        out.write(piece)
    out.commit()
    assert refused == [0]  # the first block once, then every write buffered
    assert not out.is_direct
    assert path.read_bytes() == b"".join(pieces)


def test_a_failed_direct_write_is_raised_by_the_next_write_or_the_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "full.bin"
    out = _direct_or_skip(path)
    monkeypatch.setattr(os, "pwrite", full)
    out.write(bytes(DIRECT_BLOCK))  # hands the first block to the thread, whose write fails
    with pytest.raises(OSError) as caught:
        for _ in range(3):
            out.write(bytes(DIRECT_BLOCK))
        out.commit()
    assert caught.value.errno == errno.ENOSPC
    out.abort()
    assert not path.exists() and not temp_path(path).exists()


def test_an_abort_of_a_direct_file_stops_its_thread_and_removes_it(tmp_path: Path) -> None:
    path = tmp_path / "gone.bin"
    out = _direct_or_skip(path)
    for piece in _pieces(4):
        out.write(piece)
    out.abort()
    assert not path.exists() and not temp_path(path).exists()
    assert not [thread for thread in threading.enumerate() if thread.name == "shardfmt-direct"]
