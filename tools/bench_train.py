"""Train torchvision's ResNet-50 fed by shardfmt and by a PIL DataLoader: images/s and GPU waits.

The step: ResNet-50 (torchvision, 1000 classes, random weights), channels_last, bf16 autocast,
SGD with momentum, batch 256, RandomResizedCrop(224) + flip on the bench's generated
ImageNet-like JPEGs (tools/bench_loader.py's, shared through ``--work-dir``), normalised with
the ImageNet mean and std. Feeders, each for ``--warmup-steps`` untimed then ``--steps`` timed
steps from a fresh start:

  shardfmt cpu      ``Loader(device="cuda", mean=..., std=...)``: W workers decode; the batch is
                    copied and normalised on a side stream.
  shardfmt hybrid   the same with ``decode="hybrid"``: part of each batch decoded by nvJPEG.
  PIL DataLoader    ``DataLoader(num_workers=W, pin_memory=True, persistent_workers=True)`` over
                    an ImageFolder-style dataset doing the same crop and flip in PIL
                    (tools/bench_loader.py's ``FolderDataset``); the uint8 batch is copied with
                    ``non_blocking=True`` and normalised on the training stream.

images/s: timed images over the wall time from the first timed batch request to the end of the
last step (``torch.cuda.synchronize()``). GPU wait fraction: CUDA events on the training stream
around each step's work (the record before the forward pass comes after the batch is ready on
that stream); the gaps between one step's end and the next one's start, over the time from the
first timed step's start to the last one's end, are the time the GPU had nothing to do because
the next batch was not there.

The side stream: ``overlap`` times the shardfmt cpu feeder again with its copy on the training
stream (``DeviceStage(side_stream=False)``), so that the copy and the step run one after the
other; the difference per step is the copy time that the side stream hides.

Usage::

    PYTHONPATH=.:tools python tools/bench_train.py --work-dir /tmp/bench --workers 16 --json train.json

Without CUDA or torchvision it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from bench_loader import (
    OUTPUT_SIZE,
    FolderDataset,
    Settings,
    generate_imagefolder,
    load_source,
    prepare_converted,
    say,
    shutdown_dataloader,
    warm_page_cache,
)

import shardfmt

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def gpu_missing() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import torchvision.models  # noqa: F401
    except ImportError as err:
        return f"torchvision cannot be imported ({err})"
    return None


class Trainer:
    """ResNet-50, channels_last, bf16 autocast, SGD; `step` enqueues one step and its events."""

    def __init__(self) -> None:
        import torchvision

        torch.backends.cudnn.benchmark = True
        self.model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
        self.loss = torch.nn.CrossEntropyLoss()

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.loss(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        ended.record()
        return began, ended


Feed = Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]


def shardfmt_feed(path: Path, *, workers: int, batch_size: int, decode: str, side_stream: bool = True) -> tuple[Feed, Callable[[], None]]:
    loader = shardfmt.Loader(
        path,
        batch_size=batch_size,
        num_workers=workers,
        seed=0,
        device="cuda",
        transform=shardfmt.ImageTransform(size=OUTPUT_SIZE, crop="train", mean=MEAN, std=STD, decode=decode),
        output=shardfmt.Output(layout="NCHW"),
    )
    if not side_stream:
        from shardfmt._loader.cuda import DeviceStage

        stage = DeviceStage(torch.device("cuda"), mean=MEAN, std=STD, layout="NCHW", side_stream=False)
        scheduler = getattr(loader, "scheduler", None)  # where the loader keeps its device stage
        if scheduler is not None:
            scheduler.stage = stage
        else:
            loader._stage = stage

    def epochs() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield from loader

    return epochs, loader.close


def pil_feed(files: Sequence[Path], labels: Sequence[int], *, workers: int, batch_size: int) -> tuple[Feed, Callable[[], None]]:
    dataset = FolderDataset([(str(path), label) for path, label in zip(files, labels, strict=True)])
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=True, persistent_workers=workers > 0, drop_last=True
    )
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)

    def epochs() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            for images, targets in loader:
                images = images.cuda(non_blocking=True).contiguous(memory_format=torch.channels_last)
                yield (images.float() - mean) / std, targets.cuda(non_blocking=True)

    return epochs, lambda: shutdown_dataloader(loader)


def run_feeder(
    name: str, trainer: Trainer, opened: tuple[Feed, Callable[[], None]], *, warmup: int, steps: int, batch_size: int
) -> dict[str, Any]:
    feed, close = opened
    say(f"{name}: {warmup} untimed and {steps} timed steps")
    try:
        batches = feed()
        for _ in range(warmup):
            images, labels = next(batches)
            trainer.step(images, labels)
        torch.cuda.synchronize()
        events = []
        start = time.perf_counter()
        for _ in range(steps):
            images, labels = next(batches)
            if len(labels) != batch_size:
                images, labels = next(batches)  # an epoch's short last batch: not a full step
            events.append(trainer.step(images, labels))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        close()
    busy = sum(began.elapsed_time(ended) for began, ended in events) / 1000
    span = events[0][0].elapsed_time(events[-1][1]) / 1000
    result = {
        "name": name,
        "steps": steps,
        "images": steps * batch_size,
        "seconds": seconds,
        "images_per_second": steps * batch_size / seconds,
        "gpu_busy_seconds": busy,
        "gpu_span_seconds": span,
        "gpu_wait_fraction": max(0.0, 1 - busy / span),
        "step_ms": 1000 * seconds / steps,
    }
    say(f"{name}: {result['images_per_second']:.0f} images/s, GPU waited {100 * result['gpu_wait_fraction']:.1f}% of the time")
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per feeder (default 50)")
    parser.add_argument("--warmup-steps", type=int, default=8, help="untimed steps per feeder first (default 8)")
    parser.add_argument("--feeders", default="cpu,hybrid,pil,overlap", help="comma list out of cpu,hybrid,pil,overlap")
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = gpu_missing()
    if missing is not None:
        print(f"bench_train: skipped: {missing}")
        return 0
    args.work_dir.mkdir(parents=True, exist_ok=True)
    source = load_source(generate_imagefolder(args.work_dir, args.images), args.work_dir, args.images)
    converted = prepare_converted(source, Settings(batch_size=args.batch_size, workers=args.workers, epochs=1))
    warm_page_cache(source)
    feeders = [name.strip() for name in args.feeders.split(",") if name.strip()]
    trainer = Trainer()
    say("warming up the model (cudnn autotuning)")
    images = torch.randn(args.batch_size, 3, OUTPUT_SIZE, OUTPUT_SIZE, device="cuda").contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (args.batch_size,), device="cuda")
    for _ in range(5):
        trainer.step(images, labels)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        trainer.step(images, labels)
    torch.cuda.synchronize()
    synthetic = 10 * args.batch_size / (time.perf_counter() - start)
    say(f"synthetic data on the GPU: {synthetic:.0f} images/s")
    common = {"warmup": args.warmup_steps, "steps": args.steps, "batch_size": args.batch_size}
    shard = {"workers": args.workers, "batch_size": args.batch_size}
    results = []
    if "cpu" in feeders:
        results.append(run_feeder("shardfmt cpu workers", trainer, shardfmt_feed(converted, decode="cpu", **shard), **common))
    if "hybrid" in feeders:
        results.append(run_feeder("shardfmt hybrid", trainer, shardfmt_feed(converted, decode="hybrid", **shard), **common))
    if "pil" in feeders:
        results.append(run_feeder("PIL DataLoader", trainer, pil_feed(source.files, source.labels, **shard), **common))
    overlap = None
    if "overlap" in feeders:
        with_side = run_feeder("shardfmt cpu, copy on a side stream", trainer, shardfmt_feed(converted, decode="cpu", **shard), **common)
        without = run_feeder(
            "shardfmt cpu, copy on the training stream",
            trainer,
            shardfmt_feed(converted, decode="cpu", side_stream=False, **shard),
            **common,
        )
        overlap = {"side_stream": with_side, "training_stream": without, "step_ms_saved": without["step_ms"] - with_side["step_ms"]}
    device = torch.cuda.get_device_name()
    print(f"device: {device}; ResNet-50, bf16 autocast, channels_last, batch {args.batch_size}, {args.workers} workers")
    print(f"synthetic data already on the GPU: {synthetic:.0f} images/s")
    print(f"{'feeder':<44} {'images/s':>9} {'step ms':>8} {'GPU waits':>9}")
    for row in results + ([overlap["side_stream"], overlap["training_stream"]] if overlap else []):
        print(f"{row['name']:<44} {row['images_per_second']:>9.0f} {row['step_ms']:>8.1f} {100 * row['gpu_wait_fraction']:>8.1f}%")
    if overlap:
        print(f"the side stream saves {overlap['step_ms_saved']:.2f} ms a step")
    if args.json is not None:
        document = {
            "device": device,
            "settings": {
                "workers": args.workers,
                "batch_size": args.batch_size,
                "steps": args.steps,
                "warmup_steps": args.warmup_steps,
                "images": len(source.files),
            },
            "synthetic_images_per_second": synthetic,
            "results": results,
            "overlap": overlap,
            "load_average": os.getloadavg(),
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
