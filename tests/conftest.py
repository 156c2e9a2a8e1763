"""Shared fixtures: small generated JPEGs and datasets, never committed binaries."""

from __future__ import annotations

import io
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from hypothesis import settings
from PIL import Image

from shardfmt import DatasetWriter
from shardfmt._synthetic import make_image, make_imagefolder
from shardfmt.format import IMAGE_CLASSIFICATION

# tools/ holds the vector generator and the byte-level shard builder the format tests share.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
# Tests live in folders that mirror the package's layers; the helpers beside this file
# (remote_servers) are imported from any of them.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from leaks import no_leaks  # noqa: E402, F401  (the fixture, for every test)

# Hypothesis: in CI (the CI variable set) every run draws the same examples, so a failure is a
# failure of the code and not of the draw; in development each run draws afresh, to find more.
# Either way a failure prints the blob that replays it (@reproduce_failure), and a failure found
# once is kept as an explicit @example. No deadline: a deadline is a wall-clock assertion, and
# the suite runs on loaded machines. HYPOTHESIS_PROFILE picks a profile by name.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

webdataset_leaves_files_open = pytest.mark.filterwarnings("ignore:unclosed file <_io.BufferedReader:ResourceWarning")
"""For a test that reads tars with webdataset's WebDataset: webdataset 1.0 opens each tar and never
closes it (the garbage collector does, with a ResourceWarning, which the suite makes an error).
Not ours to fix; only tests that read with webdataset carry this mark."""


def jpeg_bytes(height: int = 24, width: int = 32, *, seed: int = 0, quality: int = 90) -> bytes:
    """A small textured RGB JPEG."""
    return simplejpeg.encode_jpeg(make_image(height, width, seed=seed), quality=quality, colorsubsampling="420")


@pytest.fixture
def imagefolder(tmp_path: Path) -> Path:
    """A 3-class ImageFolder of 8 small JPEGs per class."""
    return make_imagefolder(tmp_path / "src", num_classes=3, per_class=8, size=(48, 64), seed=1)


@pytest.fixture
def small_dataset(tmp_path: Path) -> Path:
    """A dataset of 40 records of varied size in shards of about 8 KB, written directly."""
    out = tmp_path / "ds"
    rng = np.random.default_rng(3)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=8192, classes=["a", "b", "c"]) as writer:
        for i in range(40):
            h, w = int(rng.integers(20, 60)), int(rng.integers(20, 60))
            writer.write({"image": jpeg_bytes(h, w, seed=i), "label": i % 3, "key": f"rec{i:03d}"})
    return out


def pillow_bytes(image: Image.Image, fmt: str = "JPEG", **options: object) -> bytes:
    """`image` saved in `fmt` with Pillow's `options`."""
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def exif_rotated_jpeg(height: int = 24, width: int = 40, *, orientation: int = 6, seed: int = 0) -> bytes:
    """A JPEG stored `height` x `width` whose EXIF says to turn it (6: 90 degrees clockwise)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return pillow_bytes(Image.fromarray(make_image(height, width, seed=seed)), exif=exif)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` 1-bit pixels; its data is never valid."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00")) + chunk(b"IEND", b"")


def awkward_files() -> dict[str, bytes]:
    """Inputs that each exercise one handling rule, by file name relative to a class folder."""
    rgb = Image.fromarray(make_image(30, 44, seed=5))
    full = jpeg_bytes(30, 40, seed=6)
    return {
        "cmyk.jpg": pillow_bytes(rgb.convert("CMYK")),
        "gray.jpg": pillow_bytes(rgb.convert("L")),
        "png_named.JPEG": pillow_bytes(rgb, "PNG"),
        "progressive.jpg": pillow_bytes(rgb, progressive=True, quality=80),
        "rotated.jpg": exif_rotated_jpeg(24, 40),
        "truncated.jpg": full[: len(full) // 2],
        "zero.jpg": b"",
        "notes.txt": b"not an image\n",
        ".hidden.jpg": full,
        "bomb.png": png_header_only(10_000, 10_000),
    }


def make_awkward_tree(folder: Path) -> Path:
    """Write, as `folder`/awkward, an ImageFolder with plain JPEGs, every kind of awkward input,
    an empty class, a symlink loop, a broken link, a hidden folder and a file name that is not
    UTF-8; return its root (also `tools/compare_convert.py`'s "nasty" source)."""
    root = make_imagefolder(folder / "awkward", num_classes=3, per_class=6, size=(40, 52), seed=2)
    for name, data in awkward_files().items():
        (root / "class_001" / name).write_bytes(data)
    (root / "class_000" / "nested" / "deeper").mkdir(parents=True)
    (root / "class_000" / "nested" / "deeper" / "inner.jpg").write_bytes(jpeg_bytes(20, 20, seed=7))
    os.symlink("..", root / "class_000" / "nested" / "loop")
    os.symlink("missing.jpg", root / "class_002" / "broken.jpg")
    (root / "class_002" / ".cache").mkdir()
    (root / "class_002" / ".cache" / "x.jpg").write_bytes(jpeg_bytes(seed=8))
    (root / "empty_class").mkdir()
    with open(os.path.join(os.fsencode(root), b"class_002", b"caf\xe9.jpg"), "wb") as file:
        file.write(jpeg_bytes(16, 16, seed=9))
    return root


@pytest.fixture
def awkward_tree(tmp_path: Path) -> Path:
    """The awkward ImageFolder of `make_awkward_tree`."""
    return make_awkward_tree(tmp_path)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under `root` by relative path: to compare two outputs byte for byte."""
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


@pytest.fixture(scope="module")
def small_dataset_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `small_dataset` records, written once per test module."""
    out = tmp_path_factory.mktemp("small") / "ds"
    rng = np.random.default_rng(3)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=8192, classes=["a", "b", "c"]) as writer:
        for i in range(40):
            h, w = int(rng.integers(20, 60)), int(rng.integers(20, 60))
            writer.write({"image": jpeg_bytes(h, w, seed=i), "label": i % 3, "key": f"rec{i:03d}"})
    return out

