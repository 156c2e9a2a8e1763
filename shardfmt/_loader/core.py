"""`Loader`: shuffled batches of decoded, cropped images as torch tensors over shared memory.

Workers decode chunks of each batch straight into a ring of preallocated shared-memory slots;
the loader hands out tensors that wrap a slot without copying. The lifetime rule: **batches are
yours; what is kept is set aside, not overwritten.** Labels, indices and every field of one
number a sample are copies; images (and array fields) view their slot, which is refilled only
once nothing the caller holds views it any more; a slot still held when its turn comes is left
to the caller and a fresh one takes its place (`lending` says when, and what it costs). Pass
``output=Output(copy=True)`` to get images in plain memory. With ``device="cuda"`` the loader copies each batch
to the GPU on a side stream and the slot is reused once that copy is done.

Iterations follow torch's DataLoader: each ``iter(loader)`` that is advanced starts the next
epoch (first epoch 0, or the one given to `set_epoch`), finished or not; only the first after
`load_state_dict` continues the saved epoch. An ``iter()`` never advanced starts none. An
iterator replaced by a newer ``iter()`` (or `set_epoch`, `load_state_dict`, `set_size`) raises
RuntimeError when advanced. Batches decoded ahead are kept when the next iteration starts with
them, and discarded otherwise.

Shared memory: ``(prefetch + 1) * batch_size * (H * W * 3 + 8)`` bytes (each part rounded up to 4 KiB),
plus per worker a decode buffer of the largest image it has decoded (height * width * 3 bytes; where it
decodes crop boxes alone, a second of height * (width + 32) * 4), plus the slots set aside while the
caller holds them. With ``fields=...``, ``(prefetch + 1) * batch_size * sum of every field's sample bytes``
(H * W * C for an image, the array's bytes, 8 for a number; each field's part rounded up to 4 KiB), plus
per worker and jpeg field a decode buffer of its largest image (height * width * C bytes). The loader holds
per-shard counts and one shared bit per record (which records have passed their checksum);
`Loader()` opens no shard, and an epoch's order is computed batch by batch (`orders`, `split`).
With a transform's ``mean``/``std`` and no device, images are float32 (4 bytes a value). After `set_size` the
ring is reallocated only if the new size needs more than it has.

The loader is a facade over option objects owned by the layers that read them: the epochs'
order reads a `Sampling` (`epoch.Epochs`), the workers an `ImageTransform` (in their
`chunk.WorkerConfig`), the slots and processes `Workers` (`scheduler.Scheduler`), the hand-out
an `Output` (`stream`). The stream's position is a `Cursor` (`cursor`), and an iteration runs
the cursor and the scheduler together (`stream`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .._dataset.concat import open_records
from .._sampling.mixture import Mixture
from .._sampling.policy import Sampling
from .._sampling.ranks import split_batches
from .._storage import RemoteOptions
from ..ops import Pipeline
from ..ops._augment import describe_steps
from ..ops._batch import BatchStep, check_dataset_classes
from ..ops._transform import ImageTransform, size_pair
from .cursor import Cursor, SavedState
from .epoch import EpochBatches, EpochRecords, Epochs, EpochSampler
from .form import refuse_with_fields
from .location import loader_path, worker_start_method
from .options import (
    Output,
    Workers,
    as_device,
    as_option,
    as_transform,
    batch_steps,
    check_batch_size,
    check_fields,
    check_picklable,
    check_remote,
    check_verify,
)
from .outputs import FieldRequest
from .pool import WorkerPool
from .ranks import DistributedRanks
from .scheduler import Scheduler
from .shm import check_slot_memory
from .stages import configure, open_stages
from .stream import Delivery, stream_batches
from .values import split_values

__all__ = ["Loader"]


class Loader:
    """Shuffled batches from a shardfmt dataset, decoded by worker processes into shared memory.

    The keywords a torch DataLoader user knows are the loader's own; the rest is grouped in
    option objects, each owned by the layer that reads it: `ImageTransform` (one image, from
    its bytes to its row), `Sampling` (the epochs' order), `Workers` (the processes) and
    `Output` (the form of a batch).

    Args:
        path: the dataset directory or its manifest.json (``~`` expanded), or a URL (``s3://bucket/prefix``, ...);
            or local WebDataset tars, as `open_dataset` takes them (a ``.tar`` path, a brace
            pattern, or a list); or a `shardfmt.Mixture` of such sources, whose records are
            numbered across the sources in the order given and of which each epoch draws
            exactly the mixture's counts (spec/sampling.md, "Mixtures").
        batch_size: records per batch.
        shuffle, seed, drop_last: the fields of `sampling` of these names: a seeded permutation
            per epoch, its seed (crops and augmentations are pure functions of (seed, epoch,
            record)), and whether the epoch's remainder is dropped so that every batch is full.
            Given here and in `sampling` with other values than the defaults, they must agree.
        num_workers: decoding processes (default: one a core); 0 decodes in this process. The
            field of `workers` of that name.
        transform: what happens to each image: an `ImageTransform`, or a crop alone ("train":
            RandomResizedCrop + horizontal flip at 224; "eval": resize to 256, center crop 224;
            "resize"; or a `shardfmt.ops.Pipeline`, of `shardfmt.ops` or your own) for
            ``ImageTransform(crop=...)``. Its size changes between epochs with `set_size`.
        fields: deliver several fields as a dict of tensors instead of (images, labels): a
            mapping from field name to `shardfmt.ops.ImageOutput` (or its size, or None for
            the defaults), or a list of names. Image fields ("jpeg", "raw") are cut at the same
            place: the crop draws the box on the first image field and the others take it
            scaled by their size ratio, with the same flip (a jpeg field decoded at a reduced
            DCT scale snaps it to that scale, exact for whole-number ratios at proportional
            output sizes: `shardfmt.ops._crop.scale_plan`); each has its own output size, channels
            and interpolation. "ndarray", "int64" and "float64" fields arrive as stored.
            "str", "json" and "bytes" fields (captions, metadata, keys: give None) arrive as
            lists of one value a sample (str, the parsed JSON value, bytes), read in this
            process for the batch's records; they need an image or number field beside them.
            The transform's augment steps and normalisation apply to its one image field (three
            channels); `batch_augment` and a GPU decode serve the (images, labels) form only.
        batch_augment: batch steps (`shardfmt.ops.MixUp`, `CutMix`, `RandomChoice`, or a
            `shardfmt.ops.BatchStep` of your own) run on each batch as it leaves the loader (on
            the device after the transfer with `device`): the labels become soft labels (N x
            num_classes float32), the images float; drawn from (seed, epoch, batch), so a resume
            mixes the same way.
        device: "cuda" (or a torch.device) to deliver batches on the GPU, copied from pinned
            memory on a side stream (the transform's mean/std then normalise there); None keeps
            them on the CPU.
        sampling: the epochs' order (`Sampling`: order, window, repeats, subset, ranks).
        workers: how batches are made (`Workers`: prefetch, ordered, start method, timeout).
        output: the form of a batch (`Output`: layout, copy, return_indices, image and label
            fields).
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
        remote: for a dataset given by URL, how to read it (range reads or a local shard cache,
            credentials, retries; see `RemoteOptions`). With a cache, the loader downloads the
            shards its coming batches need ahead of the workers.

    Raises:
        DatasetNotFoundError, ManifestError, FormatError: the dataset cannot be opened.
        SchemaError: without `fields`, the fields are not an image ("jpeg" or "raw") and an
            "int64" label; with `fields`, one is missing or cannot be delivered (str, bytes,
            json).
        ValueError: the batch split is impossible (e.g. fewer records than ranks), a subset is
            malformed, an option is given twice with two values, or the transform does not
            fit the fields.
        TypeError: an argument is of the wrong type, or a step cannot be pickled where the
            start method needs it (spawn, forkserver).

    A failure in a worker is raised here as an instance of both `WorkerError` and the class the
    worker raised (`ChecksumError`, `DecodeError`, ...), naming the shard, record and offset,
    with the worker's traceback as its cause.

    Attributes:
        epoch: the epoch in progress (begun and not finished), else the one the next iteration starts.
        size: the (height, width) the images have now (see `set_size`).
        transform, sampling, workers, output: the option objects as the loader runs them (the
            shortcuts in them; the workers' number of processes a number, their start method resolved).
        dataset: the records an epoch draws from (`EpochRecords`: ``len``, ``classes``,
            ``[i]`` the record), as torch's DataLoader has it; batch_size, shuffle, seed,
            drop_last, num_workers, sampler (``set_epoch``), batch_sampler (`EpochBatches`),
            pin_memory likewise: what Lightning and Accelerate read (docs/frameworks.md).

    Example::

        loader = Loader("sr", batch_size=16, transform=RandomCrop(48),
                        fields={"lr": 48, "hr": 192, "mask": ImageOutput(192, 1, "nearest")})
        for batch in loader:
            batch["lr"], batch["hr"]   # (16, 3, 48, 48), (16, 3, 192, 192) uint8
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mixture,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int | None = None,
        drop_last: bool = False,
        transform: ImageTransform | Pipeline | str = "train",
        fields: FieldRequest | None = None,
        batch_augment: Sequence[BatchStep] | None = None,
        device: str | torch.device | None = None,
        sampling: Sampling | None = None,
        workers: Workers | None = None,
        output: Output | None = None,
        verify: bool | str = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        self.batch_size = check_batch_size(batch_size)
        self.path: Mixture | str | Path | list[str] = loader_path(path)
        self.sampling = as_option("sampling", sampling, Sampling).with_shortcuts(shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.shuffle, self.seed, self.drop_last = self.sampling.shuffle, self.sampling.seed, self.sampling.drop_last
        given = as_option("workers", workers, Workers).with_shortcut(num_workers)
        start_method = worker_start_method(self.path, given.start_method)
        self.workers = dataclasses.replace(given, num_workers=given.count, start_method=start_method)
        self.num_workers = self.workers.count
        self.transform = as_transform(transform)
        self.output = as_option("output", output, Output)
        self.batch_augment = batch_steps(batch_augment)
        self.fields = check_fields(fields, self.transform, batch_augment=bool(self.batch_augment))
        self.device = as_device(device)
        self.pin_memory = self.device is not None
        self.verify = check_verify(verify)
        self.remote = check_remote(remote)
        check_picklable(self.transform, self.workers)
        self._mixture = self.path if isinstance(self.path, Mixture) else None
        self._ranks = DistributedRanks(self.sampling.rank, self.sampling.world_size)
        self.rank, self.world_size = self._ranks.resolve()
        self._dataset = open_records(self.path, verify=bool(verify), remote=remote)
        self._fingerprint = self._dataset.fingerprint
        check_dataset_classes(self.batch_augment, getattr(self._dataset, "classes", None))
        self._epochs = Epochs(
            self.sampling, self._dataset, batch_size=self.batch_size, mixture=self._mixture, rank=self.rank, world_size=self.world_size
        )
        self.num_records = self._epochs.num_records
        """Records of the dataset, or the mixture's epoch size."""
        self.order = self._epochs.order
        self.cursor = Cursor(
            self._epochs.order_of,
            epoch_records=self._epochs.epoch_positions,
            batch_size=self.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=self.drop_last,
        )
        self._open_machinery()

    def _open_machinery(self) -> None:
        """The stages, value fields and scheduler the options ask for, configured at the transform's size."""
        stages = open_stages(
            self._dataset,
            transform=self.transform,
            device=self.device,
            layout=self.output.layout,
            image_field=self.output.image_field,
            num_workers=self.num_workers,
            remote=self.remote,
        )
        self._gpu = stages.gpu
        self._values = split_values(self._dataset.schema, self.fields)[1]
        """Fields delivered as lists, read here for each batch (`values.read_values`)."""
        self.scheduler = Scheduler(
            self._dataset,
            prefetcher=stages.prefetcher,
            stage=stages.device,
            gpu=self._gpu,
            workers=self.workers,
            batch_size=self.batch_size,
            copy=self.output.copy,
            repeats=self.sampling.repeats,
        )
        self._delivery = Delivery(self.output.layout, self.batch_augment, self.seed)
        self._configure(None)
        self._finalizer = self.scheduler.finalizer(self)
        self._closed = False
        self.sampler = EpochSampler(self.set_epoch)
        self.batch_sampler = EpochBatches(self.sampler, batch_size=self.batch_size, drop_last=self.drop_last, plan=self._plan)

    @property
    def epoch(self) -> int:
        """The epoch in progress (begun and not finished), else the one the next iteration starts."""
        return self.cursor.epoch

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
                (``Workers(ordered=False)``), or what is left of its epoch cannot be split equally over the
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
        labels), with ``Output(return_indices=True)`` (images, labels, indices), or with `fields` a dict from
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
        return stream_batches(
            self.cursor, self.scheduler, generation, dataset=self._dataset, values=self._values, delivery=self._delivery, close=self.close
        )

    # -- internals ----------------------------------------------------------------------------

    def _configure(self, size: tuple[int, int] | None) -> None:
        """Resolve the outputs and the workers' config: at `size`, or at the transform's.

        Raises:
            ValueError: the batch slots would not fit the memory there is for them.
        """
        made = configure(
            self._dataset,
            transform=self.transform if size is None else self.transform.at_size(size),
            fields=self.fields,
            output=self.output,
            on_device=self.device is not None,
            gpu=self._gpu,
            batch_size=self.batch_size,
            prefetch=self.workers.prefetch,
            seed=self.seed,
            repeats=self.sampling.repeats,
            batch_augment=bool(self.batch_augment),
            path=self.path,
            remote=self.remote,
            verify=self.verify,
        )
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
        """The fingerprint of what decides the stream, saved in the state and checked on resume:
        each option object's own (`Sampling.fingerprint` through the epochs,
        `ImageTransform.fingerprint`, `Workers.fingerprint`) and the loader's."""
        pipeline = self.transform.at_size(size).pipeline if size is not None and size != self.size else self.pipeline
        found = self._epochs.fingerprint(rank=self.rank, world_size=self.world_size) | self.workers.fingerprint()
        found |= self.transform.fingerprint(pipeline) | {"batch_size": self.batch_size, "dataset": self._fingerprint}
        if self.form.fields:
            found["fields"] = json.dumps([spec.to_config() for spec in self.outputs], sort_keys=True)
            if self._values:
                found["values"] = list(self._values)
        if self.batch_augment:  # recorded only when used, so that earlier states still resume
            found["batch_augment"] = describe_steps(self.batch_augment)
        return found
