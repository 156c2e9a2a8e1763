"""--resume reads again every input a previous run rejected for a cause that may pass (a read
that timed out; an "unreadable" reject of a run that recorded no cause, whose outages became
rejects), and keeps the shards whose rejects are permanent (a corrupt image stays a reject)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import tree_bytes
from converting import convert

from shardfmt._convert import destination

SHARD_SIZE = 6000


def interrupted(src: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Convert `src` into `out` and stop just before the commit point, with every shard finished."""

    def interrupt(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(destination.Output, "finish", interrupt)
        with pytest.raises(KeyboardInterrupt):
            convert(src, out, workers=1, shard_size=SHARD_SIZE)


def sidecar_path(out: Path, index: int) -> Path:
    return out / destination.WORK_DIR / f"shard-{index:05d}.json"


def rejects_by_shard(out: Path, count: int) -> list[list[list[Any]]]:
    return [json.loads(sidecar_path(out, index).read_bytes())["rejects"] for index in range(count)]


def test_a_timed_out_read_is_read_again_on_resume_and_a_corrupt_image_stays_rejected(
    imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (imagefolder / "class_002" / "zz_broken.JPEG").write_bytes(b"\xff\xd8\xff\xe0 not a JPEG")
    clean = convert(imagefolder, tmp_path / "clean", workers=1, shard_size=SHARD_SIZE)
    shards = len(clean.manifest.shards)
    victim = os.fspath(imagefolder / "class_000" / "img_00002.JPEG")
    real_open = os.open

    def timing_out(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == victim:
            raise OSError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", timing_out)
    out = tmp_path / "out"
    interrupted(imagefolder, out, monkeypatch)
    monkeypatch.setattr(os, "open", real_open)
    found = rejects_by_shard(out, shards)
    timed_out = [2, "unreadable", f"{os.strerror(errno.ETIMEDOUT)} (errno {errno.ETIMEDOUT})", "transient"]
    broken = [24, "corrupt", "JPEG headers are broken: byte 2: marker 0xE0 segment of 8302 bytes runs past the end (15)", "permanent"]
    assert [reject for rejects in found for reject in rejects] == [timed_out, broken]
    assert found[1] == [timed_out] and found[-1] == [broken]
    result = convert(imagefolder, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    assert result.reused_shards == shards - 1  # shard 1 built again, the corrupt image's shard kept
    assert result.num_rejects == 1
    assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


@pytest.mark.parametrize(("cause", "redone"), [(None, True), ("transient", True), ("permanent", False)])
def test_resume_builds_again_a_shard_whose_unreadable_reject_may_pass(
    imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cause: str | None, redone: bool
) -> None:
    clean = convert(imagefolder, tmp_path / "clean", workers=1, shard_size=SHARD_SIZE)
    shards = len(clean.manifest.shards)
    out = tmp_path / "out"
    interrupted(imagefolder, out, monkeypatch)
    path = sidecar_path(out, 1)
    sidecar = json.loads(path.read_bytes())
    first = sum(s.num_records for s in clean.manifest.shards[:1])
    entry: list[Any] = [first, "unreadable", "GET failed after 5 attempts: EndpointConnectionError: Could not connect"]
    sidecar["rejects"] = [entry if cause is None else [*entry, cause]]  # None: as a run that recorded no cause wrote it
    path.write_text(json.dumps(sidecar, sort_keys=True))
    result = convert(imagefolder, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    assert result.reused_shards == (shards - 1 if redone else shards)
    assert result.num_rejects == (0 if redone else 1)
    if redone:
        assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


@pytest.mark.parametrize(
    ("rejects", "redo"),
    [
        ([], False),
        ([[3, "corrupt", "bad", "permanent"], [4, "unreadable", "Permission denied (errno 13)", "permanent"]], False),
        ([[3, "corrupt", "bad"]], False),  # no cause recorded, but not "unreadable": a property of the file
        ([[3, "unreadable", "Connection timed out (errno 110)", "transient"]], True),
        ([[3, "unreadable", "GET failed after 5 attempts"]], True),
        ([[3, "unreadable"]], True),  # not a sidecar this version writes: built again
        (None, True),
    ],
)
def test_which_rejects_send_a_shard_back_to_be_built(rejects: Any, redo: bool) -> None:
    assert destination.redo_on_resume({"index": 0, "rejects": rejects}) is redo
