"""`classify_location`: the one rule for what a location string names, and where its manifest is."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardfmt import open_dataset
from shardfmt._dataset.locate import Location, LocationKind, classify_location
from shardfmt._dataset.tars import tar_sources

PATH, URL, TARS, URL_TARS = LocationKind.PATH, LocationKind.URL, LocationKind.TARS, LocationKind.URL_TARS


@pytest.mark.parametrize(
    ("text", "kind", "path", "url"),
    [
        ("/data/ds", PATH, "/data/ds", None),
        ("relative/dir", PATH, "relative/dir", None),
        ("file:///data/ds", PATH, "/data/ds", None),
        ("FILE:///data/x.tar", TARS, "/data/x.tar", None),
        ("C:/x", PATH, "C:/x", None),
        ("run:2/x-{0..1}.tar", TARS, "run:2/x-{0..1}.tar", None),
        ("shards-{000..009}.tar", TARS, "shards-{000..009}.tar", None),
        ("data/{a,b}", PATH, "data/{a,b}", None),
        ("s3://bucket/prefix", URL, None, "s3://bucket/prefix"),
        ("s3://bucket/listing.csv", URL, None, "s3://bucket/listing.csv"),
        ("https://h/d/manifest.json?sig=1", URL, None, "https://h/d/manifest.json?sig=1"),
        ("s3://bucket/x.tar", URL_TARS, None, "s3://bucket/x.tar"),
        ("https://h/shard-{0..1}.tar?sig=1", URL_TARS, None, "https://h/shard-{0..1}.tar?sig=1"),
        ("pipe:curl -s https://h/x.tar", URL_TARS, None, "pipe:curl -s https://h/x.tar"),
    ],
)
def test_each_kind_of_location(text: str, kind: LocationKind, path: str | None, url: str | None) -> None:
    assert classify_location(text) == Location(kind, text, path=path, url=url)
    assert classify_location(text).is_remote == (url is not None)
    assert classify_location(text).is_tars == (kind in (TARS, URL_TARS))


def test_a_folder_named_like_a_tar_is_a_path(tmp_path: Path) -> None:
    (tmp_path / "shards.tar").mkdir()
    assert classify_location(tmp_path / "shards.tar").kind is PATH
    assert classify_location(tmp_path / "other.tar").kind is TARS
    assert tar_sources(tmp_path / "shards.tar") is None and tar_sources(tmp_path / "other.tar") == [tmp_path / "other.tar"]


def test_the_manifest_of_a_local_dataset(tmp_path: Path) -> None:
    (tmp_path / "odd.json").mkdir()
    assert classify_location(tmp_path).manifest_path() == tmp_path / "manifest.json"
    assert classify_location(f"file://{tmp_path}/manifest.json").manifest_path() == tmp_path / "manifest.json"
    assert classify_location(tmp_path / "v2.json").manifest_path() == tmp_path / "v2.json"
    assert classify_location(tmp_path / "missing").manifest_path() == tmp_path / "missing" / "manifest.json"
    assert classify_location(tmp_path / "odd.json").manifest_path() == tmp_path / "odd.json" / "manifest.json"
    with pytest.raises(ValueError, match="is a URL, not a local path"):
        classify_location("s3://b/p").manifest_path()


def test_the_manifest_of_a_remote_dataset() -> None:
    assert classify_location("s3://b/p/").manifest_url() == ("s3://b/p", "manifest.json")
    assert classify_location("s3://b/p/manifest.json").manifest_url() == ("s3://b/p", "manifest.json")
    assert classify_location("https://h/d/v2.json?sig=1").manifest_url() == ("https://h/d?sig=1", "v2.json")
    assert classify_location("https://h/d?sig=1").manifest_url() == ("https://h/d?sig=1", "manifest.json")
    with pytest.raises(ValueError, match="is a local path, not a URL"):
        classify_location("/data/ds").manifest_url()


def test_the_url_of_one_object_splits_into_its_folder_and_name() -> None:
    assert classify_location("s3://b/lists/train.csv").split_url() == ("s3://b/lists", "train.csv")
    assert classify_location("https://h/d/train.jsonl?sig=1").split_url() == ("https://h/d?sig=1", "train.jsonl")
    with pytest.raises(ValueError, match="is a local path, not a URL"):
        classify_location("train.csv").split_url()


def test_tars_by_url_are_refused_in_a_list_too() -> None:
    assert tar_sources(["file:///a/x.tar", "b-{0..1}.tar"]) == [Path("/a/x.tar"), Path("b-0.tar"), Path("b-1.tar")]
    with pytest.raises(ValueError, match="only local tars can be opened directly"):
        tar_sources(["a.tar", "s3://bucket/b.tar"])


@pytest.mark.parametrize("path", ["x" * 100_000, ["a.tar", "y" * 5000], "d/" + "z" * 300])
def test_a_path_over_the_limits_is_refused_by_name_before_the_file_system_sees_it(path: object) -> None:
    # Before: OSError [Errno 36] File name too long, from deep inside the locate step.
    limits = r"^path must be at most 4096 bytes long \(PATH_MAX\)|^each part of path must be at most 255 bytes long \(NAME_MAX\)"
    with pytest.raises(ValueError, match=limits):
        open_dataset(path)  # type: ignore[arg-type]
