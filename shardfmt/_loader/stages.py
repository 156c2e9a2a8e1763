"""The parts of a loader that its options ask for around the workers: the stages (shard
prefetcher, GPU decode, device copy; `open_stages`) and, at a size, the pipeline, outputs, slot
layout and the workers' `WorkerConfig` (`configure`). Each takes the options it reads, no more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .._dataset.concat import RecordSource
from .._dataset.reader import DatasetReader
from .._sampling.mixture import Mixture
from .._storage import RemoteOptions
from ..ops import Pipeline
from ..ops._transform import ImageTransform
from . import gpudecode
from .chunk import WorkerConfig
from .form import BatchForm
from .gpudecode import GpuDecodeStage
from .options import Output, index_output, sample_image, transform_outputs, worker_steps
from .outputs import FieldRequest, resolve_outputs
from .prefetch import ShardPrefetcher
from .shm import SlotLayout
from .values import split_values

__all__ = ["Configured", "Stages", "configure", "open_stages"]


@dataclass(frozen=True)
class Stages:
    """The stages around a loader's workers that its options ask for, each None where not."""

    prefetcher: ShardPrefetcher | None
    """Downloads the shards of coming batches into a remote dataset's shard cache."""
    gpu: GpuDecodeStage | None
    """Decodes JPEGs on the device (``decode="gpu"``/``"hybrid"``)."""
    device: Any
    """The `cuda.DeviceStage` that copies each batch to the device."""


def open_stages(
    dataset: RecordSource,
    *,
    transform: ImageTransform,
    device: torch.device | None,
    layout: str,
    image_field: str,
    num_workers: int,
    remote: RemoteOptions | None,
) -> Stages:
    """Make the stages asked for, in this order: the shard prefetcher (a cached remote dataset
    with `RemoteOptions.prefetch_shards`), the GPU decode stage (`transform`'s ``decode``), the
    device stage (which normalises with `transform`'s mean and std).

    Raises:
        ValueError: the decode mode cannot serve the other options, or has no device to use
            (`gpudecode.open_stage`).
    """
    prefetcher = None
    if isinstance(dataset, DatasetReader) and dataset.location.cache is not None and remote is not None and remote.prefetch_shards:
        prefetcher = ShardPrefetcher(dataset, ahead=remote.prefetch_shards, threads=remote.prefetch_threads)
    gpu = gpudecode.open_stage(
        transform.decode,
        device=device,
        dataset=dataset,
        field=image_field,
        workers=num_workers,
        augment=bool(transform.augment),
    )
    target = gpu.device if gpu is not None else device
    stage: Any = None
    if target is not None and (gpu is None or target.type == "cuda"):
        from .cuda import DeviceStage

        mean, std = transform.mean, transform.std
        stage = DeviceStage(target, mean=None if mean is None else tuple(mean), std=None if std is None else tuple(std), layout=layout)
    return Stages(prefetcher, gpu, stage)


@dataclass(frozen=True)
class Configured:
    """The pipeline at the size asked for, the workers' config (outputs and layout in it), and
    the form its batches are handed out in."""

    pipeline: Pipeline
    config: WorkerConfig
    form: BatchForm


def configure(
    dataset: RecordSource,
    *,
    transform: ImageTransform,
    fields: FieldRequest | None,
    output: Output,
    on_device: bool,
    gpu: GpuDecodeStage | None,
    batch_size: int,
    prefetch: int,
    seed: int,
    repeats: int,
    batch_augment: bool,
    path: Any,
    remote: RemoteOptions | None,
    verify: bool | str,
) -> Configured:
    """Resolve the outputs and the workers' config for `transform` (at its size): the fields
    asked for (`fields`, else `output`'s image and label), the transform's steps and, unless the
    batches go to a device (`on_device`, or a `gpu` decode stage), its normalisation in the
    workers; with `gpu`, its byte arrays in every slot; and the `form.BatchForm` of the batches
    (with `batch_augment`, which mixes the labels, a dataset without labels is refused).

    Raises:
        ValueError: the transform or the batch steps cannot serve the outputs.
    """
    slotted, _ = split_values(dataset.schema, fields)  # fields of VALUE_TYPES are read by the loader itself
    pipeline, outputs = resolve_outputs(
        dataset,
        fields=slotted,
        pipeline=transform.crop,
        size=transform.size,
        image_field=output.image_field,
        label_field=output.label_field,
        interpolation=transform.interpolation,
    )
    here = not on_device and gpu is None  # a GPU stage delivers on its device
    normalised = sample_image(outputs).name if transform.mean is not None else None
    outputs, spec = transform_outputs(
        outputs,
        augment=worker_steps(transform, on_device=on_device),
        mean=transform.mean if here else None,
        std=transform.std if here else None,
    )
    if output.return_indices:
        outputs = outputs + (index_output(fields=fields is not None, names=[spec.name for spec in outputs]),)
    form = BatchForm.of(outputs, fields=fields is not None, normalised=normalised)
    if batch_augment and form.label is None:
        raise ValueError("batch_augment mixes the labels, but this dataset has none; give Output(label_field=None) to mix zero labels")
    config = WorkerConfig(
        path=path if isinstance(path, (list, Mixture)) else str(path),
        remote=remote,
        verify=bool(verify),
        verify_every_read=verify == "always" or dataset.is_remote,
        seed=seed,
        fast_decode=transform.fast_decode,
        pipeline=pipeline,
        outputs=outputs,
        layout=SlotLayout(prefetch + 1, batch_size, tuple(spec.slot_array() for spec in outputs) + (gpu.slot_arrays() if gpu else ())),
        transform=spec,
        gpu_decode=gpu.config() if gpu is not None else None,
        repeats=repeats,
        num_records=len(dataset),
    )
    return Configured(pipeline, config, form)
