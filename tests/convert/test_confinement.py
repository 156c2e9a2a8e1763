"""Confinement: every source reads only inside the roots it was given, once symbolic links are
resolved, and only regular files within the input limit; everything else is a reject with its
reason, never a file read and stored. Each hostile case is built with the real tools (pyarrow,
datasets, CSV text, os.symlink, os.mkfifo), beside a canary file outside the root whose bytes
must never reach the output."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import jpeg_bytes

import shardfmt
from shardfmt import ConvertError, open_dataset
from shardfmt._convert.plan import InputFile
from shardfmt._convert.records import MAX_INPUT_SIZE, InputReader
from shardfmt._convert.sources import confine
from shardfmt._errors import RejectError

CANARY = jpeg_bytes(20, 28, seed=99)
"""The bytes of the file outside every root: a valid JPEG, so it would be stored byte for byte if read."""


def output_bytes(out: Path) -> Iterator[bytes]:
    for path in sorted(out.rglob("*")):
        if path.is_file():
            yield path.read_bytes()


def assert_no_canary(out: Path) -> None:
    assert all(CANARY not in data for data in output_bytes(out))


def read_rejects(out: Path) -> list[tuple[str, str]]:
    return [(r["path"], r["reason"]) for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())]


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """``outside/canary.jpg`` (the canary) and ``src/`` (a root) holding ``good.jpg``, a link to
    the canary (``link.jpg``), a link to the canary's folder (``linkdir``), a FIFO
    (``fifo.jpg``) and a sparse file one byte over the input limit (``big.jpg``)."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "canary.jpg").write_bytes(CANARY)
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.jpg").write_bytes(jpeg_bytes(16, 24, seed=1))
    os.symlink(tmp_path / "outside" / "canary.jpg", src / "link.jpg")
    os.symlink("../outside", src / "linkdir")
    os.mkfifo(src / "fifo.jpg")
    with open(src / "big.jpg", "wb") as big:
        big.truncate(MAX_INPUT_SIZE + 1)  # sparse: no disk used, and never read
    return tmp_path


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path `os.open` is called with in this process (workers=1 runs inline)."""
    paths: list[str] = []
    real_open: Callable[..., int] = os.open

    def recording(path: Any, *args: Any, **kwargs: Any) -> int:
        paths.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    return paths


HOSTILE_ROWS = [  # (listed path, expected reason)
    ("good.jpg", None),
    ("link.jpg", "outside-root"),
    ("linkdir/canary.jpg", "outside-root"),
    ("../outside/canary.jpg", "outside-root"),
    ("ABSOLUTE", "outside-root"),
    ("fifo.jpg", "not-a-regular-file"),
    ("big.jpg", "too-large"),
]


def hostile_paths(world: Path) -> list[str]:
    return [str(world / "outside" / "canary.jpg") if path == "ABSOLUTE" else path for path, _ in HOSTILE_ROWS]


@pytest.mark.timeout(60)
def test_a_listing_reads_only_regular_files_inside_its_folder(world: Path, opened: list[str]) -> None:
    paths = hostile_paths(world)
    (world / "src" / "list.csv").write_text("path,label\n" + "".join(f"{path},cat\n" for path in paths))
    summary = shardfmt.convert(world / "src" / "list.csv", world / "out", workers=1)
    assert summary.records == 1
    assert summary.rejects == {"outside-root": 4, "not-a-regular-file": 1, "too-large": 1}
    assert read_rejects(world / "out") == [
        ("link.jpg", "outside-root"),
        ("linkdir/canary.jpg", "outside-root"),
        ("../outside/canary.jpg", "outside-root"),
        (paths[4], "outside-root"),
        ("fifo.jpg", "not-a-regular-file"),
        ("big.jpg", "too-large"),
    ]
    with open_dataset(world / "out") as dataset:
        assert [bytes(record["image"]) for record in dataset] == [(world / "src" / "good.jpg").read_bytes()]
    assert_no_canary(world / "out")
    assert not [path for path in opened if "canary" in path or "fifo" in path or "big" in path]


def test_a_listing_of_several_columns_keeps_its_partners_inside_too(world: Path) -> None:
    (world / "src" / "table.csv").write_text("image,mask,label\ngood.jpg,good.jpg,0\ngood.jpg,linkdir/canary.jpg,1\n")
    result = shardfmt.convert(world / "src" / "table.csv", world / "out", workers=1)
    assert (result.records, result.rejects) == (1, {"no-partner": 1})
    detail = json.loads((world / "out" / "rejects.jsonl").read_text())["detail"]
    assert detail == f"column 'mask': linkdir/canary.jpg: resolves to {world / 'outside' / 'canary.jpg'}, outside the root {world / 'src'}"
    assert_no_canary(world / "out")


@pytest.mark.timeout(60)
def test_a_link_put_in_place_after_the_scan_is_not_followed_by_the_worker(world: Path) -> None:
    """The worker checks again: a listing's file swapped for a link out, or for a FIFO, between
    the scan and the read, is refused, and the FIFO does not block."""
    reader = InputReader(str(world / "src"), confined=True)
    with pytest.raises(RejectError) as caught:
        reader.read(InputFile("link.jpg", len(CANARY), 0))
    assert caught.value.reason == "outside-root"
    for confined in (True, False):  # False: an ImageFolder's files, whose links are followed
        with pytest.raises(RejectError) as caught:
            InputReader(str(world / "src"), confined=confined).read(InputFile("fifo.jpg", 10, 0))
        assert (caught.value.reason, caught.value.message) == ("not-a-regular-file", "a FIFO, not a regular file")
    assert InputReader(str(world / "src")).read(InputFile("link.jpg", len(CANARY), 0)) == CANARY


def write_parquet_of_paths(path: Path, names: list[str]) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": None, "path": name} for name in names], struct)
    pq.write_table(pa.table({"image": images, "label": list(range(len(names)))}), path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("image_root", [None, "src"])
def test_parquet_image_paths_stay_inside_the_image_root(world: Path, opened: list[str], image_root: str | None) -> None:
    write_parquet_of_paths(world / "src" / "train.parquet", hostile_paths(world))
    summary = shardfmt.convert(world / "src" / "train.parquet", world / "out", workers=1,
                               image_root=None if image_root is None else world / image_root)
    assert summary.records == 1
    assert summary.rejects == {"outside-root": 4, "not-a-regular-file": 1, "too-large": 1}
    assert [reason for _, reason in read_rejects(world / "out")] == [reason for _, reason in HOSTILE_ROWS[1:]]
    with open_dataset(world / "out") as dataset:
        assert [(record["key"], bytes(record["image"])) for record in dataset] == [
            ("train/0", (world / "src" / "good.jpg").read_bytes())
        ]
    assert_no_canary(world / "out")
    assert not [path for path in opened if "canary" in path or "fifo" in path or "big" in path]


@pytest.mark.timeout(60)
def test_devices_and_proc_files_are_never_opened(world: Path, opened: list[str]) -> None:
    """/dev/zero, /etc/shadow and /proc/self/environ: outside the root, never opened; with the
    root "/" given on purpose, /dev/zero is still refused from its stat, before it is opened."""
    names = ["/dev/zero", "/etc/shadow", "/proc/self/environ", "../../../../../../../../dev/zero"]
    write_parquet_of_paths(world / "src" / "train.parquet", [*names, "good.jpg"])
    summary = shardfmt.convert(world / "src" / "train.parquet", world / "out", workers=1)
    assert (summary.records, summary.rejects) == (1, {"outside-root": 4})
    write_parquet_of_paths(world / "src" / "root.parquet", ["/dev/zero", "dev/zero", os.path.relpath(world / "src" / "good.jpg", "/")])
    summary = shardfmt.convert(world / "src" / "root.parquet", world / "rooted", workers=1, image_root="/")
    assert (summary.records, summary.rejects) == (1, {"not-a-regular-file": 2})
    detail = json.loads((world / "rooted" / "rejects.jsonl").read_text().splitlines()[0])["detail"]
    assert detail == "row 0 (row group 0): the image file /dev/zero: a character device, not a regular file"
    assert not [path for path in opened if path.startswith(("/dev/", "/etc/", "/proc/"))]


def test_parquet_paths_by_url_need_an_image_root_even_when_absolute(world: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    write_parquet_of_paths(world / "train.parquet", [str(world / "outside" / "canary.jpg")])
    memory = fsspec.filesystem("memory")
    memory.pipe("/confine/train.parquet", (world / "train.parquet").read_bytes())
    summary = shardfmt.convert("memory://confine/train.parquet", world / "out", workers=1, allow_empty=True)
    assert (summary.records, summary.rejects) == (0, {"missing-file": 1})
    assert_no_canary(world / "out")


def saved_dataset(folder: Path, image: bytes) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict({"image": [{"bytes": image, "path": None}], "label": [1]}, features=features).save_to_disk(str(folder))


def rename_data_file(folder: Path, name: str) -> None:
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": name}]
    (folder / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "link", "fifo", "subfolder"])
def test_a_save_to_disk_folder_reads_only_its_own_data_files(world: Path, kind: str) -> None:
    saved_dataset(world / "outside" / "evil", CANARY)
    evil = world / "outside" / "evil" / "data-00000-of-00001.arrow"
    folder = world / "src" / "saved"
    saved_dataset(folder, jpeg_bytes(16, 24, seed=1))
    name = {"dotdot": "../../outside/evil/data-00000-of-00001.arrow", "absolute": str(evil), "link": "data-00000-of-00001.arrow",
            "fifo": "pipe.arrow", "subfolder": "x/data.arrow"}[kind]
    message = {
        "dotdot": "a data file is a plain file name inside the folder",
        "absolute": "a data file is a plain file name inside the folder",
        "link": f"resolves to {evil}, outside the root {folder}",
        "fifo": "a FIFO, not a regular file",
        "subfolder": "a data file is a plain file name inside the folder",
    }[kind]
    if kind == "link":
        (folder / name).unlink()
        os.symlink(evil, folder / name)
    if kind == "fifo":
        os.mkfifo(folder / name)
    rename_data_file(folder, name)
    with pytest.raises(ConvertError) as caught:
        shardfmt.convert(folder, world / "out", workers=1)
    assert caught.value.path == str(folder / "state.json")
    assert caught.value.message == f"it names the data file {name!r}: {message}"
    assert not (world / "out" / "manifest.json").exists()
    assert_no_canary(world / "out")


def test_a_save_to_disk_folder_with_plain_names_still_converts(world: Path) -> None:
    saved_dataset(world / "src" / "saved", jpeg_bytes(16, 24, seed=1))
    summary = shardfmt.convert(world / "src" / "saved", world / "out", workers=1)
    assert (summary.records, summary.rejects) == (1, {})


@pytest.mark.timeout(60)
def test_an_imagefolder_follows_links_as_documented_but_reads_no_fifo_or_device(world: Path) -> None:
    tree = world / "tree"
    (tree / "a").mkdir(parents=True)
    shutil.copy(world / "src" / "good.jpg", tree / "a" / "good.jpg")
    os.symlink(world / "outside" / "canary.jpg", tree / "a" / "link.jpg")
    os.mkfifo(tree / "a" / "fifo.jpg")
    os.symlink("/dev/zero", tree / "a" / "zero.jpg")
    summary = shardfmt.convert(tree, world / "out", workers=1)
    assert (summary.records, summary.rejects) == (2, {"not-a-regular-file": 2})
    assert read_rejects(world / "out") == [("a/fifo.jpg", "not-a-regular-file"), ("a/zero.jpg", "not-a-regular-file")]
    with open_dataset(world / "out") as dataset:
        assert [bytes(record["image"]) for record in dataset] == [(tree / "a" / "good.jpg").read_bytes(), CANARY]


@pytest.mark.timeout(60, method="thread")  # a blocked decompression thread would outlive a signal
def test_a_fifo_among_tars_is_a_reject_and_does_not_block(world: Path) -> None:
    tars = world / "tars"
    tars.mkdir()
    with tarfile.open(tars / "a.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in (("0.jpg", jpeg_bytes(16, 24, seed=1)), ("0.cls", b"1")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.mkfifo(tars / "b.tar")
    os.mkfifo(tars / "c.tar.gz")
    summary = shardfmt.convert(tars, world / "out", workers=1)
    assert (summary.records, summary.rejects) == (1, {"not-a-regular-file": 2})
    assert read_rejects(world / "out") == [("b.tar", "not-a-regular-file"), ("c.tar", "not-a-regular-file")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("target", "message"), [("/dev/zero", "a character device, not a regular file"),
                                                  ("fifo", "a FIFO, not a regular file")])
def test_an_image_path_in_records_held_in_memory_is_a_regular_file(world: Path, target: str, message: str) -> None:
    path = world / "src" / "fifo.jpg" if target == "fifo" else Path(target)
    with pytest.raises(ConvertError) as caught:
        shardfmt.convert([{"image": str(path), "label": 0}], world / "out", workers=1)
    assert caught.value.message == f"record 0: the image file cannot be read: {message}"


def test_a_resolved_path_that_became_a_link_is_not_followed(world: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the resolution and the open, the file is swapped for a link out: the open does not
    follow it (lstat, then O_NOFOLLOW)."""
    monkeypatch.setattr(confine, "resolve_inside", lambda root, path: os.path.join(root, path))  # as if resolved earlier
    monkeypatch.setattr("shardfmt._convert.records.resolve_inside", confine.resolve_inside)
    with pytest.raises(RejectError) as caught:
        InputReader(str(world / "src"), confined=True).read(InputFile("link.jpg", len(CANARY), 0))
    assert (caught.value.reason, caught.value.message) == ("not-a-regular-file", "a symbolic link, not a regular file")


@pytest.mark.parametrize("path", ["good.jpg", "./good.jpg", "a//b/../../good.jpg", "inner/link.jpg", "inner/linkdir/../src/good.jpg",
                                  "missing/x.jpg", "inner", ".", "inner/linkdir/canary.jpg", "a/../../src/good.jpg", "a/../../outside"])
def test_resolution_is_realpath_and_keeps_inside_only_what_realpath_does(world: Path, path: str) -> None:
    (world / "src" / "inner").mkdir()
    os.symlink("../good.jpg", world / "src" / "inner" / "link.jpg")
    os.symlink("../../outside", world / "src" / "inner" / "linkdir")
    (world / "src" / "a" / "b").mkdir(parents=True)
    real = os.path.realpath(world / "src" / path)
    inside = real == str(world / "src") or real.startswith(f"{world / 'src'}{os.sep}")
    if inside:
        assert confine.resolve_inside(world / "src", path) == real
    else:
        with pytest.raises(RejectError, match=f"resolves to {real}, outside the root"):
            confine.resolve_inside(world / "src", path)
