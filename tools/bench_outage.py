"""How long an outage of an object store takes to surface, and how many requests it costs.

S3: `open_dataset` of a dataset whose S3 server (moto, as the tests run it) has been stopped.
GCS and Azure: one range read through gcsfs or adlfs from a local server that answers every
request with 503. Each for RetryPolicy(attempts=1) and the default 5 attempts, timed `--runs`
times. `--backend-retries` measures the backends' own defaults instead (their retries left on,
as before shardfmt turned them off): a call then takes a minute or more.

`--mid-shard` measures instead a `Loader` reading an S3 dataset by range reads (one shard of
256 records, 400 kB) through a TCP relay in a process of its own, which is killed after the
first batch: its connections are reset and its port refuses new ones, as when a server dies.
It prints the seconds from the kill to the loader's `RemoteError`, with `--workers` processes.
(The relay runs apart because a loader's forked workers would otherwise hold its listening
socket open, and a connection then waits for its read timeout instead of being refused.)

Usage:
    python tools/bench_outage.py --runs 3
    python tools/bench_outage.py --store gcs --store azure --attempts 1 --runs 1 --backend-retries
    python tools/bench_outage.py --mid-shard --workers 2 --runs 3
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from remote_servers import azure_options, gcs_options, make_bucket, moto_server, s3_options, storage_server, upload_tree  # noqa: E402

import shardfmt._storage.remote  # noqa: E402
from shardfmt import DatasetWriter, ImageTransform, Loader, RemoteError, RemoteOptions, RetryPolicy, Sampling, open_dataset  # noqa: E402
from shardfmt._storage.remote import FsspecStore  # noqa: E402
from shardfmt._synthetic import make_image  # noqa: E402
from shardfmt.format import IMAGE_CLASSIFICATION  # noqa: E402

STORES = ("s3", "gcs", "azure")


def s3_outage(policy: RetryPolicy) -> Callable[[], int | None]:
    """A call against a stopped moto server (requests are not counted there)."""
    with moto_server() as endpoint:
        pass  # started and stopped: nothing listens on its port any more
    options = RemoteOptions(storage_options=s3_options(endpoint), retry=policy)
    return lambda: _fail(lambda: open_dataset("s3://data/ds", remote=options), None)


def server_outage(store: str, policy: RetryPolicy, server: Any) -> Callable[[], int | None]:
    """A range read through gcsfs or adlfs from `server`, which answers 503."""
    if store == "gcs":
        url, options = "gs://bucket/ds", gcs_options(server.endpoint)
    else:
        url, options = "az://container/ds", azure_options(server.endpoint)

    def call() -> int | None:
        server.requests.clear()
        target = FsspecStore(url, storage_options=options, retry=policy)
        return _fail(lambda: target.get("train-00000.shard", start=0, stop=100), server)

    return call


def _fail(call: Callable[[], object], server: Any) -> int | None:
    try:
        call()
    except Exception:
        return None if server is None else len(server.requests)
    raise SystemExit("the call succeeded against a store that is down")


_RELAY = (
    "import sys, time; sys.path.insert(0, {tests!r}); from remote_servers import DroppingProxy; "
    "relay = DroppingProxy(({host!r}, {port}), drop_after=1 << 40); print(relay.endpoint, flush=True); time.sleep(3600)"
)


def mid_shard(*, runs: int, workers: int) -> None:
    """Print the seconds from the death of the S3 endpoint, after a loader's first batch, to its error."""
    import simplejpeg

    with moto_server() as endpoint:
        make_bucket(endpoint, "data")
        with tempfile.TemporaryDirectory() as folder:
            with DatasetWriter(Path(folder), schema=IMAGE_CLASSIFICATION, shard_size=1 << 30) as writer:
                for i in range(256):
                    image = simplejpeg.encode_jpeg(make_image(40, 40, seed=i), quality=90)
                    writer.write({"image": image, "label": i, "key": f"r{i}"})
            import s3fs

            upload_tree(s3fs.S3FileSystem(**s3_options(endpoint)), Path(folder), "data/ds")
        host, port = endpoint.removeprefix("http://").split(":")
        tests = str(Path(__file__).resolve().parents[1] / "tests")
        for run in range(runs):
            code = _RELAY.format(tests=tests, host=host, port=port)
            relay = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            assert relay.stdout is not None
            remote = RemoteOptions(mode="range", storage_options=s3_options(relay.stdout.readline().strip()))
            with Loader(
                "s3://data/ds",
                batch_size=16,
                num_workers=workers,
                remote=remote,
                seed=run,
                transform=ImageTransform(size=16),
                sampling=Sampling(window=1),
            ) as loader:
                batches = iter(loader)
                next(batches)
                relay.kill()
                relay.wait()
                started = time.monotonic()
                try:
                    for _ in batches:
                        pass
                except RemoteError as err:
                    print(f"mid-shard, workers={workers}: RemoteError after {time.monotonic() - started:.1f} s ({err.message[:80]}...)",
                          flush=True)
                else:
                    raise SystemExit("the epoch ended although the store was down")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", action="append", choices=STORES, help="repeatable; default: all three")
    parser.add_argument("--attempts", type=int, action="append", help="RetryPolicy attempts, repeatable; default: 1 and 5")
    parser.add_argument("--backend-retries", action="store_true", help="leave the backends' own retries on")
    parser.add_argument("--mid-shard", action="store_true", help="a loader's range reads, the endpoint killed after one batch")
    parser.add_argument("--workers", type=int, default=0, help="loader worker processes for --mid-shard")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the retries' log lines
    if args.mid_shard:
        mid_shard(runs=args.runs, workers=args.workers)
        return
    if args.backend_retries:
        shardfmt._storage.remote.single_attempt_options = lambda url, options: dict(options)
        shardfmt._storage.remote.single_attempt_filesystem = lambda fs: None
    with storage_server() as server:
        for store in args.store or STORES:
            for attempts in args.attempts or (1, 5):
                policy = RetryPolicy(attempts=attempts)
                call = s3_outage(policy) if store == "s3" else server_outage(store, policy, server)
                times, requests = [], []
                for _ in range(args.runs):
                    started = time.monotonic()
                    requests.append(call())
                    times.append(time.monotonic() - started)
                counted = "" if requests[0] is None else f", {', '.join(map(str, requests))} requests"
                print(f"{store} attempts={attempts}: failed after {', '.join(f'{t:.1f}' for t in times)} s{counted}", flush=True)


if __name__ == "__main__":
    main()
