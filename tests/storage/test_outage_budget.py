"""An outage in the middle of a shard costs one retry budget, not two: a loader's batch of range
reads that fails after its attempts is not followed by another full set of attempts for the
batch's first record (which doubled the time to the error: about 8 s instead of 4 with the
default `RetryPolicy`). Counted in requests and retry loops, not timed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("s3fs", reason="S3 URLs need s3fs")
pytest.importorskip("moto.server", reason="the S3-compatible test server is moto's")

from conftest import jpeg_bytes
from remote_servers import DroppingProxy, make_bucket, moto_server, s3_options, upload_tree

import shardfmt._storage.remote as remote_module
from shardfmt import DatasetWriter, ImageTransform, Loader, RemoteError, RemoteOptions, RetryPolicy, Sampling
from shardfmt._storage.remote import FsspecStore
from shardfmt.format import IMAGE_CLASSIFICATION

POLICY = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.02)
SIZE = 100_000


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import s3fs

    with moto_server() as url:
        make_bucket(url, "data")
        fs = s3fs.S3FileSystem(**s3_options(url))
        fs.pipe_file("data/budget/blob", bytes(range(256)) * (SIZE // 256) + bytes(SIZE % 256))
        out = tmp_path_factory.mktemp("budget") / "ds"
        with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=1 << 30) as writer:
            for i in range(256):  # 400 kB: more than the header and table windows a shard opens with
                writer.write({"image": jpeg_bytes(40, 40, seed=i), "label": i, "key": f"r{i}"})
        upload_tree(fs, out, "data/budget/ds")
        yield url


@pytest.fixture
def proxy(endpoint: str) -> Iterator[DroppingProxy]:
    host, port = endpoint.removeprefix("http://").split(":")
    relay = DroppingProxy((host, int(port)), drop_after=1 << 40)
    try:
        yield relay
    finally:
        relay.close()


def test_a_read_of_a_range_whose_prefetch_found_the_store_down_fails_without_new_attempts(proxy: DroppingProxy) -> None:
    store = FsspecStore("s3://data/budget", storage_options=s3_options(proxy.endpoint), retry=POLICY)
    source = store.open("blob", size=SIZE)
    proxy.take_down()
    with pytest.raises(RemoteError, match="GET 2 ranges failed after 3 attempts"):
        source.prefetch([(0, 10), (50_000, 50_010)])
    assert store.requests == 3
    with pytest.raises(RemoteError, match="GET 2 ranges failed after 3 attempts") as caught:
        source.read(50_000, 50_010)
    assert caught.value.transient is True
    assert store.requests == 3  # no new attempt: the outage was found out a moment ago
    with pytest.raises(RemoteError, match=r"GET bytes \[90000, 90010\) failed after 3 attempts"):
        source.read(90_000, 90_010)  # a range the prefetch did not cover is tried as always
    assert store.requests == 6
    proxy.down = False
    source.prefetch([(0, 10)])
    assert bytes(source.read(0, 10)) == bytes(range(10)) and store.requests == 7


def test_an_outage_mid_shard_costs_the_loader_one_retry_budget(proxy: DroppingProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    failed: list[str] = []  # the retry loops that ran out of attempts
    call_with_retries = remote_module.call_with_retries

    def counted(call: Any, **kwargs: Any) -> Any:
        try:
            return call_with_retries(call, **kwargs)
        except Exception:
            failed.append(kwargs["what"])
            raise

    monkeypatch.setattr(remote_module, "call_with_retries", counted)
    remote = RemoteOptions(mode="range", storage_options=s3_options(proxy.endpoint), retry=POLICY)
    with Loader(
        "s3://data/budget/ds",
        batch_size=16,
        num_workers=0,
        remote=remote,
        seed=0,
        transform=ImageTransform(size=16),
        sampling=Sampling(window=1),
    ) as loader:
        batches = iter(loader)
        next(batches)
        proxy.take_down()
        with pytest.raises(RemoteError, match="GET 8 ranges failed after 3 attempts"):
            for _ in batches:
                pass
    assert failed == ["GET 8 ranges s3://data/budget/ds/shard-00000.shard"]  # 8 of the 16 records lie outside the windows read


def test_the_default_policy_waits_at_most_the_documented_budget() -> None:
    policy = RetryPolicy()
    waits = [policy.first_delay * policy.multiplier ** (retry - 1) for retry in range(1, policy.attempts)]
    assert policy.attempts == 5 and waits == [0.25, 0.5, 1.0, 2.0]
    assert sum(waits) * 1.25 == pytest.approx(4.6875)  # +25% jitter at most: "at most 4.7 s of waiting"
