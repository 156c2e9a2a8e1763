"""Loader workers: decode chunks of records straight into shared-memory batch slots.

A worker is started once per loader with a small config (the dataset path, the pipeline as a
dict, the slot layout) and never with the dataset object, so it works under spawn as well as
fork. Messages are fixed structs sent with `send_bytes` (no pickling):

    loader -> worker   TASK  (slot, row, epoch, count) + count int64 record indices
                       STOP
    worker -> loader   READY | DONE (slot, row, count) | ERROR + UTF-8 JSON

While it works, a worker stores the record it is on in a shared array, so that if it dies the
loader can name the shard and record.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import traceback
from typing import Any

import numpy as np

from ..errors import ChecksumError, DecodeError, ShardfmtError
from ..layout import column_name
from ..ops import ImageDecoder, pipeline_from_config
from ..ops.decode import as_target
from ..reader import DatasetReader
from ..sampling import AUGMENT_STREAM, record_keys
from .shm import SlotLayout, SlotRing

__all__ = ["ChunkProcessor", "worker_main"]

TASK, STOP, READY, DONE, ERROR = 1, 2, 3, 4, 5
HEADER = struct.Struct("<qqqqq")  # op, slot, row, epoch, count


class ChunkFailure(Exception):
    """A record failed inside a worker; `fields` holds what the loader needs to name it:
    message, shard, record, index, offset, kind, trace."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(fields["message"])
        self.fields = fields


class ChunkProcessor:
    """Decode records into slots. Runs inside a worker, or in the loader with num_workers=0."""

    def __init__(self, config: dict[str, Any], ring: SlotRing) -> None:
        self.config = config
        self.ring = ring
        self.dataset = DatasetReader(config["path"], verify=config["verify"])
        self.image_field = config["image_field"]
        self.label_field = config["label_field"]
        self.pipeline = pipeline_from_config(config["pipeline"])
        self.seed = int(config["seed"])
        height, width = config["max_size"]
        self.decoder = ImageDecoder(max_height=height, max_width=width, output_size=tuple(config["output_size"]), fast=config["fast_decode"])
        self.targets = [as_target(images) for images in ring.images]
        self.current = np.zeros(1, np.int64)  # replaced by a shared cell in worker processes

    def process(self, slot: int, row: int, epoch: int, indices: np.ndarray) -> None:
        """Decode `indices` into rows [row, row + len(indices)) of slot `slot`.

        Raises:
            ChunkFailure: naming the shard, record and byte offset of the record that failed.
        """
        count = len(indices)
        shards = np.searchsorted(self.dataset.cumulative, indices, side="right") - 1
        local = indices - self.dataset.cumulative[shards]
        heights = np.empty(count, np.int64)
        widths = np.empty(count, np.int64)
        labels = self.ring.labels[slot]
        readers = []
        image_offset = column_name(self.image_field, "offset")
        image_size = column_name(self.image_field, "size")
        height_col = column_name(self.image_field, "height")
        width_col = column_name(self.image_field, "width")
        rows = []
        for k in range(count):
            reader = self.dataset.shard(int(shards[k]))
            table_row = reader.table[int(local[k])]
            readers.append(reader)
            rows.append(table_row)
            heights[k] = table_row[height_col]
            widths[k] = table_row[width_col]
            labels[row + k] = table_row[self.label_field] if self.label_field else 0
        plan = self.pipeline.plan(heights, widths, record_keys(self.seed, AUGMENT_STREAM, epoch, indices.astype(np.uint64)))
        targets = self.targets[slot]
        for k in range(count):
            reader, table_row, record = readers[k], rows[k], int(local[k])
            self.current[0] = indices[k]
            start = int(table_row[image_offset])
            try:
                if reader.verify:
                    reader.verify_record(record)
                data = reader.source.read(start, start + int(table_row[image_size]))
                self.decoder.decode_box(
                    data,
                    height=int(heights[k]),
                    width=int(widths[k]),
                    top=int(plan.top[k]),
                    left=int(plan.left[k]),
                    box_height=int(plan.height[k]),
                    box_width=int(plan.width[k]),
                    flip=bool(plan.flip[k]),
                    out=targets[row + k : row + k + 1],
                )
            except ChecksumError as err:
                raise self._failure(err, reader.path, record, int(indices[k]), err.offset) from err
            except (ShardfmtError, ValueError) as err:
                wrapped = DecodeError(f"image field {self.image_field!r} does not decode: {err}", path=reader.path, offset=start, record=record)
                raise self._failure(wrapped, reader.path, record, int(indices[k]), start) from err
            except Exception as err:
                raise self._failure(err, reader.path, record, int(indices[k]), start) from err
        self.current[0] = -1

    @staticmethod
    def _failure(err: BaseException, shard: str, record: int, index: int, offset: int | None) -> ChunkFailure:
        message = err.message if isinstance(err, ShardfmtError) else f"{type(err).__name__}: {err}"
        return ChunkFailure(
            message=message, shard=shard, record=record, index=index, offset=offset, kind=type(err).__name__, trace=traceback.format_exc()
        )

    def locate(self, index: int) -> tuple[str, int]:
        """Return (shard path, record) of dataset record `index`."""
        shard, local = self.dataset.locate(index)
        return str(self.dataset.root / self.dataset.manifest.shards[shard].path), local

    def close(self) -> None:
        self.dataset.close()


def worker_main(worker_id: int, conn: Any, config: dict[str, Any], current: Any) -> None:
    """Entry point of a worker process: serve TASK messages until STOP or the loader goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the loader's to handle
    import torch

    torch.set_num_threads(1)
    try:
        layout = SlotLayout(config["num_slots"], config["batch_size"], tuple(config["image_shape"]))
        ring = SlotRing.attach(config["shm_name"], layout)
        processor = ChunkProcessor(config, ring)
        processor.current = np.frombuffer(current.get_obj(), np.int64)[worker_id : worker_id + 1]
    except BaseException as err:  # report start-up failures instead of dying silently
        _send_error(conn, err, None, None, -1, None)
        return
    conn.send_bytes(HEADER.pack(READY, 0, 0, 0, 0))
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the loader is gone
        op, slot, row, epoch, count = HEADER.unpack_from(message)
        if op == STOP:
            processor.close()
            return
        indices = np.frombuffer(message, np.int64, count=count, offset=HEADER.size)
        try:
            processor.process(slot, row, epoch, indices)
        except ChunkFailure as failure:
            _send(conn, ERROR, failure.fields)
            continue
        except BaseException as err:
            _send_error(conn, err, None, None, -1, None)
            continue
        conn.send_bytes(HEADER.pack(DONE, slot, row, epoch, count))


def _send_error(conn: Any, err: BaseException, shard: str | None, record: int | None, index: int, offset: int | None) -> None:
    _send(
        conn,
        ERROR,
        {
            "message": err.message if isinstance(err, ShardfmtError) else f"{type(err).__name__}: {err}",
            "shard": shard if shard is not None else getattr(err, "path", None),
            "record": record if record is not None else getattr(err, "record", None),
            "index": index,
            "offset": offset if offset is not None else getattr(err, "offset", None),
            "kind": type(err).__name__,
            "trace": traceback.format_exc(),
        },
    )


def _send(conn: Any, op: int, payload: dict[str, Any]) -> None:
    try:
        conn.send_bytes(HEADER.pack(op, 0, 0, 0, 0) + json.dumps(payload).encode())
    except (BrokenPipeError, OSError):
        os._exit(1)
