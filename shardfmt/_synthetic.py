"""Synthetic ImageFolder trees for the demo, the benchmarks and the tests.

The images are textured (sinusoids plus noise) so that they compress like photographs: at the
default 416x362 px and quality 95 with 4:2:0 subsampling a JPEG is about 85 KB and takes libjpeg-turbo
as long to decode as an ImageNet validation image of that size.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import simplejpeg

__all__ = ["make_image", "make_imagefolder"]


def make_image(height: int, width: int, *, seed: int) -> np.ndarray:
    """Return a deterministic textured RGB image, uint8 HxWx3."""
    rng = np.random.default_rng(seed)
    y = np.arange(height, dtype=np.float32)[:, None]
    x = np.arange(width, dtype=np.float32)[None, :]
    image = np.zeros((height, width, 3), np.float32)
    for channel in range(3):
        for _ in range(4):
            fx, fy = rng.uniform(0.005, 0.15, 2)
            amplitude, phase = rng.uniform(10, 40), rng.uniform(0, 6.3)
            # sin(a + b) = sin a cos b + cos a sin b, with a along x and b along y: outer products
            # instead of a sine per pixel.
            a, b = fx * x + phase, fy * y
            image[..., channel] += amplitude * (np.sin(a) * np.cos(b) + np.cos(a) * np.sin(b))
    image += rng.standard_normal((height, width, 1), dtype=np.float32) * 12
    image += rng.standard_normal((height, width, 3), dtype=np.float32) * 6
    low, high = float(image.min()), float(image.max())
    return ((image - low) * (255.0 / max(high - low, 1e-6))).astype(np.uint8)


def make_imagefolder(
    root: str | os.PathLike[str],
    *,
    num_classes: int = 10,
    per_class: int = 20,
    size: tuple[int, int] = (362, 416),
    jitter: float = 0.2,
    quality: int = 95,
    seed: int = 0,
    processes: int = 1,
) -> Path:
    """Write an ImageFolder tree of synthetic JPEGs: root/class_NNN/img_NNNNN.JPEG.

    Args:
        root: created if missing.
        num_classes, per_class: how many folders and images per folder.
        size: mean (height, width); each image varies by up to `jitter` of it.
        quality: JPEG quality, 4:2:0 subsampling.
        seed: the same seed writes the same bytes.
        processes: encode in this many processes (the bytes are the same for any number).

    Returns:
        The root path.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    jobs = []
    for label in range(num_classes):
        folder = root / f"class_{label:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h = max(8, int(size[0] * rng.uniform(1 - jitter, 1 + jitter)))
            w = max(8, int(size[1] * rng.uniform(1 - jitter, 1 + jitter)))
            jobs.append((str(folder / f"img_{label * per_class + i:05d}.JPEG"), h, w, int(rng.integers(1 << 62)), quality))
    if processes > 1 and len(jobs) > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(processes) as pool:
            pool.map(_write_image, jobs, chunksize=max(1, len(jobs) // (4 * processes)))
    else:
        for job in jobs:
            _write_image(job)
    return root


def _write_image(job: tuple[str, int, int, int, int]) -> None:
    path, height, width, seed, quality = job
    data = simplejpeg.encode_jpeg(make_image(height, width, seed=seed), quality=quality, colorsubsampling="420")
    Path(path).write_bytes(data)
