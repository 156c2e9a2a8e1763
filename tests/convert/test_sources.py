"""convert/sources: one set of rules for a source wherever it lies. The same listing (.csv or
.jsonl, path,label or several columns) or ImageFolder tree, on disk, on fsspec's ``memory://``
and on moto's S3 server on 127.0.0.1, gives the same records, the same rejects and the same bytes;
malformed labels give the same ConvertError on every path."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import jpeg_bytes, tree_bytes
from converting import convert
from remote_servers import make_bucket, moto_server, s3_options, upload_tree

from shardfmt import ConvertError, RemoteOptions, RetryPolicy, open_dataset
from shardfmt._cli import main
from shardfmt._convert.options import RecordRequest
from shardfmt._convert.route import choose_route
from shardfmt._convert.sources import listing_columns, scan_fields, scan_source
from shardfmt._convert.sources.results import IMAGE_AND_LABEL, SourceScan
from shardfmt._convert.sources.tars import TARS_BY_URL

FAST = RetryPolicy(attempts=3, first_delay=0.02, max_delay=0.1)
TWO_COLUMNS = [("img/0.jpg", "cat"), ("img/missing.jpg", "dog"), ("img/notes.txt", "cat"), ("./img/5.jpg", "dog"), ("img", "cat")]
SEVERAL_COLUMNS = [
    ("img/0.jpg", "img/0b.jpg", "cat", 0.5),
    ("img/missing.jpg", "img/0b.jpg", "dog", 1.5),
    ("img/1.jpg", "img/nope.jpg", "dog", 2.5),
    ("img/notes.txt", "img/0b.jpg", "cat", 3.5),
    ("./img/5.jpg", "img/5b.jpg", "dog", 4.5),
    ("img", "img/5b.jpg", "cat", 5.5),
]
MISSING = "No such file or directory (errno 2)"


def write_listing(root: Path, name: str) -> None:
    """Images, a text file, and the listing `name`: list.csv / list.jsonl (path,label: class
    names in the CSV, integers in the JSONL) or table.csv / table.jsonl (image,extra,label,weight)."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    for i, stem in enumerate(["0", "0b", "1", "5", "5b"]):  # a partner "b" has its image's size
        (root / "img" / f"{stem}.jpg").write_bytes(jpeg_bytes(12 + int(stem[0]), 16, seed=i))
    (root / "img" / "notes.txt").write_text("not an image\n")
    if name == "list.csv":
        text = "path,label\n" + "".join(f"{path},{label}\n" for path, label in TWO_COLUMNS)
    elif name == "list.jsonl":
        text = "".join(json.dumps({"path": path, "label": n * 3}) + "\n" for n, (path, _) in enumerate(TWO_COLUMNS))
    elif name == "table.csv":
        text = "image,extra,label,weight\n" + "".join(",".join(map(str, row)) + "\n" for row in SEVERAL_COLUMNS)
    else:
        names = ("image", "extra", "label", "weight")
        text = "".join(json.dumps(dict(zip(names, row, strict=True))) + "\n" for row in SEVERAL_COLUMNS)
    (root / name).write_text(text)


def read_rejects(out: Path) -> list[tuple[str, str, str]]:
    return [(r["path"], r["reason"], r["detail"]) for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())]


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    pytest.importorskip("s3fs", reason="S3 URLs need s3fs")
    pytest.importorskip("moto.server", reason="the S3-compatible test server is moto's")
    with moto_server() as url:
        make_bucket(url, "sources")
        yield url


class Place:
    """Where a local folder is copied to be read by URL."""

    def __init__(self, url: str, fs: Any, path: str, remote: RemoteOptions | None, cli: list[str]) -> None:
        self.url, self.fs, self.path, self.remote, self.cli = url, fs, path, remote, cli

    def upload(self, local: Path) -> str:
        upload_tree(self.fs, local, self.path)
        return self.url


@pytest.fixture(params=["memory", "s3"])
def place(request: pytest.FixtureRequest) -> Iterator[Place]:
    import fsspec

    prefix = uuid.uuid4().hex[:12]
    if request.param == "memory":
        fs = fsspec.filesystem("memory")
        yield Place(f"memory://{prefix}", fs, f"/{prefix}", None, [])
        if fs.exists(f"/{prefix}"):
            fs.rm(f"/{prefix}", recursive=True)
        return
    endpoint = request.getfixturevalue("endpoint")
    fs = fsspec.filesystem("s3", **s3_options(endpoint))
    remote = RemoteOptions(storage_options=s3_options(endpoint), retry=FAST)
    yield Place(f"s3://sources/{prefix}", fs, f"sources/{prefix}", remote, ["--storage-options", json.dumps(s3_options(endpoint))])


def cli_convert(src: str, out: Path, *extra: str) -> None:
    result = CliRunner().invoke(main, ["convert", src, str(out), "--workers", "1", "--quiet", *extra])
    assert result.exit_code == 0, result.output


def comparable(scan: SourceScan) -> tuple[Any, ...]:
    """A scan without what only says where it lies: the root, and stat times or object versions."""
    return scan.kind, scan.fields, scan.classes, [(i.files[0].path, *i.values, i.files[0].size) for i in scan.inputs], scan.rejects


@pytest.mark.parametrize("name", ["list.csv", "list.jsonl"])
def test_a_path_label_listing_converts_by_url_as_on_disk(name: str, place: Place, tmp_path: Path) -> None:
    write_listing(tmp_path / "src", name)
    cli_convert(str(tmp_path / "src" / name), tmp_path / "disk")
    url = place.upload(tmp_path / "src")
    cli_convert(f"{url}/{name}", tmp_path / "url", *place.cli)
    assert tree_bytes(tmp_path / "url") == tree_bytes(tmp_path / "disk")
    with open_dataset(tmp_path / "url") as dataset:
        records = [(r["key"], r["label"], bytes(r["image"])) for r in dataset]
        assert dataset.classes == (["cat", "dog"] if name == "list.csv" else None)
    labels = [0, 1] if name == "list.csv" else [0, 9]
    assert records == [
        (key, label, (tmp_path / "src" / f"{key}.jpg").read_bytes()) for key, label in zip(["img/0", "img/5"], labels, strict=True)
    ]
    assert read_rejects(tmp_path / "url") == [
        ("img/missing.jpg", "missing-file", MISSING),
        ("img/notes.txt", "not-an-image", "no image format recognises the file"),
        ("img", "not-a-regular-file", "a folder, not a regular file"),
    ]


@pytest.mark.parametrize("name", ["table.csv", "table.jsonl"])
def test_a_listing_of_several_columns_converts_by_url_as_on_disk(name: str, place: Place, tmp_path: Path) -> None:
    write_listing(tmp_path / "src", name)
    cli_convert(str(tmp_path / "src" / name), tmp_path / "disk")
    url = place.upload(tmp_path / "src")
    request = RecordRequest.of()
    assert choose_route([f"{url}/{name}"], request, shard_format="binary", remote=place.remote).reader == "fields"
    assert listing_columns(f"{url}/{name}", remote=place.remote) == ["image", "extra", "label", "weight"]
    cli_convert(f"{url}/{name}", tmp_path / "url", *place.cli)
    assert tree_bytes(tmp_path / "url") == tree_bytes(tmp_path / "disk")
    with open_dataset(tmp_path / "url") as dataset:
        assert dataset.schema.names == ("image", "extra", "label", "weight", "key") and dataset.classes == ["cat", "dog"]
        assert [(r["key"], r["label"], r["weight"], bytes(r["image"]), bytes(r["extra"])) for r in dataset] == [
            (key, label, weight, (tmp_path / "src" / f"{key}.jpg").read_bytes(), (tmp_path / "src" / f"{key}b.jpg").read_bytes())
            for key, label, weight in [("img/0", 0, 0.5), ("img/5", 1, 4.5)]
        ]
    assert read_rejects(tmp_path / "url") == [
        ("img/missing.jpg", "missing-file", MISSING),
        ("img/1.jpg", "no-partner", f"column 'extra': img/nope.jpg: {MISSING}"),
        ("img/notes.txt", "not-an-image", "field 'image': no image format recognises the file"),
        ("img", "not-a-regular-file", "a folder, not a regular file"),
    ]


def test_a_listing_by_url_into_object_storage_with_raw_pixels(place: Place, tmp_path: Path) -> None:
    write_listing(tmp_path / "src", "table.csv")
    convert(tmp_path / "src" / "table.csv", tmp_path / "disk", store="raw", workers=1)
    url = place.upload(tmp_path / "src")
    result = convert(f"{url}/table.csv", tmp_path / "url", store="raw", workers=2, remote=place.remote)
    assert result.num_records == 2 and result.num_rejects == 4
    assert tree_bytes(tmp_path / "url") == tree_bytes(tmp_path / "disk")


LABEL_CASES = [
    ("big.csv", "path,label\na.jpg,1\nb.jpg,99999999999999999999\n", "line 3: label 99999999999999999999 does not fit in int64"),
    ("big.jsonl", '{"path": "a.jpg", "label": -99999999999999999999}\n', "line 1: label -99999999999999999999 does not fit in int64"),
    ("bigtable.csv", "image,label,weight\na.jpg,99999999999999999999,1\n", "line 2: label 99999999999999999999 does not fit in int64"),
    ("empty.csv", "path,label\na.jpg,cat\nb.jpg, \n", "line 3: empty label"),
    (
        "mixed.jsonl",
        '{"path": "a.jpg", "label": 1}\n{"path": "b.jpg", "label": "+-5"}\n',
        "line 2: labels must be all integers or all strings",
    ),
    (
        "mixedtable.jsonl",
        '{"image": "a.jpg", "label": "cat"}\n{"image": "b.jpg", "label": 2}\n',
        "line 1: labels must be all integers or all strings",
    ),
    ("bool.jsonl", '{"path": "a.jpg", "label": true}\n', "line 1: label must be an integer or a string, found True"),
]


@pytest.mark.parametrize(("name", "text", "message"), LABEL_CASES, ids=[case[0] for case in LABEL_CASES])
def test_malformed_labels_give_the_same_error_on_disk_and_by_url(name: str, text: str, message: str, place: Place, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jpg").write_bytes(jpeg_bytes(8, 8))
    (tmp_path / "src" / "b.jpg").write_bytes(jpeg_bytes(8, 8, seed=1))
    (tmp_path / "src" / name).write_text(text)
    url = place.upload(tmp_path / "src")
    errors: list[ConvertError] = []
    for source, remote in ((tmp_path / "src" / name, None), (f"{url}/{name}", place.remote)):
        with pytest.raises(ConvertError) as caught:
            convert(source, tmp_path / f"out{len(errors)}", workers=1, remote=remote)
        errors.append(caught.value)
    assert [error.message for error in errors] == [message, message]
    assert [error.path for error in errors] == [str(tmp_path / "src" / name), f"{url}/{name}"]


def test_a_label_that_only_looks_like_a_number_is_a_class_name_on_disk_and_by_url(place: Place, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / "src" / name).write_bytes(jpeg_bytes(8, 8))
    (tmp_path / "src" / "list.csv").write_text("path,label\na.jpg,+-5\nb.jpg, 1\n")
    (tmp_path / "src" / "table.csv").write_text("image,label\na.jpg,+-5\nb.jpg, 1\n")
    url = place.upload(tmp_path / "src")
    disk, by_url = scan_source(tmp_path / "src" / "list.csv"), scan_source(f"{url}/list.csv", remote=place.remote)
    assert comparable(disk) == comparable(by_url) == ("csv", IMAGE_AND_LABEL, ("+-5", "1"), [("a.jpg", 0, 683), ("b.jpg", 1, 683)], ())
    tables = [scan_fields([tmp_path / "src" / "table.csv"]), scan_fields([f"{url}/table.csv"], remote=place.remote)]
    assert [(t.classes, [(i.key, i.values) for i in t.inputs]) for t in tables] == [(("+-5", "1"), [("a", (0,)), ("b", (1,))])] * 2


def make_tree(root: Path) -> None:
    """An ImageFolder tree that a store can hold too (no empty folder, no link): hidden files and
    folders at every depth, files in the root between classes, folders whose sorted order differs
    from a walk's ("sub b" sorts before "sub/x")."""
    files = [
        ".hidden_root/x.jpg",
        "a/1.jpg",
        "a/.h.jpg",
        "a/.hid/4.jpg",
        "a/sub/2.jpg",
        "a/sub/.deep/3.jpg",
        "a/sub/x/6.jpg",
        "a/sub b/7.jpg",
        "b.jpg",
        "c/9.jpg",
        "c/8.txt",
        "z.txt",
    ]
    for n, name in enumerate(files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(jpeg_bytes(8, 8 + n))


def test_an_imagefolder_tree_is_scanned_alike_on_disk_and_by_url(place: Place, tmp_path: Path) -> None:
    make_tree(tmp_path / "tree")
    url = place.upload(tmp_path / "tree")
    disk, by_url = scan_source(tmp_path / "tree"), scan_source(url, remote=place.remote)
    assert comparable(disk) == comparable(by_url)
    assert disk.classes == ("a", "c") and by_url.root == url
    assert [(i.files[0].path, *i.values) for i in by_url.inputs] == [
        ("a/1.jpg", 0),
        ("a/sub/2.jpg", 0),
        ("a/sub b/7.jpg", 0),
        ("a/sub/x/6.jpg", 0),
        ("c/8.txt", 1),
        ("c/9.jpg", 1),
    ]
    assert [(r.position, r.path, r.reason) for r in by_url.rejects] == [
        (0, ".hidden_root", "hidden"),
        (0, "a/.h.jpg", "hidden"),
        (0, "a/.hid", "hidden"),
        (1, "a/sub/.deep", "hidden"),
        (4, "b.jpg", "no-class"),
        (6, "z.txt", "no-class"),
    ]


def test_what_a_url_cannot_be_is_refused_by_name(place: Place, tmp_path: Path) -> None:
    (tmp_path / "tars").mkdir()
    (tmp_path / "tars" / "a.tar").write_bytes(b"\0" * 1024)
    (tmp_path / "tars" / "notes.txt").write_text("a folder of tars, as a local one would be read\n")
    url = place.upload(tmp_path / "tars")
    for source in (url, f"{url}/a.tar"):
        with pytest.raises(ConvertError, match="tars given by URL cannot be a conversion source") as caught:
            scan_source(source, remote=place.remote)
        assert caught.value.message == TARS_BY_URL
    with pytest.raises(ConvertError, match="cannot read the listing") as missing:
        scan_source(f"{url}/none.csv", remote=place.remote)
    assert missing.value.path == f"{url}/none.csv"
    with pytest.raises(ConvertError, match="holds no objects"):
        scan_source(f"{url}/empty", remote=place.remote)
    with pytest.raises(ConvertError, match="several sources are folders of one image field each, and must be local"):
        scan_fields([url, os.fspath(tmp_path / "tars")], remote=place.remote)
