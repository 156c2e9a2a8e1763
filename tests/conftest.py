"""Shared fixtures: small generated JPEGs and datasets, never committed binaries."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

from shardfmt import IMAGE_CLASSIFICATION, DatasetWriter
from shardfmt.sample import make_image, make_imagefolder

# tools/ holds the vector generator and the byte-level shard builder the format tests share.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))


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
