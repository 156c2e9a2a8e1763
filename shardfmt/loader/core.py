"""`Loader`: shuffled batches of decoded, cropped images as torch tensors over shared memory.

Workers decode chunks of each batch straight into a ring of preallocated shared-memory slots;
the loader hands out tensors that wrap a slot without copying. The lifetime rule: **a batch's
tensors stay valid until the next batch is requested** (the next `next()` on an iterator of
this loader, or a new `iter()`); then their slot is refilled. Pass ``copy=True`` to get tensors
you may keep, or copy what you keep. With ``device="cuda"`` the loader copies each batch to the
GPU on a side stream and the slot is reused once that copy is done.

Iterations follow torch's DataLoader: every ``iter(loader)`` starts the next epoch (the first
one starts epoch 0, or the epoch given to `set_epoch`), whether or not the one before it was
finished; only the first ``iter()`` after `load_state_dict` continues the saved epoch where the
state was taken. An iterator replaced by a newer ``iter()`` (or by `set_epoch`,
`load_state_dict`, `set_size`) raises RuntimeError when advanced. Batches decoded ahead are kept
when the next iteration starts with them (a finished epoch runs on into the next one), and
discarded otherwise.

Shared memory: ``(prefetch + 1) * batch_size * (H * W * 3 + 8)`` bytes (each part rounded up to
4 KiB), plus per worker a decode buffer of the largest image it has decoded (height * width * 3
bytes). With ``fields=...``, ``(prefetch + 1) * batch_size * sum of every field's sample bytes``
(H * W * C for an image, the array's bytes, 8 for a number; each field's part rounded up to 4
KiB), plus per worker and jpeg field a decode buffer of its largest image (height * width * C
bytes). The loader holds per-shard counts and one shared bit per record (which records have
passed their checksum); `Loader()` opens no shard, and an epoch's order is computed batch by
batch (`orders`, `split`). With
``mean``/``std`` and no device, images are float32 (4 bytes a value). After `set_size` the ring is
reallocated only if the new size needs more than it has.
"""

from __future__ import annotations

import json
import math
import os
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checksum import checksum, format_checksum
from ..dataset.concat import open_records
from ..dataset.locate import classify_location
from ..dataset.reader import DatasetReader
from ..mixture import Mixture
from ..ops import Pipeline
from ..ops.augment import AugmentStep, describe_steps
from ..orders import epoch_order, resolve_order
from ..sampling import check_split, check_subset
from ..split import RankPlan, delivered_records, split_batches
from ..storage import RemoteOptions
from . import gpudecode
from .fields import FieldRequest, OutputSpec, resolve_outputs
from .options import index_output, pipeline_at, size_pair, transform_outputs
from .pool import Chunk, InlinePool, WorkerPool
from .prefetch import ShardPrefetcher
from .shm import SlotLayout, SlotRing

__all__ = ["Loader"]

_STATE_VERSION = 1


def _loader_path(path: Mixture | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Mixture | str | Path | list[str]:
    """A list of tars as strings, a URL as given, a local path as a `Path` (``file://`` stripped)."""
    if isinstance(path, Mixture):
        return path
    if isinstance(path, (list, tuple)):
        return [os.fspath(p) for p in path]
    where = classify_location(os.fspath(path))  # type: ignore[arg-type]
    return where.url if where.url is not None else Path(where.path or where.text)


def _distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank, dist.get_world_size() if world_size is None else world_size)
    return (0 if rank is None else rank, 1 if world_size is None else world_size)


@dataclass
class _Item:
    """A batch scheduled into a slot: it is ready once none of its chunks is pending or in flight."""

    epoch: int
    batch: int
    slot: int
    count: int
    start: int = 0
    """The position of the epoch's order the batch's split starts at (not 0 after an elastic resume)."""


@dataclass
class _Resources:
    """What must be released even if the loader is never closed: a weakref finaliser calls
    `release` at garbage collection or interpreter exit."""

    pool: Any = None
    ring: SlotRing | None = None
    extra: list[Any] = field(default_factory=list)

    def release(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        if self.ring is not None:
            self.ring.unlink()
            self.ring = None
        for item in self.extra:
            item.close()
        self.extra = []


class Loader:
    """Shuffled batches from a shardfmt dataset, decoded by worker processes into shared memory.

    Args:
        path: the dataset directory or its manifest.json, or a URL (``s3://bucket/prefix``, ...);
            or local WebDataset tars, as `open_dataset` takes them (a ``.tar`` path, a brace
            pattern, or a list); or a `shardfmt.Mixture` of such sources, whose records are
            numbered across the sources in the order given and of which each epoch draws
            exactly the mixture's counts (spec/sampling.md, "Mixtures").
        batch_size: records per batch.
        shuffle: a seeded permutation per epoch (else dataset order).
        seed: the permutation and augmentations are pure functions of (seed, epoch, record).
        num_workers: decoding processes (default: all cores); 0 decodes in this process.
        pipeline: "train" (RandomResizedCrop + horizontal flip), "eval" (resize shorter side to
            size/0.875, center crop), "resize" (whole image to size), or an object from
            `shardfmt.ops`.
        size: output size for the named pipelines, int or (height, width); `set_size` changes it
            between epochs.
        drop_last: drop the epoch's remainder so every batch is full (see `sampling.sample_batches`).
        layout: "NCHW" (default; a channels_last view of the slot, what convolutions run fastest
            on; use .reshape rather than .view) or "NHWC" (contiguous).
        rank, world_size: this process's share; default from torch.distributed when initialised.
        ordered: deliver batches in order (default) or as soon as each is ready.
        prefetch: batches decoded ahead of the consumer; shared memory holds prefetch + 1 slots.
        copy: hand out copies instead of views of shared memory.
        device: "cuda" (or a torch.device) to deliver batches on the GPU, copied from pinned
            memory on a side stream; None keeps them on the CPU.
        mean, std: normalise the images to float32 ``(x - mean) / std``, per channel, on the
            0-255 scale: on the device when there is one, else in the workers (channels_last
            like the uint8 images; the slots then hold float32).
        verify: check each record's XXH3-64 before it is used. True (default): for a local
            dataset, the first time this loader reads the record (the workers share one bit
            per record; a memory-mapped shard cannot change under the loader, since writers
            replace files rather than edit them), and for a URL every time its bytes are
            fetched. "always": before every use. False: never.
        fast_decode: libjpeg-turbo's fast IDCT and upsampling (default): about 5% faster; crops
            stay within 44 dB PSNR of PIL's exact decode and resize. False gives PIL's pixels (64 dB).
        start_method: multiprocessing start method; default the platform's.
        timeout: seconds without progress after which a stalled worker is reported.
        image_field, label_field: field names (label_field=None gives zero labels).
        remote: for a dataset given by URL, how to read it (range reads or a local shard cache,
            credentials, retries; see `RemoteOptions`). With a cache, the loader downloads the
            shards its coming batches need ahead of the workers.
        window: shuffle shards, then records within windows of this many shards (see
            `sampling.window_order`), so that only about `window` shards are read at a time;
            None shuffles all records at once. Works alike with `fields`. Not with a `Mixture`.
        order: how a shuffled epoch is ordered: "sorted-key" (every record's key sorted: 8
            bytes a record), "feistel" (a bijection computed batch by batch: nothing a record),
            or "auto" (default): "sorted-key" below `orders.FEISTEL_FROM` (65,536) records,
            "feistel" from there on. A `Mixture` is always "feistel".
        fields: deliver several fields as a dict of tensors instead of (images, labels): a
            mapping from field name to `shardfmt.ops.ImageOutput` (or its size, or None for
            the defaults), or a list of names. Image fields ("jpeg", "raw") are cut at the same
            place: the pipeline draws the box on the first image field and the others take it
            scaled by their size ratio, with the same flip (a jpeg field decoded at a reduced
            DCT scale snaps it to that scale, exact for whole-number ratios at proportional
            output sizes: `shardfmt.ops.scale_plan`); each has its own output size, channels
            and interpolation. "ndarray", "int64" and "float64" fields arrive as stored.
            ``image_field`` and ``label_field`` are then unused.
        return_indices: add each sample's record index in the dataset (int64, what
            ``open_dataset(path)[i]`` reads) to every batch: ``(images, labels, indices)``, or an
            "index" entry with `fields`.
        subset: the records an epoch holds: record indices (distinct, any order) or a boolean
            mask with one entry per record. Shuffled, an epoch of a subset is the full epoch's
            order with the other records left out; unshuffled, the indices' own order. Ranks,
            drop_last, `len()` and resume count the subset's records.
        augment: steps run in the workers on each sample after its crop and flip: the
            torchvision-style steps of `shardfmt.ops` (`RandomVerticalFlip`, `RandomRotation`,
            `ColorJitter`, `RandomGrayscale`) or your own picklable ``step(sample, generator)``
            (a (3, H, W) uint8 tensor and a `torch.Generator` seeded from (seed, epoch,
            record); it returns the (3, H, W) uint8 sample). Their draws are pure functions of
            (seed, epoch, record), like the crops. With `fields`, they apply to its one image
            field (three channels).
        decode: where JPEGs are decoded: "cpu" (default) in the workers; "gpu" on the CUDA
            device with nvJPEG (torchvision's batched decode), the workers still reading,
            checking and batching the bytes into shared memory; "hybrid" the first rows of each
            batch in the workers and the rest on the GPU, in proportion to their measured rates
            (`gpudecode`). The crop boxes are the CPU path's; the pixels agree with it within
            rounding (docs/gpu.md). "gpu" and "hybrid" deliver on ``device`` (default "cuda"),
            for the (images, labels) form of a jpeg field, without ``augment``.

    Raises:
        DatasetNotFoundError, ManifestError, FormatError: the dataset cannot be opened.
        SchemaError: without `fields`, the fields are not an image ("jpeg" or "raw") and an
            "int64" label; with `fields`, one is missing or cannot be delivered (str, bytes,
            json).
        ValueError: the batch split is impossible (e.g. fewer records than ranks), a subset is
            malformed, or augment/mean/std do not fit the fields.

    A failure in a worker is raised here as an instance of both `WorkerError` and the class the
    worker raised (`ChecksumError`, `DecodeError`, ...), naming the shard, record and offset,
    with the worker's traceback as its cause.

    Attributes:
        epoch: the epoch in progress (begun and not finished), else the one the next iteration
            starts.
        size: the (height, width) the images have now (see `set_size`).

    Example::

        loader = Loader("sr", batch_size=16, pipeline=RandomCrop(48),
                        fields={"lr": 48, "hr": 192, "mask": ImageOutput(192, 1, "nearest")})
        for batch in loader:
            batch["lr"], batch["hr"]   # (16, 3, 48, 48), (16, 3, 192, 192) uint8
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int | None = None,
        pipeline: Pipeline | str = "train",
        size: int | tuple[int, int] = 224,
        drop_last: bool = False,
        layout: str = "NCHW",
        rank: int | None = None,
        world_size: int | None = None,
        ordered: bool = True,
        prefetch: int = 2,
        copy: bool = False,
        device: str | torch.device | None = None,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        verify: bool | str = True,
        fast_decode: bool = True,
        start_method: str | None = None,
        timeout: float = 120.0,
        image_field: str = "image",
        label_field: str | None = "label",
        fields: FieldRequest | None = None,
        remote: RemoteOptions | None = None,
        window: int | None = None,
        order: str = "auto",
        return_indices: bool = False,
        subset: Sequence[int] | np.ndarray | None = None,
        augment: Sequence[AugmentStep] | None = None,
        decode: str = "cpu",
    ) -> None:
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be 'NHWC' or 'NCHW', got {layout!r}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1 shard, got {window}")
        self.path: Mixture | str | Path | list[str] = _loader_path(path)
        self._mixture = self.path if isinstance(self.path, Mixture) else None
        if self._mixture is not None and window is not None:
            raise ValueError("window does not apply to a Mixture: its order interleaves every source")
        self.window = window
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_workers = (os.cpu_count() or 1) if num_workers is None else num_workers
        self.drop_last = drop_last
        self.layout = layout
        self.rank, self.world_size = _distributed_defaults(rank, world_size)
        self.ordered = ordered
        self.prefetch = prefetch
        self.copy = copy
        self.timeout = timeout
        self.return_indices = return_indices
        self.augment: list[AugmentStep] = list(augment or [])
        # Where the stream stands: `epoch` is the epoch in progress, or the one the next iter()
        # starts; `_started` says an iter() has begun it (so the next one moves on), `_resume`
        # that load_state_dict asked the next iter() to continue it.
        self.epoch = 0
        self._position = 0
        self._start_position = 0
        self._delivered: set[int] = set()
        self._started = False
        self._resume = False
        self._generation = 0
        self._held: tuple[int, Any] | None = None

        if verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always', got {verify!r}")
        self._dataset = open_records(self.path, verify=bool(verify), remote=remote)
        self._fields = fields is not None
        self._request = {"fields": fields, "image_field": image_field, "label_field": label_field}
        self._pipeline_request = pipeline
        self.num_records = self._mixture.epoch_size if self._mixture is not None else len(self._dataset)
        """Records of the dataset, or the mixture's epoch size."""
        if subset is not None and self._mixture is not None:
            raise ValueError("subset does not apply to a Mixture: its weights and epoch_size choose the records of an epoch")
        self._subset = None if subset is None else check_subset(subset, self.num_records)
        self._epoch_records = self.num_records if self._subset is None else len(self._subset)
        """Records of an epoch: the subset's, or all of them."""
        self.order = resolve_order(order, num_records=self.num_records, mixture=self._mixture is not None)
        self._source_counts = self._mixture.counts if self._mixture is not None else None
        if self._mixture is not None:
            for name, records, count in zip(self._mixture.names, self._dataset.sizes, self._source_counts):  # type: ignore[union-attr, arg-type]
                if count and not records:
                    raise ValueError(f"source {name!r} of the mixture holds no records but is to give {count} an epoch")
        check_split(self._epoch_records, batch_size=batch_size, world_size=self.world_size, drop_last=drop_last)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside [0, {self.world_size})")
        self._device = torch.device(device) if device is not None else None
        self._gpu = gpudecode.open_stage(
            decode, device=self._device, dataset=self._dataset, field=image_field, workers=self.num_workers, fields=self._fields, augment=bool(self.augment)
        )
        if self._gpu is not None:
            self._device = self._gpu.device
        if self._fields and (mean is not None or std is not None):
            raise ValueError("mean and std normalise the images of the (images, labels) form; with fields=..., normalise the fields yourself")
        self._normalise_here = self._device is None and (mean is not None or std is not None)
        self._mean, self._std = mean, std
        self._common_config: dict[str, Any] = {
            "path": self.path if isinstance(self.path, (list, Mixture)) else str(self.path),
            "remote": remote,
            "verify": bool(verify),
            "verify_every_read": verify == "always" or self._dataset.is_remote,
            "seed": seed,
            "fast_decode": fast_decode,
            "batch_size": batch_size,
            "num_slots": prefetch + 1,
        }
        self._size_request = size
        self._configure(None)
        self._chunk = max(1, min(64, math.ceil(batch_size / (2 * max(1, self.num_workers)))))
        self._start_method = start_method
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.release)
        self._pool: WorkerPool | InlinePool | None = None
        self._ring: SlotRing | None = None
        self._memory: bytearray | None = None
        self._checked: Any = None
        self._free: list[int] = []
        self._queue: deque[_Item] = deque()
        self._pending: deque[Chunk] = deque()
        self._plans: dict[tuple[int, int], RankPlan] = {}
        self._shard_sizes = np.diff(self._dataset.cumulative)
        self._prefetcher: ShardPrefetcher | None = None
        if isinstance(self._dataset, DatasetReader) and self._dataset.location.cache is not None and remote is not None and remote.prefetch_shards:
            self._prefetcher = ShardPrefetcher(self._dataset, ahead=remote.prefetch_shards, threads=remote.prefetch_threads)
            self._resources.extra.append(self._prefetcher)
        self._closed = False
        self._stage: Any = None
        if self._device is not None and (self._gpu is None or self._device.type == "cuda"):
            from .cuda import DeviceStage

            self._stage = DeviceStage(self._device, mean=mean, std=std, layout=layout)

    # -- public -------------------------------------------------------------------------------

    @property
    def shared_memory_bytes(self) -> int:
        """Bytes of shared memory the slot ring uses (see the module docstring): what the current
        size needs, or what the ring holds if a larger size allocated more."""
        capacity = self._ring.capacity if self._ring is not None and self.num_workers else 0
        return max(self.layout_spec.total_bytes, capacity)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (empty before the first iteration or with num_workers=0)."""
        return [p.pid for p in self._pool.processes] if isinstance(self._pool, WorkerPool) else []

    def __len__(self) -> int:
        """Batches per epoch on this rank (a whole epoch: one resumed on other ranks may have fewer)."""
        return split_batches(self._epoch_records, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration start at the beginning of `epoch`."""
        self.epoch, self._position, self._start_position, self._delivered = epoch, 0, 0, set()
        self._started = self._resume = False
        self._generation += 1

    def set_size(self, size: int | tuple[int, int]) -> None:
        """Deliver images of `size` ((height, width) or one int) from the next iteration on, for
        progressive resizing. The pipeline keeps its parameters and draws (a named pipeline is
        made again for the size; a `CenterCrop`'s ``resize`` scales with it). The workers restart
        with the new size; the shared memory is reallocated only if the new size needs more than
        it holds. Batches decoded ahead are discarded, and an iterator in progress ends (it
        raises RuntimeError if advanced). `state_dict` records the size, and `load_state_dict`
        sets it again.

        Raises:
            ValueError: `size` is malformed, or the loader delivers `fields` (make a new loader).
            RuntimeError: the loader is closed.
        """
        if self._closed:
            raise RuntimeError("this Loader is closed")
        if self._fields:
            raise ValueError("set_size changes the size of the (images, labels) form; with fields=..., make a loader for the new sizes")
        pair = size_pair(size)
        if pair == self.size:
            return
        self._stop_workers()
        self._configure(pair)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: load it into a loader with the same settings to continue
        with exactly the batches that would have come next (at the same size)."""
        epoch, position, start, delivered = self._progress()
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "position": position,
            "start": start,
            "delivered": delivered,
            "size": list(self.size),
            "settings": self._settings(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()`: the next ``iter()`` resumes the saved epoch where the
        state was taken, at the size it was taken at.

        On the same rank of the same world size, the stream continues with exactly the batches
        that would have come next. On another world size (elastic resume; or another rank), the
        state must have been taken after the same number of batches on every rank: the rest of
        its epoch is then exactly the records no rank had delivered, split equally over the new
        ranks (spec/sampling.md, "Resuming on another number of ranks"); later epochs are whole.

        Raises:
            ValueError: the state comes from a loader with other settings (seed, batch size,
                dataset size, subset, order, augmentation, ...), which would not continue the same
                stream; or, resumed on other ranks, it holds batches delivered out of order
                (``ordered=False``), or what is left of its epoch cannot be split equally over the
                new ranks.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r} is not {_STATE_VERSION}")
        theirs = dict(state.get("settings", {}))
        theirs.setdefault("order", "sorted-key")  # states of shardfmt 0.1, which had that order only
        saved_size = state.get("size")
        if "augment" not in theirs:  # a state from before augment, subset and set_size
            theirs |= {"augment": "", "subset": None}
            pipeline = json.loads(theirs.get("pipeline", "{}"))
            saved_size = pipeline.pop("size", saved_size)
            theirs["pipeline"] = json.dumps(pipeline, sort_keys=True)
        size = size_pair(saved_size) if saved_size is not None and not self._fields else self.size
        ours = self._settings(size)
        changed = sorted(k for k in set(ours) | set(theirs) if k not in ("rank", "world_size") and theirs.get(k) != ours.get(k))
        if changed:
            detail = ", ".join(f"{k}: {theirs.get(k)!r} -> {ours.get(k)!r}" for k in changed)
            raise ValueError(f"loader state was saved with other settings ({detail})")
        if size != self.size:
            self.set_size(size)
        epoch, position, start = int(state["epoch"]), int(state["position"]), int(state.get("start", 0))
        delivered = {int(b) for b in state.get("delivered", [])}
        if (theirs.get("rank"), theirs.get("world_size")) == (self.rank, self.world_size):
            self.epoch, self._position, self._start_position, self._delivered = epoch, position, start, delivered
            if self._position >= len(self._plan(self.epoch)):  # an earlier build's state at an epoch's end
                self.epoch, self._position, self._start_position, self._delivered = self.epoch + 1, 0, 0, set()
        else:
            if delivered:
                raise ValueError(
                    "this state holds batches delivered out of order (ordered=False); it resumes on the ranks it was saved on only"
                )
            done = start + delivered_records(
                self._epoch_records - start, batch_size=self.batch_size, world_size=int(theirs["world_size"]), drop_last=self.drop_last, batches=position
            )
            remaining = self._epoch_records - done
            if remaining and not (self.drop_last and remaining < self.world_size * self.batch_size):
                try:
                    check_split(remaining, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last)
                except ValueError as err:
                    raise ValueError(f"the rest of epoch {epoch} cannot go to {self.world_size} ranks: {err}; set_epoch({epoch + 1}) starts the next epoch") from err
            self.epoch, self._position, self._start_position, self._delivered = epoch, 0, done, set()
        self._started, self._resume = False, True
        self._generation += 1

    def close(self) -> None:
        """Stop the workers and remove the shared memory. Safe to call more than once."""
        self._closed = True
        self._generation += 1
        self._pool = None
        self._held = None
        self._finalizer()
        self._dataset.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        """Start the next epoch (see the module docstring) and yield its batches as (images,
        labels), with `return_indices` (images, labels, indices), or with `fields` a dict from
        field name to tensor."""
        if self._closed:
            raise RuntimeError("this Loader is closed")
        if self._resume:
            self._resume = False
        elif self._started:
            self.epoch, self._position, self._delivered = self.epoch + 1, 0, set()
        self._started = True
        self._generation += 1
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self._stream(self._generation)

    # -- internals ----------------------------------------------------------------------------

    def _configure(self, size: tuple[int, int] | None) -> None:
        """Resolve the outputs and the workers' config: at `size`, or as the loader was made."""
        request = self._pipeline_request
        if size is not None and not isinstance(request, str):
            request = pipeline_at(request, size)
        self.pipeline, outputs = resolve_outputs(self._dataset, pipeline=request, size=size or self._size_request, **self._request)  # type: ignore[arg-type]
        self.size: tuple[int, int] = self.pipeline.size
        outputs, transform = transform_outputs(
            outputs, augment=self.augment, mean=self._mean if self._normalise_here else None, std=self._std if self._normalise_here else None
        )
        if self.return_indices:
            outputs = outputs + (index_output(fields=self._fields, names=[spec.name for spec in outputs]),)
        self.outputs: tuple[OutputSpec, ...] = outputs
        self.image_shape = self.outputs[0].shape if not self._fields else None
        arrays = tuple(spec.slot_array() for spec in self.outputs)
        if self._gpu is not None:
            arrays += self._gpu.slot_arrays()
        self.layout_spec = SlotLayout(self.prefetch + 1, self.batch_size, arrays)
        self._config = self._common_config | {
            "outputs": [spec.to_config() for spec in self.outputs],
            "pipeline": self.pipeline.to_config(),
            "slot_arrays": [array.to_config() for array in arrays],
            "transform": transform,
            "gpu_decode": self._gpu.config() if self._gpu is not None else None,
        }

    def _progress(self) -> tuple[int, int, int, list[int]]:
        """(epoch, position, start, delivered batches past it) as a resumed loader takes them: an
        epoch whose batches have all been handed out resumes as the next one."""
        if self._started and self._position >= len(self._plan(self.epoch)):
            return self.epoch + 1, 0, 0, []
        return self.epoch, self._position, self._start_position, sorted(b for b in self._delivered if b >= self._position)

    def _settings(self, size: tuple[int, int] | None = None) -> dict[str, Any]:
        pipeline = pipeline_at(self._pipeline_request, size) if size is not None and size != self.size else self.pipeline
        shape = {k: v for k, v in pipeline.to_config().items() if k != "size"}  # the state records the size itself
        subset = None if self._subset is None else format_checksum(checksum(self._subset.astype("<i8").tobytes()))
        return {
            "seed": self.seed,
            "num_records": self.num_records,
            "subset": subset,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "rank": self.rank,
            "world_size": self.world_size,
            "ordered": self.ordered,
            "window": self.window,
            "order": self.order,
            "pipeline": json.dumps(shape, sort_keys=True),
            "augment": describe_steps(self.augment),
        } | ({"fields": json.dumps([spec.to_config() for spec in self.outputs], sort_keys=True)} if self._fields else {}) | (
            {"mixture": json.dumps(self._mixture.to_config() | {"sizes": self._dataset.sizes}, sort_keys=True)} if self._mixture is not None else {}  # type: ignore[union-attr]
        )

    def _start(self) -> None:
        if self._pool is not None:
            return
        layout = self.layout_spec
        if self.num_workers == 0:
            if self._memory is None or len(self._memory) < layout.total_bytes:
                self._memory = bytearray(layout.total_bytes)
            self._ring = SlotRing("in-process", layout, memoryview(self._memory), None)
            self._pool = InlinePool(config=self._config, ring=self._ring, checked=self._checked)
            self._checked = self._pool.processor.checked
        else:
            if self._ring is not None and self._ring.capacity >= layout.total_bytes:
                self._ring = self._ring.with_layout(layout)
            else:
                if self._ring is not None:
                    self._ring.unlink()
                self._ring = SlotRing.create(layout)
            self._resources.ring = self._ring
            self._pool = WorkerPool(
                config=self._config,
                ring=self._ring,
                num_workers=self.num_workers,
                start_method=self._start_method,
                timeout=self.timeout,
                dataset=self._dataset,
                checked=self._checked,
            )
            self._checked = self._pool.checked
        self._resources.pool = self._pool
        self._free = list(range(layout.num_slots))
        self._tensors = [{name: torch.from_numpy(array) for name, array in slot.items()} for slot in self._ring.arrays]
        if self._stage is not None:
            self._stage.pin(self._ring)

    def _stop_workers(self) -> None:
        """Stop the workers and forget what was scheduled; the ring and the checked records stay."""
        self._generation += 1
        self._held = None
        if self._pool is not None:
            self._pool.shutdown()
        self._pool = self._resources.pool = None
        self._queue.clear()
        self._pending.clear()
        self._free = []
        if self._stage is not None:
            self._stage.unpin()

    def _plan_start(self, epoch: int) -> int:
        """Where this loader's split of `epoch` starts in its order (0 but after an elastic resume)."""
        return self._start_position if epoch == self.epoch else 0

    def _plan(self, epoch: int) -> RankPlan:
        start = self._plan_start(epoch)
        plan = self._plans.get((epoch, start))
        if plan is None:
            order = epoch_order(
                self.order,
                num_records=self.num_records,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                shard_sizes=self._shard_sizes if self.window is not None else None,
                window=self.window,
                source_sizes=self._dataset.sizes if self._mixture is not None else None,  # type: ignore[union-attr]
                source_counts=self._source_counts,
                subset=self._subset,
            )
            plan = RankPlan(order, batch_size=self.batch_size, rank=self.rank, world_size=self.world_size, drop_last=self.drop_last, start=start)
            self._plans = {k: p for k, p in self._plans.items() if k[0] >= epoch - 1}
            self._plans[(epoch, start)] = plan
        return plan

    def _reconcile(self, epoch: int, expected: list[int]) -> tuple[int, int]:
        """Keep batches already scheduled if they are exactly what comes next (the start of this
        epoch's remaining batches, then the start of the next epoch); else discard them.
        Returns the scheduling cursor (epoch, index into that epoch's list)."""
        start = self._plan_start(epoch)
        ours = [item.batch for item in self._queue if item.epoch == epoch and item.start == start]
        ahead = [item.batch for item in self._queue if item.epoch == epoch + 1 and item.start == 0]
        keep = (
            len(ours) + len(ahead) == len(self._queue)
            and ours == expected[: len(ours)]
            and ahead == list(range(len(ahead)))
            and (not ahead or len(ours) == len(expected))
        )
        if not keep:
            self._pending.clear()
            self._pool.drain()  # type: ignore[union-attr]
            self._queue.clear()
            self._free = list(range(self.layout_spec.num_slots))
            return epoch, 0
        return (epoch + 1, len(ahead)) if ahead else (epoch, len(ours))

    def _schedule(self, cursor: tuple[int, int], expected: list[int]) -> tuple[int, int]:
        """Fill free slots with the next batches, running on into the next epoch."""
        epoch, index = cursor
        while self._free:
            if epoch == self.epoch:
                if index >= len(expected):
                    epoch, index = epoch + 1, 0
                    continue
                batch = expected[index]
            else:
                plan_next = self._plan(epoch)
                if index >= len(plan_next) or epoch > self.epoch + 1:
                    break
                batch = index
            indices = self._plan(epoch).batch(batch)
            if self._prefetcher is not None:
                self._prefetcher.schedule(epoch, self._plan(epoch), batch)
            slot = self._free.pop()
            if self._gpu is not None:
                self._gpu.assign(self._ring.arrays[slot], len(indices))  # type: ignore[union-attr]
            self._queue.append(_Item(epoch, batch, slot, len(indices), self._plan_start(epoch)))
            for row in range(0, len(indices), self._chunk):
                self._pending.append((slot, row, epoch, np.ascontiguousarray(indices[row : row + self._chunk])))
            index += 1
        return epoch, index

    def _take_ready(self, epoch: int) -> _Item | None:
        busy = self._pool.busy_slots | {chunk[0] for chunk in self._pending}  # type: ignore[union-attr]
        for position, item in enumerate(self._queue):
            if item.epoch != epoch:
                return None
            if item.slot not in busy:
                del self._queue[position]
                return item
            if self.ordered:
                return None
        return None

    def _release_held(self) -> None:
        """Give back the slot of the batch handed out last, once its copy to the device is done."""
        if self._held is not None:
            slot, done = self._held
            self._held = None
            if done is not None:
                done.synchronize()  # the copy out of the slot is over before the slot is refilled
            self._free.append(slot)

    def _package(self, tensors: dict[str, torch.Tensor]) -> Any:
        """The batch as handed out: the dict of every field, or (images, labels[, indices])."""
        if self._fields:
            return tensors
        return tuple(tensors[spec.name] for spec in self.outputs)

    def _deliver(self, tensors: dict[str, torch.Tensor]) -> Any:
        """Images NCHW (a channels_last view) if asked, then the batch as handed out."""
        if self.layout == "NCHW":
            tensors = {spec.name: tensors[spec.name].permute(0, 3, 1, 2) if spec.is_image else tensors[spec.name] for spec in self.outputs}
        return self._package(tensors)

    def _stream(self, generation: int) -> Iterator[Any]:
        epoch = self.epoch
        plan = self._plan(epoch)
        expected = [b for b in range(self._position, len(plan)) if b not in self._delivered]
        replaced = False
        try:
            self._release_held()
            cursor = self._reconcile(epoch, expected)
            remaining = len(expected)
            while remaining:
                cursor = self._schedule(cursor, expected)
                self._pool.feed(self._pending)  # type: ignore[union-attr]
                item = self._take_ready(epoch)
                if item is None:
                    self._pool.wait()  # type: ignore[union-attr]
                    continue
                remaining -= 1
                self._delivered.add(item.batch)
                while self._position in self._delivered:
                    self._delivered.discard(self._position)
                    self._position += 1
                tensors = {name: tensor[: item.count] for name, tensor in self._tensors[item.slot].items()}
                if self._gpu is not None:
                    stream = self._stage.stream if self._stage is not None else None
                    tensors = self._gpu.decode(tensors, self._ring.arrays[item.slot], stream=stream)  # type: ignore[union-attr]
                if self._stage is not None:
                    images = {spec.name for spec in self.outputs if spec.is_image}
                    tensors, done = self._stage.transfer(tensors, images)
                    self._held = (item.slot, done)
                    batch = self._package(tensors)
                elif self.copy:
                    tensors = {name: tensor.clone() for name, tensor in tensors.items()}
                    self._free.append(item.slot)
                    batch = self._deliver(tensors)
                else:
                    self._held = (item.slot, None)
                    batch = self._deliver(tensors)
                yield batch
                if generation != self._generation:
                    replaced = True
                    break
                self._release_held()
            if not replaced:
                self.epoch, self._position, self._start_position, self._delivered, self._started = epoch + 1, 0, 0, set(), False
        except GeneratorExit:
            raise
        except BaseException:
            self.close()
            raise
        if replaced:
            raise RuntimeError(
                "this iterator of the Loader was replaced by a newer iter(loader) (or set_epoch, "
                "load_state_dict, set_size): each iter() starts an epoch of its own"
            )
