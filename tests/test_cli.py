"""The shardfmt command through click's CliRunner: help, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner
from conftest import tree_bytes
from converting import convert

import shardfmt
import shardfmt._cli
import shardfmt._dataset.verify
from shardfmt import ConvertError, open_dataset
from shardfmt._cli import CLOSED_PIPE_STATUS, ByteSize, main
from shardfmt.format import ShardReader

REPO = Path(__file__).resolve().parents[1]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.mark.parametrize("command", [[], ["convert"], ["index"], ["info"], ["verify"], ["preview"], ["demo"]])
def test_every_help_has_examples(command: list[str]) -> None:
    code, output = run(*command, "--help")
    assert code == 0 and "Examples:" in output and "shardfmt " in output


def test_convert_info_verify_round_trip(imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output = run("convert", imagefolder, out, "--workers", "1", "--shard-size", "8KiB")
    assert code == 0 and "24 records in" in output and "images/s" in output
    code, output = run("info", out)
    assert code == 0
    fields = dict(line.split(None, 1) for line in output.splitlines() if not line.startswith(("per class", "passed through")))
    assert fields["records"] == "24" and fields["classes"] == "3" and fields["channels"] == "3: 24"
    code, output = run("info", out, "--json")
    assert code == 0 and json.loads(output)["num_records"] == 24
    code, output = run("verify", out)
    assert code == 0 and output.startswith("ok: ") and "bytes hashed" in output
    code, output = run("verify", out, "--quick")
    assert code == 0 and "record tables" in output


def test_quiet_convert_prints_nothing(imagefolder: Path, tmp_path: Path) -> None:
    assert run("convert", imagefolder, tmp_path / "out", "--workers", "1", "--quiet") == (0, "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["convert", "{src}", "{out}"], "--resume to finish an interrupted conversion, or --overwrite"),
        (["convert", "{tmp}/nowhere", "{tmp}/x"], "the source does not exist"),
        (["info", "{tmp}"], "no manifest.json"),
        (["verify", "{src}"], "no manifest.json"),
    ],
)
def test_user_mistakes_exit_1_with_one_line_and_no_traceback(imagefolder: Path, tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    assert run("convert", imagefolder, out, "--workers", "1", "--quiet")[0] == 0
    code, output = run(*(a.format(src=imagefolder, out=out, tmp=tmp_path) for a in args))
    assert code == 1
    assert len(output.strip().splitlines()) == 1 and output.startswith("Error: ") and message in output
    assert "Traceback" not in output


def test_resume_of_a_finished_output_exits_0_and_says_so(imagefolder: Path, tmp_path: Path) -> None:
    """A kill that lands after the manifest leaves a finished dataset: the retry has nothing to do
    (before: exit 1, "nothing to resume", so a retry wrapper failed)."""
    out = tmp_path / "out"
    assert run("convert", imagefolder, out, "--workers", "1", "--quiet")[0] == 0
    before = tree_bytes(out)
    code, output = run("convert", imagefolder, out, "--workers", "1", "--resume")
    assert code == 0
    assert output.startswith(f"nothing to resume: {out} holds a finished dataset (") and output.rstrip().endswith("left as it was")
    assert tree_bytes(out) == before
    assert run("convert", imagefolder, out, "--workers", "1", "--resume", "--quiet") == (0, "")


def test_bad_option_values_are_usage_errors(imagefolder: Path, tmp_path: Path) -> None:
    assert run("convert", imagefolder, tmp_path / "out", "--quality", "0")[0] == 2
    code, output = run("convert", imagefolder, tmp_path / "out", "--shard-size", "lots")
    assert code == 2 and "is not a size like 256MiB" in output


def test_byte_sizes() -> None:
    size = ByteSize()
    assert [size.convert(text, None, None) for text in ("4096", "8KiB", "256MiB", "1.5GB", "2g")] == [
        4096, 8192, 256 << 20, 1_500_000_000, 2_000_000_000
    ]


def test_strict_exits_1_naming_the_first_reject(awkward_tree: Path, tmp_path: Path) -> None:
    code, output = run("convert", awkward_tree, tmp_path / "out", "--workers", "1", "--strict", "--quiet")
    assert code == 1 and "class_000/nested/loop: symlink-loop:" in output
    assert (tmp_path / "out" / "manifest.json").exists()
    assert run("convert", awkward_tree, tmp_path / "lax", "--workers", "1", "--quiet")[0] == 0


def test_verify_names_shard_offset_and_record_of_damage(imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run("convert", imagefolder, out, "--workers", "1", "--shard-size", "8KiB", "--quiet")
    shard = out / "shard-00000.shard"
    with ShardReader(shard) as reader:
        start = int(reader.table[1]["offset"])
    data = bytearray(shard.read_bytes())
    data[start + 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        f"error: {shard}: byte {start}: record 1: payload [{start}, {start + int(reader.table[1]['size'])}) "
        "does not match its checksum: the shard is corrupt"
    )


def test_debug_shows_the_exception(imagefolder: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    result = CliRunner().invoke(main, ["--debug", "convert", str(imagefolder), str(tmp_path / "out")])
    assert result.exit_code == 1 and isinstance(result.exception, ConvertError)


def test_demo_generates_converts_and_reads_back(tmp_path: Path) -> None:
    code, output = run("demo", "--dir", tmp_path, "--images", "12", "--workers", "1")
    assert code == 0, output
    assert "generated  12 JPEGs" in output and "converted  12 records" in output and "read       12 records" in output
    assert "loader" in output
    assert run("demo", "--dir", tmp_path, "--images", "10", "--workers", "1")[0] == 0  # replaces its own folders
    (tmp_path / "other" / "imagefolder").mkdir(parents=True)
    (tmp_path / "other" / "imagefolder" / "keep.txt").write_text("x")
    code, output = run("demo", "--dir", tmp_path / "other", "--images", "3")
    assert code == 1 and "not made by the demo" in output


def closed_pipe_run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the command with its stdout a pipe whose reader has already gone: every write fails
    (what ``shardfmt info DATASET | head -3`` meets once head has its lines)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            [sys.executable, "-m", "shardfmt", *args], stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=60, check=False
        )
    finally:
        os.close(write_end)


def test_a_closed_pipe_ends_the_command_quietly_with_the_sigpipe_status(imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run("convert", imagefolder, out, "--workers", "1", "--quiet")[0] == 0
    for args in (["info", str(out)], ["info", str(out), "--json"], ["verify", str(out)]):
        done = closed_pipe_run(*args)
        assert (done.returncode, done.stderr) == (CLOSED_PIPE_STATUS, b""), args
    assert CLOSED_PIPE_STATUS == 141


@pytest.fixture
def memory_dataset(imagefolder: Path) -> Iterator[str]:
    """The imagefolder converted into fsspec's memory:// store."""
    url = "memory://cli-remote/ds"
    convert(imagefolder, url, workers=1, shard_size=8000)
    yield url
    fsspec.filesystem("memory").rm("/cli-remote", recursive=True)


def test_info_and_verify_take_a_url(memory_dataset: str, imagefolder: Path, tmp_path: Path) -> None:
    convert(imagefolder, tmp_path / "local", workers=1, shard_size=8000)
    code, remote = run("info", memory_dataset)
    assert code == 0
    code, local = run("info", tmp_path / "local")
    assert remote.splitlines()[1:] == local.splitlines()[1:]
    assert remote.splitlines()[0].split() == ["dataset", memory_dataset]
    code, output = run("verify", memory_dataset)
    shards = len(list((tmp_path / "local").glob("*.shard")))
    size = sum(p.stat().st_size for p in (tmp_path / "local").glob("*.shard"))
    records = sum(1 for _ in open_dataset(tmp_path / "local"))
    assert (code, output) == (
        0,
        f"ok: {shards} shards, 24 records (structure and checksums, {size + _payload(tmp_path / 'local'):,} bytes hashed)\n",
    )
    assert records == 24
    assert run("verify", memory_dataset, "--quick") == (0, f"ok: {shards} shards, 24 records (manifest and record tables)\n")


def _payload(root: Path) -> int:
    with open_dataset(root) as dataset:
        return sum(int(dataset.shard(n).table["size"].sum()) for n in range(len(dataset.manifest.shards)))


def test_verify_names_a_damaged_shard_of_a_url(memory_dataset: str) -> None:
    fs = fsspec.filesystem("memory")
    data = bytearray(fs.cat_file("/cli-remote/ds/shard-00001.shard"))
    with open_dataset(memory_dataset) as dataset:
        start = int(dataset.shard(1).table[0]["offset"])
    data[start + 5] ^= 0xFF
    fs.pipe_file("/cli-remote/ds/shard-00001.shard", bytes(data))
    result = CliRunner().invoke(main, ["verify", memory_dataset])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0].startswith(f"error: memory://cli-remote/ds/shard-00001.shard: byte {start}: record 0: payload")


def test_verify_shows_a_progress_bar_on_a_terminal_for_a_large_dataset(
    imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    convert(imagefolder, out, workers=1)
    size = sum(p.stat().st_size for p in out.glob("*.shard"))
    result = CliRunner().invoke(main, ["verify", str(out)])  # not a terminal: no bar
    assert result.exit_code == 0 and result.stderr == ""
    monkeypatch.setattr(shardfmt._cli, "_on_terminal", lambda: True)
    result = CliRunner().invoke(main, ["verify", str(out)])  # a terminal, but a small dataset: no bar
    assert result.exit_code == 0 and result.stderr == ""
    monkeypatch.setattr(shardfmt._dataset.verify, "PROGRESS_MIN_BYTES", size)
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0 and result.stdout.startswith("ok: 1 shards, 24 records")
    assert "verify: 100%" in result.stderr and f"{size / 1000:.1f}k/{size / 1000:.1f}k" in result.stderr


def test_convert_workers_are_checked_at_the_door_with_their_range(imagefolder: Path, tmp_path: Path) -> None:
    limit = 4 * (os.cpu_count() or 1)
    result = CliRunner().invoke(main, ["convert", str(imagefolder), str(tmp_path / "out"), "--workers", str(limit + 1)])
    assert result.exit_code == 2
    assert f"1<=x<={limit}" in result.output
    assert not (tmp_path / "out").exists()
    for workers, error in [(0, ValueError), (limit + 1, ValueError), (10**5, ValueError), (2.5, TypeError), (True, TypeError)]:
        with pytest.raises(error, match=rf"workers must be an int in \[1, {limit}\]"):
            shardfmt.convert(imagefolder, tmp_path / "api-out", workers=workers)
        assert not (tmp_path / "api-out").exists()
