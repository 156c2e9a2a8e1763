"""Conversions under contention and faults: two runs into one output, a full disk."""

from __future__ import annotations

import errno
import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import tree_bytes

import shardfmt.convert.records
import shardfmt.convert.run
import shardfmt.storage.atomic
from shardfmt import ConvertError, LockedError, open_dataset
from shardfmt._sample import make_imagefolder
from shardfmt.checksum import checksum
from shardfmt.cli import main
from shardfmt.convert.output import Output
from shardfmt.convert.plan import InputFile, PlannedRecord
from shardfmt.convert.records import ImageLabelBuilder, InputReader, KeptFile
from shardfmt.convert.run import convert
from shardfmt.format.jpeg import read_jpeg_info
from shardfmt.dataset.verify import verify_dataset
from shardfmt.storage import open_store
from shardfmt.storage.lock import LOCK_NAME, StoreLock

FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_imagefolder(tmp_path_factory.mktemp("safety") / "src", num_classes=3, per_class=8, size=(48, 64), seed=7)


def _hold_the_lock(src: str, out: str, locked: Any, tried: Any, results: Any, resume: bool) -> None:
    """Convert, pausing once the output is locked until the other run has tried."""
    real = shardfmt.convert.run.scan_source

    def pausing(*args: Any, **kwargs: Any) -> Any:
        locked.set()
        tried.wait(30)
        return real(*args, **kwargs)

    shardfmt.convert.run.scan_source = pausing  # type: ignore[assignment]
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
        convert(src, out, workers=1, shard_size=4000, resume=True)
        results.put("ran")
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
    # One resumes; the other is refused, by the lock while the first runs, or after it as
    # "nothing to resume" (a ConvertError): never two writers.
    assert outcomes.count("ran") == 1, outcomes
    assert outcomes[0] in ("ConvertError", "LockedError")
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
    from shardfmt.storage import LocalStore

    with StoreLock(LocalStore(out), purpose="converting into this output"):
        result = CliRunner().invoke(main, ["convert", str(source), str(out), "--workers", "1", "-q"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {out}: another run is converting into this output (process ")


def test_a_full_disk_stops_with_one_line_keeps_nothing_partial_and_resume_finishes(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    real_write = shardfmt.storage.atomic.AtomicFile.write
    written = {"bytes": 0}

    def filling(self: Any, data: Any) -> int:
        written["bytes"] += len(data)
        if written["bytes"] > 40_000 and self.path.name.startswith("shard-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(shardfmt.storage.atomic.AtomicFile, "write", filling)
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


def test_worker_processes_send_kept_files_by_reference(source: Path, tmp_path: Path) -> None:
    """With worker processes, an image kept as it is comes back as a reference that the
    converting process reads again; the shards are byte for byte those of an inline run."""
    path = sorted(source.glob("*/*"))[0]
    planned = InputFile(path.relative_to(source).as_posix(), path.stat().st_size, path.stat().st_mtime_ns)
    builder = ImageLabelBuilder(InputReader(str(source)), None, 90, by_reference=True)
    fields, reasons = builder.build(PlannedRecord(files=(planned,), label=0, key="k"))
    assert reasons == (None,)
    assert fields["image"] == KeptFile(planned, checksum(path.read_bytes()), read_jpeg_info(path.read_bytes()))
    inline, pooled = tmp_path / "inline", tmp_path / "pooled"
    convert(source, inline, workers=1, shard_size=4000)
    convert(source, pooled, workers=2, shard_size=4000)
    assert tree_bytes(inline) == tree_bytes(pooled)


def test_a_file_changed_after_its_check_is_rejected_not_written(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converting process compares a kept file's digest with the worker's: bytes that differ
    from those checked are never written (the workers here see a digest that cannot match)."""
    monkeypatch.setattr(shardfmt.convert.records, "checksum", lambda data: 0)  # inherited by the forked workers
    result = convert(source, tmp_path / "out", workers=2, shard_size=4000)
    assert result.num_records == 0
    lines = (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    rejects = [json.loads(line) for line in lines]
    assert len(rejects) == 24
    assert {(r["reason"], r["detail"]) for r in rejects} == {("unreadable", "the file changed while it was being converted")}
