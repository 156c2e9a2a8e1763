"""Engines that build record chunks in parallel and hand the results back in plan order.

`imap_ordered(fn, args, items)` runs ``fn(args, item)`` for every item and yields the results
in the order of `items`, with at most `window` items in flight, so memory stays bounded however
long the plan is. Three engines share that one contract: inline (one worker: this process), a
local process pool (forked workers that die with the converting process), and Ray (one task per
item on the running cluster, or a local Ray instance).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final, TypeVar

from ..errors import ConvertError, ShardfmtError, WorkerError
from ..forks import frozen_heap

__all__ = ["ENGINES", "WorkerDied", "imap_ordered"]

ENGINES: Final = ("local", "ray")

T = TypeVar("T")
R = TypeVar("R")


class WorkerDied(Exception):
    """A worker process died (killed, or out of memory) while it held `item`."""

    def __init__(self, item: Any) -> None:
        super().__init__("a worker process died")
        self.item = item


def imap_ordered(
    fn: Callable[[Any, T], R], args: Any, items: Iterable[T], *, engine: str, workers: int, window: int
) -> Iterator[R]:
    """Yield ``fn(args, item)`` for each item, in order (see the module docstring).

    Args:
        fn: a module-level function, so that it reaches worker processes and Ray tasks.
        args: its first argument, the same for every item (sent once per item).
        items: the work, consumed lazily.
        engine: "local" or "ray".
        workers: processes for "local" (1 runs inline).
        window: items in flight at most.

    Raises:
        WorkerDied: a worker process died holding an item (local engine).
        ConvertError: Ray is asked for and not installed.
        WorkerError: a Ray task failed or its worker died.
        Whatever `fn` raises, re-raised in this process.
    """
    if engine == "ray":
        yield from _ray_map(fn, args, items, window=window)
    elif workers <= 1:
        for item in items:
            yield fn(args, item)
    else:
        yield from _pool_map(fn, args, items, workers=workers, window=window)


def _pool_map(fn: Callable[[Any, T], R], args: Any, items: Iterable[T], *, workers: int, window: int) -> Iterator[R]:
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with frozen_heap(context.get_start_method()):  # the pool forks its workers on the first submits
        yield from _run_pool(fn, args, items, context=context, workers=workers, window=window)


def _run_pool(fn: Callable[[Any, T], R], args: Any, items: Iterable[T], *, context: Any, workers: int, window: int) -> Iterator[R]:
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),))
    pending: deque[tuple[Future[R], T]] = deque()
    source = iter(items)
    try:
        while True:
            while len(pending) < window:
                item = next(source, _END)
                if item is _END:
                    break
                pending.append((pool.submit(fn, args, item), item))  # type: ignore[arg-type]
            if not pending:
                return
            future, item = pending.popleft()
            try:
                result = future.result()
            except BrokenProcessPool as err:
                raise WorkerDied(item) from err
            yield result
    finally:
        for future, _ in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


_END: Final = object()


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this worker when the converting process dies (Linux), so that a
    ``kill -9`` of the converter leaves no worker writing behind a resumed run."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _ray_map(fn: Callable[[Any, T], R], args: Any, items: Iterable[T], *, window: int) -> Iterator[R]:
    try:
        import ray
    except ImportError as err:
        raise ConvertError("--engine ray needs Ray: pip install 'shardfmt[ray]'") from err
    started_here = False
    if not ray.is_initialized():
        try:
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:  # no running cluster: start a local instance for this conversion
            ray.init(include_dashboard=False, log_to_driver=False)
        started_here = True
    try:
        remote_fn = ray.remote(num_cpus=1, max_retries=1)(fn)
        shared = ray.put(args)
        pending: deque[Any] = deque()
        source = iter(items)
        while True:
            while len(pending) < window:
                item = next(source, _END)
                if item is _END:
                    break
                pending.append(remote_fn.remote(shared, item))
            if not pending:
                return
            try:
                yield ray.get(pending.popleft())
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None)
                if isinstance(cause, ShardfmtError):
                    raise cause from err
                raise WorkerError(f"a Ray task failed: {err}") from err
            except ray.exceptions.RayError as err:
                raise WorkerError(f"a Ray worker died before its records were built: {type(err).__name__}") from err
    finally:
        if started_here:
            ray.shutdown()
