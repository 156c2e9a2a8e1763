"""The loader on a GPU machine: CPU workers, nvJPEG decoding and the hybrid split, in one run.

Every contender delivers the bench's batches (RandomResizedCrop(224) + flip, batch 256, uint8,
NCHW channels_last) on the CUDA device from the same converted copy of tools/bench_loader.py's
generated ImageNet-like JPEGs (``--work-dir`` is shared with it):

  cpu      ``Loader(device="cuda", num_workers=W)``: the workers decode, the batch is copied to
           the GPU from pinned shared memory on a side stream.
  gpu      ``Loader(device="cuda", num_workers=W, decode="gpu")``: the workers read, check and
           batch the bytes; the training process decodes them with nvJPEG and cuts and resizes
           the boxes on the GPU.
  hybrid   ``decode="hybrid"``: the workers decode the first rows of each batch and the GPU the
           rest, in proportion to their measured rates (the final GPU share is printed); once
           with W workers and once with W - 1, which leaves the training process, which
           decodes the GPU's rows, a core of its own.
  nvjpeg   context: torchvision's batched decode alone on batches of the same bytes held in
           RAM, no crop, no loader.

Each loader runs one untimed epoch from a fresh start, then timed epochs until they last
``--min-seconds``; the clock stops after ``torch.cuda.synchronize()``. Target: hybrid at 1.5x or
more the images/s of cpu.

Pixels: the first batches of ``decode="gpu"`` against the CPU path with the exact IDCT
(``fast_decode=False``), same seed: mean and largest absolute difference and PSNR.

Usage::

    PYTHONPATH=.:tools python tools/bench_gpu.py --work-dir /tmp/bench --workers 16 --json loader_gpu.json

Without CUDA or torchvision it says so and exits with status 0 and no JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from bench_loader import (
    OUTPUT_SIZE,
    Settings,
    generate_imagefolder,
    load_source,
    machine_info,
    prepare_converted,
    say,
    warm_page_cache,
)

import shardfmt

HYBRID_TARGET = 1.5


def gpu_missing() -> str | None:
    """Why this machine cannot run the GPU contenders, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import torchvision.io  # noqa: F401
    except ImportError as err:
        return f"torchvision cannot be imported ({err})"
    return None


def make_loader(
    path: Path, *, workers: int, batch_size: int, decode: str, fast_decode: bool = True, shuffle: bool = True
) -> shardfmt.Loader:
    return shardfmt.Loader(
        path,
        batch_size=batch_size,
        num_workers=workers,
        seed=0,
        device="cuda",
        shuffle=shuffle,
        transform=shardfmt.ImageTransform(size=OUTPUT_SIZE, crop="train", decode=decode, fast_decode=fast_decode),
        output=shardfmt.Output(layout="NCHW"),
    )


def measure(name: str, open_loader: Callable[[], shardfmt.Loader], *, num_records: int, min_seconds: float) -> dict[str, Any]:
    """One untimed epoch from a fresh start, then timed epochs until `min_seconds` have passed."""
    say(f"{name}: first epoch")
    start = time.perf_counter()
    loader = open_loader()
    try:
        delivered = sum(len(labels) for _, labels in loader)
        torch.cuda.synchronize()
        first_epoch = time.perf_counter() - start
        if delivered != num_records:
            raise SystemExit(f"{name}: the first epoch delivered {delivered} of {num_records} images")
        say(f"{name}: timed epochs")
        images, epochs = 0, 0
        start = time.perf_counter()
        while True:
            count = 0
            for batch, labels in loader:
                if batch.shape[1:] != (3, OUTPUT_SIZE, OUTPUT_SIZE) or batch.device.type != "cuda":
                    raise SystemExit(f"{name}: a batch of {tuple(batch.shape)} on {batch.device}")
                count += len(labels)
            if count != num_records:
                raise SystemExit(f"{name}: an epoch delivered {count} of {num_records} images")
            images, epochs = images + count, epochs + 1
            torch.cuda.synchronize()
            if time.perf_counter() - start >= min_seconds:
                break
        seconds = time.perf_counter() - start
        share = loader._gpu.split.gpu_share if loader._gpu is not None else None
    finally:
        loader.close()
    result = {
        "name": name,
        "images": images,
        "epochs": epochs,
        "seconds": seconds,
        "images_per_second": images / seconds,
        "first_epoch_images_per_second": num_records / first_epoch,
        "gpu_share": share,
    }
    say(f"{name}: {result['images_per_second']:.0f} images/s" + (f" (GPU share {share:.2f})" if share is not None else ""))
    return result


def measure_nvjpeg(files: Sequence[Path], *, batch_size: int, batches: int) -> dict[str, Any]:
    """torchvision's batched nvJPEG decode alone, bytes in RAM, `batches` batches after one warm-up."""
    from torchvision.io import ImageReadMode, decode_jpeg

    blobs = [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8) for path in files[: batch_size * (batches + 1)]]
    groups = [blobs[i : i + batch_size] for i in range(0, len(blobs), batch_size)]
    decode_jpeg(groups[0], mode=ImageReadMode.RGB, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    images = 0
    for group in groups[1:]:
        decode_jpeg(group, mode=ImageReadMode.RGB, device="cuda")
        images += len(group)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"name": "nvjpeg alone", "images": images, "seconds": seconds, "images_per_second": images / seconds}


def compare_pixels(path: Path, *, workers: int, batch_size: int, batches: int) -> dict[str, Any]:
    """decode="gpu" against the exact-IDCT CPU path, same seed, the first `batches` batches."""
    cpu = make_loader(path, workers=workers, batch_size=batch_size, decode="cpu", fast_decode=False)
    gpu = make_loader(path, workers=workers, batch_size=batch_size, decode="gpu")
    try:
        total = squared = 0.0
        largest, count, worst_psnr = 0, 0, math.inf
        for (a, labels_a), (b, labels_b), _ in zip(cpu, gpu, range(batches), strict=False):  # the first `batches` of two epochs
            if not torch.equal(labels_a, labels_b):
                raise SystemExit("decode='gpu' delivered other labels than the CPU path")
            difference = (a.float() - b.float()).abs()
            total += float(difference.sum())
            squared += float((difference**2).sum())
            count += difference.numel()
            largest = max(largest, int(difference.max()))
            per_image = (difference**2).flatten(1).mean(1)
            worst_psnr = min(worst_psnr, float(10 * torch.log10(255.0**2 / per_image.clamp(min=1e-12)).min()))
    finally:
        cpu.close()
        gpu.close()
    mse = squared / count
    return {
        "batches": batches,
        "mean_abs_difference": total / count,
        "max_abs_difference": largest,
        "psnr_db": 10 * math.log10(255.0**2 / mse) if mse else math.inf,
        "worst_image_psnr_db": worst_psnr,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--work-dir", type=Path, required=True, help="where tools/bench_loader.py keeps its generated data")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--min-seconds", type=float, default=4.0, help="timed epochs last at least this long (default 4)")
    parser.add_argument("--pixel-batches", type=int, default=4, help="batches compared with the CPU path (default 4)")
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = gpu_missing()
    if missing is not None:
        print(f"bench_gpu: skipped: {missing}")
        return 0
    torch.empty(1, device="cuda")  # the CUDA context first, so that no contender's first epoch pays for it
    args.work_dir.mkdir(parents=True, exist_ok=True)
    source = load_source(generate_imagefolder(args.work_dir, args.images), args.work_dir, args.images)
    settings = Settings(batch_size=args.batch_size, workers=args.workers, epochs=1)
    converted = prepare_converted(source, settings)
    warm_page_cache(source)
    num_records = len(source.files)
    common = {"workers": args.workers, "batch_size": args.batch_size}
    results = [
        measure(
            f"cpu, {args.workers} workers",
            lambda: make_loader(converted, decode="cpu", **common),
            num_records=num_records,
            min_seconds=args.min_seconds,
        ),
        measure(
            f"gpu, {args.workers} workers",
            lambda: make_loader(converted, decode="gpu", **common),
            num_records=num_records,
            min_seconds=args.min_seconds,
        ),
        measure(
            f"hybrid, {args.workers} workers",
            lambda: make_loader(converted, decode="hybrid", **common),
            num_records=num_records,
            min_seconds=args.min_seconds,
        ),
    ]
    if args.workers > 1:  # the training process decodes too: one worker fewer leaves it a core
        fewer = common | {"workers": args.workers - 1}
        results.append(
            measure(
                f"hybrid, {args.workers - 1} workers",
                lambda: make_loader(converted, decode="hybrid", **fewer),
                num_records=num_records,
                min_seconds=args.min_seconds,
            )
        )
    say("nvJPEG alone")
    nvjpeg = measure_nvjpeg(source.files, batch_size=args.batch_size, batches=max(1, min(10, num_records // args.batch_size - 1)))
    say("pixels against the CPU path")
    pixels = compare_pixels(converted, workers=args.workers, batch_size=args.batch_size, batches=args.pixel_batches)
    device = torch.cuda.get_device_name()
    ratio = results[2]["images_per_second"] / results[0]["images_per_second"]
    print(f"device: {device}; {args.workers} workers, batch {args.batch_size}, {num_records} images")
    print(f"{'loader':<22} {'images/s':>10} {'1st epoch':>10}  GPU share")
    for row in results:
        share = "-" if row["gpu_share"] is None else f"{row['gpu_share']:.2f}"
        print(f"{row['name']:<22} {row['images_per_second']:>10.0f} {row['first_epoch_images_per_second']:>10.0f}  {share}")
    print(f"{'nvjpeg alone':<22} {nvjpeg['images_per_second']:>10.0f}")
    print(f"hybrid / cpu: {ratio:.2f}x (target >= {HYBRID_TARGET}x: {'met' if ratio >= HYBRID_TARGET else 'NOT met'})")
    print(
        f"pixels, decode='gpu' vs the exact-IDCT CPU path over {pixels['batches']} batches: mean |diff| "
        f"{pixels['mean_abs_difference']:.2f}, "
        f"max {pixels['max_abs_difference']}, PSNR {pixels['psnr_db']:.1f} dB (worst image {pixels['worst_image_psnr_db']:.1f} dB)"
    )
    if args.json is not None:
        document = {
            "device": device,
            "machine": machine_info(),
            "settings": common | {"images": num_records, "min_seconds": args.min_seconds},
            "load_average": os.getloadavg(),
            "results": results,
            "nvjpeg": nvjpeg,
            "hybrid_over_cpu": ratio,
            "target": HYBRID_TARGET,
            "pixels": pixels,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
