"""`Loader`: shuffled batches of decoded, cropped images as torch tensors over shared memory.

Workers decode chunks of each batch straight into a ring of preallocated shared-memory slots;
the loader hands out tensors that wrap a slot without copying. The lifetime rule: **batches are
yours; what is kept is set aside, not overwritten.** Labels, indices and every field of one
number a sample are copies; images (and array fields) view their slot, which is refilled only
once nothing the caller holds views it any more; a slot still held when its turn comes is left
to the caller and a fresh one takes its place (`lending` says when, and what it costs). Pass
``copy=True`` to get images in plain memory. With ``device="cuda"`` the loader copies each batch
to the GPU on a side stream and the slot is reused once that copy is done.

Iterations follow torch's DataLoader: each ``iter(loader)`` that is advanced starts the next
epoch (first epoch 0, or the one given to `set_epoch`), finished or not; only the first after
`load_state_dict` continues the saved epoch. An ``iter()`` never advanced starts none. An
iterator replaced by a newer ``iter()`` (or `set_epoch`, `load_state_dict`, `set_size`) raises
RuntimeError when advanced. Batches decoded ahead are kept when the next iteration starts with
them, and discarded otherwise.

Shared memory: ``(prefetch + 1) * batch_size * (H * W * 3 + 8)`` bytes (each part rounded up to
4 KiB), plus per worker a decode buffer of the largest image it has decoded (height * width * 3
bytes), plus the slots set aside while the caller holds them. With ``fields=...``,
``(prefetch + 1) * batch_size * sum of every field's sample bytes`` (H * W * C for an image, the
array's bytes, 8 for a number; each field's part rounded up to 4 KiB), plus per worker and jpeg
field a decode buffer of its largest image (height * width * C bytes). The loader holds
per-shard counts and one shared bit per record (which records have passed their checksum);
`Loader()` opens no shard, and an epoch's order is computed batch by batch (`orders`, `split`).
With ``mean``/``std`` and no device, images are float32 (4 bytes a value). After `set_size` the
ring is reallocated only if the new size needs more than it has.

The loader is a facade: its keyword arguments become a frozen `LoaderOptions` (`options`), the
stream's position is a `Cursor` (`cursor`), the slots, workers, queue and device stage are a
`Scheduler` (`scheduler`), and an iteration runs the two together (`stream`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._dataset.concat import open_records
from .._sampling.mixture import Mixture
from .._sampling.ranks import split_batches
from .._storage import RemoteOptions
from ..ops import Pipeline
from ..ops._augment import AugmentStep
from ..ops._batch import BatchStep
from .attributes import LoaderAttributes
from .config import DistributedRanks, configure, loader_path, open_stages, settings, worker_start_method
from .cursor import Cursor, SavedState
from .epoch import EpochBatches, EpochRecords, Epochs, EpochSampler
from .form import refuse_with_fields
from .options import LoaderOptions, pipeline_at, size_pair
from .outputs import FieldRequest
from .pool import WorkerPool
from .scheduler import Scheduler
from .shm import check_slot_memory
from .stream import stream_batches
from .values import split_values

__all__ = ["Loader"]


class Loader(LoaderAttributes):
    """Shuffled batches from a shardfmt dataset, decoded by worker processes into shared memory.

    Args:
        path: the dataset directory or its manifest.json (``~`` expanded), or a URL (``s3://bucket/prefix``, ...);
            or local WebDataset tars, as `open_dataset` takes them (a ``.tar`` path, a brace
            pattern, or a list); or a `shardfmt.Mixture` of such sources, whose records are
            numbered across the sources in the order given and of which each epoch draws
            exactly the mixture's counts (spec/sampling.md, "Mixtures").
        batch_size: records per batch.
        shuffle: a seeded permutation per epoch (else dataset order).
        seed: the permutation and augmentations are pure functions of (seed, epoch, record).
        num_workers: decoding processes (default: all cores); 0 decodes in this process.
        pipeline: "train" (RandomResizedCrop + horizontal flip), "eval" (resize shorter side to
            size/0.875, center crop), "resize" (whole image to size), or a `shardfmt.ops.Pipeline`:
            one of `shardfmt.ops` or an object of your own (docs/augmentation.md).
        size: output size for the named pipelines, int or (height, width); `set_size` changes it
            between epochs.
        drop_last: drop the epoch's remainder so every batch is full (see `sampling.keys.sample_batches`).
        layout: "NCHW" (default; a channels_last view of the slot, what convolutions run fastest
            on; use .reshape rather than .view) or "NHWC" (contiguous).
        rank, world_size: this process's share; where not given, torch.distributed's when it is
            initialised as each epoch starts (the loader may be made before the process group).
        ordered: deliver batches in order (default) or as soon as each is ready.
        prefetch: batches decoded ahead of the consumer; shared memory holds prefetch + 1 slots.
        copy: hand out copies instead of views of shared memory.
        device: "cuda" (or a torch.device) to deliver batches on the GPU, copied from pinned
            memory on a side stream; None keeps them on the CPU.
        mean, std: normalise the images to float32 ``(x - mean) / std``, per channel, on the
            0-255 scale: on the device when there is one, else in the workers (channels_last
            like the uint8 images; the slots then hold float32). With `fields`, they normalise its
            one image field (three channels).
        verify: check each record's XXH3-64 before it is used. True (default): for a local
            dataset, the first time this loader reads the record (the workers share one bit
            per record; a memory-mapped shard cannot change under the loader, since writers
            replace files rather than edit them), and for a URL every time its bytes are
            fetched. "always": before every use. False: never. What is checked: a binary
            shard's record checksum covers every field of the record; a tar shard's image
            member is checked against its checksum and every member field (captions, JSON,
            bytes: checked each time it is read, with True as with "always") against the
            member's own checksum in the member index; labels and keys are values of the
            index, checked when it is opened. An index written before member checksums
            existed has none: its member fields are then read unchecked.
        fast_decode: libjpeg-turbo's fast IDCT and upsampling (default): about 5% faster; crops
            stay within 44 dB PSNR of PIL's exact decode and resize. False gives PIL's pixels (64 dB).
            A `CenterCrop` (``pipeline="eval"``) always decodes exactly, to give torchvision's
            ``Resize`` + ``CenterCrop`` pixels (spec/sampling.md, "The evaluation rule").
        start_method: multiprocessing start method; default the platform's, but forkserver for a
            ``gs://`` dataset, which gcsfs reads over gRPC (gRPC does not survive fork).
        timeout: seconds without progress after which a stall is reported, in a worker or, with
            num_workers=0, in this process's main thread (docs/limits.md).
        image_field, label_field: field names (label_field=None gives zero labels; over a dataset
            without labels, such as image-text tars, the default "label" gives the images alone).
        remote: for a dataset given by URL, how to read it (range reads or a local shard cache,
            credentials, retries; see `RemoteOptions`). With a cache, the loader downloads the
            shards its coming batches need ahead of the workers.
        window: shuffle shards, then records within windows of this many shards (see
            `sampling.keys.window_order`), so that only about `window` shards are read at a time;
            None shuffles all records at once. Works alike with `fields`. Not with a `Mixture`.
        order: how a shuffled epoch is ordered: "sorted-key" (every record's key sorted: 8
            bytes a record), "feistel" (a bijection computed batch by batch: nothing a record),
            or "auto" (default): "sorted-key" below `sampling.orders.FEISTEL_FROM` (65,536) records,
            "feistel" from there on. A `Mixture` is always "feistel".
        fields: deliver several fields as a dict of tensors instead of (images, labels): a
            mapping from field name to `shardfmt.ops.ImageOutput` (or its size, or None for
            the defaults), or a list of names. Image fields ("jpeg", "raw") are cut at the same
            place: the pipeline draws the box on the first image field and the others take it
            scaled by their size ratio, with the same flip (a jpeg field decoded at a reduced
            DCT scale snaps it to that scale, exact for whole-number ratios at proportional
            output sizes: `shardfmt.ops._crop.scale_plan`); each has its own output size, channels
            and interpolation. "ndarray", "int64" and "float64" fields arrive as stored.
            "str", "json" and "bytes" fields (captions, metadata, keys: give None) arrive as
            lists of one value a sample (str, the parsed JSON value, bytes), read in this
            process for the batch's records; they need an image or number field beside them.
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
            `ColorJitter`, `RandomGrayscale`, `TrivialAugmentWide`, `RandAugment`, `AutoAugment`,
            `RandomErasing`: docs/augmentation.md) or any picklable callable taking ``(sample)`` (a
            torchvision transform, a `torch.nn.Module`) or ``(sample, generator)`` (a (3, H, W)
            uint8 tensor and a `torch.Generator` seeded from (seed, epoch, record); it returns
            the (3, H, W) uint8 sample). Before each such step the worker's global torch,
            numpy and `random` generators are seeded from (seed, epoch, record, step). Their
            draws are pure functions of (seed, epoch, record), like the crops. With `fields`,
            they apply to its one image field (three channels). A `RandomErasing` whose value
            is "mean" fills with `mean` (needed), 0 after the normalisation.
        decode: where JPEGs are decoded: "cpu" (default) in the workers; "gpu" on the CUDA
            device with nvJPEG (torchvision's batched decode), the workers still reading,
            checking and batching the bytes into shared memory; "hybrid" the first rows of each
            batch in the workers and the rest on the GPU, in proportion to their measured rates
            (`gpudecode`). The crop boxes are the CPU path's; the pixels agree with it within
            rounding (docs/gpu.md). "gpu" and "hybrid" deliver on ``device`` (default "cuda"),
            for the (images, labels) form of a jpeg field, without ``augment``.
        interpolation: the crop's resize, "bilinear" (default) or "bicubic", both antialiased
            (PIL's and torchvision's results), or "nearest" (PIL's ``NEAREST``, torchvision's
            ``NEAREST`` on PIL images and ``NEAREST_EXACT`` on tensors; no DCT-scaled decode),
            for every pipeline; an `ImageOutput` given in `fields` keeps its own.
        repeats: repeated augmentation (DeiT's RASampler): each record `repeats` times an
            epoch, every copy with its own crop and draws, the copies of a record on
            consecutive ranks; `len()` and the state count the copies (spec/sampling.md).
        repeats_epoch: with `repeats` k, "copies" (default): an epoch of k N samples, every
            copy of every record; "records": an epoch of N samples, as RASampler's (the first
            N of those positions: about N / k records, k copies each), so that epoch-based
            schedules need no dividing by k.
        batch_augment: batch steps (`shardfmt.ops.MixUp`, `CutMix`, `RandomChoice`, or a
            `shardfmt.ops.BatchStep` of your own) run on
            each batch as it leaves the loader (on the device after the transfer with
            `device`): the labels become soft labels (N x num_classes float32), the images
            float; drawn from (seed, epoch, batch), so a resume mixes the same way.

    Raises:
        DatasetNotFoundError, ManifestError, FormatError: the dataset cannot be opened.
        SchemaError: without `fields`, the fields are not an image ("jpeg" or "raw") and an
            "int64" label; with `fields`, one is missing or cannot be delivered (str, bytes,
            json).
        ValueError: the batch split is impossible (e.g. fewer records than ranks), a subset is
            malformed, or augment/mean/std do not fit the fields.
        TypeError: a step is not callable, takes neither (sample) nor (sample, generator), or
            cannot be pickled where the start method needs it (spawn, forkserver).

    A failure in a worker is raised here as an instance of both `WorkerError` and the class the
    worker raised (`ChecksumError`, `DecodeError`, ...), naming the shard, record and offset,
    with the worker's traceback as its cause.

    Attributes:
        epoch: the epoch in progress (begun and not finished), else the one the next iteration
            starts.
        size: the (height, width) the images have now (see `set_size`).
        options: the arguments as a frozen `LoaderOptions`.
        dataset: the records an epoch draws from (`EpochRecords`: ``len``, ``classes``,
            ``[i]`` the record), as torch's DataLoader has it; batch_size, drop_last,
            num_workers, sampler (``set_epoch``), batch_sampler (`EpochBatches`), pin_memory
            likewise: what Lightning and Accelerate read (docs/frameworks.md).

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
        interpolation: str = "bilinear",
        repeats: int = 1,
        batch_augment: Sequence[BatchStep] | None = None,
        repeats_epoch: str = "copies",
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k not in ("self", "path")}
        self.path: Mixture | str | Path | list[str] = loader_path(path)
        arguments["start_method"] = worker_start_method(self.path, start_method)
        self.options = options = LoaderOptions.parse(**arguments)
        self._mixture = self.path if isinstance(self.path, Mixture) else None
        if self._mixture is not None and window is not None:
            raise ValueError("window does not apply to a Mixture: its epochs interleave the sources record by record")
        self._ranks = DistributedRanks(rank, world_size)
        self.rank, self.world_size = self._ranks.resolve()
        self._dataset = open_records(self.path, verify=bool(verify), remote=remote)
        self._fingerprint = self._dataset.fingerprint
        self._epochs = Epochs(options, self._dataset, mixture=self._mixture, rank=self.rank, world_size=self.world_size)
        self.num_records = self._epochs.num_records
        """Records of the dataset, or the mixture's epoch size."""
        self.order = self._epochs.order
        self.cursor = Cursor(
            self._epochs.order_of,
            epoch_records=self._epochs.epoch_positions,
            batch_size=batch_size,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=drop_last,
        )
        stages = open_stages(options, self._dataset)
        self._gpu = stages.gpu
        self._values = split_values(self._dataset.schema, fields)[1]
        """Fields delivered as lists, read here for each batch (`values.read_values`)."""
        self.scheduler = Scheduler(options, self._dataset, prefetcher=stages.prefetcher, stage=stages.device, gpu=self._gpu)
        self._configure(None)
        self._finalizer = self.scheduler.finalizer(self)
        self._closed = False
        self.sampler = EpochSampler(self.set_epoch)
        self.batch_sampler = EpochBatches(self.sampler, batch_size=batch_size, drop_last=drop_last, plan=self._plan)

    @property
    def dataset(self) -> EpochRecords:
        """The records an epoch draws from, as torch's `torch.utils.data.DataLoader.dataset`."""
        return EpochRecords(self._dataset, subset=self._epochs.subset, epoch_records=self._epochs.epoch_records)

    @property
    def shared_memory_bytes(self) -> int:
        """Bytes of shared memory the slot ring uses (see the module docstring): what the current
        size needs, or what the ring holds if a larger size allocated more."""
        return self.scheduler.shared_memory_bytes

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (empty before the first iteration or with num_workers=0)."""
        pool = self.scheduler.pool
        return [p.pid for p in pool.processes] if isinstance(pool, WorkerPool) else []

    def __len__(self) -> int:
        """Batches per epoch on this rank (a whole epoch: one resumed on other ranks may have fewer)."""
        self._follow_ranks()
        return split_batches(self._epochs.epoch_positions, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration start at the beginning of `epoch`; for the epoch the next one
        starts anyway (fresh, or continued after `load_state_dict`), change nothing (`Cursor.set_epoch`).

        Raises:
            TypeError, ValueError: `epoch` is not an int in [0, 2**32 - 1] (`cursor.MAX_EPOCH`).
        """
        self.cursor.set_epoch(epoch)

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
        if self.form.fields:
            raise refuse_with_fields("set_size")
        pair = size_pair(size)
        if pair == self.size:
            return
        self.cursor.generation += 1
        self.scheduler.stop()
        self._configure(pair)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: load it into a loader with the same settings to continue
        with exactly the batches that would have come next (at the same size)."""
        self._follow_ranks()
        return self.cursor.state(size=self.size, settings=self._settings())

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
        saved = SavedState.read(state)
        self._follow_ranks(force=True)
        size = size_pair(saved.size) if saved.size is not None and not self.form.fields else self.size
        saved.check_settings(self._settings(size))
        if size != self.size:
            self.set_size(size)
        self.cursor.restore(saved)

    def close(self) -> None:
        """Stop the workers and remove the shared memory. Safe to call more than once. Batches
        the caller still holds stay valid."""
        self._closed = True
        self.cursor.generation += 1
        self.scheduler.close(self._finalizer)
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
        self._follow_ranks(force=True)
        generation = self.cursor.begin()
        try:
            self.scheduler.start()
        except BaseException:
            self.close()
            raise
        return stream_batches(self.cursor, self.scheduler, generation, dataset=self._dataset, values=self._values, close=self.close)

    # -- internals ----------------------------------------------------------------------------

    def _configure(self, size: tuple[int, int] | None) -> None:
        """Resolve the outputs and the workers' config: at `size`, or as the loader was made.

        Raises:
            ValueError: the batch slots would not fit the memory there is for them.
        """
        made = configure(self.options, self._dataset, path=self.path, size=size, gpu=self._gpu)
        check_slot_memory(made.config.layout, batch_size=self.batch_size, shared=bool(self.num_workers))
        self.pipeline, self.outputs, self.layout_spec, self.form = made.pipeline, made.config.outputs, made.config.layout, made.form
        self.size: tuple[int, int] = self.pipeline.size
        self.image_shape = self.outputs[0].shape if not self.form.fields else None
        self.scheduler.configure(made.config, self.form)

    def _plan(self) -> Any:  # this rank's `RankPlan` of the epoch in progress or next
        self._follow_ranks()
        return self.cursor.plan(self.cursor.epoch)

    def _follow_ranks(self, *, force: bool = False) -> None:
        """The ranks as they are now (`DistributedRanks`) when an epoch starts (`force`), else
        unless one is in progress; ValueError if the epoch does not split over them."""
        if force or not self.cursor.started:
            self.rank, self.world_size = self._ranks.resolve()
            self._epochs.check_ranks(self.rank, self.world_size)
            self.cursor.set_ranks(self.rank, self.world_size)

    def _settings(self, size: tuple[int, int] | None = None) -> dict[str, Any]:
        """The fingerprint of what decides the stream, saved in the state and checked on resume."""
        pipeline = pipeline_at(self.options.pipeline, size) if size is not None and size != self.size else self.pipeline
        return settings(
            self.options,
            pipeline=pipeline,
            outputs=self.outputs,
            form=self.form,
            subset=self._epochs.subset,
            mixture=self._epochs.mixture_settings(),
            num_records=self.num_records,
            rank=self.rank,
            world_size=self.world_size,
            order=self.order,
            dataset=self._fingerprint,
            values=self._values,
        )
