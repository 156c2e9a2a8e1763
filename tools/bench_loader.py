"""Benchmark `shardfmt.Loader` against the usual PyTorch input paths, on the same images, in one run.

Contenders. Every loader runs ``--warmup-epochs`` untimed epochs from a fresh start, then
``--epochs`` timed ones, each of ``--images`` images, as uint8 batches of
shape (B, 3, 224, 224) with int64 labels, augmented by RandomResizedCrop(224) (torchvision's
default scale (0.08, 1) and ratio (3/4, 4/3)) and a horizontal flip with probability 0.5; the
bench checks the shape of every batch and that each epoch delivers every label exactly as often
as the dataset holds it.

  shardfmt        ``shardfmt.Loader(transform="train")`` (NCHW) over the images converted by
                  `shardfmt._convert` (from a listing of them), which keeps every one of these
                  baseline JPEGs byte for byte (checked: every record is a pass-through), so that
                  every contender decodes byte-identical files; its manifest says the converter
                  strictly decoded every JPEG (``strict_jpeg``), so the loader decodes only the
                  crop box from a record's first read on. Once with ``fast_decode=True`` (the
                  default) and once with ``fast_decode=False``. Target: the first epoch, start-up
                  included, at 0.9x the images/s of the later epochs.
  tar             the same Loader (``fast_decode=True``) over the same JPEG bytes written as
                  WebDataset tar shards, each with its member index (``DatasetWriter(...,
                  shard_format="tar")``, which checks no JPEG: its first epoch decodes whole
                  images), read from the memory-mapped tars. Target: 0.9x the images/s of
                  ``shardfmt fast_decode=True``.
  PIL DataLoader  ``torch.utils.data.DataLoader(shuffle=True, persistent_workers=True)`` (workers
                  start once, as shardfmt's do) with the default collate, over an ImageFolder-style Dataset of (path, label): PIL
                  ``Image.open(...).convert("RGB")``, torchvision's RandomResizedCrop.get_params
                  (reimplemented: torchvision has no CPU wheel here), ``Image.crop`` then
                  ``Image.resize((224, 224), BILINEAR)`` as torchvision's ``resized_crop`` does on
                  a PIL image, ``transpose`` for the flip, numpy to a CHW tensor.
  augment         ``--only augment``: RandomResizedCrop(224) + flip, then ColorJitter(0.4, 0.4, 0.4,
                  0.1) and RandomRotation(15): ``ImageTransform(augment=[...])`` (the steps run
                  in its workers) against the PIL DataLoader above with the same steps as
                  torchvision runs them on PIL images (`bench_steps`). Target: shardfmt at 2.5x.
                  It also prints the cost of each step per image (`bench_steps.measure_steps`).
  recipe          ``--only recipe``: today's training recipe in the workers, RandomResizedCrop(224) +
                  flip, then TrivialAugmentWide and RandomErasing(p=0.25, value="mean") with the
                  ImageNet normalisation (float32 batches): ``ImageTransform(augment=[...],
                  mean=, std=)`` against a DataLoader whose Dataset decodes with simplejpeg (fast
                  IDCT, as the Loader's default) and augments with Albumentations (OpenCV):
                  ``RandomResizedCrop`` (OpenCV's bilinear, not antialiased), ``HorizontalFlip``,
                  a ``OneOf`` over its transforms of TrivialAugmentWide's operations and ranges
                  (`bench_steps.albumentations_equivalents`; it has no TrivialAugmentWide),
                  ``Normalize``, ``Erasing(p=0.25)``, with OpenCV on one thread a worker.
                  torchvision's v2 transforms are not installable here (no CPU wheel), so that
                  contender of the recipe is not run. Target: shardfmt at 1.5x the
                  Albumentations DataLoader. Needs the bench extra (albumentations).
  webdataset      the webdataset library over the same JPEG bytes in its own tar shards (written
                  in a shuffled order with ``ShardWriter``, ``jpg`` + ``cls``, at least two shards
                  per worker and split across workers by webdataset), ``.shuffle(1000)``,
                  simplejpeg decode (exact IDCT), the same get_params, the crop resized with
                  torch's antialiased bilinear kernel (torchvision's tensor resize; PIL-free),
                  ``.batched()`` inside the workers of a ``DataLoader(batch_size=None)``.
  raw             ``shardfmt.Loader(transform="train")`` (NCHW) over the same images stored
                  as raw RGB pixels (a "raw" field: each JPEG decoded once, exact IDCT, by
                  simplejpeg, and written with `DatasetWriter`; about 450 KB a record for the
                  generated images, 5x the JPEG), so that loading is a crop and resize from the
                  memory-mapped shard, with no decode: the same 224 crop, the same checksum
                  checks (each record once per loader: `Loader(verify=True)`). Its ratio to ``shardfmt
                  fast_decode=True`` is printed (no target: see ``patches``); the images per CPU
                  second ratio is the steadier figure.
  patches         ``--only patches``: the same images converted once more by ``shardfmt convert
                  --patch 256`` (shorter side resized to 256, the centred 256x256 square kept),
                  once as JPEG (``--quality 95``) and once with ``--store raw``, both loaded by
                  ``shardfmt.Loader(transform=RandomCrop(224))``: a 224x224 box placed at random
                  and a random flip, no resize. This is what ``--store raw`` with fixed-size
                  patches is for: the raw copy's loading is a copy out of the memory map, bound
                  by memory bandwidth, while the JPEG copy still decodes every box. Target: raw
                  patches at 5x or more the images/s of the JPEG patches (same crop size, same
                  pipeline). The ``raw`` contender above keeps the RandomResizedCrop of the
                  main table, where both paths resize every crop (about 0.1 to 0.2 ms for 224 px,
                  torch's kernel) and the ratio is bounded by that shared cost.
  shardfmt over S3  ``--only s3``: the same records and Loader settings (fast_decode=True), read by
                  URL from moto's S3-compatible server on 127.0.0.1 (a thread of this process, so
                  its CPU counts as the loader's own) through s3fs. The shards are written again
                  with ``--s3-shard-size`` (default 16 MiB): moto copies the whole object for every
                  ranged GET (about 18 ms for a 1 MiB object, 60 ms for 64 MiB, 140 ms for
                  180 MiB here), which real object stores do not, so big shards would time moto
                  rather than the loader. Once with range reads
                  (``RemoteOptions(mode="range")``), once with the shard cache
                  (``mode="cache"``, a fresh cache folder for every start, so the first epoch
                  downloads every shard and the second reads the cache). Loopback only: this is
                  the CPU and protocol cost of object storage, not a network's latency.
  decode limit    ``simplejpeg.decode_jpeg`` of the JPEG bytes already in RAM, in this process on
                  one thread with nothing else running, times ``os.cpu_count()``; with the exact
                  IDCT (the limit the targets use) and with the fast IDCT and upsampling. The
                  one-core figures are printed too. This is a full-size decode: where a crop
                  box is at least twice the output on both sides, shardfmt decodes at a reduced
                  DCT scale and can pass it (never for the generated images, at most 434 rows).

Rounds: the whole list of contenders is measured ``--rounds`` times (default 2), one after the
other, and each contender's fastest round is reported, its other rates in the note column. Other
load on a shared machine only ever slows a run down, so, as with timeit's minimum, the best
round is the least disturbed one; every contender, baselines included, gets the same treatment.
The first epoch and the first batch are each taken from their own best round in the same way.

Columns, for each loader:

  images/s     images delivered in the timed epochs / seconds from the end of the warm-up
               epochs to the last batch: the rate a training run sees from its second epoch on.
               Timed epochs are added past ``--epochs`` until they last ``--min-seconds``
               (default 5), so that a fast contender is not timed over a second or two.
               The start and the first epoch are not hidden, they have their own columns (first
               batch; 1st epoch img/s). ``--warmup-epochs 0`` times from constructing the loader
               instead: worker start-up (about 0.2 s) then weighs about 4% of shardfmt's 2
               epochs of 5,000 images and 15% of the raw contender's, as it would not over a
               real dataset's epochs.
  CPU s        user + system CPU time over the timed epochs of this process
               (``getrusage(RUSAGE_SELF)``, less the CPU of the memory sampler thread) plus that
               of its live descendant processes (psutil), read at the start and the end of the
               timed epochs; the JSON also gives the workers' part. Work a loader does ahead of
               the consumer counts too (shardfmt's workers run on into the next epoch).
               CPU ms/img divides it by the images delivered.
  PSS, anon,   the largest sum, over the samples a thread takes every second from
  RSS          /proc/<pid>/smaps_rollup, of this process and every process started during the
               run: of Pss, of Pss_Anon + Pss_Shmem, and of Rss (each peak taken on its own). PSS
               divides each shared page among the processes that map it, so the shared-memory
               batch ring and the pages workers share with the parent after fork count once; RSS
               counts them in each process and is an upper bound. "anon" leaves out file-backed
               pages: the page cache of memory-mapped shards (shardfmt maps its shards, so the
               pages a worker has read count in its PSS until it unmaps them) and of libraries.
               All include this process's own baseline (torch imported: a few hundred MiB;
               printed under the table, per loader in the JSON). Spikes shorter than 50 ms can
               be missed.
  first batch  seconds from constructing a fresh loader to receiving its first batch, in a
               separate start before the timed run.
  1st epoch    images of the warm-up epochs / seconds from constructing the loader to their
               last batch: start-up, first page faults of memory-mapped shards and first checks
               of each record's checksum included.

Ratios are printed of images/s (with the targets: shardfmt at least 2.4x the PIL DataLoader and
0.8x the exact-IDCT decode limit, tar shards at least 0.9x, and raw patches at least 5x the JPEG
patches), of images per CPU second (the images/s ratio the contenders would reach with every
core busy and to themselves, the steadier figure on a shared machine), and the targets once more
on the first-epoch rates, start-up included.

All files are read from the page cache (the images and their copies are read once before the
first round: shardfmt writes its shards past the cache, with O_DIRECT), so this measures the CPU
cost of loading, not the disk. Timings are only as quiet as the machine: the load average is
printed before and after.

Data preparation is cached under ``--work-dir``: the generated ImageFolder (from
`shardfmt._synthetic.make_imagefolder`: ImageNet-like, about 416x362 and 90 KB per JPEG) and, per set
of selected images, the shardfmt, shardfmt tar, raw-pixel (about 2.2 GB for the default 5000
images) and webdataset copies; delete the directory to rebuild.

Scaling (``--scaling 1,2,4,8,16``): instead of the contenders, ``shardfmt fast_decode=True`` at
each worker count, against the decode limit (one core's exact-IDCT rate, measured first) times
the workers; target 0.85x at the largest count. Run on a machine with that many cores
(docs/gpu.md has a 16-core run).

Usage::

    PYTHONPATH=. python tools/bench_loader.py --work-dir /tmp/bench --json out.json --chart out.png
    PYTHONPATH=. python tools/bench_loader.py --work-dir /tmp/bench --scaling 1,2,4,8,16 --rounds 1 --json scaling.json
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import math
import multiprocessing
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import psutil
import simplejpeg
import torch
import webdataset as wds
from bench_steps import StepCost, albumentations_equivalents, measure_steps, pil_augment, print_steps, shardfmt_steps
from PIL import Image
from torch.utils.data import DataLoader, default_collate

import shardfmt
from shardfmt import DatasetWriter, convert
from shardfmt._synthetic import make_imagefolder
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import RandomCrop, RandomErasing, TrivialAugmentWide

OUTPUT_SIZE = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
CONTENDERS = ("shardfmt", "tar", "raw", "patches", "pil", "augment", "recipe", "webdataset", "decode", "s3")
SAMPLE_INTERVAL = 1.0  # reading smaps_rollup of 3 processes costs ~45 ms of CPU: every 50 ms it took a core
WDS_SHUFFLE_BUFFER = 1000
GENERATED_SIZE = (362, 416)
GENERATED_QUALITY = 95
JPEG_SUFFIXES = (".jpg", ".jpeg")

SHARDFMT_FAST = "shardfmt fast_decode=True"
SHARDFMT_EXACT = "shardfmt fast_decode=False"
SHARDFMT_TAR = "shardfmt on tar shards"
SHARDFMT_RAW = "shardfmt raw pixels"
JPEG_PATCHES = "shardfmt JPEG patches"
RAW_PATCHES = "shardfmt raw patches"
PATCH_SIZE = 256
PATCH_QUALITY = 95
S3_RANGE = "shardfmt over S3, range reads"
S3_CACHE = "shardfmt over S3, shard cache"
PIL_LOADER = "PIL DataLoader"
AUGMENT_SHARDFMT = "shardfmt + ColorJitter + RandomRotation"
AUGMENT_PIL = "PIL DataLoader + ColorJitter + RandomRotation"
RECIPE_SHARDFMT = "shardfmt + TrivialAugmentWide + RandomErasing"
RECIPE_ALBUMENTATIONS = "Albumentations DataLoader + TrivialAugmentWide + RandomErasing"
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)
ERASE_P = 0.25
WEBDATASET = "webdataset"
LIMIT_EXACT = "decode limit, exact IDCT"
LIMIT_FAST = "decode limit, fast IDCT"
ONE_CORE_EXACT = "  decode on 1 core, exact IDCT"
ONE_CORE_FAST = "  decode on 1 core, fast IDCT"
PARALLEL_EXACT = "  decode on all cores at once, exact IDCT"

Batch = tuple[torch.Tensor, torch.Tensor]


class BenchError(RuntimeError):
    """A contender delivered something other than what every contender must deliver."""


@dataclass(frozen=True)
class Source:
    """The images every contender reads, and the directory their derived copies live in."""

    files: tuple[Path, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]
    root: Path
    derived: Path


@dataclass(frozen=True)
class Settings:
    batch_size: int
    workers: int
    epochs: int
    warmup_epochs: int = 1
    min_seconds: float = 0.0
    window: int | None = None
    """The shardfmt contenders' ``window=`` (None: a full shuffle)."""


@dataclass(frozen=True)
class Result:
    """One row of the table. `parallel` scales a one-core measurement to the machine."""

    name: str
    images: int
    seconds: float
    parallel: int = 1
    cpu_seconds: float | None = None
    worker_cpu_seconds: float | None = None
    peak_pss_bytes: int | None = None
    peak_anon_pss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    baseline_pss_bytes: int | None = None
    first_batch_seconds: float | None = None
    shared_memory_bytes: int | None = None
    warmup_images: int | None = None
    warmup_seconds: float | None = None
    note: str = ""

    @property
    def images_per_second(self) -> float:
        return self.images * self.parallel / self.seconds

    @property
    def warmup_images_per_second(self) -> float | None:
        """Images/s of the untimed first epochs, counted from constructing the loader."""
        if not self.warmup_images or not self.warmup_seconds:
            return None
        return self.warmup_images / self.warmup_seconds


@dataclass(frozen=True)
class Stream:
    """An opened loader: `epoch()` iterates one epoch of (images, labels); `close()` stops it."""

    epoch: Callable[[], Iterator[Batch]]
    close: Callable[[], None]
    shared_memory_bytes: int | None = None


def read_memory(process: psutil.Process) -> tuple[int, int, int]:
    """(PSS, PSS of anonymous and shared memory, RSS) of a process, in bytes."""
    try:
        text = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
    except OSError:
        info = process.memory_full_info()
        pss = getattr(info, "pss", info.rss)
        return pss, pss, info.rss
    values = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        values[key] = int(rest.split()[0]) * 1024
    return values["Pss"], values.get("Pss_Anon", 0) + values.get("Pss_Shmem", 0), values["Rss"]


@dataclass
class TreeSampler:
    """Samples the summed memory of this process and its new descendants in a thread."""

    exclude: set[int]
    peak_pss: int = 0
    peak_anon_pss: int = 0
    peak_rss: int = 0
    cpu_seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        start = time.thread_time()
        me = psutil.Process()
        while True:
            self._sample(me)
            self.cpu_seconds = time.thread_time() - start
            if self._stop.wait(SAMPLE_INTERVAL):
                break
        self._sample(me)
        self.cpu_seconds = time.thread_time() - start

    def _sample(self, me: psutil.Process) -> None:
        processes = [me] + [p for p in me.children(recursive=True) if p.pid not in self.exclude]
        total = [0, 0, 0]
        for process in processes:
            try:
                for i, value in enumerate(read_memory(process)):
                    total[i] += value
            except (KeyError, ValueError, psutil.Error):
                continue  # the process exited between listing and reading
        self.peak_pss = max(self.peak_pss, total[0])
        self.peak_anon_pss = max(self.peak_anon_pss, total[1])
        self.peak_rss = max(self.peak_rss, total[2])


def say(message: str) -> None:
    """Progress goes to stderr; the report goes to stdout."""
    print(message, file=sys.stderr, flush=True)


# -- the crop every contender uses ------------------------------------------------------------


def crop_params(height: int, width: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params with its default scale and ratio, drawing from
    torch's generator in the same order: returns (top, left, height, width)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(RATIO))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(SCALE[0], SCALE[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(float(log_ratio[0]), float(log_ratio[1]))).item()
        box_width = int(round(math.sqrt(target_area * aspect_ratio)))
        box_height = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < box_width <= width and 0 < box_height <= height:
            top = int(torch.randint(0, height - box_height + 1, size=(1,)).item())
            left = int(torch.randint(0, width - box_width + 1, size=(1,)).item())
            return top, left, box_height, box_width
    in_ratio = width / height
    if in_ratio < min(RATIO):
        box_width, box_height = width, int(round(width / min(RATIO)))
    elif in_ratio > max(RATIO):
        box_height, box_width = height, int(round(height * max(RATIO)))
    else:
        box_height, box_width = height, width
    return (height - box_height) // 2, (width - box_width) // 2, box_height, box_width


class FolderDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """ImageFolder with a torchvision-equivalent RandomResizedCrop(224) + RandomHorizontalFlip in
    PIL; with `augment`, then ColorJitter and RandomRotation as torchvision runs them on PIL
    images (`bench_steps.pil_augment`)."""

    def __init__(self, samples: Sequence[tuple[str, int]], *, augment: bool = False) -> None:
        self.samples = list(samples)
        self.augment = augment

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with open(path, "rb") as file:
            image = Image.open(file).convert("RGB")
        top, left, height, width = crop_params(image.height, image.width)
        # torchvision's F.resized_crop on a PIL image: crop, then resize (antialiased bilinear).
        image = image.crop((left, top, left + width, top + height))
        image = image.resize((OUTPUT_SIZE, OUTPUT_SIZE), Image.Resampling.BILINEAR)
        if torch.rand(1).item() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if self.augment:
            image = pil_augment(image)
        return torch.from_numpy(np.array(image)).permute(2, 0, 1), label


def decode_and_crop(sample: tuple[bytes, bytes]) -> tuple[torch.Tensor, int]:
    """webdataset's map step: simplejpeg decode, the torchvision crop, torch's antialiased
    bilinear resize (what torchvision does on tensors), flip."""
    data, label = sample
    pixels = simplejpeg.decode_jpeg(data, colorspace="RGB")
    top, left, height, width = crop_params(pixels.shape[0], pixels.shape[1])
    box = torch.from_numpy(pixels[top : top + height, left : left + width]).permute(2, 0, 1).unsqueeze(0)
    image = torch.nn.functional.interpolate(box, size=(OUTPUT_SIZE, OUTPUT_SIZE), mode="bilinear", antialias=True, align_corners=False)[0]
    if torch.rand(1).item() < 0.5:
        image = image.flip(2)
    return image, int(label)


# -- the contenders: each opens a Stream ------------------------------------------------------


CONVERTED = "shardfmt-converted"
"""The folder of the converted copy (the one the shardfmt contenders read)."""


def open_shardfmt(
    source: Source, settings: Settings, *, fast_decode: bool, folder: str = CONVERTED, augment: bool = False, recipe: bool = False
) -> Stream:
    steps = shardfmt_steps() if augment else [TrivialAugmentWide(), RandomErasing(p=ERASE_P, value="mean")] if recipe else None
    loader = shardfmt.Loader(
        source.derived / folder,
        batch_size=settings.batch_size,
        num_workers=settings.workers,
        seed=0,
        transform=shardfmt.ImageTransform(
            size=OUTPUT_SIZE,
            crop="train",
            fast_decode=fast_decode,
            augment=steps,
            mean=MEAN if recipe else None,
            std=STD if recipe else None,
        ),
        output=shardfmt.Output(layout="NCHW"),
        **({"sampling": shardfmt.Sampling(window=settings.window)} if settings.window is not None else {}),
    )
    return Stream(epoch=lambda: iter(loader), close=loader.close, shared_memory_bytes=loader.shared_memory_bytes)


def open_raw(source: Source, settings: Settings) -> Stream:
    """The same Loader over the raw-pixel copy of the images: no decode, crop and resize only."""
    loader = shardfmt.Loader(
        source.derived / "raw",
        batch_size=settings.batch_size,
        num_workers=settings.workers,
        seed=0,
        transform=shardfmt.ImageTransform(size=OUTPUT_SIZE, crop="train"),
        output=shardfmt.Output(layout="NCHW"),
    )
    return Stream(epoch=lambda: iter(loader), close=loader.close, shared_memory_bytes=loader.shared_memory_bytes)


def open_patches(source: Source, settings: Settings, *, store: str) -> Stream:
    """The Loader over a `prepare_patches` copy: a 224 box at random and a flip, no resize."""
    loader = shardfmt.Loader(
        source.derived / f"patches-{PATCH_SIZE}-{store}",
        batch_size=settings.batch_size,
        num_workers=settings.workers,
        seed=0,
        transform=RandomCrop(OUTPUT_SIZE),
        output=shardfmt.Output(layout="NCHW"),
    )
    return Stream(epoch=lambda: iter(loader), close=loader.close, shared_memory_bytes=loader.shared_memory_bytes)


@dataclass
class S3Server:
    """moto's S3 server on 127.0.0.1 holding the shardfmt shards at s3://bench/shardfmt."""

    server: Any
    endpoint: str

    @classmethod
    def start(cls, folder: Path) -> S3Server:
        try:
            import boto3
            from moto.server import ThreadedMotoServer
        except ImportError as err:
            raise SystemExit(f"--only s3 needs moto[server], boto3 and s3fs ({err})") from err
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1"
        )
        client.create_bucket(Bucket="bench")
        say(f"uploading the shardfmt shards to moto's S3 server at {endpoint}")
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), "bench", f"shardfmt/{path.name}")
        return cls(server, endpoint)

    def options(self) -> dict[str, Any]:
        return {"key": "bench", "secret": "bench", "endpoint_url": self.endpoint, "client_kwargs": {"region_name": "us-east-1"}}

    def stop(self) -> None:
        self.server.stop()


def open_shardfmt_s3(server: S3Server, settings: Settings, *, mode: str) -> Stream:
    """shardfmt.Loader over s3://bench/shardfmt; with mode "cache", a fresh cache folder."""
    cache = tempfile.mkdtemp(prefix="shardfmt-bench-cache-")
    remote = shardfmt.RemoteOptions(mode=mode, cache_dir=cache, storage_options=server.options())
    loader = shardfmt.Loader(
        "s3://bench/shardfmt",
        batch_size=settings.batch_size,
        num_workers=settings.workers,
        seed=0,
        remote=remote,
        transform=shardfmt.ImageTransform(size=OUTPUT_SIZE, crop="train"),
        output=shardfmt.Output(layout="NCHW"),
    )

    def close() -> None:
        loader.close()
        shutil.rmtree(cache, ignore_errors=True)

    return Stream(epoch=lambda: iter(loader), close=close, shared_memory_bytes=loader.shared_memory_bytes)


def open_pil_dataloader(source: Source, settings: Settings, *, augment: bool = False) -> Stream:
    dataset = FolderDataset([(str(path), label) for path, label in zip(source.files, source.labels, strict=True)], augment=augment)
    loader = DataLoader(
        dataset,
        batch_size=settings.batch_size,
        shuffle=True,
        num_workers=settings.workers,
        persistent_workers=settings.workers > 0,
    )
    return Stream(epoch=lambda: iter(loader), close=lambda: shutdown_dataloader(loader))


class AlbumentationsDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The recipe as an Albumentations user writes it: simplejpeg decode, then Albumentations'
    RandomResizedCrop, HorizontalFlip, TrivialAugmentWide's operations, Normalize, Erasing."""

    def __init__(self, samples: Sequence[tuple[str, int]]) -> None:
        import albumentations as A

        self.samples = list(samples)
        self.transform = A.Compose(
            [
                A.RandomResizedCrop(size=(OUTPUT_SIZE, OUTPUT_SIZE), scale=SCALE, ratio=RATIO, p=1.0),
                A.HorizontalFlip(p=0.5),
                albumentations_equivalents()["TrivialAugmentWide()"],
                A.Normalize(mean=tuple(m / 255 for m in MEAN), std=tuple(s / 255 for s in STD), p=1.0),
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


def _one_opencv_thread(worker: int) -> None:
    import cv2

    cv2.setNumThreads(1)


def open_albumentations_dataloader(source: Source, settings: Settings) -> Stream:
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


def open_webdataset(source: Source, settings: Settings) -> Stream:
    urls = webdataset_shards(source, settings)
    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls))
        .shuffle(WDS_SHUFFLE_BUFFER)
        .to_tuple("jpg", "cls")
        .map(decode_and_crop)
        .batched(settings.batch_size, collation_fn=default_collate, partial=True)
    )
    loader = DataLoader(dataset, batch_size=None, num_workers=settings.workers, persistent_workers=settings.workers > 0)
    return Stream(epoch=lambda: iter(loader), close=lambda: shutdown_dataloader(loader))


def shutdown_dataloader(loader: DataLoader) -> None:  # type: ignore[type-arg]
    """Stop a DataLoader's persistent workers now (DataLoader itself only does so when collected)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def measure_decode(source: Source, settings: Settings, *, fast: bool) -> tuple[Result, Result]:
    """Decode every image `epochs` times in this process on one thread, bytes already in RAM;
    return the limit (one core times os.cpu_count()) and the one-core row."""
    cores = os.cpu_count() or 1
    simplejpeg.decode_jpeg(source.files[0].read_bytes(), colorspace="RGB", fastdct=fast, fastupsample=fast)
    seconds = cpu = 0.0
    images = 0
    for start in range(0, len(source.files), 256):
        blobs = [path.read_bytes() for path in source.files[start : start + 256]]
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        for _ in range(settings.epochs):
            for data in blobs:
                simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast, fastupsample=fast)
        seconds += time.perf_counter() - wall0
        cpu += time.thread_time() - cpu0
        images += settings.epochs * len(blobs)
    limit, one_core = (LIMIT_FAST, ONE_CORE_FAST) if fast else (LIMIT_EXACT, ONE_CORE_EXACT)
    busy = f"; busy machine: wall time {seconds / cpu:.2f}x CPU time" if 0 < 1.15 * cpu < seconds else ""
    return (
        Result(limit, images, seconds, parallel=cores, cpu_seconds=cpu, note=f"one core x {cores} cores{busy}"),
        Result(one_core, images, seconds, cpu_seconds=cpu, note=busy.lstrip("; ")),
    )


def _decode_share(args: tuple[list[str], int]) -> tuple[int, float]:
    paths, epochs = args
    blobs = [Path(path).read_bytes() for path in paths]
    start = time.perf_counter()
    for _ in range(epochs):
        for data in blobs:
            simplejpeg.decode_jpeg(data, colorspace="RGB")
    return epochs * len(blobs), time.perf_counter() - start


def measure_parallel_decode(source: Source, settings: Settings) -> Result:
    """Context for the limit: one process per core decoding its share of the images at the same
    time (bytes in RAM, exact IDCT). Cores share caches, memory bandwidth and clock headroom, so
    this is usually a little below one core x cores; the targets use one core x cores."""
    cores = os.cpu_count() or 1
    shares = [([str(p) for p in source.files[i::cores]], settings.epochs) for i in range(cores)]
    with multiprocessing.get_context("fork").Pool(cores) as pool:
        done = pool.map(_decode_share, shares)
    images = sum(count for count, _ in done)
    seconds = max(wall for _, wall in done)
    return Result(PARALLEL_EXACT, images, seconds, note=f"{cores} processes, each timing its own share")


# -- measuring a loader -----------------------------------------------------------------------


def child_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_for_children(baseline: set[int], *, timeout: float = 15.0) -> bool:
    """Wait until every process started since `baseline` was taken is gone (and so reaped)."""
    deadline = time.monotonic() + timeout
    while child_pids() - baseline:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def live_cpu_seconds(exclude: set[int]) -> tuple[float, float]:
    """CPU seconds so far of this process and of its live descendants not in `exclude`."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    workers = 0.0
    for process in psutil.Process().children(recursive=True):
        if process.pid in exclude:
            continue
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue  # exited between listing and reading
        workers += times.user + times.system
    return own.ru_utime + own.ru_stime, workers


def check_batch(name: str, images: torch.Tensor, labels: torch.Tensor, batch_size: int) -> None:
    count = len(labels)
    if not 1 <= count <= batch_size:
        raise BenchError(f"{name}: a batch of {count} labels, expected 1 to {batch_size}")
    dtype = torch.float32 if name in (RECIPE_SHARDFMT, RECIPE_ALBUMENTATIONS) else torch.uint8  # the recipe normalises
    if tuple(images.shape) != (count, 3, OUTPUT_SIZE, OUTPUT_SIZE) or images.dtype != dtype:
        raise BenchError(
            f"{name}: images {tuple(images.shape)} {images.dtype}, expected ({count}, 3, {OUTPUT_SIZE}, {OUTPUT_SIZE}) {dtype}"
        )
    if labels.dtype != torch.int64:
        raise BenchError(f"{name}: labels are {labels.dtype}, expected int64")


def consume(name: str, stream: Stream, source: Source, settings: Settings, *, epochs: int) -> int:
    """Run `epochs` epochs, checking each batch, and that each epoch delivers every label as
    often as the dataset holds it; return the images delivered."""
    expected = torch.bincount(torch.tensor(source.labels), minlength=len(source.classes))
    total = 0
    for epoch in range(epochs):
        counts = torch.zeros_like(expected)
        for images, labels in stream.epoch():
            check_batch(name, images, labels, settings.batch_size)
            counts += torch.bincount(labels, minlength=len(expected))[: len(expected)]
            total += len(labels)
        if not torch.equal(counts, expected):
            raise BenchError(
                f"{name}: epoch {epoch} delivered {int(counts.sum())} images with other labels than the dataset's {len(source.files)}"
            )
    return total


def measure_loader(name: str, open_stream: Callable[[], Stream], source: Source, settings: Settings) -> Result:
    """Time the first batch from a fresh start; then, from another start, run the warm-up
    epochs (timed from constructing the loader) and time the epochs after them."""
    baseline = child_pids()
    say(f"{name}: first batch")
    start = time.perf_counter()
    stream = open_stream()
    try:
        iterator = stream.epoch()
        images, labels = next(iterator)
        first_batch = time.perf_counter() - start
        check_batch(name, images, labels, settings.batch_size)
        if int(images.max()) == 0:
            raise BenchError(f"{name}: the first batch is all zeros")
        del iterator, images, labels
    finally:
        stream.close()
    gc.collect()
    if not wait_for_children(baseline):
        say(f"{name}: workers of the first-batch start are still running; CPU time may be off")

    say(f"{name}: {settings.warmup_epochs} untimed and {settings.epochs} timed epochs of {len(source.files)} images")
    gc.collect()
    sampler = TreeSampler(exclude=baseline)
    baseline_pss = read_memory(psutil.Process())[0]
    sampler.start()
    cpu_before, sampler_before = live_cpu_seconds(baseline), 0.0
    start = time.perf_counter()
    stream = open_stream()
    warmup_images = warmup_seconds = None
    try:
        if settings.warmup_epochs:
            warmup_images = consume(name, stream, source, settings, epochs=settings.warmup_epochs)
            warmup_seconds = time.perf_counter() - start
            cpu_before, sampler_before = live_cpu_seconds(baseline), sampler.cpu_seconds
            start = time.perf_counter()
        images_done = consume(name, stream, source, settings, epochs=settings.epochs)
        while time.perf_counter() - start < settings.min_seconds:  # a short window is a noisy one
            images_done += consume(name, stream, source, settings, epochs=1)
        seconds = time.perf_counter() - start
        cpu_after, sampler_after = live_cpu_seconds(baseline), sampler.cpu_seconds
    finally:
        stream.close()
        reaped = wait_for_children(baseline)
        sampler.stop()
    own = cpu_after[0] - cpu_before[0] - (sampler_after - sampler_before)
    workers = cpu_after[1] - cpu_before[1]
    result = Result(
        name,
        images_done,
        seconds,
        cpu_seconds=own + workers,
        worker_cpu_seconds=workers,
        peak_pss_bytes=sampler.peak_pss,
        peak_anon_pss_bytes=sampler.peak_anon_pss,
        peak_rss_bytes=sampler.peak_rss,
        baseline_pss_bytes=baseline_pss,
        first_batch_seconds=first_batch,
        shared_memory_bytes=stream.shared_memory_bytes,
        warmup_images=warmup_images,
        warmup_seconds=warmup_seconds,
        note="" if reaped else "workers not reaped",
    )
    say(f"{name}: {result.images_per_second:.0f} images/s")
    return result


# -- data preparation -------------------------------------------------------------------------


def generate_imagefolder(work_dir: Path, images: int) -> Path:
    """An ImageNet-like ImageFolder of at least `images` JPEGs (100 classes), cached."""
    num_classes = min(100, images)
    per_class = -(-images // num_classes)
    root = work_dir / f"imagefolder-{num_classes}x{per_class}-q{GENERATED_QUALITY}"
    marker = root / ".complete"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    say(f"generating {num_classes * per_class} JPEGs in {root} (cached for later runs with this --work-dir)")
    make_imagefolder(
        root, num_classes=num_classes, per_class=per_class, size=GENERATED_SIZE, quality=GENERATED_QUALITY, processes=os.cpu_count() or 1
    )
    marker.write_text("complete\n")
    return root


def load_source(root: Path, work_dir: Path, images: int | None) -> Source:
    """List root/<class>/<file>.jpg; keep a seeded subset of `images` if there are more."""
    classes = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    pairs = [
        (path, label)
        for label, name in enumerate(classes)
        for path in sorted((root / name).iterdir())
        if path.suffix.lower() in JPEG_SUFFIXES and path.is_file()
    ]
    if not pairs:
        raise SystemExit(f"no .jpg/.jpeg files under {root}/<class>/")
    if images is not None and images < len(pairs):
        keep = np.sort(np.random.default_rng(0).choice(len(pairs), images, replace=False))
        pairs = [pairs[i] for i in keep]
    digest = hashlib.sha256(str(root.resolve()).encode())
    for path, label in pairs:
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\t{label}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    derived = work_dir / f"derived-{digest.hexdigest()[:12]}"
    derived.mkdir(parents=True, exist_ok=True)
    return Source(
        files=tuple(path for path, _ in pairs),
        labels=tuple(label for _, label in pairs),
        classes=tuple(classes),
        root=root,
        derived=derived,
    )


def write_listing(source: Source) -> Path:
    """A listing of the selected files (integer labels, so that a subset keeps the folder's
    class numbers) beside hard links to them (copies across file systems): a listing reads only
    regular files inside its own folder once links are resolved, so symbolic links to the
    source would be rejected as outside-root; cached."""
    links = source.derived / "patch-inputs"
    listing = links / "listing.csv"
    if not listing.exists():
        shutil.rmtree(links, ignore_errors=True)
        lines = ["path,label"]
        for path, label in zip(source.files, source.labels, strict=True):
            rel = path.relative_to(source.root)
            (links / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path.resolve(), links / rel)
            except OSError:  # another file system, or no hard links there
                shutil.copyfile(path, links / rel)
            lines.append(f"{rel.as_posix()},{label}")
        partial = links / "listing.csv.tmp"
        partial.write_text("\n".join(lines) + "\n")
        partial.replace(listing)
    return listing


def warm_page_cache(source: Source) -> None:
    """Read every selected image and every file of its prepared copies once, so that every
    contender reads from the page cache (shardfmt writes its shards with O_DIRECT, past it)."""
    copies = [path for path in sorted(source.derived.rglob("*")) if path.is_file() and not path.is_symlink()]
    for path in [*source.files, *copies]:
        with open(path, "rb") as file:
            while file.read(1 << 24):
                pass


def prepare_converted(source: Source, settings: Settings, *, shard_size: int | None = None) -> Path:
    """The images converted by `shardfmt._convert`, each kept byte for byte (checked), cached."""
    out = source.derived / (CONVERTED if shard_size is None else f"{CONVERTED}-{shard_size}")
    if (out / "manifest.json").exists():  # written last: the commit point of the dataset
        return out
    shutil.rmtree(out, ignore_errors=True)
    say(f"converting the images to {out}")
    options = {} if shard_size is None else {"shard_size": shard_size}
    result = convert(write_listing(source), out, workers=max(1, settings.workers), **options)
    kept = result.manifest.stats.get("passthrough")
    if result.num_rejects or kept != len(source.files):
        shutil.rmtree(out, ignore_errors=True)
        raise SystemExit(
            (
                f"the converter kept {kept} of {len(source.files)} JPEGs byte for byte ({result.num_rejects} rejects): the contenders "
                "would not read the same bytes"
            )
        )
    return out


def prepare_shardfmt(source: Source, *, shard_format: str = "binary", shard_size: int | None = None) -> Path:
    name = "shardfmt" if shard_format == "binary" else "shardfmt-tar"
    out = source.derived / (name if shard_size is None else f"{name}-{shard_size}")
    if (out / "manifest.json").exists():  # written last: the commit point of the dataset
        return out
    shutil.rmtree(out, ignore_errors=True)
    say(f"writing shardfmt {shard_format} shards to {out}")
    options = {} if shard_size is None else {"shard_size": shard_size}
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, classes=source.classes, shard_format=shard_format, **options) as writer:
        for path, label in zip(source.files, source.labels, strict=True):
            key = path.relative_to(source.root).with_suffix("").as_posix()
            writer.write({"image": path.read_bytes(), "label": label, "key": key})
    return out


def prepare_raw(source: Source) -> None:
    """The images decoded once (exact IDCT, RGB) and stored as a "raw" field, cached."""
    out = source.derived / "raw"
    if (out / "manifest.json").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    say(f"writing raw-pixel shards to {out}")
    schema = shardfmt.format.Schema.of(image="raw", label="int64", key="str")
    with DatasetWriter(out, schema=schema, classes=source.classes) as writer:
        for path, label in zip(source.files, source.labels, strict=True):
            key = path.relative_to(source.root).with_suffix("").as_posix()
            pixels = simplejpeg.decode_jpeg(path.read_bytes(), colorspace="RGB", fastdct=False, fastupsample=False)
            writer.write({"image": pixels, "label": label, "key": key})


def prepare_patches(source: Source, settings: Settings) -> None:
    """The images as `PATCH_SIZE` squares (``shardfmt convert --patch``), as JPEG and as raw
    pixels, cached. The selected files are listed (integer labels, so that a subset keeps the
    folder's class numbers) beside symbolic links to them, since a listing names files below
    its own folder."""
    listing = write_listing(source)
    for store in ("jpeg", "raw"):
        out = source.derived / f"patches-{PATCH_SIZE}-{store}"
        if (out / "manifest.json").exists():
            continue
        shutil.rmtree(out, ignore_errors=True)
        say(f"converting {PATCH_SIZE}x{PATCH_SIZE} patches stored as {store} to {out}")
        result = convert(listing, out, store=store, patch=PATCH_SIZE, quality=PATCH_QUALITY, workers=max(1, settings.workers))
        if result.num_rejects:
            raise SystemExit(f"{result.num_rejects} images were rejected converting patches; see {out / 'rejects.jsonl'}")


def webdataset_dir(source: Source, settings: Settings) -> tuple[Path, int]:
    """Where the tar shards go and how many images each holds: the same number of shards for
    every worker, at least 2 each and 8 in all (fewer only with fewer images)."""
    workers = max(1, settings.workers)
    num_shards = min(len(source.files), workers * max(2, -(-8 // workers)))
    per_shard = -(-len(source.files) // num_shards)
    return source.derived / f"webdataset-{per_shard}-per-shard", per_shard


def webdataset_shards(source: Source, settings: Settings) -> list[str]:
    out, _ = webdataset_dir(source, settings)
    return sorted(str(path) for path in out.glob("shard-*.tar"))


def prepare_webdataset(source: Source, settings: Settings) -> None:
    out, per_shard = webdataset_dir(source, settings)
    marker = out / ".complete"
    if marker.exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    say(f"writing webdataset tar shards to {out}")
    order = np.random.default_rng(0).permutation(len(source.files))
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for index in order:
            path, label = source.files[index], source.labels[index]
            sink.write({"__key__": f"{int(index):08d}", "jpg": path.read_bytes(), "cls": label})
    workers = max(1, settings.workers)
    if len(webdataset_shards(source, settings)) < workers:
        raise SystemExit(f"{len(source.files)} images make fewer tar shards than {workers} workers; use more --images")
    marker.write_text("complete\n")


# -- the report -------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "cpu_model": model,
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "simplejpeg": simplejpeg.__version__,
        "pillow": PIL.__version__,
        "webdataset": getattr(wds, "__version__", "unknown"),
        "numpy": np.__version__,
        "shardfmt": shardfmt.__version__,
        "start_method": multiprocessing.get_start_method(),
    }


def print_machine(machine: dict[str, Any], settings: Settings, source: Source) -> None:
    print(
        (
            f"machine: {machine['cpu_count']} CPUs ({machine['usable_cpus']} usable), {machine['cpu_model']}, "
            f"{machine['memory_bytes'] / 2**30:.0f} GiB"
        )
    )
    print(
        f"versions: python {machine['python']}, torch {machine['torch']}, simplejpeg {machine['simplejpeg']}, "
        f"pillow {machine['pillow']}, webdataset {machine['webdataset']}, numpy {machine['numpy']}, shardfmt {machine['shardfmt']}"
    )
    sizes = [path.stat().st_size for path in source.files]
    print(
        f"data: {len(source.files)} JPEGs in {len(source.classes)} classes, mean {np.mean(sizes) / 1000:.0f} KB, from {source.root}; "
        f"batch {settings.batch_size}, {settings.workers} workers, {settings.warmup_epochs} untimed + {settings.epochs} timed epochs, "
        f"start method {machine['start_method']}"
    )


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def print_table(results: list[Result]) -> None:
    header = (
        f"{'contender':<32} {'images':>7} {'seconds':>8} {'images/s':>9} {'CPU s':>7} {'CPU ms/img':>10} "
        f"{'PSS MiB':>8} {'anon MiB':>8} {'RSS MiB':>8} {'1st batch s':>11} {'1st epoch img/s':>15}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        cpu = "-" if r.cpu_seconds is None else f"{r.cpu_seconds:.1f}"
        per_image = "-" if r.cpu_seconds is None else f"{1000 * r.cpu_seconds / r.images:.2f}"
        first = "-" if r.first_batch_seconds is None else f"{r.first_batch_seconds:.2f}"
        warm = "-" if r.warmup_images_per_second is None else f"{r.warmup_images_per_second:.0f}"
        line = (
            f"{r.name:<32} {r.images:>7} {r.seconds:>8.2f} {r.images_per_second:>9.0f} {cpu:>7} {per_image:>10} "
            f"{mib(r.peak_pss_bytes):>8} {mib(r.peak_anon_pss_bytes):>8} {mib(r.peak_rss_bytes):>8} {first:>11} {warm:>15}"
        )
        print(f"{line}  {r.note}".rstrip())
    baselines = [r.baseline_pss_bytes for r in results if r.baseline_pss_bytes is not None]
    if baselines:
        print(f"PSS and RSS include this process at rest: PSS {mib(min(baselines))} to {mib(max(baselines))} MiB before each loader")
    for r in results:
        if r.shared_memory_bytes is not None:
            print(f"{r.name}: Loader.shared_memory_bytes = {r.shared_memory_bytes} ({mib(r.shared_memory_bytes)} MiB, part of its PSS)")


SPEED_RATIOS = (
    (SHARDFMT_FAST, PIL_LOADER, 2.4),
    (AUGMENT_SHARDFMT, AUGMENT_PIL, 2.5),
    (RECIPE_SHARDFMT, RECIPE_ALBUMENTATIONS, 1.5),
    (RAW_PATCHES, JPEG_PATCHES, 5.0),
    (SHARDFMT_RAW, SHARDFMT_FAST, None),
    (RAW_PATCHES, SHARDFMT_FAST, None),
    (S3_RANGE, SHARDFMT_FAST, None),
    (S3_CACHE, SHARDFMT_FAST, None),
    (SHARDFMT_EXACT, PIL_LOADER, None),
    (SHARDFMT_FAST, LIMIT_EXACT, 0.8),
    (SHARDFMT_FAST, LIMIT_FAST, None),
    (SHARDFMT_EXACT, LIMIT_EXACT, None),
    (SHARDFMT_TAR, SHARDFMT_FAST, 0.9),
    (SHARDFMT_FAST, PARALLEL_EXACT, None),
    (WEBDATASET, LIMIT_EXACT, None),
    (WEBDATASET, PIL_LOADER, None),
)
FIRST_EPOCH_RATIOS = (
    (SHARDFMT_FAST, 0.9),
    (SHARDFMT_TAR, None),
    (AUGMENT_SHARDFMT, None),
    (RECIPE_SHARDFMT, None),
    (PIL_LOADER, None),
)
CPU_RATIOS = (
    (AUGMENT_SHARDFMT, AUGMENT_PIL),
    (RECIPE_SHARDFMT, RECIPE_ALBUMENTATIONS),
    (RAW_PATCHES, JPEG_PATCHES),
    (SHARDFMT_RAW, SHARDFMT_FAST),
    (SHARDFMT_FAST, PIL_LOADER),
    (SHARDFMT_FAST, ONE_CORE_EXACT),
    (WEBDATASET, ONE_CORE_EXACT),
)


def compute_ratios(results: list[Result]) -> list[dict[str, Any]]:
    """images/s ratios, then images per CPU second ratios (what images/s would be if every core
    were busy for the contender alone: less sensitive to a shared machine)."""
    speed = {r.name: r.images_per_second for r in results}
    efficiency = {r.name.strip(): r.images / r.cpu_seconds for r in results if r.cpu_seconds}
    rows = []
    for top, bottom, target in SPEED_RATIOS:
        value = speed[top] / speed[bottom] if top in speed and bottom in speed else None
        rows.append({"measure": "images/s", "numerator": top, "denominator": bottom, "ratio": value, "target": target})
    for top, bottom in CPU_RATIOS:
        bottom = bottom.strip()
        value = efficiency[top] / efficiency[bottom] if top in efficiency and bottom in efficiency else None
        rows.append({"measure": "images per CPU second", "numerator": top, "denominator": bottom, "ratio": value, "target": None})
    # The targets again on the first epoch (start-up included; the limit has no start-up).
    first = {r.name: r.warmup_images_per_second or (r.images_per_second if r.first_batch_seconds is None else None) for r in results}
    for top, bottom, target in SPEED_RATIOS:
        if target is not None and first.get(top) and first.get(bottom):
            rows.append(
                {
                    "measure": "first-epoch images/s",
                    "numerator": top,
                    "denominator": bottom,
                    "ratio": first[top] / first[bottom],
                    "target": target,
                }
            )
    # Each loader's first epoch (start-up included) against its later ones.
    for name, target in FIRST_EPOCH_RATIOS:
        if first.get(name) and name in speed:
            rows.append(
                {
                    "measure": "first epoch / later epochs",
                    "numerator": f"{name}, 1st epoch",
                    "denominator": "its later epochs",
                    "ratio": first[name] / speed[name],
                    "target": target,
                }
            )
    return rows


def print_ratios(ratios: list[dict[str, Any]]) -> None:
    measure = None
    for row in ratios:
        if row["measure"] != measure:
            measure = row["measure"]
            print(f"ratios of {measure}:")
        label = f"{row['numerator']} / {row['denominator']}"
        if row["ratio"] is None:
            print(f"ratio {label:<56} n/a (not run)")
            continue
        verdict = ""
        if row["target"] is not None:
            verdict = f"  target >= {row['target']}x: {'met' if row['ratio'] >= row['target'] else 'NOT met'}"
        print(f"ratio {label:<56} {row['ratio']:5.2f}x{verdict}")


def write_chart(path: Path, results: list[Result], machine: dict[str, Any], settings: Settings) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The patch rows have another pipeline (and raw patches would dwarf the scale): table only.
    loaders = [r for r in results if r.first_batch_seconds is not None and r.name not in (JPEG_PATCHES, RAW_PATCHES)]
    limits = {r.name: r.images_per_second for r in results if r.name in (LIMIT_EXACT, LIMIT_FAST)}
    figure, axes = plt.subplots(figsize=(9, 0.55 * len(loaders) + 1.6))
    names = [r.name for r in loaders][::-1]
    values = [r.images_per_second for r in loaders][::-1]
    colours = ["#4c72b0" if name.startswith("shardfmt") else "#8c8c8c" for name in names]
    bars = axes.barh(names, values, color=colours)
    axes.bar_label(bars, fmt="%.0f", padding=3)
    for name, style in ((LIMIT_EXACT, "-"), (LIMIT_FAST, "--")):
        if name in limits:
            axes.axvline(limits[name], color="#c44e52", linestyle=style, label=f"{name}: {limits[name]:.0f}/s")
    axes.set_xlim(0, 1.15 * max(values + list(limits.values()) + [1.0]))
    if limits:
        axes.legend(loc="lower right", fontsize=8)
    axes.set_xlabel("images/s")
    axes.set_title(
        f"RandomResizedCrop 224 + flip, batch {settings.batch_size}, {settings.workers} workers, "
        f"{machine['cpu_model']}, {machine['cpu_count']} CPUs",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# -- main -------------------------------------------------------------------------------------


def _default_contenders() -> list[str]:
    try:
        import albumentations  # noqa: F401
    except ImportError:
        return [name for name in CONTENDERS if name != "recipe"]
    return list(CONTENDERS)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--images", type=int, default=None, help="images to use (default 5000; with --src, all of them)")
    parser.add_argument("--src", type=Path, help="an existing ImageFolder (root/<class>/<image>.jpg) instead of generated images")
    parser.add_argument("--work-dir", type=Path, help="keep generated data here between runs (default: a temporary directory)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of every loader (default 2)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2, help="timed passes over the images per contender (default 2)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="measure every contender this many times, in turn, and keep each one's best (default 2)"
    )
    parser.add_argument(
        "--min-seconds", type=float, default=5.0, help="add timed epochs until they last this long (default 5)"
    )
    parser.add_argument(
        "--warmup-epochs", type=int, default=1, help="untimed passes first, from a fresh start (default 1; 0 times the start-up too)"
    )
    parser.add_argument(
        "--only",
        default=",".join(_default_contenders()),
        help=f"comma list of contenders out of {','.join(CONTENDERS)} (default: all; recipe only with albumentations installed)",
    )
    parser.add_argument(
        "--s3-shard-size", type=int, default=16 << 20, help="shard size of the copy the s3 contenders read (default 16 MiB)"
    )
    parser.add_argument(
        "--scaling",
        help="comma list of worker counts (e.g. 1,2,4,8,16): instead of the contenders, measure 'shardfmt fast_decode=True' "
        "at each count against the exact-IDCT decode limit of one core times that count",
    )
    parser.add_argument("--window", type=int, default=None, help="the shardfmt contenders' window= (default: a full shuffle)")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--chart", type=Path, help="write a bar chart of images/s here (PNG)")
    args = parser.parse_args(argv)
    try:
        args.scaling = [int(value) for value in args.scaling.split(",")] if args.scaling else None
    except ValueError:
        parser.error(f"--scaling takes a comma list of worker counts, got {args.scaling!r}")
    if args.scaling is not None and min(args.scaling) < 1:
        parser.error("--scaling counts must be at least 1")
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(args.only) - set(CONTENDERS))
    if unknown or not args.only:
        parser.error(f"--only takes names out of {','.join(CONTENDERS)}, got {','.join(unknown) or 'none'}")
    if args.images is not None and args.images < 1:
        parser.error("--images must be at least 1")
    if args.batch_size < 1 or args.epochs < 1 or args.workers < 0 or args.warmup_epochs < 0 or args.min_seconds < 0 or args.rounds < 1:
        parser.error("--batch-size, --epochs and --rounds must be at least 1, --workers, --warmup-epochs and --min-seconds at least 0")
    return args


def measure_round(args: argparse.Namespace, source: Source, settings: Settings, s3_shards: Any) -> list[Result]:
    """Measure every selected contender once, in a fixed order: shardfmt's ways of storing and reading, then the others."""
    return measure_stored(args, source, settings, s3_shards) + measure_others(args, source, settings)


def measure_stored(args: argparse.Namespace, source: Source, settings: Settings, s3_shards: Any) -> list[Result]:
    """The selected contenders among shardfmt's stores: binary shards, tars, raw pixels, patches, S3."""
    results: list[Result] = []
    if "shardfmt" in args.only:
        for name, fast in ((SHARDFMT_FAST, True), (SHARDFMT_EXACT, False)):
            results.append(measure_loader(name, functools.partial(open_shardfmt, source, settings, fast_decode=fast), source, settings))
    if "tar" in args.only:
        opener = functools.partial(open_shardfmt, source, settings, fast_decode=True, folder="shardfmt-tar")
        results.append(measure_loader(SHARDFMT_TAR, opener, source, settings))
    if "raw" in args.only:
        results.append(measure_loader(SHARDFMT_RAW, lambda: open_raw(source, settings), source, settings))
    if "patches" in args.only:
        for name, store in ((JPEG_PATCHES, "jpeg"), (RAW_PATCHES, "raw")):
            results.append(measure_loader(name, functools.partial(open_patches, source, settings, store=store), source, settings))
    if "s3" in args.only:
        server = S3Server.start(s3_shards)
        try:
            for name, mode in ((S3_RANGE, "range"), (S3_CACHE, "cache")):
                results.append(measure_loader(name, functools.partial(open_shardfmt_s3, server, settings, mode=mode), source, settings))
        finally:
            server.stop()
    return results


def measure_others(args: argparse.Namespace, source: Source, settings: Settings) -> list[Result]:
    """The selected contenders that are not a store: PIL, the augmentations, the recipe, webdataset, the decode limits."""
    results: list[Result] = []
    if "pil" in args.only:
        results.append(measure_loader(PIL_LOADER, lambda: open_pil_dataloader(source, settings), source, settings))
    if "augment" in args.only:
        opener = functools.partial(open_shardfmt, source, settings, fast_decode=True, augment=True)
        results.append(measure_loader(AUGMENT_SHARDFMT, opener, source, settings))
        results.append(measure_loader(AUGMENT_PIL, lambda: open_pil_dataloader(source, settings, augment=True), source, settings))
    if "recipe" in args.only:
        opener = functools.partial(open_shardfmt, source, settings, fast_decode=True, recipe=True)
        results.append(measure_loader(RECIPE_SHARDFMT, opener, source, settings))
        results.append(measure_loader(RECIPE_ALBUMENTATIONS, lambda: open_albumentations_dataloader(source, settings), source, settings))
    if "webdataset" in args.only:
        results.append(measure_loader(WEBDATASET, lambda: open_webdataset(source, settings), source, settings))
    if "decode" in args.only:
        for fast in (False, True):
            say(f"decode limit, {'fast' if fast else 'exact'} IDCT")
            results.extend(measure_decode(source, settings, fast=fast))
        say("decode on all cores at once")
        results.append(measure_parallel_decode(source, settings))
    return results


def best_of(rounds: list[list[Result]]) -> list[Result]:
    """Each contender's fastest round (as timeit takes the minimum: other load on a shared
    machine only ever slows a run down), in the order of the first round, with every round's
    rate in its note.

    The first epoch and the first batch are start-up measures of their own, so each also takes
    its best round, which need not be the round of the best later epochs: taking the first epoch
    of that round paired a best-case later rate with an unselected first epoch, and one spell of
    load in it (1,361 against rounds of 1,492 and 1,781 images/s later) read as a slow start."""
    best: list[Result] = []
    for first in rounds[0]:
        runs = [r for results in rounds for r in results if r.name == first.name]
        chosen = max(runs, key=lambda r: r.images_per_second)
        if len(runs) > 1:
            rates = ", ".join(f"{r.images_per_second:.0f}" for r in runs)
            notes = [chosen.note, f"best of {rates}"]
            started = [r for r in runs if r.warmup_images_per_second is not None]
            if started:
                fastest = max(started, key=lambda r: r.warmup_images_per_second or 0.0)
                chosen = replace(chosen, warmup_images=fastest.warmup_images, warmup_seconds=fastest.warmup_seconds)
                notes.append("1st epoch best of " + ", ".join(f"{r.warmup_images_per_second:.0f}" for r in started))
            batches = [r.first_batch_seconds for r in runs if r.first_batch_seconds is not None]
            if batches:
                chosen = replace(chosen, first_batch_seconds=min(batches))
            chosen = replace(chosen, note="; ".join(filter(None, notes)))
        best.append(chosen)
    return best


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """The median of `values` and an interval that holds the true median with at least
    `confidence`, whatever the values' distribution: (low, median, high, coverage).

    The interval runs from the k-th smallest value to the k-th largest, k the largest rank for
    which a Binomial(n, 1/2) count falls below k with probability at most (1 - confidence) / 2:
    each value lies below the true median with probability 1/2, so the interval misses it with
    probability 2 P(count < k). `coverage` is that interval's own, 1 - 2 P(count < k). With
    fewer than 6 values no interval reaches 95%: the whole range is given, with its own coverage.

    Raises:
        ValueError: no values, or `confidence` outside (0, 1).
    """
    if not values:
        raise ValueError("median_interval needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    ordered, n = sorted(values), len(values)
    k, tail = 1, 1.0 / 2**n  # the rank reached so far, and P(count < k)
    while k < (n + 1) // 2:
        below = tail + math.comb(n, k) / 2**n  # P(count < k + 1)
        if below > (1.0 - confidence) / 2:
            break
        tail, k = below, k + 1
    middle = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return ordered[k - 1], middle, ordered[n - k], 1.0 - 2 * tail


def measure_scaling(args: argparse.Namespace, source: Source, settings: Settings) -> list[dict[str, Any]]:
    """`SHARDFMT_FAST` at each worker count of ``--scaling`` (each its best of ``--rounds``)
    against the limit of one core's exact-IDCT decode rate times the workers, which is measured
    first, on one thread with nothing else running."""
    _, one_core = measure_decode(source, settings, fast=False)
    say(f"one core decodes {one_core.images_per_second:.0f} images/s (exact IDCT)")
    rows = []
    for workers in args.scaling:
        run_settings = replace(settings, workers=workers)
        opener = functools.partial(open_shardfmt, source, run_settings, fast_decode=True)
        rounds = [[measure_loader(f"{SHARDFMT_FAST}, {workers} workers", opener, source, run_settings)] for _ in range(args.rounds)]
        best = best_of(rounds)[0]
        limit = one_core.images_per_second * workers
        rows.append(
            {
                "workers": workers,
                "images_per_second": best.images_per_second,
                "decode_limit_images_per_second": limit,
                "ratio_to_limit": best.images_per_second / limit,
                "cpu_seconds": best.cpu_seconds,
                "images": best.images,
                "seconds": best.seconds,
                "note": best.note,
            }
        )
    return [
        {
            "one_core_exact_images_per_second": one_core.images_per_second,
            "one_core_images": one_core.images,
            "one_core_seconds": one_core.seconds,
        },
        *rows,
    ]


def print_scaling(rows: list[dict[str, Any]], target: float) -> None:
    one_core, loaders = rows[0], rows[1:]
    print(
        f"decode limit: one core decodes {one_core['one_core_exact_images_per_second']:.0f} images/s (exact IDCT, simplejpeg, bytes in RAM)"
    )
    print(f"{'workers':>7} {'images/s':>10} {'limit':>10} {'ratio':>6}  CPU ms/img")
    for row in loaders:
        cpu = f"{1000 * row['cpu_seconds'] / row['images']:.2f}" if row["cpu_seconds"] else "-"
        print(
            (
                f"{row['workers']:>7} {row['images_per_second']:>10.0f} {row['decode_limit_images_per_second']:>10.0f} "
                f"{row['ratio_to_limit']:>5.2f}x  {cpu}"
            )
        )
    last = loaders[-1]
    verdict = "met" if last["ratio_to_limit"] >= target else "NOT met"
    print(f"target >= {target}x of the limit at {last['workers']} workers: {verdict} ({last['ratio_to_limit']:.2f}x)")


SCALING_TARGET = 0.85


def run_scaling(args: argparse.Namespace, source: Source, settings: Settings) -> int:
    prepare_converted(source, settings)
    warm_page_cache(source)
    resource_tracker.ensure_running()
    machine = machine_info()
    load_before = os.getloadavg()
    rows = measure_scaling(args, source, settings)
    load_after = os.getloadavg()
    print()
    print_machine(machine, settings, source)
    print(f"load average (1 min): {load_before[0]:.2f} before, {load_after[0]:.2f} after, on {machine['cpu_count']} CPUs")
    print()
    print_scaling(rows, SCALING_TARGET)
    if args.json is not None:
        document = {
            "machine": machine,
            "settings": asdict(settings)
            | {"images": len(source.files), "source": str(source.root), "scaling": args.scaling, "rounds": args.rounds},
            "load_average": {"before": load_before, "after": load_after},
            "decode_limit_one_core": rows[0],
            "scaling": rows[1:],
            "target": SCALING_TARGET,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


def bench_source(args: argparse.Namespace, work_dir: Path) -> Source:
    """The images to measure on: ``--src``, or a generated ImageFolder of ``--images`` (default 5000)."""
    if args.src is not None:
        return load_source(args.src, work_dir, args.images)
    images = 5000 if args.images is None else args.images
    return load_source(generate_imagefolder(work_dir, images), work_dir, images)


def prepare_contenders(args: argparse.Namespace, source: Source, settings: Settings) -> Path | None:
    """Write what the selected contenders read; return the shards of the s3 contenders (None without them)."""
    s3_shards: Path | None = None
    if "shardfmt" in args.only or "augment" in args.only or "recipe" in args.only:
        prepare_converted(source, settings)
    if "tar" in args.only:
        prepare_shardfmt(source, shard_format="tar")
    if "raw" in args.only:
        prepare_raw(source)
    if "patches" in args.only:
        prepare_patches(source, settings)
    if "s3" in args.only:
        s3_shards = prepare_shardfmt(source, shard_size=args.s3_shard_size)
    if "webdataset" in args.only:
        prepare_webdataset(source, settings)
    return s3_shards


def run(args: argparse.Namespace, work_dir: Path) -> int:
    settings = Settings(
        batch_size=args.batch_size,
        workers=args.workers,
        epochs=args.epochs,
        warmup_epochs=args.warmup_epochs,
        min_seconds=args.min_seconds,
        window=args.window,
    )
    source = bench_source(args, work_dir)
    if len(source.files) < max(1, settings.workers, *(args.scaling or [])):
        raise SystemExit(f"{len(source.files)} images are fewer than the workers")
    if args.scaling is not None:
        return run_scaling(args, source, settings)
    s3_shards = prepare_contenders(args, source, settings)
    warm_page_cache(source)
    resource_tracker.ensure_running()  # started now, so that it is not taken for a worker

    machine = machine_info()
    load_before = os.getloadavg()
    steps: list[StepCost] = []
    if "augment" in args.only:
        say("the cost of each augmentation step")
        steps = measure_steps(source.files)
    rounds = []
    for number in range(args.rounds):
        say(f"round {number + 1} of {args.rounds}")
        rounds.append(measure_round(args, source, settings, s3_shards))
    results = best_of(rounds)
    load_after = os.getloadavg()

    print()
    print_machine(machine, settings, source)
    print(f"load average (1 min): {load_before[0]:.2f} before, {load_after[0]:.2f} after, on {machine['cpu_count']} CPUs")
    print()
    print_table(results)
    if steps:
        print()
        print_steps(steps)
    print()
    ratios = compute_ratios(results)
    print_ratios(ratios)
    if args.json is not None:
        document = {
            "machine": machine,
            "settings": asdict(settings) | {"images": len(source.files), "source": str(source.root), "only": args.only},
            "load_average": {"before": load_before, "after": load_after},
            "results": [
                asdict(r) | {"images_per_second": r.images_per_second, "warmup_images_per_second": r.warmup_images_per_second}
                for r in results
            ],
            "ratios": ratios,
            "steps": [asdict(step) for step in steps],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.chart is not None:
        write_chart(args.chart, results, machine, settings)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        return run(args, args.work_dir)
    with tempfile.TemporaryDirectory(prefix="shardfmt-bench-") as temporary:
        return run(args, Path(temporary))


if __name__ == "__main__":
    sys.exit(main())
