"""--resume: after a failure or a `kill -9` at any point, the finished output equals a clean run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import pillow_bytes, tree_bytes
from converting import convert
from PIL import Image
from shardbytes import ShardBytes

from shardfmt import ConvertError, DatasetNotFoundError, WorkerError, open_dataset
from shardfmt._checksum import checksum, format_checksum
from shardfmt._convert import destination as convert_output
from shardfmt._convert import records as convert_records
from shardfmt._synthetic import make_image

REPO = Path(__file__).resolve().parents[2]
SHARD_SIZE = 300 * 1024  # one input per shard: 48 shards


@pytest.fixture(scope="module")
def slow_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 PNGs (each re-encoded, several ms apiece) in 4 classes: long enough to kill mid-run."""
    root = tmp_path_factory.mktemp("slow") / "src"
    for i in range(48):
        folder = root / f"class_{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(make_image(320, 320, seed=i % 6))
        (folder / f"{i:03d}.png").write_bytes(pillow_bytes(image, "PNG", compress_level=0))
    return root


@pytest.fixture(scope="module")
def clean(slow_source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("clean") / "out"
    convert(slow_source, out, workers=1, shard_size=SHARD_SIZE)
    return tree_bytes(out)


def done_sidecars(out: Path) -> int:
    try:
        return sum(name.endswith(".json") and name.startswith("shard-") for name in os.listdir(out / ".shardfmt-work"))
    except FileNotFoundError:
        return 0


def temp_shard_exists(out: Path) -> bool:
    try:
        return any(name.startswith(".shard-") for name in os.listdir(out))
    except FileNotFoundError:
        return False


def children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


KILL_POINTS: dict[str, Callable[[Path], bool]] = {
    "plan-written": lambda out: (out / ".shardfmt-work" / "plan.json").exists(),
    "first-shard-being-written": temp_shard_exists,
    "one-shard-done": lambda out: done_sidecars(out) >= 1,
    "several-shards-done": lambda out: done_sidecars(out) >= 5,
}


@pytest.mark.parametrize(
    ("point", "workers"), [("plan-written", 1), ("first-shard-being-written", 2), ("one-shard-done", 1), ("several-shards-done", 2)]
)
def test_resume_after_kill_9_equals_a_clean_run(
    slow_source: Path, clean: dict[str, bytes], tmp_path: Path, point: str, workers: int
) -> None:
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "shardfmt",
        "convert",
        str(slow_source),
        str(out),
        "--shard-size",
        str(SHARD_SIZE),
        "--workers",
        str(workers),
        "--quiet",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    reached = KILL_POINTS[point]
    workers_seen: list[int] = []
    with subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        try:
            while process.poll() is None and not reached(out):
                workers_seen = children_of(process.pid) or workers_seen
                time.sleep(0.001)
            workers_seen = children_of(process.pid) or workers_seen
            process.send_signal(signal.SIGKILL)
            process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.stderr is not None
        assert process.returncode == -signal.SIGKILL, f"the conversion ended before {point}: {process.stderr.read()!r}"
    assert not (out / "manifest.json").exists()
    with pytest.raises(DatasetNotFoundError):
        open_dataset(out)
    for pid in workers_seen:  # workers die with the converter and cannot race the resumed run
        for _ in range(1000):
            if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                break
            time.sleep(0.01)
        else:
            pytest.fail(f"worker {pid} outlived the killed converter")

    result = convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    assert tree_bytes(out) == clean
    if point == "several-shards-done":
        assert result.reused_shards >= 5


def test_resume_after_a_failed_task_keeps_finished_shards(
    slow_source: Path, clean: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    real = convert_records.store_image
    calls = {"n": 0}

    def fail_on_tenth(data: bytes, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 10:
            raise OSError(28, "No space left on device")
        return real(data, **kwargs)

    monkeypatch.setattr(convert_records, "store_image", fail_on_tenth)
    with pytest.raises(WorkerError, match="No space left on device"):
        convert(slow_source, out, workers=1, shard_size=SHARD_SIZE)
    assert not any(name.startswith(".shard-") for name in os.listdir(out)), "the failed shard's temporary file remains"
    monkeypatch.setattr(convert_records, "store_image", real)
    finished = done_sidecars(out)
    assert finished == 9  # one input a shard; the tenth input failed, after the nine before it were written
    result = convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    assert result.reused_shards == finished
    assert tree_bytes(out) == clean


def test_resume_redoes_a_shard_that_no_longer_matches_its_sidecar(
    slow_source: Path, clean: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    convert_interrupted(slow_source, out, monkeypatch)
    shard = out / "shard-00001.shard"
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF  # same size, different bytes: only the re-hash notices
    shard.write_bytes(bytes(data))
    result = convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    assert result.reused_shards == len(result.manifest.shards) - 1
    assert tree_bytes(out) == clean


def _raise_interrupt(*args: Any, **kwargs: Any) -> Any:
    raise KeyboardInterrupt


def convert_interrupted(
    source: Path, out: Path, monkeypatch: pytest.MonkeyPatch, *, at: tuple[Any, str] = (convert_output.Output, "finish")
) -> None:
    """Convert `source` into `out` stopped where `at` (an object and the name of one of its
    attributes) is called, as a kill there would stop it; then undo the test's patches."""
    monkeypatch.setattr(*at, _raise_interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert(source, out, workers=1, shard_size=SHARD_SIZE)
    monkeypatch.undo()


def test_resume_after_the_manifest_but_before_cleanup(
    slow_source: Path, clean: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    convert_interrupted(slow_source, out, monkeypatch, at=(convert_output.shutil, "rmtree"))
    assert (out / "manifest.json").exists() and (out / ".shardfmt-work").exists()
    convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    assert tree_bytes(out) == clean


def test_resume_refuses_changed_options_or_inputs(slow_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    convert_interrupted(slow_source, out, monkeypatch)
    with pytest.raises(ConvertError, match='options changed from .*"quality": 90.* to .*"quality": 80'):
        convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, quality=80, resume=True)
    victim = slow_source / "class_1" / "005.png"
    stat = victim.stat()
    try:
        os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        with pytest.raises(ConvertError, match=r"1 input files were added, removed or modified \(first: class_1/005.png\)"):
            convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    finally:
        os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    plan = json.loads((out / ".shardfmt-work" / "plan.json").read_text())
    assert "workers" not in plan["options"]
    convert(slow_source, out, workers=2, shard_size=SHARD_SIZE, resume=True)  # workers may change
    finished = tree_bytes(out)
    again = convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, resume=True)  # a finished output: nothing to do
    assert (
        again.already_finished
        and again.num_inputs == 0
        and again.num_records == json.loads((out / "manifest.json").read_text())["num_records"]
    )
    assert tree_bytes(out) == finished


def test_resume_into_an_empty_or_missing_folder_starts_afresh(slow_source: Path, clean: dict[str, bytes], tmp_path: Path) -> None:
    convert(slow_source, tmp_path / "new", workers=1, shard_size=SHARD_SIZE, resume=True)
    assert tree_bytes(tmp_path / "new") == clean


def test_resume_keeps_the_shards_an_older_format_version_finished(
    slow_source: Path, clean: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run of a 1.1 writer stopped after some shards; a 1.2 writer resumes it. The plan (of the
    # inputs) is the same, the 1.1 shards stay valid (a minor version only adds) and are kept, and
    # the manifest says 1.2, which may list older shards (spec/manifest.md, step 12).
    out = tmp_path / "out"
    convert_interrupted(slow_source, out, monkeypatch)
    work = out / ".shardfmt-work"
    older = ["shard-00000.shard", "shard-00003.shard"]
    for name in older:  # rewrite as the 1.1 writer wrote them, with their sidecars
        shard = ShardBytes((out / name).read_bytes())
        shard.drop_table_blocks()
        shard.header()["minor"] = 1
        shard.reseal_header()
        (out / name).write_bytes(bytes(shard))
        sidecar_path = work / name.replace(".shard", ".json")
        sidecar = json.loads(sidecar_path.read_text())
        sidecar["size"], sidecar["checksum"] = len(shard), format_checksum(checksum(bytes(shard)))
        sidecar_path.write_text(json.dumps(sidecar, sort_keys=True))
    result = convert(slow_source, out, workers=1, shard_size=SHARD_SIZE, resume=True)
    assert result.reused_shards == len(result.manifest.shards)
    assert json.loads((out / "manifest.json").read_text())["format_version"] == "1.2"
    with open_dataset(out, verify=True) as dataset:
        versions = {name: dataset.shard(i).version for i, name in enumerate(s.path for s in dataset.manifest.shards)}
        assert [versions[name] for name in older] == [(1, 1), (1, 1)] and versions["shard-00001.shard"] == (1, 2)
        assert len(dataset) == sum(1 for _ in dataset) == len(result.manifest.shards)
    assert {k: v for k, v in tree_bytes(out).items() if k not in older and k != "manifest.json"} == {
        k: v for k, v in clean.items() if k not in older and k != "manifest.json"
    }
