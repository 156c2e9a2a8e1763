"""The shardfmt command through click's CliRunner: help, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardfmt import ConvertError, ShardReader
from shardfmt.cli import ByteSize, main


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.mark.parametrize("command", [[], ["convert"], ["index"], ["info"], ["verify"], ["demo"]])
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
        (["convert", "{src}", "{out}", "--resume"], "finished dataset: nothing to resume"),
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
