"""Datasets read by URL from a local HTTP server with Range support: bounded requests on open,
range reads and the shard cache, a dropped connection, a corrupt object, no credential in any
message."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiohttp", reason="HTTP URLs need fsspec's HTTP filesystem (aiohttp)")

from remote_servers import RangeServer, range_server

import shardfmt._storage.remote
from shardfmt import (
    ChecksumError,
    DatasetNotFoundError,
    ImageTransform,
    Loader,
    RemoteError,
    RemoteOptions,
    RetryPolicy,
    Sampling,
    ShardfmtError,
    open_dataset,
)
from shardfmt._checksum import checksum
from shardfmt._storage.cache import ShardCache

FAST = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.05)


@pytest.fixture(autouse=True)
def separate_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test shards are small: keep their header and table reads apart, as for real shards."""
    monkeypatch.setattr(shardfmt._storage.remote, "MERGE_GAP", 0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, small_dataset_module: Path) -> Iterator[tuple[RangeServer, Path]]:
    root = tmp_path_factory.mktemp("www")
    shutil.copytree(small_dataset_module, root / "ds")
    with range_server(root) as server:
        yield server, root / "ds"


@pytest.fixture
def server(served: tuple[RangeServer, Path]) -> RangeServer:
    served[0].requests.clear()
    return served[0]


def record_bytes(reader: object) -> list[tuple[bytes, int, str]]:
    return [(bytes(r["image"]), r["label"], r["key"]) for r in reader]  # type: ignore[attr-defined]


def test_open_costs_one_get_for_the_manifest_and_two_per_shard(server: RangeServer, small_dataset_module: Path) -> None:
    reader = open_dataset(f"{server.url}/ds", remote=RemoteOptions(retry=FAST))
    assert sum(server.requests.values()) == 1
    reader.open_shards(range(len(reader.manifest.shards)))
    shards = len(reader.manifest.shards)
    assert shards >= 3
    assert sum(server.requests.values()) == 1 + 2 * shards
    assert not any("HEAD" in path for path in server.requests)
    local = open_dataset(small_dataset_module)
    assert record_bytes(reader) == record_bytes(local)
    assert reader.shard_path(0) == f"{server.url}/ds/shard-00000.shard"


def test_nearby_windows_merge_into_one_read(server: RangeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shardfmt._storage.remote, "MERGE_GAP", 256 * 1024)
    reader = open_dataset(f"{server.url}/ds/manifest.json", remote=RemoteOptions(retry=FAST))
    reader.shard(1)
    assert sum(server.requests.values()) == 2


def test_a_connection_dropped_mid_shard_is_retried(
    server: RangeServer, small_dataset_module: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server.drop_once = {"shard-00001.shard"}
    with caplog.at_level(logging.WARNING, logger="shardfmt._storage"):
        reader = open_dataset(f"{server.url}/ds", remote=RemoteOptions(retry=FAST))
        assert record_bytes(reader) == record_bytes(open_dataset(small_dataset_module))
    assert server.dropped and server.dropped[0].endswith("shard-00001.shard")
    assert any("retrying" in message for message in caplog.messages)


def test_cache_mode_downloads_each_shard_once_and_verifies(server: RangeServer, small_dataset_module: Path, tmp_path: Path) -> None:
    options = RemoteOptions(mode="cache", cache_dir=str(tmp_path / "cache"), retry=FAST)
    reader = open_dataset(f"{server.url}/ds", remote=options)
    assert record_bytes(reader) == record_bytes(open_dataset(small_dataset_module))
    full_gets = [p for p in server.requests if p.endswith(".shard")]
    cache = reader.location.cache
    assert cache is not None and cache.downloads == len(reader.manifest.shards) == len(full_gets)
    again = open_dataset(f"{server.url}/ds", remote=options)
    before = sum(server.requests.values())
    assert record_bytes(again)[5] == record_bytes(reader)[5]
    again.close()
    assert again.location.cache is not None and again.location.cache.downloads == 0
    assert sum(server.requests.values()) - before == 2 * len(reader.manifest.shards)  # header and table reads only


def test_a_corrupt_download_is_fetched_again(server: RangeServer, tmp_path: Path) -> None:
    server.corrupt_once = {"shard-00002.shard"}
    reader = open_dataset(f"{server.url}/ds", remote=RemoteOptions(mode="cache", cache_dir=str(tmp_path), retry=FAST))
    shard = reader.shard(2)
    assert len([bytes(record["image"]) for record in shard]) == len(shard)
    assert not server.corrupt_once
    assert reader.location.cache is not None and reader.location.cache.downloads == 2


def test_a_corrupt_object_is_named(served: tuple[RangeServer, Path], tmp_path: Path) -> None:
    server, root = served
    bad = root.parent / "bad"
    shutil.copytree(root, bad)
    shard = bad / "shard-00001.shard"
    data = bytearray(shard.read_bytes())
    data[300] ^= 0xFF
    shard.write_bytes(bytes(data))
    reader = open_dataset(f"{server.url}/bad", remote=RemoteOptions(mode="cache", cache_dir=str(tmp_path), retry=FAST))
    with pytest.raises(ChecksumError, match="downloaded twice") as info:
        reader[int(reader.cumulative[1])]["image"]
    assert info.value.path == f"{server.url}/bad/shard-00001.shard"
    ranged = open_dataset(f"{server.url}/bad", remote=RemoteOptions(retry=FAST))
    with pytest.raises(ChecksumError, match="does not match its checksum"):
        for record in ranged:
            record["image"]


def test_the_cache_keeps_to_its_size_limit(server: RangeServer, tmp_path: Path) -> None:
    probe = open_dataset(f"{server.url}/ds", remote=RemoteOptions(retry=FAST))
    sizes = [entry.size for entry in probe.manifest.shards]
    limit = max(sizes) * 2 + 10
    options = RemoteOptions(mode="cache", cache_dir=str(tmp_path), cache_size=limit, retry=FAST)
    reader = open_dataset(f"{server.url}/ds", remote=options)
    for record in reader:
        record["image"]
    cache = reader.location.cache
    assert cache is not None
    assert 0 < cache.usage() <= limit
    with pytest.raises(RemoteError, match=f"raise cache_size to at least {max(sizes)}"):  # said on open, not at the first read
        open_dataset(f"{server.url}/ds", remote=RemoteOptions(mode="cache", cache_dir=str(tmp_path / "tiny"), cache_size=100, retry=FAST))


def _fetch_all(url: str, cache_dir: str, barrier: object, results: object) -> None:
    reader = open_dataset(url, remote=RemoteOptions(mode="cache", cache_dir=cache_dir, retry=FAST))
    barrier.wait()  # type: ignore[attr-defined]
    for index in range(len(reader.manifest.shards)):
        reader.location.fetch_shard(reader.manifest.shards[index])
    assert reader.location.cache is not None
    results.put(reader.location.cache.downloads)  # type: ignore[attr-defined]


def test_processes_sharing_a_cache_download_each_shard_once(server: RangeServer, tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(3), context.Queue()
    processes = [context.Process(target=_fetch_all, args=(f"{server.url}/ds", str(tmp_path), barrier, results)) for _ in range(3)]
    for process in processes:
        process.start()
    downloads = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(10)
    shards = len(list((tmp_path / "shards").rglob("*.shard")))
    assert shards >= 3 and sum(downloads) == shards
    assert not [name for name in (tmp_path / "shards").rglob(".*tmp*")]


def test_loader_over_http_with_workers(server: RangeServer, small_dataset_module: Path) -> None:
    for mode in ("range", "cache"):
        remote = RemoteOptions(mode=mode, cache_dir=str(server.root / f"cache-{mode}"), retry=FAST)
        with Loader(
            f"{server.url}/ds", batch_size=8, num_workers=2, remote=remote, transform=ImageTransform(size=16), sampling=Sampling(window=2)
        ) as loader:
            labels = [b.tolist() for _, b in loader]
        with Loader(
            small_dataset_module, batch_size=8, num_workers=0, transform=ImageTransform(size=16), sampling=Sampling(window=2)
        ) as local:
            assert labels == [b.tolist() for _, b in local]


def test_missing_dataset_and_unreachable_server_keep_credentials_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret_headers = {"headers": {"X-Api-Key": "tok-9f8e7d6c5b4a"}}
    with range_server(tmp_path) as server:
        url = server.url.replace("http://", "http://alice:pw-0a1b2c3d4e@") + "/nothing?X-Amz-Signature=sig-1234abcd"
        with pytest.raises(DatasetNotFoundError) as missing:
            open_dataset(url, remote=RemoteOptions(storage_options=secret_headers, retry=FAST))
    with socket.socket() as probe:  # a port nothing listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = RemoteOptions(storage_options=secret_headers, retry=FAST)
    with caplog.at_level(logging.DEBUG, logger="shardfmt"), pytest.raises(RemoteError) as refused:
        open_dataset(f"http://alice:pw-0a1b2c3d4e@127.0.0.1:{port}/ds?X-Amz-Signature=sig-1234abcd", remote=options)
    assert "after 3 attempts" in str(refused.value)
    texts = [str(missing.value), str(refused.value), repr(options), *caplog.messages]
    for error in (missing.value, refused.value):
        cause: BaseException | None = error
        while cause is not None:
            texts.append(str(cause))
            cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    for secret in ("pw-0a1b2c3d4e", "tok-9f8e7d6c5b4a", "sig-1234abcd"):
        assert not any(secret in text for text in texts), secret
    assert "127.0.0.1" in str(refused.value)


def test_only_shardfmt_errors_for_a_truncated_remote_shard(served: tuple[RangeServer, Path]) -> None:
    server, root = served
    cut = root.parent / "cut"
    shutil.copytree(root, cut)
    shard = cut / "shard-00000.shard"
    shard.write_bytes(shard.read_bytes()[:-100])
    reader = open_dataset(f"{server.url}/cut", remote=RemoteOptions(retry=FAST))
    with pytest.raises(ShardfmtError):
        reader.shard(0)


def test_cache_entries_are_named_by_content(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, size_limit=1 << 20)
    path = cache.entry_path("ns", "a/b.shard", size=10, checksum=0xABC)
    assert path.name == "0000000000000abc-10-a%2Fb.shard"
    assert np.isscalar(cache.usage())


class HeldStore:
    """A store whose downloads each wait for the test to let them finish, and that records
    in what order they start and end."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.events: list[str] = []
        self.started = {key: threading.Event() for key in objects}
        self.finish = {key: threading.Event() for key in objects}

    def describe(self, key: str) -> str:
        return f"held://{key}"

    def get_file(self, key: str, path: str) -> None:
        self.events.append(f"start {key}")
        self.started[key].set()
        assert self.finish[key].wait(60), "the test never let the download finish"
        Path(path).write_bytes(self.objects[key])
        self.events.append(f"end {key}")


def test_a_download_that_does_not_fit_beside_those_in_progress_waits_for_one_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = {key: bytes([n]) * 1000 for n, key in enumerate(["a", "b", "c"])}
    store = HeldStore(objects)
    cache = ShardCache(tmp_path, size_limit=2000)  # two of them
    full = threading.Event()  # the third download found no room
    make_room = ShardCache._make_room

    def watched(self: ShardCache, incoming: int, *, keep: Path) -> tuple[Path, str] | None:
        waiting = make_room(self, incoming, keep=keep)
        if keep.name.endswith("-c"):
            full.set()
        return waiting

    monkeypatch.setattr(ShardCache, "_make_room", watched)

    def fetch(key: str) -> None:
        cache.fetch(store, key, size=1000, checksum=checksum(objects[key]), namespace="ns")  # type: ignore[arg-type]

    threads = {key: threading.Thread(target=fetch, args=(key,)) for key in objects}
    for key in ("a", "b"):
        threads[key].start()
        assert store.started[key].wait(60)
    threads["c"].start()
    assert full.wait(60)
    store.finish["a"].set()
    threads["a"].join(60)
    store.finish["b"].set()
    store.finish["c"].set()
    for thread in threads.values():
        thread.join(60)
    assert store.events.index("start c") > store.events.index("end a")
    assert sorted(store.events) == ["end a", "end b", "end c", "start a", "start b", "start c"]
    assert cache.usage() == 2000


def test_map_style_dataset_over_http_in_a_dataloader(server: RangeServer) -> None:
    import torch

    from shardfmt import Dataset

    dataset = Dataset(f"{server.url}/ds", remote=RemoteOptions(retry=FAST), transform=ImageTransform(crop="eval", size=16))
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2)
    labels = [x for _, batch in loader for x in batch.tolist()]
    assert labels == [i % 3 for i in range(40)]


def test_http_is_no_conversion_output_or_listable_source(server: RangeServer, imagefolder: Path) -> None:
    from converting import convert

    from shardfmt import ConvertError

    with pytest.raises(ConvertError, match="read-only"):
        convert(imagefolder, f"{server.url}/new", workers=1)
    with pytest.raises(ConvertError, match="list its objects"):
        convert(f"{server.url}/ds", server.root / "out", workers=1)


class _Location:
    def __init__(self) -> None:
        self.fetched: list[str] = []
        self.cache = object()

    def fetch_shard(self, entry: object) -> None:
        self.fetched.append(entry.path)  # type: ignore[attr-defined]


def test_the_prefetcher_fetches_the_shards_of_coming_batches_in_order(small_dataset_module: Path) -> None:
    from shardfmt._loader.prefetch import ShardPrefetcher
    from shardfmt._sampling.keys import sample_batches

    reader = open_dataset(small_dataset_module)
    reader.location = _Location()  # type: ignore[assignment]
    sizes = np.diff(reader.cumulative)
    plan = sample_batches(len(reader), batch_size=4, seed=0, epoch=0, shard_sizes=sizes, window=2)
    prefetcher = ShardPrefetcher(reader, ahead=1, threads=1)
    prefetcher.schedule(0, plan, 0)
    for future in list(prefetcher.futures):
        future.result(timeout=10)
    shard_of = np.searchsorted(reader.cumulative, plan.indices, side="right") - 1
    first_use = list(dict.fromkeys(shard_of.tolist()))
    in_batch = set(shard_of[: plan.bounds[1]].tolist())
    expected = [f"shard-{s:05d}.shard" for s in first_use[: len(in_batch) + 1]]
    assert reader.location.fetched == expected  # type: ignore[attr-defined]
    prefetcher.schedule(0, plan, 0)
    assert len(prefetcher.futures) == 0 or all(f.done() for f in prefetcher.futures)
    prefetcher.close()


def test_a_chunk_of_records_is_fetched_at_once(server: RangeServer) -> None:
    reader = open_dataset(f"{server.url}/ds", remote=RemoteOptions(retry=FAST))
    shard = reader.shard(0)
    spans = [(int(row["offset"]), int(row["offset"] + row["size"])) for row in shard.table]
    before = sum(server.requests.values())
    shard.source.prefetch(spans)  # type: ignore[attr-defined]
    assert sum(server.requests.values()) - before == len(spans)
    for index in range(len(shard)):
        bytes(shard.record(index)["image"])  # verified and read from the prefetched spans
    assert sum(server.requests.values()) - before == len(spans)
    server.drop_once = {"shard-00000.shard"}
    fresh = open_dataset(f"{server.url}/ds", remote=RemoteOptions(retry=FAST)).shard(0)
    fresh.source.prefetch(spans[:3])  # type: ignore[attr-defined]
    assert server.dropped, "one range was cut mid-body and fetched again"
    assert [bytes(fresh.record(i)["image"]) for i in range(3)] == [bytes(shard.record(i)["image"]) for i in range(3)]


def test_a_windowed_epoch_trains_from_a_cache_smaller_than_the_dataset(server: RangeServer, tmp_path: Path) -> None:
    probe = open_dataset(f"{server.url}/ds", remote=RemoteOptions(retry=FAST))
    sizes = [entry.size for entry in probe.manifest.shards]
    limit = 3 * max(sizes)
    assert limit < sum(sizes) / 2
    remote = RemoteOptions(mode="cache", cache_dir=str(tmp_path), cache_size=limit, prefetch_shards=1, retry=FAST)
    with Loader(
        f"{server.url}/ds",
        batch_size=4,
        num_workers=2,
        remote=remote,
        seed=2,
        transform=ImageTransform(size=16),
        sampling=Sampling(window=1),
    ) as loader:
        labels = [x for epoch in range(2) for _, batch in loader for x in batch.tolist()]
        cache = loader._dataset.location.cache
    assert sorted(labels) == sorted([i % 3 for i in range(40)] * 2)
    assert cache is not None and cache.usage() <= limit
