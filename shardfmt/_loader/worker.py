"""Loader workers: the process that decodes chunks of records straight into shared-memory batch
slots (with a `chunk.ChunkProcessor`), and the messages between it and the loader.

A worker is started once per loader with a `WorkerConfig` (the dataset path, the pipeline and
the steps as the objects the caller gave, the slot layout), pickled as it is under spawn, so it
works under spawn as well as fork; the dataset object is never pickled: a spawned worker opens
the dataset the config names, a forked one of a local dataset inherits the loader's (its
manifest parsed already). Messages are fixed structs sent with `send_bytes` (no pickling):

    loader -> worker   SEGMENT (serial) then the segment's file descriptor (POSIX)
                       TASK  (slot, serial, row, epoch, count) + count int64 record indices
                       STOP
    worker -> loader   READY | DONE (slot, row, count) | ERROR + UTF-8 JSON

While it works, a worker stores the record it is on in a shared array, so that if it dies the
loader can name the shard and record, and it holds a shared byte at 1 while libjpeg's partial
decoder runs (`ops.decode.ImageDecoder.in_partial_decode`), so that the loader can tell a death there from
any other. The workers also share the bitmaps of checked records and of records to decode whole
(`chunk`).

A task names the slot's segment by its serial (`shm.SlotRing.replace` puts fresh segments in the
ring); a worker maps a segment the first time a task names it and drops the slot's old mapping.
On POSIX the segments have no names: the loader sends each one's file descriptor (SEGMENT)
before the first task that names it.
"""

from __future__ import annotations

import json
import os
import struct
import traceback
from multiprocessing import reduction
from typing import Any

import numpy as np

from .._dataset.concat import RecordSource
from .._errors import ShardfmtError, worker_error_kind
from .._forks import WATCH_SECONDS, Lifeline, default_signals, parent_alive
from .chunk import ChunkFailure, ChunkProcessor, WorkerConfig
from .shm import attach, map_segment, slot_arrays

__all__ = ["DONE", "ERROR", "HEADER", "READY", "SEGMENT", "STOP", "TASK", "worker_main"]

TASK, STOP, READY, DONE, ERROR, SEGMENT = 1, 2, 3, 4, 5, 6
HEADER = struct.Struct("<qqqqqq")  # op, slot, serial, row, epoch, count


def worker_main(
    worker_id: int,
    conn: Any,
    config: WorkerConfig,
    current: Any,
    checked: Any,
    partial: Any,
    whole_only: Any,
    *,
    lifeline: Lifeline,
    inherited: tuple[Any, ...] = (),
    dataset: RecordSource | None = None,
) -> None:
    """Entry point of a worker process: serve TASK messages until STOP or the loader goes away.

    `current`, `checked`, `partial` and `whole_only` are the pool's shared arrays: the record each
    worker is on, the checked records, the byte per worker set during a partial decode, and the
    records to decode whole. `lifeline` ties the worker to the loader's process (it exits when
    that ends, `forks.Lifeline`); `inherited` are the loader's ends of the workers' pipes, which a
    forked worker holds copies of and closes, so that its own pipe reports the loader's end;
    `dataset` is the loader's dataset, which a forked worker inherits instead of parsing the
    manifest again (None: the worker opens the dataset `config` names)."""
    default_signals()  # not the parent's handlers: SIGTERM ends a worker, Ctrl-C is the loader's
    parent = lifeline.hold()
    for end in inherited:
        end.close()
    _one_thread_each()
    segments: dict[int, Any] = {}  # serial -> a mapping received and not yet taken by a task

    def slot_arrays_of(slot: int, serial: int) -> dict[str, np.ndarray]:
        if os.name != "posix":
            return attach(config.ring, serial, config.layout)
        buffer = segments.pop(serial, None)
        if buffer is None:
            raise RuntimeError(f"no segment {serial} was sent before the task that names it")
        return slot_arrays(buffer, config.layout)

    try:
        processor = ChunkProcessor(config, slot_arrays_of, in_worker=True, dataset=dataset)
        processor.current = np.frombuffer(current, np.int64)[worker_id : worker_id + 1]
        processor.checked = np.frombuffer(checked, np.uint8)
        processor.whole_only = np.frombuffer(whole_only, np.uint8)
        processor.share_partial_flag(np.frombuffer(partial, np.uint8).data[worker_id : worker_id + 1])
    except BaseException as err:  # report start-up failures instead of dying silently
        _send_error(conn, err, None, None, -1, None)
        return
    _reply(conn, HEADER.pack(READY, 0, 0, 0, 0, 0))
    _serve(conn, processor, config, segments, parent)


def _one_thread_each() -> None:
    """Keep torch and OpenCV to one thread: the workers are the loader's parallelism."""
    import cv2
    import torch

    torch.set_num_threads(1)
    if cv2.getNumThreads() != 1:
        # OpenCV's own pool would compete with the other workers for the cores. A forked worker
        # has it at 1 already (set around the fork: calling this in a child forked from a process
        # whose pool ran hangs); a spawned one starts fresh.
        cv2.setNumThreads(1)


def _serve(conn: Any, processor: ChunkProcessor, config: WorkerConfig, segments: dict[int, Any], parent: Any) -> None:
    """Answer the loader's messages until STOP, or until the loader is gone."""
    while True:
        try:
            if not conn.poll(WATCH_SECONDS):
                if not parent_alive(parent):
                    return
                continue
            message = conn.recv_bytes()
            op, slot, serial, row, epoch, count = HEADER.unpack_from(message)
            if op == SEGMENT:
                _receive_segment(conn, serial, config, segments)
                continue
        except (EOFError, OSError):
            return  # the loader is gone
        if op == STOP:
            processor.close()
            return
        _run_task(conn, processor, message, slot, serial, row, epoch, count)


def _receive_segment(conn: Any, serial: int, config: WorkerConfig, segments: dict[int, Any]) -> None:
    """Map the segment whose file descriptor follows a SEGMENT message, for the task that names it."""
    handle = reduction.recv_handle(conn)
    try:
        segments[serial] = map_segment(handle, config.layout)
    finally:
        os.close(handle)


def _run_task(conn: Any, processor: ChunkProcessor, message: bytes, slot: int, serial: int, row: int, epoch: int, count: int) -> None:
    """Fill the rows a TASK names and answer DONE, or ERROR naming the record that failed."""
    indices = np.frombuffer(message, np.int64, count=count, offset=HEADER.size)
    try:
        processor.process(slot, serial, row, epoch, indices)
    except ChunkFailure as failure:
        _send(conn, ERROR, failure.fields)
        return
    except BaseException as err:
        _send_error(conn, err, None, None, int(processor.current[0]), None)
        return
    _reply(conn, HEADER.pack(DONE, slot, serial, row, epoch, count))


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
            "kind": worker_error_kind(err),
            "trace": traceback.format_exc(),
        },
    )


def _send(conn: Any, op: int, payload: dict[str, Any]) -> None:
    _reply(conn, HEADER.pack(op, 0, 0, 0, 0, 0) + json.dumps(payload).encode())


def _reply(conn: Any, message: bytes) -> None:
    """Send to the loader; a worker whose loader is gone has nobody to work for and ends."""
    try:
        conn.send_bytes(message)
    except OSError:
        os._exit(0)
