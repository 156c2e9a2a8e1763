"""Train a small ResNet on a shardfmt dataset: one process, or several with torchrun.

A complete script to start from: a ResNet-style model written here with torch.nn, SGD with
momentum and a cosine learning-rate schedule, a shardfmt `Loader` with augmentation
(RandomResizedCrop + flip) for training and one with the "eval" pipeline for validation,
checkpoints that save and restore the loader's position mid-epoch, and a progress bar with
images/s. Under torchrun each process trains on its share of every batch (DistributedDataParallel;
gloo on CPU, NCCL on GPUs) and the loaders split the records between them.

    shardfmt demo --dir demo                                   # 500 JPEGs in 10 classes, converted
    python examples/train.py demo/dataset --epochs 3
    torchrun --standalone --nproc_per_node 2 examples/train.py demo/dataset --epochs 3
    python examples/train.py demo/dataset --checkpoint run.pt --save-every 20   # stop it at any time (Ctrl-C) ...
    python examples/train.py demo/dataset --checkpoint run.pt --resume          # ... and go on from there

A resumed run continues with exactly the batches the interrupted one would have seen next: the
loader's state (epoch, position and seed) is in the checkpoint, one per process.

The data options of torchvision's classification reference script are here too, run by the
loader (spec/sampling.md draws every one from the seed, so a resumed run sees the same batches):

    python examples/train.py demo/dataset --auto-augment ta_wide --random-erase 0.25 \
        --mixup-alpha 0.2 --cutmix-alpha 1.0 --ra-reps 3 --interpolation bicubic \
        --val-resize-size 146 --val-crop-size 128
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import shardfmt
import shardfmt.ops

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (a 1x1 convolution when the shape changes)."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.shortcut = nn.Identity()
        if stride != 1 or inputs != outputs:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet: a stem, three stages of `blocks` basic blocks (each stage halves the size
    and doubles the width), global average pooling and a linear classifier."""

    def __init__(self, num_classes: int, *, width: int = 32, blocks: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages: list[nn.Module] = []
        inputs = width
        for stage in range(3):
            outputs = width * 2**stage
            for block in range(blocks):
                stages.append(BasicBlock(inputs, outputs, 2 if block == 0 and stage > 0 else 1))
                inputs = outputs
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(inputs, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="the training dataset (a folder or a URL)")
    parser.add_argument("--val-data", default=None, help="the validation dataset [default: the training one]")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--lr", type=float, default=0.1, help="peak learning rate, for a batch of 256 over all processes")
    parser.add_argument("--size", type=int, default=128, help="side of the training crops and validation images")
    parser.add_argument("--workers", type=int, default=4, help="decoding processes per training process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in all (a short run)")
    parser.add_argument("--val-batches", type=int, default=None, help="validate on at most this many batches per process")
    parser.add_argument("--checkpoint", type=Path, default=None, help="where checkpoints are written (and read with --resume)")
    parser.add_argument("--save-every", type=int, default=None, help="steps between checkpoints (also saved at the end)")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="end this run at this step, as an interruption would (the schedule still spans the whole run)")
    parser.add_argument("--step-log", type=Path, default=None, help="write one JSON line per step (with several processes: one file each)")
    parser.add_argument("--auto-augment", choices=("ta_wide", "ra", "imagenet"), default=None,
                        help="TrivialAugmentWide, RandAugment(2, 9) or AutoAugment's ImageNet policy, after the crop")
    parser.add_argument("--random-erase", type=float, default=0.0, help="RandomErasing's probability (the box takes the mean colour)")
    parser.add_argument("--mixup-alpha", type=float, default=0.0, help="MixUp on each batch with Beta(alpha, alpha) (0: off)")
    parser.add_argument(
        "--cutmix-alpha", type=float, default=0.0, help="CutMix on each batch (0: off); with MixUp, one of the two each batch"
    )
    parser.add_argument("--ra-reps", type=int, default=1, help="repeated augmentation: each record this many times an epoch")
    parser.add_argument(
        "--interpolation", choices=("nearest", "bilinear", "bicubic"), default="bilinear", help="the crop's resize and auto-augment's warps"
    )
    parser.add_argument(
        "--val-resize-size", type=int, default=None, help="validation: shorter side resized to this [default: size / 0.875]"
    )
    parser.add_argument("--val-crop-size", type=int, default=None, help="validation: centred crop of this side [default: --size]")
    return parser.parse_args()


def sample_steps(args: argparse.Namespace) -> list[Any]:
    """The per-sample steps the training loader runs in its workers, after the crop and flip."""
    steps: list[Any] = []
    if args.auto_augment == "ta_wide":
        steps.append(shardfmt.ops.TrivialAugmentWide(interpolation=args.interpolation))
    elif args.auto_augment == "ra":
        steps.append(shardfmt.ops.RandAugment(num_ops=2, magnitude=9, interpolation=args.interpolation))
    elif args.auto_augment == "imagenet":
        steps.append(shardfmt.ops.AutoAugment("imagenet", interpolation=args.interpolation))
    if args.random_erase > 0:
        steps.append(shardfmt.ops.RandomErasing(p=args.random_erase, value="mean"))
    return steps


def batch_steps(args: argparse.Namespace, num_classes: int) -> list[Any]:
    """MixUp and CutMix on each batch (one of the two when both are asked for), as the reference script does."""
    mixes: list[Any] = []
    if args.mixup_alpha > 0:
        mixes.append(shardfmt.ops.MixUp(args.mixup_alpha, num_classes=num_classes))
    if args.cutmix_alpha > 0:
        mixes.append(shardfmt.ops.CutMix(args.cutmix_alpha, num_classes=num_classes))
    if len(mixes) > 1:
        return [shardfmt.ops.RandomChoice(mixes)]
    return mixes


def setup() -> tuple[int, int, torch.device]:
    """Join the process group when started by torchrun; return (rank, world size, device)."""
    if "WORLD_SIZE" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return dist.get_rank(), dist.get_world_size(), device


def normalise(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 NCHW (a channels_last view) -> float32 on `device`, normalised per channel; images
    the loader normalised already (float32) are only moved."""
    if images.dtype != torch.uint8:
        return images.to(device, non_blocking=True)
    x = images.to(device, non_blocking=True).float()
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    return (x - mean) / std


def save_checkpoint(path: Path, *, model: nn.Module, optimizer: Any, scheduler: Any, loader: shardfmt.Loader, step: int,
                    rank: int, world_size: int) -> None:
    """Write the model, optimiser, schedule and every process's loader state; rank 0 writes, atomically."""
    states: list[Any] = [loader.state_dict()]
    if world_size > 1:
        states = [None] * world_size
        dist.all_gather_object(states, loader.state_dict())
    if rank == 0:
        module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        checkpoint = {"model": module.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                      "loaders": states, "step": step, "world_size": world_size}
        temporary = path.with_name(path.name + ".tmp")
        torch.save(checkpoint, temporary)
        os.replace(temporary, path)
    if world_size > 1:
        dist.barrier()


@torch.no_grad()
def validate(model: nn.Module, loader: shardfmt.Loader, device: torch.device, *, max_batches: int | None, world_size: int) -> float:
    """Top-1 accuracy over the validation loader (every process's share, summed)."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for number, (images, labels) in enumerate(loader):
        if max_batches is not None and number >= max_batches:
            break
        predicted = model(normalise(images, device)).argmax(1).cpu()
        counts += torch.tensor([float((predicted == labels).sum()), float(len(labels))], dtype=torch.float64, device=device)
    if world_size > 1:
        dist.all_reduce(counts)
    model.train()
    return float(counts[0] / counts[1]) if counts[1] else 0.0


def build_model(num_classes: int, device: torch.device, world_size: int) -> nn.Module:
    """The ResNet in channels_last on `device`, wrapped for DistributedDataParallel on several processes."""
    model: nn.Module = ResNet(num_classes).to(device).to(memory_format=torch.channels_last)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def planned_steps(args: argparse.Namespace, batches_per_epoch: int) -> tuple[int, int]:
    """The steps the schedule spans (--epochs, at most --max-steps) and the step this run stops at (--stop-at)."""
    total_steps = args.epochs * batches_per_epoch
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    return total_steps, total_steps if args.stop_at is None else min(total_steps, args.stop_at)


def resume(checkpoint_path: Path | None, *, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
           loader: shardfmt.Loader, rank: int, world_size: int) -> int:
    """Load a checkpoint written by `save_checkpoint` into everything that trains; return its step."""
    if checkpoint_path is None or not checkpoint_path.exists():
        raise SystemExit(f"--resume: no checkpoint at {checkpoint_path}")
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    if checkpoint["world_size"] != world_size:
        raise SystemExit(f"the checkpoint was written by {checkpoint['world_size']} processes, not {world_size}")
    (model.module if world_size > 1 else model).load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    loader.load_state_dict(checkpoint["loaders"][rank])  # the same batches come next, mid-epoch too
    return int(checkpoint["step"])


def open_step_log(path: Path | None, *, rank: int, world_size: int) -> IO[str] | None:
    """The file each step is logged to (one per rank), or None without --step-log."""
    if path is None:
        return None
    name = path if world_size == 1 else path.with_name(f"{path.stem}-rank{rank}{path.suffix}")
    return open(name, "a")  # noqa: SIM115 (closed in main's finally)


def close_all(log: IO[str] | None, *loaders: shardfmt.Loader, world_size: int) -> None:
    """Close the step log and the loaders, and leave the process group."""
    if log is not None:
        log.close()
    for loader in loaders:
        loader.close()
    if world_size > 1:
        dist.destroy_process_group()


def log_step(log: IO[str] | None, *, step: int, epoch: int, loss: torch.Tensor, labels: torch.Tensor, images: torch.Tensor) -> None:
    """One line of --step-log: the step's loss, labels and a checksum of its pixels."""
    if log is None:
        return
    pixels = int(images.sum()) if images.dtype == torch.uint8 else round(float(images.double().sum()), 3)
    line = {"step": step, "epoch": epoch, "loss": loss.item(), "labels": labels.tolist(), "pixels": pixels}
    log.write(json.dumps(line) + "\n")


def main() -> None:
    args = parse_args()
    rank, world_size, device = setup()
    torch.manual_seed(args.seed)
    with shardfmt.open_dataset(args.data) as dataset:
        classes = dataset.classes
    if classes is None:
        raise SystemExit("the training dataset has no class names: this example needs them to size its classifier")

    steps, mixes = sample_steps(args), batch_steps(args, len(classes))
    # RandomErasing fills with the mean, so the loader normalises (in its workers) when it runs.
    normalised = {"mean": MEAN, "std": STD} if args.random_erase > 0 else {}
    transform = shardfmt.ImageTransform("train", size=args.size, interpolation=args.interpolation, augment=steps, **normalised)
    train_loader = shardfmt.Loader(
        args.data,
        batch_size=args.batch_size,
        seed=args.seed,
        num_workers=args.workers,
        drop_last=True,
        transform=transform,
        batch_augment=mixes or None,
        sampling=shardfmt.Sampling(repeats=args.ra_reps),
    )
    val_size = args.val_crop_size or args.size
    val_pipeline: Any = "eval"
    if args.val_resize_size is not None:
        val_pipeline = shardfmt.ops.CenterCrop(size=val_size, resize=args.val_resize_size)
    val_loader = shardfmt.Loader(
        args.val_data or args.data,
        batch_size=args.batch_size,
        shuffle=False,
        num_workers=args.workers,
        transform=shardfmt.ImageTransform(val_pipeline, size=val_size, interpolation=args.interpolation),
    )
    if len(train_loader) == 0:
        raise SystemExit(f"no full batch of {args.batch_size} per process in the training dataset: lower --batch-size")
    model = build_model(len(classes), device, world_size)
    lr = args.lr * args.batch_size * world_size / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    total_steps, stop = planned_steps(args, len(train_loader))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))

    step = 0
    if args.resume:
        step = resume(args.checkpoint, model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader, rank=rank,
                      world_size=world_size)
    log = open_step_log(args.step_log, rank=rank, world_size=world_size)
    bar = tqdm(total=total_steps * args.batch_size * world_size, initial=step * args.batch_size * world_size, unit="img",
               unit_scale=True, desc="train", disable=rank != 0, smoothing=0.3)
    started, seen = time.perf_counter(), 0
    model.train()
    try:
        while step < stop:
            epoch = train_loader.epoch
            for images, labels in train_loader:
                loss = F.cross_entropy(model(normalise(images, device)), labels.to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                seen += len(labels) * world_size
                bar.update(len(labels) * world_size)
                bar.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}", lr=f"{scheduler.get_last_lr()[0]:.4f}")
                log_step(log, step=step, epoch=epoch, loss=loss, labels=labels, images=images)
                if args.checkpoint is not None and args.save_every and step % args.save_every == 0:
                    save_checkpoint(args.checkpoint, model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader,
                                    step=step, rank=rank, world_size=world_size)
                if step >= stop:
                    break
        bar.close()
        if args.checkpoint is not None:
            save_checkpoint(args.checkpoint, model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader,
                            step=step, rank=rank, world_size=world_size)
        seconds = time.perf_counter() - started
        accuracy = validate(model, val_loader, device, max_batches=args.val_batches, world_size=world_size)
        weights = sum(float(p.detach().double().sum()) for p in model.parameters())
        if log is not None:
            log.write(json.dumps({"done": step, "val_accuracy": accuracy, "weights": weights}) + "\n")
        if rank == 0:
            rate = seen / seconds if seconds > 0 else math.inf
            print(f"{step} steps, {seen} images in {seconds:.1f} s ({rate:,.0f} images/s over {world_size} process"
                  f"{'es' if world_size > 1 else ''}); validation accuracy {accuracy:.3f}")
    finally:
        close_all(log, train_loader, val_loader, world_size=world_size)


if __name__ == "__main__":
    main()
