"""The loader's worker processes: start, feed chunks, collect completions, report failures.

`WorkerPool` owns the processes and their pipes; `InlinePool` has the same interface and decodes
in the calling process (num_workers=0). Each worker holds at most `DEPTH` chunks, so a slow
worker never holds back more than that, and chunks go to the least-loaded worker.

Failures never hang: a worker's ERROR message, its death (its process sentinel fires) or no
progress for `timeout` seconds raise `WorkerError` naming the shard and record. An ERROR keeps
the class the worker raised: the error is an instance of it too (`errors.worker_error_class`),
with the worker's traceback as its cause.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections import deque
from multiprocessing import connection
from typing import Any

import numpy as np
import torch

from ..dataset.concat import RecordSource
from ..errors import WorkerError, WorkerTraceback, worker_error_class
from .shm import SlotRing
from .worker import (
    DONE,
    ERROR,
    HEADER,
    READY,
    TASK,
    ChunkFailure,
    ChunkProcessor,
    checked_bytes,
    worker_main,
)

__all__ = ["Chunk", "InlinePool", "WorkerPool"]

DEPTH = 2
Chunk = tuple[int, int, int, np.ndarray]  # slot, row, epoch, record indices


class WorkerPool:
    """Worker processes decoding chunks into the slots of `ring`.

    Args:
        config: the workers' configuration (plain values only; it is pickled for spawn).
        ring: the shared-memory slots (its name goes into the config).
        num_workers: processes to start.
        start_method: multiprocessing start method, None for the platform default.
        timeout: seconds without any completion before the pool reports a stall.
        dataset: used only to name the shard and record in error messages.
        checked: the shared bitmap of checked records (`worker.checked_bytes`) of an earlier
            pool of the same loader and start method, or None for a new one.
    """

    def __init__(
        self,
        *,
        config: dict[str, Any],
        ring: SlotRing,
        num_workers: int,
        start_method: str | None,
        timeout: float,
        dataset: RecordSource,
        checked: Any = None,
    ) -> None:
        self.num_workers = num_workers
        self.timeout = timeout
        self.dataset = dataset
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        self.load = [0] * num_workers
        self.outstanding: dict[tuple[int, int], int] = {}
        self.ring = ring
        context = multiprocessing.get_context(start_method)
        self.current = context.Array("q", [-1] * num_workers)
        self.checked = checked if checked is not None else context.RawArray("B", checked_bytes(len(dataset)))
        config = dict(config, shm_name=ring.name)
        for worker_id in range(num_workers):
            parent_end, child_end = context.Pipe(duplex=True)
            process = context.Process(target=worker_main, args=(worker_id, child_end, config, self.current, self.checked), name=f"shardfmt-worker-{worker_id}", daemon=True)
            process.start()
            child_end.close()
            self.processes.append(process)
            self.conns.append(parent_end)
        ready = 0
        deadline = time.monotonic() + timeout
        while ready < num_workers:
            ready += sum(1 for op in self._poll(deadline) if op == READY)

    @property
    def busy_slots(self) -> set[int]:
        return {slot for slot, _row in self.outstanding}

    def feed(self, pending: deque[Chunk]) -> None:
        """Send chunks from the front of `pending` while some worker has room."""
        while pending:
            worker_id = min(range(self.num_workers), key=self.load.__getitem__)
            if self.load[worker_id] >= DEPTH:
                return
            slot, row, epoch, indices = pending.popleft()
            self.conns[worker_id].send_bytes(HEADER.pack(TASK, slot, row, epoch, len(indices)) + indices.tobytes())
            self.load[worker_id] += 1
            self.outstanding[(slot, row)] = worker_id

    def wait(self) -> None:
        """Block until at least one chunk completes. Raises WorkerError on any failure."""
        self._poll(time.monotonic() + self.timeout)

    def drain(self) -> None:
        """Wait until no chunk is in flight."""
        while self.outstanding:
            self.wait()

    def _poll(self, deadline: float) -> list[int]:
        sentinels = {process.sentinel: i for i, process in enumerate(self.processes)}
        while True:
            ready = connection.wait(self.conns + list(sentinels), timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            ops = []
            for item in ready:
                if item in sentinels:
                    worker_id = sentinels[item]
                    if not self.conns[worker_id].poll(0):
                        self._raise_dead(worker_id)
                    continue
                ops.append(self._handle(self.conns.index(item), item))
            if ops:
                return ops
            if time.monotonic() > deadline:
                busy = [int(i) for i in self.current]
                raise WorkerError(f"no progress for {self.timeout:.0f} s; workers are on dataset records {busy}")

    def _handle(self, worker_id: int, conn: Any) -> int:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            self._raise_dead(worker_id)
        op, slot, row, _epoch, _count = HEADER.unpack_from(message)
        if op == ERROR:
            raise failure_error(json.loads(message[HEADER.size :].decode()), f"worker {worker_id}")
        if op == DONE:
            self.load[worker_id] -= 1
            del self.outstanding[(slot, row)]
        return int(op)

    def _raise_dead(self, worker_id: int) -> None:
        process = self.processes[worker_id]
        process.join(0.1)
        code = process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        index = int(self.current[worker_id])
        shard = record = None
        if index >= 0:
            shard_index, record = self.dataset.locate(index)
            shard = self.dataset.shard_path(shard_index)
        where = f" while decoding dataset record {index}" if index >= 0 else ""
        raise WorkerError(f"worker {worker_id} (pid {process.pid}) {how}{where}", path=shard, record=record)

    def shutdown(self) -> None:
        """Stop every worker at once and close the pipes. Idempotent.

        Workers hold nothing that needs a clean exit (read-only maps, slots the loader owns),
        so they are terminated rather than asked to finish the chunks queued to them.
        """
        for process in self.processes:
            if process.is_alive():
                process.terminate()
        for process in self.processes:
            process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        for conn in self.conns:
            conn.close()
        self.processes, self.conns, self.outstanding = [], [], {}


class InlinePool:
    """The same interface, decoding in the calling process (num_workers=0, for debugging)."""

    def __init__(self, *, config: dict[str, Any], ring: SlotRing, checked: np.ndarray | None = None) -> None:
        self.processor = ChunkProcessor(config, ring)
        if checked is not None:
            self.processor.checked = checked
        self.outstanding: dict[tuple[int, int], int] = {}
        self.busy_slots: set[int] = set()

    def feed(self, pending: deque[Chunk]) -> None:
        # Per-image torch calls are tiny; the caller's thread pool would make them 6x slower.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            while pending:
                slot, row, epoch, indices = pending.popleft()
                try:
                    self.processor.process(slot, row, epoch, indices)
                except ChunkFailure as failure:
                    raise failure_error(failure.fields, "decoding") from (failure.__cause__ or failure)
        finally:
            torch.set_num_threads(threads)

    def wait(self) -> None:
        return

    def drain(self) -> None:
        return

    def shutdown(self) -> None:
        self.processor.close()


def failure_error(info: dict[str, Any], who: str) -> WorkerError:
    """Build the error for a failure report from a worker (or the inline processor): an instance
    of `WorkerError` and of the class the worker raised, named by `info["kind"]` (see
    `errors.worker_error_class`), with the worker's traceback as its ``__cause__``."""
    error = worker_error_class(str(info["kind"]))(
        f"{who} failed on dataset record {info['index']}: {info['message']}",
        path=info.get("shard"),
        offset=info.get("offset"),
        record=info.get("record"),
    )
    error.__cause__ = WorkerTraceback(str(info["trace"]))
    return error
