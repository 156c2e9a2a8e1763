"""Storage building blocks without a server: URLs, redaction, retries, window merging, options."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest

from shardfmt import ImageTransform, RemoteOptions, RetryPolicy
from shardfmt._storage import LocalFile, LocalStore, Redactor, is_url
from shardfmt._storage.remote import merge_windows
from shardfmt._storage.retry import ShortReadError, call_with_retries, is_transient
from shardfmt._storage.urls import join_url


def test_urls_and_local_paths() -> None:
    assert is_url("s3://bucket/prefix") and is_url("https://host/x") and is_url("memory://a")
    assert not is_url("/data/ds") and not is_url("file:///data/ds") and not is_url("C:/x") and not is_url("relative/dir")
    assert join_url("https://h/d?sig=1", "shard-00000.shard") == "https://h/d/shard-00000.shard?sig=1"


def test_redaction_hides_userinfo_queries_and_secret_options() -> None:
    options = {
        "key": "AKIAEXAMPLE123",
        "secret": "s3cr3t/value",
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"headers": {"Authorization": "Bearer abcdefgh"}},
    }
    redact = Redactor.for_location("https://bob:hunter22@example.org/data?X-Amz-Signature=feedface", options)
    text = redact(
        (
            "GET https://bob:hunter22@example.org/data?X-Amz-Signature=feedface failed; key AKIAEXAMPLE123, secret s3cr3t/value, Bearer "
            "abcdefgh"
        )
    )
    for secret in ("hunter22", "feedface", "AKIAEXAMPLE123", "s3cr3t/value", "abcdefgh", "bob:"):
        assert secret not in text
    assert "example.org/data" in text and "127.0.0.1" in redact("endpoint http://127.0.0.1:9000")
    assert "s3cr3t" not in repr(RemoteOptions(storage_options=options))


def test_transient_errors_are_retried_with_backoff_and_others_are_not() -> None:
    waits: list[float] = []
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    policy = RetryPolicy(attempts=4, first_delay=1.0, multiplier=2.0, max_delay=10.0)
    assert call_with_retries(flaky, policy=policy, what="GET x", redact=Redactor(), sleep=waits.append) == "ok"
    assert calls["n"] == 3 and len(waits) == 2
    assert 0.75 <= waits[0] <= 1.25 and 1.5 <= waits[1] <= 2.5

    def always() -> None:
        raise ShortReadError("short")

    waits.clear()
    with pytest.raises(ShortReadError):
        call_with_retries(always, policy=policy, what="GET x", redact=Redactor(), sleep=waits.append)
    assert len(waits) == 3, "bounded: attempts - 1 waits"
    with pytest.raises(FileNotFoundError):
        call_with_retries(
            lambda: (_ for _ in ()).throw(FileNotFoundError("gone")), policy=policy, what="GET x", redact=Redactor(), sleep=waits.append
        )
    assert len(waits) == 3, "a missing object is not retried"


def test_which_errors_are_transient() -> None:
    class Status(Exception):
        def __init__(self, status: int) -> None:
            self.status = status

    assert is_transient(TimeoutError()) and is_transient(ConnectionResetError()) and is_transient(ShortReadError("x"))
    assert is_transient(Status(503)) and is_transient(Status(429)) and not is_transient(Status(403)) and not is_transient(Status(404))
    assert not is_transient(PermissionError()) and not is_transient(ValueError())
    assert RetryPolicy().attempts == 5
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_windows_merge_when_close_and_clip_to_the_object() -> None:
    assert merge_windows(((0, 128), (1000, 2000)), size=2000) == [(0, 2000)]
    assert merge_windows(((0, 128), (10**7, 10**7 + 64)), size=10**7 + 64) == [(0, 128), (10**7, 10**7 + 64)]
    assert merge_windows(((-5, 10), (50, 10**9)), size=100) == [(0, 100)]


def test_remote_options_check_their_values() -> None:
    with pytest.raises(ValueError, match="mode"):
        RemoteOptions(mode="stream")
    with pytest.raises(ValueError, match="cache_size"):
        RemoteOptions(cache_size=0)


def test_local_store_round_trip(tmp_path: object) -> None:
    store = LocalStore(str(tmp_path))
    store.put("a/b.json", b"{}")
    assert store.get("a/b.json") == b"{}" and store.exists("a/b.json")
    assert set(store.list()) == {"a/b.json"}
    store.delete("a/b.json")
    store.delete("a/b.json")
    assert not store.exists("a/b.json")


def test_file_urls_are_local_paths(small_dataset: object) -> None:
    from shardfmt import Loader, open_dataset

    url = f"file://{small_dataset}"
    reader = open_dataset(url)
    assert len(reader) == 40 and not reader.location.is_remote
    with Loader(url, batch_size=8, num_workers=1, transform=ImageTransform(size=16)) as loader:
        assert sum(len(labels) for _, labels in loader) == 40


class _Advice:
    """Stands for a LocalFile's map: records what the kernel is asked to read ahead."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int, int]] = []

    def madvise(self, option: int, start: int, length: int) -> None:
        self.asked.append((option, start, length))


def test_a_local_file_asks_the_kernel_once_for_the_pages_of_many_ranges(tmp_path: Path) -> None:
    page = mmap.PAGESIZE
    path = tmp_path / "data"
    path.write_bytes(bytes(10 * page))
    source = LocalFile(path)
    real, advice = source._map, _Advice()
    source._map = advice  # type: ignore[assignment]
    try:
        # two ranges on page 3 and one across pages 3 and 4 are one request from page 3; one on
        # page 7, cut at the end of the file; an empty range is no request
        source.prefetch([(3 * page + 100, 3 * page + 200), (7 * page + 5, 20 * page), (3 * page + 10, 4 * page + 1), (page, page)])
        source.will_need(2 * page + 1, 2 * page + 9)
    finally:
        source._map = real
    source.close()
    willneed = mmap.MADV_WILLNEED
    assert advice.asked == [(willneed, 3 * page, page + 1), (willneed, 7 * page, 3 * page), (willneed, 2 * page, 9)]
