"""The augmented loader against the Albumentations DataLoader, both with the same steps:
RandomResizedCrop(224) + horizontal flip, ColorJitter(0.4, 0.4, 0.4, 0.1), RandomRotation(15)
(nearest, black corners) and RandomErasing(p=0.5, value=0), uint8 batches of 128.

shardfmt runs ``ImageTransform(augment=[ColorJitter(...), RandomRotation(15), RandomErasing(0.5,
value=0)], fast_decode=True)`` over the bench's converted shards; the other contender is a torch
DataLoader whose Dataset decodes with simplejpeg (fast IDCT, as the Loader's default) and runs
Albumentations' ``RandomResizedCrop``, ``HorizontalFlip``, ``ColorJitter``, ``Rotate`` and
``Erasing``, with OpenCV on one thread a worker. The two are measured in turn, ``--rounds``
times, each keeping its best round (`bench_loader.measure_loader`: one warm-up epoch, then the
timed epochs).

One such measure gives one ratio, and on a shared machine two measures a minute apart can give
ratios 10% apart. ``--repeats N`` takes N of them and prints their median with an interval that
holds the true median with at least 95% probability whatever the spread (`median_interval`:
order statistics, no assumption of a normal spread); the target is met when the whole interval
lies at or above it.

    PYTHONPATH=.:tools python tools/bench_augment.py --images 2000 --work-dir /tmp/bench-augment
    PYTHONPATH=.:tools python tools/bench_augment.py --images 2000 --work-dir /tmp/bench-augment --repeats 25
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

import simplejpeg
import torch
from bench_loader import (
    CONVERTED,
    OUTPUT_SIZE,
    RATIO,
    SCALE,
    Settings,
    Source,
    Stream,
    _one_opencv_thread,
    generate_imagefolder,
    load_source,
    measure_loader,
    median_interval,
    prepare_converted,
    shutdown_dataloader,
)
from torch.utils.data import DataLoader

import shardfmt
from shardfmt.ops import ColorJitter, RandomErasing, RandomRotation

JITTER = (0.4, 0.4, 0.4, 0.1)
DEGREES = 15.0
ERASE_P = 0.5
TARGET = 1.5
"""The ratio in images/s the augmented loader is to reach."""
SHARDFMT = "shardfmt + ColorJitter + RandomRotation + RandomErasing"
ALBUMENTATIONS = "simplejpeg + Albumentations DataLoader, same steps"


def open_shardfmt(source: Source, settings: Settings) -> Stream:
    loader = shardfmt.Loader(
        source.derived / CONVERTED,
        batch_size=settings.batch_size,
        num_workers=settings.workers,
        seed=0,
        transform=shardfmt.ImageTransform(
            size=OUTPUT_SIZE,
            crop="train",
            fast_decode=True,
            augment=[ColorJitter(*JITTER), RandomRotation(DEGREES), RandomErasing(p=ERASE_P, value=0)],
        ),
        output=shardfmt.Output(layout="NCHW"),
    )
    return Stream(epoch=lambda: iter(loader), close=loader.close, shared_memory_bytes=loader.shared_memory_bytes)


class AlbumentationsDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """simplejpeg decode, then Albumentations' equivalents of the steps above."""

    def __init__(self, samples: Sequence[tuple[str, int]]) -> None:
        import albumentations as A
        import cv2

        self.samples = list(samples)
        self.transform = A.Compose(
            [
                A.RandomResizedCrop(size=(OUTPUT_SIZE, OUTPUT_SIZE), scale=SCALE, ratio=RATIO, p=1.0),
                A.HorizontalFlip(p=0.5),
                A.ColorJitter(brightness=JITTER[0], contrast=JITTER[1], saturation=JITTER[2], hue=JITTER[3], p=1.0),
                A.Rotate(limit=DEGREES, interpolation=cv2.INTER_NEAREST, border_mode=cv2.BORDER_CONSTANT, fill=0, p=1.0),
                A.Erasing(scale=(0.02, 0.33), ratio=(0.3, 3.3), fill=0, p=ERASE_P),
            ]
        )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with open(path, "rb") as file:
            pixels = simplejpeg.decode_jpeg(file.read(), colorspace="RGB", fastdct=True, fastupsample=True)
        image = self.transform(image=pixels)["image"]
        return torch.from_numpy(image).permute(2, 0, 1), label


def open_albumentations(source: Source, settings: Settings) -> Stream:
    dataset = AlbumentationsDataset([(str(path), label) for path, label in zip(source.files, source.labels, strict=True)])
    loader = DataLoader(
        dataset,
        batch_size=settings.batch_size,
        shuffle=True,
        num_workers=settings.workers,
        persistent_workers=settings.workers > 0,
        worker_init_fn=_one_opencv_thread,
    )
    return Stream(epoch=lambda: iter(loader), close=lambda: shutdown_dataloader(loader))


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the augmented Loader and the Albumentations DataLoader in turn; print the best rates."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--images", type=int, default=2000, help="generated JPEGs (default 2000)")
    parser.add_argument("--src", type=Path, help="an existing ImageFolder instead of generated images")
    parser.add_argument("--work-dir", type=Path, help="keep the images and shards here between runs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per round (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each contender in turn; each keeps its best (default 2)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="the whole measure (its rounds) this many times, each giving a ratio; with more than one, their median "
        "and a 95%% interval for it (default 1)",
    )
    parser.add_argument("--target", type=float, default=TARGET, help=f"the ratio to reach (default {TARGET})")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.repeats < 1 or args.epochs < 1:
        parser.error("--rounds, --repeats and --epochs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="shardfmt-augment-") as scratch:
        work = args.work_dir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        root = args.src or generate_imagefolder(work, args.images)
        source = load_source(root, work, None if args.src else args.images)
        settings = Settings(batch_size=args.batch_size, workers=args.workers, epochs=args.epochs)
        prepare_converted(source, settings)
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
        ratios = []
        for repeat in range(args.repeats):
            if args.repeats > 1:
                print(f"repeat {repeat + 1} of {args.repeats}")
            ratios.append(measure_pair(source, settings, args.rounds))
    if args.repeats > 1:
        low, middle, high, coverage = median_interval(ratios)
        below = sum(ratio < args.target for ratio in ratios)
        print(f"ratios in images/s, in order: {', '.join(f'{ratio:.2f}' for ratio in ratios)}")
        print(
            f"median {middle:.3f}x; {coverage:.1%} interval for the median {low:.2f}x to {high:.2f}x; "
            f"{below} of {len(ratios)} below {args.target}x: target {'met' if low >= args.target else 'NOT met'}"
        )
    return 0


def measure_pair(source: Source, settings: Settings, rounds: int) -> float:
    """Both contenders in turn, `rounds` times, each keeping its best; print the rates and
    return shardfmt's best over Albumentations' best, in images/s."""
    before = os.getloadavg()[0]
    best: dict[str, float] = {}
    cpu: dict[str, float] = {}  # CPU ms an image, the loader's process and its workers
    for _ in range(rounds):
        for name, opener in ((SHARDFMT, open_shardfmt), (ALBUMENTATIONS, open_albumentations)):
            result = measure_loader(name, lambda o=opener: o(source, settings), source, settings)  # type: ignore[misc]
            best[name] = max(best.get(name, 0.0), result.images_per_second)
            if result.cpu_seconds is not None:
                cpu[name] = min(cpu.get(name, float("inf")), result.cpu_seconds / result.images * 1e3)
    after = os.getloadavg()[0]
    print(f"load average (1 min): {before:.2f} before, {after:.2f} after; {len(source.files)} images, best of {rounds} rounds")
    for name, rate in best.items():
        print(f"{name:<60} {rate:8.0f} images/s {cpu.get(name, float('nan')):6.2f} CPU ms/image")
    ratio = best[SHARDFMT] / best[ALBUMENTATIONS]
    print(f"{'ratio':<60} {ratio:8.2f}x", end="")
    if len(cpu) == 2:
        print(f" in images/s, {cpu[ALBUMENTATIONS] / cpu[SHARDFMT]:.2f}x per CPU second")
    else:
        print()
    return ratio


if __name__ == "__main__":
    import sys

    sys.exit(main())
