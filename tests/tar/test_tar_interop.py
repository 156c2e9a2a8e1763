"""Interop with the webdataset library, Python's tarfile formats and GNU tar, both ways; and the
loader over a tar dataset against the same images in binary shards."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import jpeg_bytes, webdataset_leaves_files_open
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfmt import DatasetWriter, ImageTransform, Loader, open_dataset
from shardfmt._dataset.tars import index_tars
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.tar._index import index_tar
from shardfmt.tar._keys import split_key
from shardfmt.tar._scan import iter_tar_samples
from shardfmt.tar._writer import TarShardWriter

wds = pytest.importorskip("webdataset")
from webdataset.tariterators import base_plus_ext  # noqa: E402

pytestmark = webdataset_leaves_files_open  # every test here reads with webdataset, or may


def plain(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample with bytes values and without webdataset's own bookkeeping keys."""
    return {k: bytes(v) if isinstance(v, (bytes, memoryview)) else v for k, v in sample.items() if k not in ("__url__", "__local_path__")}


def webdataset_samples(urls: str | list[str]) -> list[dict[str, Any]]:
    return [plain(sample) for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False)]


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="ab./\nJ\u00e9", max_size=12))
def test_split_key_is_webdatasets_base_plus_ext(name: str) -> None:
    key, extension = base_plus_ext(name)
    assert split_key(name) == (None if key is None else (key, extension))


# -- ours, read by webdataset ------------------------------------------------------------------

AWKWARD_KEYS = ["plain", "dir/sub/" + "long" * 40, "v1.2/dotted-dir", "h\u00e9llo/\u65e5\u672c", "caf\udce9"]


def test_webdataset_reads_our_tars(tmp_path: Path) -> None:
    path = tmp_path / "ours.tar"
    expected = []
    with TarShardWriter(path) as writer:
        for i, key in enumerate(AWKWARD_KEYS):
            image = jpeg_bytes(10, 12, seed=i)
            writer.write(key, image=image, label=i * 7, meta={"n": i} if i % 2 else None)
            sample = {"__key__": key, "cls": str(i * 7).encode(), "jpg": image}
            if i % 2:
                sample["json"] = f'{{"n":{i}}}'.encode()
            expected.append(sample)
    assert webdataset_samples(str(path)) == expected
    decoded = [(s["__key__"], s["cls"]) for s in wds.WebDataset(str(path), shardshuffle=False).decode()]
    assert decoded == [(key, i * 7) for i, key in enumerate(AWKWARD_KEYS)]


def test_webdataset_reads_a_tar_dataset_by_brace_pattern(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with DatasetWriter(root, schema=IMAGE_CLASSIFICATION, shard_format="tar", shard_size=15_000) as writer:
        for i in range(12):
            writer.write({"image": jpeg_bytes(20, 20, seed=i), "label": i % 4, "key": f"k{i:02d}"})
    shards = sorted(root.glob("*.tar"))
    assert len(shards) > 2
    pattern = str(root / f"shard-{{00000..{len(shards) - 1:05d}}}.tar")
    theirs = webdataset_samples(pattern)
    with open_dataset(root) as reader:
        ours = [{"__key__": r["key"], "cls": str(r["label"]).encode(), "jpg": bytes(r["image"])} for r in reader]
    assert theirs == ours


# -- theirs, read by us ------------------------------------------------------------------------


def ours_from(path: Path) -> list[tuple[str, int, bytes]]:
    with open_dataset(path) as reader:
        return [(r["key"], r["label"], bytes(r["image"])) for r in reader]


def test_we_read_webdatasets_tarwriter_and_shardwriter(tmp_path: Path) -> None:
    samples = [(f"s/{i:03d}", i % 5, jpeg_bytes(9 + i, 11, seed=i)) for i in range(10)]
    with wds.TarWriter(str(tmp_path / "one.tar")) as writer:
        for key, label, image in samples:
            writer.write({"__key__": key, "jpg": image, "cls": label, "txt": f"caption {key}"})
    assert ours_from(tmp_path / "one.tar") == samples
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    with wds.ShardWriter(str(sharded / "part-%04d.tar"), maxcount=3, verbose=0) as writer:
        for key, label, image in samples:
            writer.write({"__key__": key, "jpg": image, "cls": label})
    manifest = index_tars([sharded])
    assert len(manifest.shards) == 4 and manifest.num_records == 10
    assert ours_from(sharded) == samples
    assert [s["__key__"] for s in iter_tar_samples(tmp_path / "one.tar")] == [k for k, _, _ in samples]
    with open_dataset(tmp_path / "one.tar") as reader:
        assert reader.shard(0).members(0)["txt"].tobytes() == b"caption s/000"


LONG = "p" * 90 + "/" + "x" * 80
"""Over 100 bytes, yet USTAR can store it (split into its 155-byte prefix and 100-byte name)."""


def member_list(image: bytes) -> list[tuple[str | bytes, bytes]]:
    """Names that exercise every part of the key rule, each sample's members adjacent."""
    return [
        ("plain.jpg", image), ("plain.cls", b"1"),
        (LONG + ".jpg", image), (LONG + ".cls", b"2"),
        ("multi.dot.name.jpg", image), ("multi.cls", b"9"),
        ("v1.2/k.JPG", image), ("v1.2/k.Cls", b"3"), ("v1.2/k.seg.png", b"png"),
        (".hidden.jpg", image), ("d/.lead.jpg", image),
        ("noext", b"skip me"), ("__meta__/info.json", b"{}"),
        (b"caf\xe9.jpg", image), (b"caf\xe9.cls", b"4"),
    ]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_tarfile_formats_read_as_webdataset_reads_them(tmp_path: Path, fmt: int) -> None:
    image = jpeg_bytes(10, 10)
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=fmt, encoding="utf-8", errors="surrogateescape") as archive:
        for name, data in member_list(image):
            if isinstance(name, bytes):
                name = name.decode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    theirs = webdataset_samples(str(path))
    ours = [plain(s) for s in iter_tar_samples(path)]
    assert ours == theirs
    keys = [s["__key__"] for s in ours]
    assert keys == ["plain", LONG, "multi", "v1.2/k", "d/", "caf\udce9"]
    assert sorted(ours[3]) == ["__key__", "cls", "jpg", "seg.png"]
    assert sorted(ours[2]) == ["__key__", "cls", "dot.name.jpg"]
    info = index_tar(path)
    assert [(r.key, r.reason) for r in info.rejects] == [("multi", "no-image"), ("d/", "no-image")]
    with pytest.warns(UserWarning, match=r"2 samples left out of the index \({'no-image': 2}\)"):
        reader = open_dataset(path)
    with reader:
        assert [(r["key"], r["label"]) for r in reader] == [("plain", 1), (LONG, 2), ("v1.2/k", 3), ("caf\udce9", 4)]


def test_non_adjacent_members_are_grouped_where_webdataset_splits_them(tmp_path: Path) -> None:
    a, b = jpeg_bytes(8, 8, seed=1), jpeg_bytes(8, 8, seed=2)
    path = tmp_path / "interleaved.tar"
    with tarfile.open(path, "w") as archive:
        for name, data in [("a.jpg", a), ("b.jpg", b), ("a.cls", b"0"), ("b.cls", b"1")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    assert [sorted(s) for s in webdataset_samples(str(path))] == [["__key__", "jpg"]] * 2 + [["__key__", "cls"]] * 2
    assert [plain(s) for s in iter_tar_samples(path)] == [
        {"__key__": "a", "jpg": a, "cls": b"0"},
        {"__key__": "b", "jpg": b, "cls": b"1"},
    ]
    assert ours_from(path) == [("a", 0, a), ("b", 1, b)]


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs a tar binary")
def test_tar_lists_our_shards(tmp_path: Path) -> None:
    path = tmp_path / "ours.tar"
    keys = ["plain", "dir/" + "y" * 150, "h\u00e9llo"]
    with TarShardWriter(path) as writer:
        for i, key in enumerate(keys):
            writer.write(key, image=jpeg_bytes(8, 8, seed=i), label=i)
    listing = subprocess.run(["tar", "-tvf", str(path)], capture_output=True, check=True, env={"LC_ALL": "C.UTF-8"})
    lines = listing.stdout.decode("utf-8").splitlines()
    assert [line.split()[-1] for line in lines] == [f"{k}.{e}" for k in keys for e in ("cls", "jpg")]
    assert all(line.startswith("-rw-r--r-- 0/0") and " 1970-01-01 00:00 " in line for line in lines)
    assert listing.stderr == b""


# -- the loader ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twin_datasets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same 37 records as binary shards and as tar shards, cut at different points."""
    root = tmp_path_factory.mktemp("twins")
    rng = np.random.default_rng(5)
    records = [
        {"image": jpeg_bytes(int(rng.integers(30, 70)), int(rng.integers(30, 70)), seed=i), "label": i, "key": f"r{i:02d}"}
        for i in range(37)
    ]
    for name, options in (("bin", {"shard_size": 20_000}), ("tar", {"shard_size": 45_000, "shard_format": "tar"})):
        with DatasetWriter(root / name, schema=IMAGE_CLASSIFICATION, **options) as writer:
            for record in records:
                writer.write(record)
    return root / "bin", root / "tar"


def batches(path: Any, crop: str = "train", **options: Any) -> list[tuple[list[int], bytes]]:
    with Loader(path, batch_size=8, seed=7, **options, transform=ImageTransform(crop, size=24)) as loader:
        return [(labels.tolist(), images.numpy().tobytes()) for _ in range(2) for images, labels in loader]


def test_loader_gives_the_same_batches_over_tar_and_binary_shards(twin_datasets: tuple[Path, Path]) -> None:
    binary, tar = twin_datasets
    expected = batches(binary, num_workers=0)
    assert batches(tar, num_workers=0) == expected
    assert batches(sorted(map(str, tar.glob("*.tar"))), num_workers=2, crop="eval") == batches(binary, num_workers=0, crop="eval")


def test_torch_dataset_over_tar_shards(twin_datasets: tuple[Path, Path]) -> None:
    from shardfmt import Dataset

    dataset = Dataset(twin_datasets[1], transform=ImageTransform(crop="resize", size=16))
    image, label = dataset[5]
    assert tuple(image.shape) == (3, 16, 16) and label == 5 and len(dataset) == 37
