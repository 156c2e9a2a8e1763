"""The demo: generate a small ImageFolder, convert it, read it back, and time each step."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import simplejpeg

from ._convert.api import convert
from ._convert.loop import ConvertResult
from ._dataset.reader import open_dataset
from ._errors import ConvertError
from ._synthetic import make_imagefolder

__all__ = ["DemoResult", "run_demo"]

_MARKER = ".shardfmt-demo"
"""Left in the generated tree, so a later demo may replace it; hidden, so the scan skips it."""


@dataclass(frozen=True)
class DemoResult:
    """What the demo did.

    Attributes:
        source, output: the generated ImageFolder and the dataset.
        generate_seconds: time to write the JPEGs.
        converted: the conversion's result (images/s, records, rejects).
        read_images, read_seconds: records read back with `open_dataset`, checksums verified
            and decoded to RGB with simplejpeg, and the time it took.
        loader_images, loader_seconds: images `shardfmt.Loader` delivered, or None if skipped.
        loader_skipped: why the loader was not run, or None.
    """

    source: Path
    output: Path
    generate_seconds: float
    converted: ConvertResult
    read_images: int
    read_seconds: float
    loader_images: int | None
    loader_seconds: float | None
    loader_skipped: str | None


def run_demo(
    directory: str | os.PathLike[str], *, images: int = 500, workers: int | None = None, batch_size: int = 64
) -> DemoResult:
    """Generate `images` JPEGs of about 416x362 px in up to 10 classes, convert and read them back.

    Args:
        directory: where ``imagefolder/`` and ``dataset/`` are written; a previous demo's
            folders there are replaced.
        images: how many JPEGs to generate.
        workers: conversion processes (None: one per CPU).
        batch_size: batch size for the loader, when it is available.

    Returns:
        A `DemoResult`.

    Raises:
        ConvertError: ``directory/imagefolder`` exists but was not made by the demo.
    """
    if images < 1:
        raise ValueError(f"images {images} must be at least 1")
    directory = Path(directory)
    source, output = directory / "imagefolder", directory / "dataset"
    if source.exists():
        if not (source / _MARKER).exists():
            raise ConvertError("exists and was not made by the demo; choose another --dir", path=source)
        shutil.rmtree(source)
    num_classes = max(n for n in range(1, 11) if images % n == 0)
    start = time.perf_counter()
    make_imagefolder(source, num_classes=num_classes, per_class=images // num_classes, size=(362, 416), quality=95)
    (source / _MARKER).touch()
    generated = time.perf_counter() - start

    converted = convert(source, output, workers=workers, overwrite=True, shard_size=16 << 20).result

    start = time.perf_counter()
    read = 0
    with open_dataset(output) as dataset:
        for record in dataset:
            simplejpeg.decode_jpeg(record["image"])
            read += 1
    read_seconds = time.perf_counter() - start

    try:
        from ._loader import Loader
    except ImportError as err:
        return DemoResult(
            source, output, generated, converted, read, read_seconds, None, None, f"shardfmt._loader is not available ({err})"
        )
    start = time.perf_counter()
    loaded = 0
    for batch in Loader(output, batch_size=batch_size):
        loaded += _batch_length(batch)
    return DemoResult(source, output, generated, converted, read, read_seconds, loaded, time.perf_counter() - start, None)


def _batch_length(batch: Any) -> int:
    """Return the number of images in a batch, whether it is a mapping, a sequence or a tensor."""
    if isinstance(batch, Mapping):
        batch = next(iter(batch.values()))
    elif isinstance(batch, (tuple, list)):
        batch = batch[0]
    return len(batch)
