"""Google Cloud Storage and Azure Blob Storage behind a local server: `RetryPolicy` is the one
retry layer, so an outage costs exactly `attempts` requests, not gcsfs's 6 or azure-storage-blob's
4 per attempt of ours (a minute or more each); and gcsfs downloads, streamed through ``open()``
for that reason, arrive whole."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_servers import StorageServer, azure_options, gcs_options, storage_server

import shardfmt._storage.remote
from shardfmt import ImageTransform, RemoteError, RetryPolicy, Workers
from shardfmt._storage.remote import FsspecStore

POLICY = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.02)


@pytest.fixture
def server() -> Iterator[StorageServer]:
    with storage_server() as httpd:
        yield httpd


def gcs_store(server: StorageServer) -> FsspecStore:
    pytest.importorskip("gcsfs", reason="gs:// URLs need gcsfs")
    return FsspecStore("gs://bucket/data", storage_options=gcs_options(server.endpoint), retry=POLICY)


def azure_store(server: StorageServer) -> FsspecStore:
    pytest.importorskip("adlfs", reason="az:// URLs need adlfs")
    return FsspecStore("az://container/data", storage_options=azure_options(server.endpoint), retry=POLICY)


@pytest.mark.parametrize("make_store", [gcs_store, azure_store], ids=["gcs", "azure"])
@pytest.mark.parametrize("call", ["range", "download"])
def test_an_outage_costs_exactly_the_policys_attempts(server: StorageServer, make_store: Any, call: str, tmp_path: Path) -> None:
    store = make_store(server)
    with pytest.raises(RemoteError, match=f"failed after {POLICY.attempts} attempts: .*503") as raised:
        if call == "range":
            store.get("train-00000.shard", start=0, stop=100)
        else:
            store.get_file("train-00000.shard", str(tmp_path / "copy"))
    # One request for the object per attempt of ours: the backend's own loop would make it 18
    # (gcsfs) or 12 (azure). gcsfs may also ask once whether a folder of that name exists.
    asked = [r for r in server.requests if "train-00000.shard" in r and "prefix=" not in r]
    assert len(asked) == POLICY.attempts, server.requests
    assert len(server.requests) <= 2 * POLICY.attempts, server.requests
    assert "train-00000.shard" in str(raised.value)


def test_a_gcs_download_streams_the_whole_object_in_blocks(server: StorageServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = gcs_store(server)
    monkeypatch.setattr(shardfmt._storage.remote, "DOWNLOAD_BLOCK", 1 << 20)
    data = bytes(range(256)) * (10 * 1024 + 7)  # 2.5 MiB and a bit: three blocks
    server.objects["data/train-00000.shard"] = data
    server.down = False
    target = tmp_path / "copy"
    store.get_file("train-00000.shard", str(target))
    assert target.read_bytes() == data
    media = [r for r in server.requests if "alt=media" in r]
    assert len(media) == 3, server.requests
    assert store.get("train-00000.shard", start=5, stop=9) == data[5:9]


def test_a_missing_gcs_object_is_not_retried(server: StorageServer, tmp_path: Path) -> None:
    from shardfmt import ShardNotFoundError

    store = gcs_store(server)
    server.down = False
    with pytest.raises(ShardNotFoundError):
        store.get_file("absent.shard", str(tmp_path / "copy"))
    # one look by gcsfs (the object, a folder of that name, the object once more), which a retry
    # by the policy (3 attempts) would have made 3 times
    assert server.requests.count("GET /storage/v1/b/bucket/o/data%2Fabsent.shard") <= 2, server.requests
    assert len(server.requests) <= 3, server.requests


def test_what_the_caller_sets_is_kept() -> None:
    from shardfmt._storage.remote import single_attempt_options

    assert single_attempt_options("gs://b", {"retry_timeout": 5})["retry_timeout"] == 5
    assert single_attempt_options("gs://b", {})["retry_timeout"] == 0
    assert single_attempt_options("az://c", {"skip_instance_cache": False})["skip_instance_cache"] is False
    assert single_attempt_options("abfs://c", {})["skip_instance_cache"] is True
    assert single_attempt_options("https://h/x", {"a": 1}) == {"a": 1}


@pytest.mark.parametrize("mode", ["range", "cache"])
@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_a_loader_reads_a_dataset_whole(server: StorageServer, small_dataset: Path, tmp_path: Path, scheme: str, mode: str) -> None:
    """A dataset served as GCS or Azure serves it loads the labels of the local copy, by range
    reads and through the shard cache (gcsfs's downloads are streamed). gs:// workers start by
    forkserver, since gcsfs's gRPC does not survive fork (they used to abort with SIGABRT)."""
    pytest.importorskip("gcsfs" if scheme == "gs" else "adlfs", reason=f"{scheme}:// URLs need their fsspec backend")
    from shardfmt import Loader, RemoteOptions

    server.serve_tree(small_dataset, "ds")
    storage_options = gcs_options(server.endpoint) if scheme == "gs" else azure_options(server.endpoint)
    remote = RemoteOptions(mode=mode, cache_dir=str(tmp_path / "cache"), storage_options=storage_options, retry=POLICY)
    url = f"{scheme}://bucket/ds"
    labels = {}
    for source, options in ((str(small_dataset), None), (url, remote)):
        with Loader(source, batch_size=4, num_workers=1, shuffle=False, remote=options, transform=ImageTransform(size=16)) as loader:
            labels[source] = [int(v) for batch in loader for v in batch[1]]
            expected = "forkserver" if source.startswith("gs://") else multiprocessing.get_start_method()
            assert loader.workers.resolved_start_method == expected
    assert labels[url] == labels[str(small_dataset)]
    if mode == "cache":  # every shard downloaded whole
        shards = sorted(data for name, data in server.objects.items() if name.endswith(".shard"))
        assert sorted(path.read_bytes() for path in (tmp_path / "cache").rglob("*.shard")) == shards


def test_fork_is_refused_for_a_gs_dataset_with_the_reason(server: StorageServer, small_dataset: Path) -> None:
    pytest.importorskip("gcsfs", reason="gs:// URLs need gcsfs")
    pytest.importorskip("grpc", reason="gcsfs before its gRPC layout lookup forks safely")
    from shardfmt import Loader, RemoteOptions

    remote = RemoteOptions(storage_options=gcs_options(server.endpoint), retry=POLICY)
    with pytest.raises(ValueError, match=r"start_method='fork' cannot read gs://bucket/ds: gcsfs reads it over gRPC"):
        Loader("gs://bucket/ds", batch_size=4, num_workers=1, remote=remote, workers=Workers(start_method="fork"))
    assert server.requests == []  # refused before anything was fetched


@pytest.mark.slow
def test_convert_from_gs_with_worker_processes_writes_the_local_bytes(server: StorageServer, imagefolder: Path, tmp_path: Path) -> None:
    """The workers that read a gs:// source are spawned, not forked (gcsfs's gRPC does not
    survive fork: every forked worker used to die), and write the bytes of a local conversion."""
    pytest.importorskip("gcsfs", reason="gs:// URLs need gcsfs")
    from shardfmt import RemoteOptions, convert

    server.serve_tree(imagefolder, "raw")
    remote = RemoteOptions(storage_options=gcs_options(server.endpoint), retry=POLICY)
    by_url = convert("gs://bucket/raw", tmp_path / "by-url", workers=2, remote=remote)
    local = convert(imagefolder, tmp_path / "local", workers=2)
    assert by_url.records == local.records == 24
    shards = sorted(path.name for path in (tmp_path / "local").glob("*.shard"))
    assert shards and sorted(path.name for path in (tmp_path / "by-url").glob("*.shard")) == shards
    for name in shards:
        assert (tmp_path / "by-url" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


@pytest.mark.slow
def test_a_map_style_gs_dataset_asks_for_workers_that_are_not_forked(server: StorageServer, small_dataset: Path) -> None:
    """shardfmt.Dataset in torch's DataLoader: forked workers get a RuntimeError naming the fix
    (not a SIGABRT from gRPC); forkserver workers read the records of the local copy."""
    pytest.importorskip("gcsfs", reason="gs:// URLs need gcsfs")
    pytest.importorskip("grpc", reason="gcsfs before its gRPC layout lookup forks safely")
    import torch.utils.data

    from shardfmt import Dataset, RemoteOptions

    server.serve_tree(small_dataset, "ds")
    remote = RemoteOptions(storage_options=gcs_options(server.endpoint), retry=POLICY)
    dataset = Dataset("gs://bucket/ds", remote=remote, transform=ImageTransform(crop="eval", size=16))
    with pytest.raises(RuntimeError, match="multiprocessing_context='forkserver'"):
        next(iter(torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context="fork")))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context="forkserver")
    labels = [int(v) for _, batch in loader for v in batch]
    assert labels == [int(label) for _, label in Dataset(small_dataset, transform=ImageTransform(crop="eval", size=16))]
