"""Every member and column of a source is kept, or said to be left out: tars whose samples lack a
declared member, and Parquet, Arrow and ``datasets`` sources with label and further columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import jpeg_bytes

from shardfmt import open_dataset
from shardfmt._cli import main

wds = pytest.importorskip("webdataset")


def run(*args: Any) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def read_rejects(out: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


def captioned_tar(path: Path, *, count: int, uncaptioned: set[int]) -> Path:
    """A tar written by webdataset: samples with a JPEG and a caption, but some without caption."""
    with wds.TarWriter(str(path)) as writer:
        for n in range(count):
            sample: dict[str, Any] = {"__key__": f"s{n:03d}", "jpg": jpeg_bytes(16, 16, seed=n)}
            if n not in uncaptioned:
                sample["txt"] = f"caption {n}"
            writer.write(sample)
    return path


def test_tar_declared_member_is_kept_and_samples_without_it_rejected(tmp_path: Path) -> None:
    tar = captioned_tar(tmp_path / "part.tar", count=10, uncaptioned={3, 7})
    code, output = run("convert", tar, tmp_path / "out", "--field", "txt=str", "--workers", "1")
    assert code == 0, output
    assert "8 records" in output and "2 rejected" in output
    with open_dataset(tmp_path / "out") as reader:
        assert reader.schema.names == ("image", "key", "txt")
        assert [(r["key"], r["txt"]) for r in reader] == [(f"s{n:03d}", f"caption {n}") for n in range(10) if n not in (3, 7)]
    rejects = read_rejects(tmp_path / "out")
    assert [(r["key"], r["reason"]) for r in rejects] == [("s003", "missing-member"), ("s007", "missing-member")]
    assert "txt" in rejects[0]["detail"]


def test_tar_member_not_in_every_sample_is_reported_by_convert(tmp_path: Path) -> None:
    tar = captioned_tar(tmp_path / "part.tar", count=10, uncaptioned={3, 7})
    code, output = run("convert", tar, tmp_path / "out", "--workers", "1")
    assert code == 0, output
    assert "10 records" in output
    assert "members not stored (not in every sample; --field NAME=KIND keeps one): .txt: 8" in output
    with open_dataset(tmp_path / "out") as reader:
        assert "txt" not in reader.schema.names


def test_tar_declared_member_that_no_sample_has_is_an_error(tmp_path: Path) -> None:
    tar = captioned_tar(tmp_path / "part.tar", count=3, uncaptioned=set())
    code, output = run("convert", tar, tmp_path / "out", "--field", "json=json")
    assert code == 1 and "field 'json' was declared, but no sample of the tars has a member .json" in output
