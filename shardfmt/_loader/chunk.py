"""Filling slot rows with a chunk of records: `ChunkProcessor`, which runs inside a worker process
(`worker`), or in the loader with num_workers=0, and the `WorkerConfig` it is made from.

Each delivered field has its filler (`fillers.make_filler`); the crop boxes of a chunk are drawn
once, on the reference image field, and carried to the other image fields (snapped to the DCT
scale of each jpeg field that is decoded at one). Image fillers write through (N, C, H, W) views
of the slot arrays (`ops.decode.as_target`).

Checksums and trust: the workers share one bit per record (`checked`, num_records / 8 bytes),
set once the record's checksum has been checked (when the loader verifies) and every field has
decoded without error. A record of a local dataset is checked only while its bit is clear;
records fetched from a URL are checked every time. A record whose bit is set is "trusted": its
JPEG fields may be decoded partially (only the crop box, `ops.jpegcrop`), which is only done in
worker processes. So is a record whose checksum has just matched in a dataset whose manifest
says that the converter strictly decoded every JPEG (``strict_jpeg``, spec/manifest.md): its
bytes are the ones that decode cleanly, so it is decoded partially from its first read. Two
workers setting bits of one byte at once may lose a bit, which only means that record is checked
again: a bit is never set for a record that was not checked and decoded.

A second shared bitmap (`whole_only`, set by the loader only) names the records whose partial
decode ended a worker: libjpeg reports a fatal error by ``exit()``, so the loader starts a new
worker, and every worker decodes those records whole from then on, trusted or not.

With ``decode="gpu"``/``"hybrid"`` (the config's ``gpu_decode``), a row the loader marked for the
GPU is read and checked as any other, but its jpeg field is not decoded: its bytes, its crop box
and its dataset index go into the slot's byte arrays (`jpegbytes`), and such a row sets no bit
of `checked` (nothing here decoded it). Every row's seconds are written beside it: the loader's
measure of the CPU's rate.

After the fields, a sample of the image field named by the config's "transform" (the transform's
``augment`` steps, then ``mean``/``std``) is decoded into a scratch image, transformed with the
chunk's draws (`ops.augment.SampleTransform`) and written into its slot row; outputs of type "index"
receive the chunk's dataset indices.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._dataset.concat import RecordSource, open_records
from .._errors import ChecksumError, DecodeError, FormatError, ShardfmtError, worker_error_kind
from .._sampling.keys import AUGMENT_STREAM, keys_by_epoch
from .._sampling.permutation import draw_epoch as _draw_epochs
from .._storage import LocalFile, RemoteOptions
from ..format._layout import column_name
from ..ops import CenterCrop, CropPlan, Pipeline
from ..ops._augment import AugmentStep, SampleTransform
from ..ops._crop import scale_plan, snap_to_scale
from ..ops._decode import as_target
from .fillers import make_filler
from .jpegbytes import ON_GPU, SECONDS, JpegBytesWriter
from .outputs import OutputSpec
from .shm import SlotLayout

__all__ = ["ChunkFailure", "ChunkProcessor", "SlotArrays", "TransformSpec", "WorkerConfig", "checked_bytes", "encode_copies"]

SlotArrays = Callable[[int, int], dict[str, np.ndarray]]
"""(slot, serial) -> the slot's arrays: mapped in a worker, the loader's own in-process."""


@dataclass(frozen=True)
class TransformSpec:
    """The steps run on the image field `field` after its crop, then the normalisation."""

    field: str
    steps: tuple[AugmentStep, ...]
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs, as objects (pickled as they are under spawn)."""

    path: Any
    remote: RemoteOptions | None
    verify: bool
    verify_every_read: bool
    seed: int
    fast_decode: bool
    pipeline: Pipeline
    outputs: tuple[OutputSpec, ...]
    layout: SlotLayout
    transform: TransformSpec | None
    ring: str = ""
    """The base name of the slots' shared-memory segments."""
    gpu_decode: dict[str, Any] | None = None
    """``{"field", "max_bytes"}``: the jpeg field whose rows marked for the GPU get their bytes
    and crop box written into the slot instead of being decoded (`jpegbytes`); None: none."""
    repeats: int = 1
    """Copies of each record an epoch (repeated augmentation): a task's index then holds
    ``copy * num_records + record`` (`encode_copies`), and copy c draws as epoch
    ``repeats * epoch + c``."""
    num_records: int = 0


class ChunkFailure(Exception):
    """A record failed inside a worker; `fields` holds what the loader needs to name it:
    message, shard, record, index, offset, kind, trace."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(fields["message"])
        self.fields = fields


class ChunkProcessor:
    """Fill slots with records. Runs inside a worker, or in the loader with num_workers=0."""

    def __init__(
        self, config: WorkerConfig, slot_arrays: SlotArrays, *, in_worker: bool = False, dataset: RecordSource | None = None
    ) -> None:
        """`dataset`: the loader's own, opened from `config` (a forked worker inherits it); None: open it here."""
        self.config = config
        self.dataset = dataset if dataset is not None else open_records(config.path, verify=config.verify, remote=config.remote)
        self.pipeline = config.pipeline
        self.seed = int(config.seed)
        specs = list(config.outputs)
        self.specs = specs
        self.index_outputs = [spec.name for spec in specs if spec.type == "index"]
        center = self.pipeline if isinstance(self.pipeline, CenterCrop) else None
        self.fillers = [
            make_filler(spec, fast_decode=config.fast_decode, partial=in_worker, center=center) for spec in specs if spec.type != "index"
        ]
        self.images = [spec for spec in specs if spec.is_image]
        self.reads_payload = any(filler.reads_payload for filler in self.fillers)
        transform = config.transform
        self.transform: SampleTransform | None = None
        self.transformed: str | None = None
        if transform is not None:
            spec = next(spec for spec in specs if spec.name == transform.field)
            height, width, channels = spec.shape
            self.transform = SampleTransform(transform.steps, height=height, width=width, mean=transform.mean, std=transform.std)
            self.transformed = spec.name
            self._scratch = np.empty((1, height, width, channels), np.uint8)  # the decoded sample, before its steps
            self._scratch_rows = _row_views(as_target(self._scratch))
        self._slot_arrays = slot_arrays
        self._targets: dict[int, tuple[int, dict[str, Any]]] = {}
        self.current = np.zeros(1, np.int64)  # replaced by a shared cell in worker processes
        self.every_read = bool(config.verify_every_read)
        self.remote = self.dataset.is_remote
        self.strict = bool(self.dataset.strict_jpeg)
        self.checked = np.zeros(checked_bytes(len(self.dataset)), np.uint8)  # shared in worker processes
        self.whole_only = np.zeros(checked_bytes(len(self.dataset)), np.uint8)  # shared in worker processes
        gpu = config.gpu_decode
        self.jpeg_bytes = JpegBytesWriter(gpu) if gpu else None
        self._size_columns = (column_name(gpu["field"], "height"), column_name(gpu["field"], "width")) if gpu else ("", "")

    def targets(self, slot: int, serial: int) -> dict[str, Any]:
        """What each filler writes into in segment `serial` of slot `slot`: for an image field one
        (1, C, H, W) view per row, which the decoder and resizer write through; other fields (and
        a transformed image, which the transform writes) as the numpy arrays."""
        held = self._targets.get(slot)
        if held is not None and held[0] == serial:
            return held[1]
        self._targets.pop(slot, None)  # the old segment's mapping goes with its views
        arrays = self._slot_arrays(slot, serial)
        targets = {
            spec.name: _row_views(as_target(arrays[spec.name])) if spec.is_image and spec.name != self.transformed else arrays[spec.name]
            for spec in self.specs
        }
        targets.update((name, array) for name, array in arrays.items() if name not in targets)  # GPU decoding's byte arrays
        self._targets[slot] = (serial, targets)
        return targets

    def process(self, slot: int, serial: int, row: int, epoch: int, indices: np.ndarray) -> None:
        """Fill rows [row, row + len(indices)) of slot `slot` (segment `serial`) with records `indices`.

        Raises:
            ChunkFailure: naming the shard, record and byte offset of the record that failed.
        """
        draw_epoch: int | np.ndarray = epoch
        if self.config.repeats > 1:
            copies, indices = np.divmod(indices, self.config.num_records)
            draw_epoch = _draw_epochs(epoch, copies, self.config.repeats)
        readers, rows, local = self._read_rows(indices)
        boxes = {
            name: list(
                zip(plan.top.tolist(), plan.left.tolist(), plan.height.tolist(), plan.width.tolist(), plan.flip.tolist(), strict=True)
            )
            for name, plan in self._boxes(rows, draw_epoch, indices).items()
        }
        draws = self.transform.draw(self.seed, draw_epoch, indices) if self.transform is not None else []
        targets = self.targets(slot, serial)
        self._fill(targets, row, readers, rows, local, indices.tolist(), boxes, draws)
        for name in self.index_outputs:
            targets[name][row : row + len(indices)] = indices
        self.current[0] = -1

    def _read_rows(self, indices: np.ndarray) -> tuple[list[Any], list[Any], list[int]]:
        """The shard reader, table row and record number in its shard of each dataset record in
        `indices`; a remote source is asked for all of their bytes at once."""
        shard_array = np.searchsorted(self.dataset.cumulative, indices, side="right") - 1
        local = (indices - self.dataset.cumulative[shard_array]).tolist()
        shards = shard_array.tolist()
        first = (self.checked[indices >> 3] & (1 << (indices & 7))) == 0  # records not read before in this loader
        if first.any():  # their shards and table blocks may be cold: the disk is asked for them together
            self.dataset.read_ahead(shards, local)
        readers: list[Any] = []
        rows = []
        for k in range(len(indices)):
            reader = self.dataset.shard(shards[k])
            if not readers or reader is not readers[-1]:  # a chunk's records run shard by shard, mostly
                try:  # a truncated file is an error, not SIGBUS (its table is mapped too)
                    reader.check_file(local[k])
                except FormatError as err:
                    raise self._failure(err, reader.path, local[k], int(indices[k]), err.offset) from err
            try:  # the row's block of the table is checked on its first use
                reader.check_row(local[k])
            except FormatError as err:  # it names the first broken row of the block
                record = err.record if err.record is not None else local[k]
                raise self._failure(err, reader.path, record, int(indices[k]) + record - local[k], err.offset) from err
            readers.append(reader)
            rows.append(reader.table[local[k]])
        if self.reads_payload:
            _prefetch_spans(readers, rows, first.tolist())
        return readers, rows, local

    def _fill(
        self,
        targets: dict[str, Any],
        row: int,
        readers: list[Any],
        rows: list[Any],
        local: list[int],
        numbers: list[int],
        boxes: dict[str, list[tuple[int, int, int, int, bool]]],
        draws: Any,
    ) -> None:
        """Fill rows [row, row + len(readers)) of `targets`, record by record: check its bytes
        where that is due, fill every field (or write a GPU row's bytes and box), mark it checked,
        then run the transform on its scratch sample."""
        transform, transformed = self.transform, self.transformed
        checked = self.checked.data  # a memoryview: plain int reads and writes, cheaper than numpy's
        whole_only = self.whole_only.data
        current = self.current
        writer = self.jpeg_bytes
        on_gpu = targets[ON_GPU] if writer is not None else None
        gpu_field, write_gpu_row, gpu_boxes = _gpu_rows(writer, boxes)
        for k in range(len(readers)):
            reader, table_row, record, index = readers[k], rows[k], local[k], numbers[k]
            current[0] = index
            filler = None
            began = time.perf_counter()
            gpu_row = on_gpu is not None and bool(on_gpu[row + k])
            byte, bit = index >> 3, 1 << (index & 7)
            trusted = bool(checked[byte] & bit)
            try:
                checked_now = reader.verify and self.reads_payload and (self.every_read or not trusted)
                if checked_now:
                    reader.verify_record(record)
                # bytes fetched again from a URL are the ones decoded before only if checked
                # again; bytes of a strictly decoded dataset that match their checksum are the
                # converter's own
                same_bytes = ((trusted and (reader.verify or not self.remote)) or (self.strict and checked_now)) and not whole_only[
                    byte
                ] & bit
                for filler in self.fillers:
                    box = boxes.get(filler.name)
                    if gpu_row and filler.name == gpu_field:
                        # the bytes as stored and the box as drawn: the training process decodes them
                        height, width = (int(table_row[column]) for column in self._size_columns)
                        write_gpu_row(
                            targets, row + k, filler.payload(reader, table_row), gpu_boxes[k], height=height, width=width, index=index
                        )
                        continue
                    # a transformed image is decoded into the scratch sample, then transformed into its row
                    out, at = (self._scratch_rows, 0) if filler.name == transformed else (targets[filler.name], row + k)
                    filler.fill(reader, table_row, box[k] if box is not None else None, out, at, trusted=same_bytes)
            except Exception as err:
                raise self._record_failure(err, reader, table_row, record, index, filler) from err
            if not trusted and not gpu_row:  # a GPU row is not decoded here: it earns no trust
                checked[byte] |= bit
            if transform is not None and transformed is not None:
                try:
                    transform.apply(self._scratch[0], draws, k, targets[transformed][row + k])
                except Exception as err:  # a user's step: keep its class (see errors.worker_error_kind)
                    raise self._failure(err, reader.path, record, index, int(table_row["offset"])) from err
            if writer is not None:
                targets[SECONDS][row + k] = time.perf_counter() - began

    def _record_failure(self, err: Exception, reader: Any, table_row: Any, record: int, index: int, filler: Any) -> ChunkFailure:
        """The failure of a record's check or fill, at the offset it names: a checksum's own; a
        field's that does not decode, as a DecodeError at the field's bytes; else the record's
        (its bytes could not be had: a remote read, the shard cache)."""
        if isinstance(err, ChecksumError):
            return self._failure(err, reader.path, record, index, err.offset)
        if isinstance(err, (ShardfmtError, ValueError)) and filler is not None:
            start = int(table_row[column_name(filler.name, "offset")] if filler.reads_payload else table_row["offset"])
            wrapped = DecodeError(
                f"{filler.spec.type} field {filler.name!r} does not decode: {err}", path=reader.path, offset=start, record=record
            )
            return self._failure(wrapped, reader.path, record, index, start)
        return self._failure(err, reader.path, record, index, int(table_row["offset"]))

    def _boxes(self, rows: list[Any], epoch: int | np.ndarray, indices: np.ndarray) -> dict[str, CropPlan]:
        """The crop of every image field: the pipeline's boxes on the reference (the first image
        field, snapped by the pipeline to its DCT scale), carried to the others by their size
        ratios and snapped again where a field is decoded at a reduced DCT scale, that scale
        being chosen on the field's own box and output size."""
        if not self.images:
            return {}

        def sizes(name: str) -> tuple[np.ndarray, np.ndarray]:
            height, width = column_name(name, "height"), column_name(name, "width")
            return (np.array([r[height] for r in rows], np.int64), np.array([r[width] for r in rows], np.int64))

        reference = self.images[0]
        ref_h, ref_w = sizes(reference.name)
        plan = self.pipeline.plan(ref_h, ref_w, keys_by_epoch(self.seed, AUGMENT_STREAM, epoch, indices.astype(np.uint64)))
        boxes = {reference.name: plan}
        for spec in self.images[1:]:
            heights, widths = sizes(spec.name)
            carried = scale_plan(plan, heights, widths, ref_h, ref_w)
            boxes[spec.name] = snap_to_scale(carried, heights, widths, (spec.shape[0], spec.shape[1])) if spec.dct_scaled else carried
        return boxes

    @staticmethod
    def _failure(err: BaseException, shard: str, record: int, index: int, offset: int | None) -> ChunkFailure:
        message = err.message if isinstance(err, ShardfmtError) else f"{type(err).__name__}: {err}"
        return ChunkFailure(
            message=message,
            shard=shard,
            record=record,
            index=index,
            offset=offset,
            kind=worker_error_kind(err),
            trace=traceback.format_exc(),
        )

    def share_partial_flag(self, flag: Any) -> None:
        """Make every jpeg field's decoder hold `flag[0]` at 1 while it decodes partially."""
        for filler in self.fillers:
            decoder = getattr(filler, "decoder", None)
            if decoder is not None:
                decoder.in_partial_decode = flag

    def locate(self, index: int) -> tuple[str, int]:
        """Return (shard path, record) of dataset record `index`."""
        shard, local = self.dataset.locate(index)
        return self.dataset.shard_path(shard), local

    def close(self) -> None:
        self._targets = {}  # the views of the slots, which would keep them mapped
        self.dataset.close()


def _gpu_rows(
    writer: JpegBytesWriter | None, boxes: dict[str, list[tuple[int, int, int, int, bool]]]
) -> tuple[str | None, Callable[..., None], list[tuple[int, int, int, int, bool]]]:
    """What the fill loop needs of GPU decoding, taken once a chunk: the field whose GPU rows
    are written (None without GPU decoding, which no filler is called), the writer's ``write``,
    and the field's crop boxes.

    Raises:
        RuntimeError: the field has no crop boxes (it is not an image field of the outputs).
    """
    if writer is None:
        return None, _no_gpu_rows, []
    field_boxes = boxes.get(writer.field)
    if field_boxes is None:
        raise RuntimeError(f"GPU decoding writes field {writer.field!r}, which has no crop boxes: it is not an image field of the outputs")
    return writer.field, writer.write, field_boxes


def _no_gpu_rows(*args: Any, **kwargs: Any) -> None:
    """The writer of GPU rows without GPU decoding: no row is marked for the GPU then."""
    raise RuntimeError("a row is marked for the GPU, but the workers decode none there")


def _row_views(images: Any) -> list[Any]:
    """Image k of an (N, C, H, W) slot view as its own (1, C, H, W) view, made once."""
    return [images[k : k + 1] for k in range(images.shape[0])]


def checked_bytes(num_records: int) -> int:
    """Bytes of the shared bitmap of checked records."""
    return max(1, (num_records + 7) // 8)


def _prefetch_spans(readers: list[Any], rows: list[Any], first_reads: list[bool]) -> None:
    """Ask every source for the record spans of the chunk at once: a remote one fetches them in
    one concurrent batch of range reads per shard instead of one round trip per record; a local
    one has the kernel read ahead together the records read for the first time in this loader
    (`first_reads`, `storage.LocalFile.prefetch`: a cold start), and only those, so that an
    epoch over cached pages makes no system call for them (about 3 us a record, 4% of a tiny
    record's cost)."""
    spans: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
    for reader, row, first in zip(readers, rows, first_reads, strict=True):
        if hasattr(reader.source, "prefetch") and (first or not isinstance(reader.source, LocalFile)):
            start = int(row["offset"])
            spans.setdefault(id(reader), (reader, []))[1].append((start, start + int(row["size"])))
    for reader, ranges in spans.values():
        try:
            reader.source.prefetch(ranges)
        except Exception:  # reported with the record by the reads below: at once after an outage (`RemoteFile.prefetch`)
            pass


def encode_copies(records: np.ndarray, copies: np.ndarray, num_records: int) -> np.ndarray:
    """The indices of a task under repeated augmentation: ``copy * num_records + record``
    (`ChunkProcessor.process` divides them back)."""
    return np.asarray(copies, np.int64) * num_records + np.asarray(records, np.int64)
