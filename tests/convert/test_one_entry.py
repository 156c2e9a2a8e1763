"""One entry for every conversion: the command and `shardfmt.convert` write the same bytes, the
shared options are one frozen value checked by keyword, and the reader is chosen once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tree_bytes

import shardfmt
from shardfmt._cli import main
from shardfmt._convert.options import ConvertOptions, RecordRequest
from shardfmt._convert.route import choose_route
from shardfmt._errors import ConvertError
from shardfmt._synthetic import make_imagefolder


@pytest.mark.parametrize("shard_format", ["binary", "tar"])
def test_the_command_and_the_api_write_the_same_bytes_of_the_awkward_tree(awkward_tree: Path, tmp_path: Path,
                                                                          shard_format: str) -> None:
    summary = shardfmt.convert(awkward_tree, tmp_path / "api", shard_format=shard_format, shard_size=4096, workers=2)
    result = CliRunner().invoke(main, ["convert", str(awkward_tree), str(tmp_path / "cli"), "--format", shard_format,
                                       "--shard-size", "4KiB", "--workers", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    api, cli = tree_bytes(tmp_path / "api"), tree_bytes(tmp_path / "cli")
    assert api == cli
    assert summary.records == 25 and summary.num_rejects == 8
    assert "manifest.json" in api and "rejects.jsonl" in api


def test_records_of_several_fields_take_the_same_entry(tmp_path: Path) -> None:
    pairs = [make_imagefolder(tmp_path / side, num_classes=1, per_class=4, size=(16, 16), seed=3) / "class_000" for side in "ab"]
    shardfmt.convert(pairs, tmp_path / "api", fields=[("a", None), ("b", None)], store="raw", workers=1)
    result = CliRunner().invoke(main, ["convert", *map(str, pairs), str(tmp_path / "cli"), "--field", "a", "--field", "b",
                                       "--store", "raw", "--workers", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    assert tree_bytes(tmp_path / "api") == tree_bytes(tmp_path / "cli")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"shard_size": 0}, ValueError, r"shard_size must be in \[1, 1099511627776\], got 0"),
        ({"shard_size": 2.5}, TypeError, r"shard_size must be an int in \[1, "),
        ({"quality": 101}, ValueError, r"quality must be in \[1, 100\], got 101"),
        ({"max_side": 0}, ValueError, r"max_side must be in \[1, "),
        ({"shard_format": "zip"}, ValueError, "shard_format must be 'binary' or 'tar', got 'zip'"),
        ({"engine": "spark"}, ValueError, "engine must be one of local, ray, got 'spark'"),
        ({"workers": 0}, ValueError, r"workers must be an int in \[1, "),
        ({"resume": True, "overwrite": True}, ConvertError, "exclude each other"),
        ({"strict": "yes"}, TypeError, "strict must be True or False, got 'yes'"),
        ({"remote": {"key": "x"}}, TypeError, "remote must be a RemoteOptions or None, got dict"),
    ],
)
def test_the_shared_options_are_checked_by_keyword_when_made(options: dict[str, object], error: type[Exception],
                                                              message: str, imagefolder: Path, tmp_path: Path) -> None:
    with pytest.raises(error, match=message):
        ConvertOptions(**options)  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        shardfmt.convert(imagefolder, tmp_path / "out", **options)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_the_options_and_the_request_are_frozen_values() -> None:
    options, request = ConvertOptions(workers=2), RecordRequest.of(fields={"txt": "str"}, scale=[2, 4], drop_columns=["x"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.workers = 3  # type: ignore[misc]
    assert (options.num_workers, request.fields, request.scale, request.drop_columns) == (2, (("txt", "str"),), (2, 4), ("x",))
    with pytest.raises(ValueError, match="store must be one of jpeg, raw, gray, rgba, mask, got 'png'"):
        RecordRequest(store="png")
    with pytest.raises(ValueError, match=r"patch must be in \[1, "):
        RecordRequest(patch=0)
    with pytest.raises(TypeError, match="drop_columns must be a sequence of column names, got the str 'x'"):
        RecordRequest.of(drop_columns="x")


def test_the_reader_is_chosen_once_from_the_source_and_the_request(imagefolder: Path, tmp_path: Path) -> None:
    def reader(sources: list[Path], shard_format: str = "binary", **request: object) -> str:
        return choose_route([str(s) for s in sources], RecordRequest.of(**request), shard_format=shard_format, remote=None).reader

    table = tmp_path / "t.parquet"
    assert reader([imagefolder]) == "images" and reader([table]) == "table"
    assert reader([imagefolder], store="raw") == reader([imagefolder, imagefolder]) == "fields"
    with pytest.raises(ConvertError, match="are for Parquet and Arrow sources"):
        reader([imagefolder], label_column="fine")
    with pytest.raises(ConvertError, match="takes none of store=, scale= or patch="):
        reader([table], store="raw")
    with pytest.raises(ConvertError, match="--format tar writes image classification records"):
        reader([imagefolder], shard_format="tar", store="raw")
