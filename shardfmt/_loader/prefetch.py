"""Downloading whole shards into the cache ahead of the workers, in the order batches need them.

Used by `Loader` for a remote dataset read with ``RemoteOptions(mode="cache")``. The loader knows
its order (`sampling.keys.sample_batches`), so for every batch it schedules the prefetcher works out
which shards are in use from that batch on and which come next, by their first record in the
order, and downloads the next `ahead` of them on a few threads. A failed prefetch is only logged:
the worker that needs the shard fetches it itself and reports the error with shard and record.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .._dataset.reader import DatasetReader
from .._sampling.ranks import RankPlan

__all__ = ["ShardPrefetcher"]

logger = logging.getLogger("shardfmt._storage")


class ShardPrefetcher:
    """Fetch shards of `dataset` into its cache ahead of use.

    Args:
        dataset: a remote dataset opened with a cache.
        ahead: shards to have on their way beyond those the scheduled batch reads.
        threads: downloads at a time.
    """

    def __init__(self, dataset: DatasetReader, *, ahead: int, threads: int) -> None:
        self.dataset = dataset
        self.ahead = ahead
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="shardfmt-prefetch")
        self._spans: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._submitted: dict[int, set[int]] = {}
        self.futures: list[Future[None]] = []

    def _span(self, epoch: int, plan: RankPlan) -> tuple[np.ndarray, np.ndarray]:
        """(first, last) position in the plan at which each shard is read; -1 if never."""
        span = self._spans.get(epoch)
        if span is None:
            num_shards = len(self.dataset.manifest.shards)
            shards = np.searchsorted(self.dataset.cumulative, plan.indices, side="right") - 1
            positions = np.arange(len(shards))
            first = np.full(num_shards, len(shards), np.int64)
            last = np.full(num_shards, -1, np.int64)
            np.minimum.at(first, shards, positions)
            np.maximum.at(last, shards, positions)
            span = (first, last)
            self._spans = {e: s for e, s in self._spans.items() if e >= epoch - 1}
            self._spans[epoch] = span
        return span

    def schedule(self, epoch: int, plan: RankPlan, batch: int) -> None:
        """The loader is about to decode `batch` of `epoch`: start its shards and the next ones."""
        first, last = self._span(epoch, plan)
        start, stop = int(plan.bounds[batch]), int(plan.bounds[batch + 1])
        live = np.flatnonzero(last >= start)
        live = live[np.argsort(first[live], kind="stable")]
        wanted = live[: int(np.count_nonzero(first[live] < stop)) + self.ahead]
        submitted = self._submitted.setdefault(epoch, set())
        for shard in wanted.tolist():
            if shard not in submitted:
                submitted.add(shard)
                self.futures.append(self._pool.submit(self._fetch, shard))
        self._submitted = {e: s for e, s in self._submitted.items() if e >= epoch - 1}
        self.futures = [f for f in self.futures if not f.done()]

    def _fetch(self, shard: int) -> None:
        try:
            self.dataset.location.fetch_shard(self.dataset.manifest.shards[shard])
        except Exception as err:  # the worker that needs it will fetch it and report
            logger.info("prefetching shard %d failed: %s", shard, err)

    def close(self) -> None:
        """Cancel what has not started; downloads in progress finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)
