"""Conversions under contention and faults: two runs into one output, a full disk."""

from __future__ import annotations

import errno
import json
import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import tree_bytes
from converting import convert

import shardfmt
import shardfmt._storage.atomic
from shardfmt import ConvertError, LockedError, open_dataset
from shardfmt._cli import main
from shardfmt._convert import route as convert_route
from shardfmt._convert.destination import Output
from shardfmt._convert.plan import InputFile, PlannedRecord
from shardfmt._convert.records import (
    Chunk,
    InputReader,
    Placed,
    RecordBuilder,
    build_chunk,
    unplace,
)
from shardfmt._convert.sources.results import IMAGE_AND_LABEL
from shardfmt._dataset.verify import verify_dataset
from shardfmt._storage import open_store
from shardfmt._storage.lock import LOCK_NAME, StoreLock
from shardfmt._synthetic import make_imagefolder
from shardfmt.format._fieldtypes import HeadedJpeg
from shardfmt.format._jpeg import read_jpeg_info

FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_imagefolder(tmp_path_factory.mktemp("safety") / "src", num_classes=3, per_class=8, size=(48, 64), seed=7)


def _hold_the_lock(src: str, out: str, locked: Any, tried: Any, results: Any, resume: bool) -> None:
    """Convert, pausing once the output is locked until the other run has tried."""
    real = convert_route.scan_source

    def pausing(*args: Any, **kwargs: Any) -> Any:
        locked.set()
        tried.wait(30)
        return real(*args, **kwargs)

    convert_route.scan_source = pausing  # type: ignore[assignment]
    try:
        convert(src, out, workers=1, shard_size=4000, resume=resume)
        results.put(("holder", "ok"))
    except Exception as err:  # reported to the test, which fails on it
        results.put(("holder", f"{type(err).__name__}: {err}"))


@pytest.mark.parametrize("resume", [False, True])
def test_a_second_run_into_a_locked_output_is_refused_and_the_first_finishes(
    source: Path, tmp_path: Path, resume: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    if resume:  # an interrupted conversion, which both runs would resume
        monkeypatch.setattr(Output, "finish", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            convert(source, out, workers=1, shard_size=4000)
        monkeypatch.undo()
    locked, tried, results = FORK.Event(), FORK.Event(), FORK.Queue()
    holder = FORK.Process(target=_hold_the_lock, args=(str(source), str(out), locked, tried, results, resume))
    holder.start()
    try:
        assert locked.wait(30)
        with pytest.raises(LockedError, match=r"another run is converting into this output \(process \d+ on .*, since "):
            convert(source, out, workers=1, shard_size=4000, resume=resume)
    finally:
        tried.set()
        holder.join(60)
    assert results.get(timeout=5) == ("holder", "ok")
    assert verify_dataset(out).num_records == 24
    assert not (out / LOCK_NAME).exists()


def _race(src: str, out: str, barrier: Any, results: Any) -> None:
    barrier.wait(30)
    try:
        result = convert(src, out, workers=1, shard_size=4000, resume=True)
        results.put("finished already" if result.already_finished else "ran")
    except ConvertError as err:
        results.put(type(err).__name__)


def test_two_resumes_started_together_never_both_write(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(Output, "finish", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        convert(source, out, workers=1, shard_size=4000)
    monkeypatch.undo()
    barrier, results = FORK.Barrier(2), FORK.Queue()
    runs = [FORK.Process(target=_race, args=(str(source), str(out), barrier, results)) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(60)
    outcomes = sorted(results.get(timeout=5) for _ in runs)
    # One resumes; the other is refused by the lock while the first runs, or finds after it a
    # finished dataset and leaves it: never two writers.
    assert outcomes.count("ran") == 1, outcomes
    assert outcomes[0] in ("LockedError", "finished already"), outcomes
    clean = tmp_path / "clean"
    convert(source, clean, workers=1, shard_size=4000)
    assert tree_bytes(out) == tree_bytes(clean)


def test_a_lock_object_in_a_store_is_refused_until_broken(source: Path) -> None:
    url = "memory://locks/out"
    store = open_store(url)
    held = StoreLock(store, purpose="converting into this output")
    with pytest.raises(LockedError, match=r"lock object \.shardfmt-lock\); if that run is gone, run again with --break-lock"):
        convert(source, url, workers=1)
    assert json.loads(store.get(LOCK_NAME))["token"]
    result = convert(source, url, workers=1, break_lock=True)  # the holder is gone (crashed, say)
    assert result.num_records == 24
    assert not store.exists(LOCK_NAME)
    held.release()  # its token is no longer the stored one: nothing to remove, no error


def test_the_cli_names_the_lock_in_one_line(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    from shardfmt._storage import LocalStore

    with StoreLock(LocalStore(out), purpose="converting into this output"):
        result = CliRunner().invoke(main, ["convert", str(source), str(out), "--workers", "1", "-q"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {out}: another run is converting into this output (process ")


def test_a_disk_filled_by_decompressing_tars_stops_with_the_disk_full_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import tarfile

    from conftest import jpeg_bytes

    from shardfmt._convert.sources import tars as tar_sources

    (tmp_path / "src").mkdir()
    with tarfile.open(tmp_path / "src" / "a.tar.gz", "w:gz") as archive:
        for i in range(3):
            for name, data in ((f"k{i}.jpg", jpeg_bytes(8, 8, seed=i)), (f"k{i}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))

    def filling(source: Any, target: Any, length: int = 0) -> None:  # a bomb meets a small disk
        target.write(source.read(1000))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tar_sources.shutil, "copyfileobj", filling)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(out), "--workers", "1", "-q"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    work = out / ".shardfmt-work" / "tars"
    assert lines == [
        f"Error: {out}: no space left on the device of the work folder {work} while decompressing the compressed tars; "
        "nothing unfinished was kept under a final name: free some space, then run the same command with --resume to keep "
        "the finished shards and do the rest"
    ]
    assert sorted(p.name for p in out.rglob("*")) == []  # the partial copy is gone, and the work folder with it
    monkeypatch.undo()
    assert convert(tmp_path / "src", out, workers=1, resume=True).num_records == 3


def test_a_full_disk_stops_with_one_line_keeps_nothing_partial_and_resume_finishes(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    real_write = shardfmt._storage.atomic.AtomicFile.write
    written = {"bytes": 0}

    def filling(self: Any, data: Any) -> int:
        written["bytes"] += len(data)
        if written["bytes"] > 40_000 and self.path.name.startswith("shard-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(shardfmt._storage.atomic.AtomicFile, "write", filling)
    result = CliRunner().invoke(main, ["convert", str(source), str(out), "--workers", "2", "--shard-size", "4000", "-q"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"Error: {out}: no space left on the device of the output; nothing unfinished was kept")
    assert "--resume" in lines[0]
    assert not (out / "manifest.json").exists()
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]  # no temporary file left either
    sidecars = {json.loads(p.read_text())["path"]: json.loads(p.read_text()) for p in (out / ".shardfmt-work").glob("shard-*.json")}
    for shard in out.glob("shard-*.shard"):  # every file under a final name is a finished shard
        assert shard.name in sidecars and shard.stat().st_size == sidecars[shard.name]["size"]
    finished = len(sidecars)
    assert 1 <= finished < 6
    monkeypatch.undo()
    resumed = convert(source, out, workers=2, shard_size=4000, resume=True)
    assert resumed.reused_shards == finished
    clean = tmp_path / "clean"
    convert(source, clean, workers=1, shard_size=4000)
    assert tree_bytes(out) == tree_bytes(clean)
    with open_dataset(out) as dataset:
        assert len(dataset) == 24


def test_worker_processes_leave_the_bytes_they_checked_in_shared_scratch_memory(source: Path, tmp_path: Path) -> None:
    """With scratch memory, a chunk's bytes come back as places in it, with the headers of a kept
    JPEG; the shards are byte for byte those of an inline run."""
    paths = sorted(source.glob("*/*"))[:3]
    records = tuple(
        (
            n,
            PlannedRecord(
                files=(InputFile(p.relative_to(source).as_posix(), p.stat().st_size, p.stat().st_mtime_ns),), key=f"k{n}", values=(0,)
            ),
        )
        for n, p in enumerate(paths)
    )
    scratch = memoryview(bytearray(1 << 20))
    built = build_chunk(RecordBuilder(InputReader(str(source)), IMAGE_AND_LABEL, None, 90), Chunk(0, records), scratch)
    offset = 0
    for one, path in zip(built, paths, strict=True):
        data = path.read_bytes()
        assert one.fields is not None and one.reencoded == (None,)
        assert one.fields["image"] == Placed(offset, len(data), read_jpeg_info(data))
        image = unplace(one.fields, scratch)["image"]
        assert isinstance(image, HeadedJpeg) and bytes(image.data) == data and image.info == read_jpeg_info(data)
        offset += len(data)
    small = memoryview(bytearray(len(paths[0].read_bytes())))  # room for the first image only
    built = build_chunk(RecordBuilder(InputReader(str(source)), IMAGE_AND_LABEL, None, 90), Chunk(0, records), small)
    assert [type(one.fields["image"]).__name__ for one in built if one.fields] == ["Placed", "HeadedJpeg", "HeadedJpeg"]
    inline, pooled = tmp_path / "inline", tmp_path / "pooled"
    convert(source, inline, workers=1, shard_size=4000)
    convert(source, pooled, workers=2, shard_size=4000)
    assert tree_bytes(inline) == tree_bytes(pooled)


def test_the_bytes_written_are_the_bytes_checked_even_if_the_file_changes_after(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing reads an input twice: a file overwritten once a worker has read it is written as
    it was read and checked (the workers here spoil each file right after reading it)."""
    copy = tmp_path / "src"
    shutil.copytree(source, copy)
    real = InputReader.read

    def read_then_spoil(self: InputReader, file: InputFile) -> bytes:
        data = real(self, file)
        (Path(self.root) / file.path).write_bytes(b"\0" * len(data))
        return data

    monkeypatch.setattr(InputReader, "read", read_then_spoil)  # inherited by the forked workers
    result = convert(copy, tmp_path / "out", workers=2, shard_size=4000)
    monkeypatch.undo()
    assert result.num_records == 24 and result.num_rejects == 0
    clean = convert(source, tmp_path / "clean", workers=1, shard_size=4000)
    assert clean.num_records == 24
    with open_dataset(tmp_path / "out") as spoiled, open_dataset(tmp_path / "clean") as expected:
        assert [bytes(spoiled[n]["image"]) for n in range(24)] == [bytes(expected[n]["image"]) for n in range(24)]


@pytest.mark.parametrize(
    ("src", "out", "name"), [("x" * 100_000, "out", "src"), (["a", "b" * 300], "out", "src"), ("a", "o" * 5000, "out")]
)
def test_a_path_over_the_limits_is_refused_by_its_keyword(tmp_path: Path, src: object, out: str, name: str) -> None:
    # Before: OSError [Errno 36] File name too long.
    with pytest.raises(ValueError, match=rf"^(each part of )?{name} must be at most (4096|255) bytes long"):
        shardfmt.convert(src, tmp_path / out if name != "out" else out)  # type: ignore[arg-type]
