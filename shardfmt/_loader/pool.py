"""The loader's worker processes: start, feed chunks, collect completions, report failures.

`WorkerPool` owns the processes and their pipes; `InlinePool` has the same interface and decodes
in the calling process (num_workers=0). Each worker holds at most `DEPTH` chunks, so a slow
worker never holds back more than that, and chunks go to the least-loaded worker.

Failures never hang: a worker's ERROR message, its death (its process sentinel fires) or no
progress for `timeout` seconds raise `WorkerError` naming the shard and record. An ERROR keeps
the class the worker raised: the error is an instance of it too (`errors.worker_error_class`),
with the worker's traceback as its cause; a death is reported with the signal that ended the
worker, from whichever end of the pipe finds it first (a send, a receive, the sentinel). One death is
survived: a worker that ends inside libjpeg's partial decoder (libjpeg reports a fatal error by
``exit()``) is replaced, the chunks it held go to its replacement, and the record is decoded whole
by every worker from then on, with one warning naming it. A second death on that record is a
`WorkerError`.

Workers never outlive the loader's process: each closes the loader's pipe ends it inherited,
arms Linux's parent-death signal and checks its parent while idle (`forks.Lifeline`), and maps
each slot's segment through a file descriptor the loader sends over its pipe before the first
task that names it (SEGMENT), no segment having a name in /dev/shm (`shm`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import random
import signal
import time
import warnings
from collections import deque
from collections.abc import Iterator
from multiprocessing import connection, reduction
from typing import Any

import cv2
import numpy as np
import torch

from .._dataset.concat import RecordSource
from .._errors import WorkerError, WorkerTraceback, worker_error_class
from .._forks import Lifeline, frozen_heap, shared_zeros, signals_held
from .chunk import ChunkFailure, ChunkProcessor, WorkerConfig, checked_bytes
from .shm import SlotRing, descriptor_error
from .watchdog import Stalled, stall_alarm
from .worker import DONE, ERROR, HEADER, READY, SEGMENT, TASK, worker_main

__all__ = ["Chunk", "InlinePool", "WorkerPool"]

DEPTH = 2
Chunk = tuple[int, int, int, int, np.ndarray]  # slot, serial, row, epoch, record indices


class WorkerPool:
    """Worker processes decoding chunks into the slots of `ring`.

    Args:
        config: the workers' configuration (pickled as it is under spawn).
        ring: the shared-memory slots (its name goes into the config).
        num_workers: processes to start.
        start_method: multiprocessing start method, None for the platform default.
        timeout: seconds without any completion before the pool reports a stall.
        dataset: the loader's dataset: it names the shard and record in error messages, and
            forked workers of a local dataset inherit it (no manifest parsed again).
        checked: the shared bitmap of checked records (`chunk.checked_bytes`) of an earlier
            pool of the same loader and start method, or None for a new one.
    """

    def __init__(
        self,
        *,
        config: WorkerConfig,
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
        self.chunks: dict[tuple[int, int], Chunk] = {}  # what is in flight, to give a replaced worker's chunks again
        self.ring = ring
        self._context: Any = multiprocessing.get_context(start_method)
        method = self._context.get_start_method()
        # shared with the workers, made without writing their bytes (`forks.shared_zeros`): the
        # record each worker is on (-1: none), the checked records, the partial-decode flags,
        # the records to decode whole
        self._current = shared_zeros(method, 8 * num_workers)
        self.current = np.frombuffer(self._current, np.int64)
        self.current[:] = -1
        self.checked = checked if checked is not None else shared_zeros(method, checked_bytes(len(dataset)))
        self.partial = shared_zeros(method, num_workers)
        self.whole_only = shared_zeros(method, checked_bytes(len(dataset)))
        self._config = dataclasses.replace(config, ring=ring.name)
        self._starting: set[int] = set()  # workers not READY yet
        self._sent: list[set[int]] = [set() for _ in range(num_workers)]  # the segments each worker was sent
        try:
            for worker_id in range(num_workers):
                self._start_worker(worker_id)
            ready = 0
            deadline = time.monotonic() + timeout
            while ready < num_workers:
                ready += sum(1 for op in self._poll(deadline, starting=True) if op == READY)
        except BaseException:
            self.shutdown()  # no worker outlives a pool that failed to start
            raise

    def _start_worker(self, worker_id: int) -> None:
        parent_end, child_end = self._context.Pipe(duplex=True)
        shared = (self._current, self.checked, self.partial, self.whole_only)
        method = self._context.get_start_method()
        # a forked worker inherits every pipe end of the loader: it closes them, or it would hold
        # its own pipe open and never see the loader go
        inherited = tuple(conn for conn in [*self.conns, parent_end] if not conn.closed) if method == "fork" else ()
        # a forked worker inherits the dataset as it stands here, manifest parsed (its shard
        # maps and checked blocks are the same file's); a remote one's clients are not
        # fork-safe, and a spawned worker would get it pickled: those open their own
        dataset = self.dataset if method == "fork" and not self.dataset.is_remote else None
        process = self._context.Process(
            target=worker_main,
            args=(worker_id, child_end, self._config, *shared),
            kwargs={"lifeline": Lifeline.here(method), "inherited": inherited, "dataset": dataset},
            name=f"shardfmt-worker-{worker_id}",
            daemon=True,
        )
        self._starting.add(worker_id)
        self._sent[worker_id] = set()
        with frozen_heap(method), opencv_threads(1), signals_held(method):  # a forked worker ready in half the time
            process.start()
        child_end.close()
        if worker_id < len(self.processes):
            self.processes[worker_id], self.conns[worker_id] = process, parent_end
        else:
            self.processes.append(process)
            self.conns.append(parent_end)

    @property
    def busy_slots(self) -> set[int]:
        return {slot for slot, _row in self.outstanding}

    def feed(self, pending: deque[Chunk]) -> None:
        """Send chunks from the front of `pending` while some worker has room.

        Raises:
            WorkerError: a worker died (see `_worker_died`).
        """
        while pending:
            worker_id = min(range(self.num_workers), key=self.load.__getitem__)
            if self.load[worker_id] >= DEPTH:
                return
            chunk = pending.popleft()
            self.outstanding[(chunk[0], chunk[2])] = worker_id
            self.chunks[(chunk[0], chunk[2])] = chunk
            self._send(worker_id, chunk)

    def _send(self, worker_id: int, chunk: Chunk) -> None:
        slot, serial, row, epoch, indices = chunk
        conn = self.conns[worker_id]
        try:
            handle = self.ring.slots[slot].handle if self.ring.serials[slot] == serial else None
            if handle is not None and serial not in self._sent[worker_id]:  # POSIX: the segment has no name
                conn.send_bytes(HEADER.pack(SEGMENT, slot, serial, 0, 0, 0))
                reduction.send_handle(conn, handle, self.processes[worker_id].pid)
                self._sent[worker_id].add(serial)
            conn.send_bytes(HEADER.pack(TASK, slot, serial, row, epoch, len(indices)) + indices.tobytes())
        except OSError as err:
            limit = descriptor_error(err, f"send a batch slot to worker {worker_id}")
            if limit is not None:  # this process is out of descriptors, not the worker gone
                raise limit from err
            self._worker_died(worker_id)  # the worker is gone: replaced with this chunk resent, or reported
            return
        self.load[worker_id] += 1

    def wait(self) -> None:
        """Block until at least one chunk completes. Raises WorkerError on any failure."""
        self._poll(time.monotonic() + self.timeout)

    def drain(self) -> None:
        """Wait until no chunk is in flight."""
        while self.outstanding:
            self.wait()

    def _poll(self, deadline: float, *, starting: bool = False) -> list[int]:
        while True:
            # made afresh each time round: a worker may have been replaced
            sentinels = {process.sentinel: i for i, process in enumerate(self.processes)}
            ready = connection.wait(self.conns + list(sentinels), timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            ops = []
            for item in ready:
                if item in sentinels:
                    worker_id = sentinels[item]
                    if self.processes[worker_id].sentinel == item and not self.conns[worker_id].poll(0):
                        self._worker_died(worker_id)
                    continue
                if item in self.conns:  # not the pipe of a worker replaced a moment ago
                    op = self._handle(self.conns.index(item), item)
                    if op is not None:
                        ops.append(op)
            if ops:
                return ops
            if time.monotonic() > deadline:
                if starting:
                    raise WorkerError(
                        f"the workers were not ready within timeout={self.timeout:g} s (they import torch and open the dataset)"
                    )
                raise WorkerError(f"no progress for {self.timeout:g} s (the timeout); {self._whereabouts()}")

    def _whereabouts(self) -> str:
        """Where each worker is, for a stall report: the shard and record, or idle."""
        places = []
        for worker_id in range(len(self.processes)):
            index = int(self.current[worker_id])
            if index < 0:
                places.append(f"worker {worker_id} is between records")
            else:
                shard, record = self._locate(index)
                places.append(f"worker {worker_id} is on {shard} record {record} (dataset record {index})")
        return "; ".join(places)

    def _locate(self, index: int) -> tuple[str, int]:
        shard_index, record = self.dataset.locate(index)
        return self.dataset.shard_path(shard_index), record

    def _handle(self, worker_id: int, conn: Any) -> int | None:
        """Take one message from a worker; None when the worker was dead and has been replaced."""
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            self._worker_died(worker_id)
            return None
        if len(message) < HEADER.size:
            raise WorkerError(f"worker {worker_id} sent a message of {len(message)} bytes, shorter than any the protocol has")
        op, slot, _serial, row, _epoch, _count = HEADER.unpack_from(message)
        if op == ERROR:
            try:
                info = json.loads(message[HEADER.size :].decode())
            except ValueError as err:
                raise WorkerError(f"worker {worker_id} reported a failure that does not parse: {err}") from err
            raise failure_error(info, f"worker {worker_id}")
        if op == READY:
            self._starting.discard(worker_id)
        elif op == DONE:
            self.load[worker_id] -= 1
            self.outstanding.pop((slot, row), None)
            self.chunks.pop((slot, row), None)
        return int(op)

    def _worker_died(self, worker_id: int) -> None:
        """Replace a worker that ended inside a partial decode of a record not yet marked to be
        decoded whole (see the module docstring); else raise WorkerError naming the record."""
        process = self.processes[worker_id]
        process.join(5.0)  # its pipe or sentinel says it is ending: wait for its exit status
        if process.is_alive():  # its pipe closed first: make sure it is gone
            process.kill()
            process.join(1.0)
        how = _exit_description(process.exitcode)
        index = int(self.current[worker_id])
        shard = record = None
        if index >= 0:
            shard, record = self._locate(index)
        byte, bit = index >> 3, 1 << (index & 7)
        if index < 0 or not self.partial[worker_id] or self.whole_only[byte] & bit:
            if index >= 0:
                where = f" while decoding record {record} of {shard} (dataset record {index})"
            else:
                where = " while starting" if worker_id in self._starting else " between records"
            raise WorkerError(f"worker {worker_id} (pid {process.pid}) {how}{where}", path=shard, record=record)
        self.whole_only[byte] |= bit
        warnings.warn(
            f"{shard}: record {record}: worker {worker_id} (pid {process.pid}) {how} in libjpeg's partial decoding of "
            f"dataset record {index}; a new worker took its place, and this loader decodes the record whole from now on",
            RuntimeWarning,
            stacklevel=2,
        )
        self.conns[worker_id].close()
        self.current[worker_id], self.partial[worker_id], self.load[worker_id] = -1, 0, 0
        self._start_worker(worker_id)
        for key, owner in list(self.outstanding.items()):
            if owner == worker_id:
                self._send(worker_id, self.chunks[key])

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
        self.processes, self.conns, self.outstanding, self.chunks = [], [], {}, {}


class InlinePool:
    """The same interface, decoding in the calling process (num_workers=0, for debugging). A chunk
    that runs `timeout` seconds is stopped by a timer in the main thread (`watchdog`) and
    reported as a stall, as the workers' are."""

    def __init__(self, *, config: WorkerConfig, ring: SlotRing, timeout: float, checked: np.ndarray | None = None) -> None:
        self.timeout = timeout
        self.processor = ChunkProcessor(config, lambda slot, serial: ring.arrays[slot])
        self._user_steps = config.transform is not None and bool(config.transform.steps)
        if checked is not None:
            self.processor.checked = checked
        self.outstanding: dict[tuple[int, int], int] = {}
        self.busy_slots: set[int] = set()

    def feed(self, pending: deque[Chunk]) -> None:
        # Per-image torch calls are tiny; the caller's thread pool would make them 6x slower.
        # User steps seed the global generators before each sample: the caller's states come back.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        states = (torch.get_rng_state(), np.random.get_state(), random.getstate()) if self._user_steps else None
        opencv = cv2.getNumThreads()
        cv2.setNumThreads(1)  # no fork follows here, so the pool may change
        try:
            while pending:
                slot, serial, row, epoch, indices = pending.popleft()
                try:
                    with stall_alarm(self.timeout):
                        self.processor.process(slot, serial, row, epoch, indices)
                except ChunkFailure as failure:
                    raise failure_error(failure.fields, "decoding") from (failure.__cause__ or failure)
                except Stalled as stalled:
                    raise self._stall_error() from stalled
        finally:
            cv2.setNumThreads(opencv)
            torch.set_num_threads(threads)
            if states is not None:
                torch.set_rng_state(states[0])
                np.random.set_state(states[1])
                random.setstate(states[2])

    def _stall_error(self) -> WorkerError:
        index = int(self.processor.current[0])
        if index < 0:
            return WorkerError(f"no progress for {self.timeout:g} s (the timeout) in the loader's process (num_workers=0), between records")
        shard, record = self.processor.locate(index)
        return WorkerError(
            f"no progress for {self.timeout:g} s (the timeout); the loader's process (num_workers=0) is on {shard} record {record} "
            f"(dataset record {index})",
            path=shard,
            record=record,
        )

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
    index = info.get("index")
    where = f"on dataset record {index}" if isinstance(index, int) and index >= 0 else "before its first record"
    error = worker_error_class(str(info.get("kind")))(
        f"{who} failed {where}: {info.get('message')}",
        path=info.get("shard"),
        offset=info.get("offset"),
        record=info.get("record"),
    )
    error.__cause__ = WorkerTraceback(str(info.get("trace")))
    return error


@contextlib.contextmanager
def opencv_threads(count: int) -> Iterator[None]:
    """OpenCV's thread count set to `count` for the block, then restored: around a fork, so that
    a forked worker inherits a pool of one thread (setting it in a child forked from a process
    whose pool has run hangs), and around decoding in the caller's process."""
    before = cv2.getNumThreads()
    if before != count:
        cv2.setNumThreads(count)
    try:
        yield
    finally:
        if before != count:
            cv2.setNumThreads(before)


def _exit_description(code: int | None) -> str:
    """How a worker ended, from its exit status: "was killed by signal 9 (SIGKILL)", ..."""
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-code}{name}"
    return f"exited with code {code}"
