"""What a loader derives from its options and dataset: where the dataset is, this process's rank,
the stages around its workers (shard prefetcher, GPU decode, device copy), the outputs, slot
layout and workers' `WorkerConfig` at a size, and the settings that its state dict saves and a
resume checks."""

from __future__ import annotations

import json
import multiprocessing
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._arguments import check_path
from .._checksum import checksum, format_checksum
from .._dataset.concat import RecordSource
from .._dataset.locate import classify_location
from .._dataset.reader import DatasetReader
from .._sampling.mixture import Mixture
from .._storage import expand_user
from .._storage.remote import forks_safely
from ..ops import Pipeline
from ..ops._augment import describe_steps
from ..ops._batch import check_dataset_classes
from . import gpudecode
from .chunk import WorkerConfig
from .form import BatchForm
from .gpudecode import GpuDecodeStage
from .options import LoaderOptions, index_output, pipeline_at, sample_image, transform_outputs, worker_steps
from .outputs import OutputSpec, resolve_outputs
from .prefetch import ShardPrefetcher
from .shm import SlotLayout
from .values import split_values

__all__ = ["Configured", "DistributedRanks", "Stages", "configure", "loader_path", "open_stages", "settings", "worker_start_method"]


def loader_path(path: Mixture | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Mixture | str | Path | list[str]:
    """A list of tars as strings, a URL as given, a local path as a `Path` (``file://`` stripped,
    ``~`` expanded).

    Raises:
        TypeError: `path` is none of these (a str, an `os.PathLike`, a list or tuple, a `Mixture`).
        ValueError: a path longer than `_arguments.MAX_PATH_LENGTH` bytes or with a part
            longer than `_arguments.MAX_NAME_LENGTH`.
    """
    if isinstance(path, Mixture):
        return path
    path = expand_user(path)
    if isinstance(path, (list, tuple)):
        for item in path:
            if not isinstance(item, (str, os.PathLike)):
                raise TypeError(f"path must be a str or os.PathLike, a list or tuple of them, or a Mixture, got a list holding {item!r}")
            check_path("path", item)
        return [os.fspath(p) for p in path]
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, a list or tuple of them, or a Mixture, got {type(path).__name__}")
    check_path("path", path)
    where = classify_location(path)
    return where.url if where.url is not None else Path(where.path or where.text)


def worker_start_method(path: Mixture | str | Path | list[str], start_method: str | None) -> str | None:
    """The start method of the workers: `start_method` as given, except for a dataset that a
    forked worker cannot read (`forks_safely`: ``gs://`` through gcsfs's gRPC): there the
    platform's default of fork becomes forkserver (spawn where there is none).

    Raises:
        ValueError: `start_method` is ``"fork"`` for such a dataset.
    """
    paths = path.paths if isinstance(path, Mixture) else [path]
    locations = [os.fspath(p) for item in paths for p in (item if isinstance(item, (list, tuple)) else [item])]
    unsafe = next((location for location in locations if not forks_safely(location)), None)
    if unsafe is None:
        return start_method
    if start_method == "fork":
        raise ValueError(
            f"start_method='fork' cannot read {unsafe}: gcsfs reads it over gRPC, whose state does not "
            "survive fork (the workers would abort or hang); pass 'forkserver' or 'spawn', or None to have forkserver"
        )
    if start_method is None and multiprocessing.get_start_method(allow_none=False) == "fork":
        return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return start_method


class DistributedRanks:
    """A loader's rank and world size: as given, else torch.distributed's when it is initialised,
    else (0, 1), asked again at each `resolve` (the loader asks when an epoch starts: a process
    group is often made after the loader). A world size given that differs from the initialised
    process group's is kept and warned about, once (each rank then reads another share than
    DDP expects)."""

    def __init__(self, rank: int | None, world_size: int | None) -> None:
        self.rank, self.world_size = rank, world_size
        self._warned = False

    def resolve(self) -> tuple[int, int]:
        rank, world_size = self.rank, self.world_size
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return (0 if rank is None else rank, 1 if world_size is None else world_size)
        group_rank, group_size = dist.get_rank(), dist.get_world_size()
        if world_size is not None and world_size != group_size and not self._warned:
            self._warned = True
            warnings.warn(
                f"Loader(world_size={world_size}) differs from the initialised process group's world size {group_size}: "
                f"this rank reads 1/{world_size} of each epoch, not 1/{group_size}; pass rank=None, world_size=None "
                "to take the process group's",
                UserWarning,
                stacklevel=4,
            )
        return (group_rank if rank is None else rank, group_size if world_size is None else world_size)


@dataclass(frozen=True)
class Stages:
    """The stages around a loader's workers that its options ask for, each None where not."""

    prefetcher: ShardPrefetcher | None
    """Downloads the shards of coming batches into a remote dataset's shard cache."""
    gpu: GpuDecodeStage | None
    """Decodes JPEGs on the device (``decode="gpu"``/``"hybrid"``)."""
    device: Any
    """The `cuda.DeviceStage` that copies each batch to the device."""


def open_stages(options: LoaderOptions, dataset: RecordSource) -> Stages:
    """Make the stages the options ask for, in this order: the shard prefetcher (a cached remote
    dataset with `RemoteOptions.prefetch_shards`), the GPU decode stage, the device stage.

    Raises:
        ValueError: the decode mode cannot serve the other options, or has no device to use
            (`gpudecode.open_stage`).
    """
    remote = options.remote
    prefetcher = None
    if isinstance(dataset, DatasetReader) and dataset.location.cache is not None and remote is not None and remote.prefetch_shards:
        prefetcher = ShardPrefetcher(dataset, ahead=remote.prefetch_shards, threads=remote.prefetch_threads)
    gpu = gpudecode.open_stage(
        options.decode,
        device=torch.device(options.device) if options.device is not None else None,
        dataset=dataset,
        field=options.image_field,
        workers=options.num_workers,
        augment=bool(options.augment),
    )
    device = gpu.device if gpu is not None else (torch.device(options.device) if options.device is not None else None)
    stage: Any = None
    if device is not None and (gpu is None or device.type == "cuda"):
        from .cuda import DeviceStage

        stage = DeviceStage(device, mean=options.mean, std=options.std, layout=options.layout)
    return Stages(prefetcher, gpu, stage)


@dataclass(frozen=True)
class Configured:
    """The pipeline at the size asked for, the workers' config (outputs and layout in it), and
    the form its batches are handed out in."""

    pipeline: Pipeline
    config: WorkerConfig
    form: BatchForm


def configure(
    options: LoaderOptions, dataset: RecordSource, *, path: Any, size: tuple[int, int] | None, gpu: GpuDecodeStage | None = None
) -> Configured:
    """Resolve the outputs and the workers' config: at `size`, or at the options' size; with
    `gpu` (``decode="gpu"``/``"hybrid"``), its byte arrays in every slot."""
    check_dataset_classes(options.batch_augment, getattr(dataset, "classes", None))
    request = options.pipeline
    if size is not None and not isinstance(request, str):
        request = pipeline_at(request, size)
    slotted, _ = split_values(dataset.schema, options.fields)  # fields of VALUE_TYPES are read by the loader itself
    pipeline, outputs = resolve_outputs(
        dataset,
        fields=slotted,
        pipeline=request,
        size=size or options.size,
        image_field=options.image_field,
        label_field=options.label_field,
        interpolation=options.interpolation,
    )
    fields = options.fields is not None
    here = options.device is None and gpu is None  # a GPU stage delivers on its device
    normalised = sample_image(outputs).name if options.mean is not None else None
    outputs, transform = transform_outputs(
        outputs, augment=worker_steps(options), mean=options.mean if here else None, std=options.std if here else None
    )
    if options.return_indices:
        outputs = outputs + (index_output(fields=fields, names=[spec.name for spec in outputs]),)
    form = BatchForm.of(outputs, fields=fields, normalised=normalised)
    if options.batch_augment and form.label is None:
        raise ValueError("batch_augment mixes the labels, but this dataset has none; give label_field=None to mix zero labels")
    config = WorkerConfig(
        path=path if isinstance(path, (list, Mixture)) else str(path),
        remote=options.remote,
        verify=bool(options.verify),
        verify_every_read=options.verify == "always" or dataset.is_remote,
        seed=options.seed,
        fast_decode=options.fast_decode,
        pipeline=pipeline,
        outputs=outputs,
        layout=SlotLayout(
            options.prefetch + 1, options.batch_size, tuple(spec.slot_array() for spec in outputs) + (gpu.slot_arrays() if gpu else ())
        ),
        transform=transform,
        gpu_decode=gpu.config() if gpu is not None else None,
        repeats=options.repeats,
        num_records=len(dataset),
    )
    return Configured(pipeline, config, form)


def settings(
    options: LoaderOptions,
    *,
    pipeline: Pipeline,
    outputs: tuple[OutputSpec, ...],
    form: BatchForm,
    subset: np.ndarray | None,
    mixture: dict[str, Any] | None,
    num_records: int,
    rank: int,
    world_size: int,
    order: str,
    dataset: str,
    values: Sequence[str] = (),
) -> dict[str, Any]:
    """What decides a loader's stream, as its state dict saves it (values of the state's
    "settings"; a resume compares them with `cursor.SavedState.check_settings`): the options
    that shape it, and the fingerprint of the dataset's records (`DatasetReader.fingerprint`)."""
    shape = {k: v for k, v in pipeline.to_config().items() if k != "size"}  # the state records the size itself
    found: dict[str, Any] = {
        "seed": options.seed,
        "num_records": num_records,
        "subset": None if subset is None else format_checksum(checksum(subset.astype("<i8").tobytes())),
        "batch_size": options.batch_size,
        "shuffle": options.shuffle,
        "drop_last": options.drop_last,
        "rank": rank,
        "world_size": world_size,
        "ordered": options.ordered,
        "window": options.window,
        "order": order,
        "pipeline": json.dumps(shape, sort_keys=True),
        "augment": describe_steps(options.augment),
        "dataset": dataset,
    }
    if form.fields:
        found["fields"] = json.dumps([spec.to_config() for spec in outputs], sort_keys=True)
        if values:
            found["values"] = list(values)
    # the recipe's options, recorded only when used, so that earlier states still resume
    if options.interpolation != "bilinear":
        found["interpolation"] = options.interpolation
    if options.repeats != 1:
        found["repeats"] = options.repeats
    if options.repeats_epoch != "copies":
        found["repeats_epoch"] = options.repeats_epoch
    if options.batch_augment:
        found["batch_augment"] = describe_steps(options.batch_augment)
    if mixture is not None:
        found["mixture"] = json.dumps(mixture, sort_keys=True)
    return found
