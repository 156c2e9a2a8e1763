"""Remote stores through fsspec (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ...) and range
reads of remote objects.

`FsspecStore` wraps one fsspec filesystem and a root URL: every call is retried as its
`RetryPolicy` says, and every failure becomes a `RemoteError` (or `ShardNotFoundError` for a
missing object) whose message holds no credential. `RemoteFile` is the `ByteSource` of one
object: the ranges it is opened with are fetched at once (merged into one request when they lie
close together) and served from memory; any other read is one ranged GET.
"""

from __future__ import annotations

import shutil
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

from .._errors import RemoteError, ShardNotFoundError
from .retry import RetryPolicy, ShortReadError, call_with_retries, is_transient
from .urls import Redactor, join_url, url_scheme

__all__ = ["FsspecStore", "RemoteFile", "forks_safely", "single_attempt_filesystem", "single_attempt_options"]

T = TypeVar("T")
MERGE_GAP = 256 * 1024
"""Two windows closer than this are fetched in one request: a round trip costs more than that."""
DOWNLOAD_BLOCK = 16 * 1024 * 1024
"""Bytes per request of a download streamed through ``open()`` (see `single_attempt_filesystem`)."""
_READ_ONLY_PROTOCOLS = frozenset({"http", "https"})
_S3 = frozenset({"s3", "s3a"})
_GCS = frozenset({"gs", "gcs"})
_AZURE = frozenset({"az", "abfs", "abfss"})


class FsspecStore:
    """A `Store` over an fsspec filesystem, rooted at `url`.

    Args:
        url: the root, e.g. ``s3://bucket/prefix`` or ``https://host/data``.
        storage_options: passed to fsspec (credentials, ``endpoint_url``, ...); never shown.
        retry: attempts and backoff for every call (default: `RetryPolicy()`).

    Raises:
        RemoteError: fsspec knows no filesystem for the URL's scheme (its package is missing).
    """

    atomic_writes = True

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None, retry: RetryPolicy | None = None) -> None:
        import fsspec

        self.redact = Redactor.for_location(url, storage_options)
        self.root = self.redact(url.rstrip("/"))
        self.retry = retry if retry is not None else RetryPolicy()
        self._url = url.rstrip("/")
        try:
            self.fs, self._base = fsspec.core.url_to_fs(self._url, **single_attempt_options(self._url, storage_options or {}))
        except (ImportError, ValueError) as err:
            raise RemoteError(f"cannot open this URL: {self.redact(str(err))}", path=self.root) from None
        single_attempt_filesystem(self.fs)
        self._streams_downloads = type(self.fs).__module__.startswith("gcsfs")
        """gcsfs's own download retries where no setting reaches (`single_attempt_filesystem`)."""
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        self.supports_writes = self.supports_listing = not protocols & _READ_ONLY_PROTOCOLS
        self.requests = 0
        """Calls made to the filesystem in this process (retries included), for tests and tuning."""

    def _path(self, key: str) -> str:
        return join_url(self._base, key) if key else self._base

    def describe(self, key: str) -> str:
        return join_url(self.root, key) if key else self.root

    def _call(self, what: str, key: str, call: Callable[[], T]) -> T:
        attempts = 0

        def counted() -> T:
            nonlocal attempts
            attempts += 1
            self.requests += 1
            return call()

        try:
            return call_with_retries(counted, policy=self.retry, what=f"{what} {self.describe(key)}", redact=self.redact)
        except Exception as err:
            self._fail(what, key, err, attempts)

    def _fail(self, what: str, key: str, err: BaseException, attempts: int) -> NoReturn:
        raw = f"{type(err).__name__}: {err}"
        text = self.redact(raw)
        cause = err if text == raw else None  # a cause that shows a secret is not chained
        if isinstance(err, FileNotFoundError):
            raise ShardNotFoundError("the object does not exist", path=self.describe(key)) from cause
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        raise RemoteError(f"{what} failed{tries}: {text}", path=self.describe(key), transient=is_transient(err)) from cause

    def get(self, key: str, *, start: int | None = None, stop: int | None = None, exact: bool = True) -> bytes:
        path = self._path(key)

        def fetch() -> bytes:
            data = bytes(self.fs.cat_file(path, start=start, end=stop))
            if stop is not None and exact:
                expected = stop - (start or 0)
                if len(data) != expected:
                    raise ShortReadError(f"asked for bytes [{start or 0}, {stop}) and got {len(data)} bytes")
            return data

        return self._call("GET" if start is None and stop is None else f"GET bytes [{start or 0}, {stop})", key, fetch)

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Return several byte ranges of one object, fetched concurrently (fsspec's
        ``cat_ranges``); a retry fetches only the ranges that failed."""
        path = self._path(key)
        found: dict[int, bytes] = {}

        def fetch_missing() -> None:
            todo = [i for i in range(len(ranges)) if i not in found]
            results = self.fs.cat_ranges([path] * len(todo), [ranges[i][0] for i in todo], [ranges[i][1] for i in todo], on_error="return")
            failure: BaseException | None = None
            for i, result in zip(todo, results, strict=True):
                start, stop = ranges[i]
                if isinstance(result, BaseException):
                    failure = failure or result
                elif len(result) != stop - start:
                    failure = failure or ShortReadError(f"asked for bytes [{start}, {stop}) and got {len(result)} bytes")
                else:
                    found[i] = bytes(result)
            if failure is not None:
                raise failure

        self._call(f"GET {len(ranges)} ranges", key, fetch_missing)
        return [found[i] for i in range(len(ranges))]

    def open(self, key: str, *, size: int, windows: tuple[tuple[int, int], ...] = ()) -> RemoteFile:
        return RemoteFile(self, key, size=size, windows=windows)

    def get_file(self, key: str, path: str) -> None:
        if self._streams_downloads:
            self._call("download", key, lambda: _stream_to_file(self.fs, self._path(key), path))
        else:
            self._call("download", key, lambda: self.fs.get_file(self._path(key), path))

    def put(self, key: str, data: bytes) -> None:
        self._call("PUT", key, lambda: self.fs.pipe_file(self._path(key), data))

    def put_file(self, key: str, path: str) -> None:
        self._call("upload", key, lambda: self.fs.put_file(path, self._path(key)))

    def delete(self, key: str) -> None:
        try:
            self._call("DELETE", key, lambda: self.fs.rm_file(self._path(key)))
        except ShardNotFoundError:
            pass

    def list(self, prefix: str = "") -> dict[str, dict[str, object]]:
        base = self._path(prefix)

        def find() -> dict[str, Any]:
            self.fs.invalidate_cache()
            return dict(self.fs.find(base, detail=True))

        found = self._call("LIST", prefix, find)
        strip = len(self._base.rstrip("/")) + 1
        result: dict[str, dict[str, object]] = {}
        for name, info in found.items():
            if info.get("type", "file") != "file":
                continue
            version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or info.get("updated") or ""
            result[name[strip:]] = {"size": int(info.get("size") or 0), "version": str(version)}
        return result

    def exists(self, key: str) -> bool:
        def check() -> bool:
            self.fs.invalidate_cache(self._path(key))
            return bool(self.fs.exists(self._path(key)))

        return self._call("HEAD", key, check)


class RemoteFile:
    """One remote object for range reads (see `ByteSource`): copies, not views of a mapping.

    The `windows` given are fetched when it opens; a read inside one, or inside the last range
    read, costs no request. A shard is opened with two windows, its header and its table with the
    footer, so validating it takes two requests (one when they lie within `MERGE_GAP`).
    """

    zero_copy = False

    def __init__(self, store: FsspecStore, key: str, *, size: int, windows: tuple[tuple[int, int], ...] = ()) -> None:
        self.path = store.describe(key)
        self.size = size
        self._store = store
        self._key = key
        self._blocks: list[tuple[int, int, memoryview]] = []
        for start, stop in merge_windows(windows, size=size):
            self._blocks.append((start, stop, memoryview(store.get(key, start=start, stop=stop))))
        self._last: tuple[int, int, memoryview] | None = None
        self._prefetched: list[tuple[int, int, memoryview]] = []
        self._unreachable: tuple[list[tuple[int, int]], RemoteError] | None = None

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """Fetch `ranges` concurrently and keep them until the next call: a loader worker asks
        for every record of a chunk at once instead of one round trip after another.

        If the store did not answer within its retries (`RemoteError.transient`), a `read` of
        one of these ranges until the next call raises that error again at once: the outage
        costs one retry budget, not one for the batch and another for its first record."""
        wanted = sorted({(a, b) for a, b in ranges if a < b and self.cached(a, b) is None})
        self._prefetched = []
        self._unreachable = None
        if wanted:
            try:
                data = self._store.get_ranges(self._key, wanted)
            except RemoteError as err:
                if err.transient:
                    self._unreachable = (wanted, err)
                raise
            self._prefetched = [(a, b, memoryview(d)) for (a, b), d in zip(wanted, data, strict=True)]

    def cached(self, start: int, stop: int) -> memoryview | None:
        """Return bytes [start, stop) if they were fetched already, else None (no request)."""
        last = [] if self._last is None else [self._last]
        for low, high, view in [*self._blocks, *last, *self._prefetched]:
            if low <= start and stop <= high:
                found: memoryview = view[start - low : stop - low]
                return found
        return None

    def read(self, start: int, stop: int) -> memoryview:
        hit = self.cached(start, stop)
        if hit is not None:
            return hit
        if start == stop:
            return memoryview(b"")
        if self._unreachable is not None and any(a <= start and stop <= b for a, b in self._unreachable[0]):
            failed = self._unreachable[1]
            raise RemoteError(failed.message, path=failed.path, transient=True) from failed
        self._last = (start, stop, memoryview(self._store.get(self._key, start=start, stop=stop)))
        return self._last[2]

    def close(self) -> None:
        self._blocks, self._last, self._prefetched, self._unreachable = [], None, [], None


def single_attempt_options(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """`storage_options` with the backend's own retrying turned off where an option does it, so
    that `RetryPolicy` is the one retry layer and an outage surfaces within its budget. A value
    the caller set is kept.

    - S3: botocore tries each call once (``config_kwargs["retries"]``).
    - Google Cloud Storage: gcsfs's bucket-layout lookup (gRPC) tries once (``retry_timeout=0``)
      instead of retrying for 60 s before each first read of a bucket.
    - Azure Blob Storage: a filesystem of our own (``skip_instance_cache``), because
      `single_attempt_filesystem` changes its client's retry policy.
    """
    options = dict(storage_options)
    scheme = url_scheme(url)
    if scheme in _S3:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"mode": "standard", "total_max_attempts": 1})  # botocore: tries in all
        options["config_kwargs"] = config
    elif scheme in _GCS:
        options.setdefault("retry_timeout", 0)
    elif scheme in _AZURE:
        options.setdefault("skip_instance_cache", True)
    return options


def forks_safely(url: str) -> bool:
    """False if a process forked from this one may be unable to read `url`: gcsfs's filesystem
    (2025 and later) talks gRPC to find a bucket's layout, and gRPC's state does not survive
    ``fork`` (a forked worker that uses it aborts with SIGABRT or hangs). Decided by whether
    loading the filesystem class for `url` loaded gRPC; any URL of another scheme forks safely.
    """
    scheme = url_scheme(url)
    if scheme not in _GCS:
        return True
    import fsspec

    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError):
        return True  # opening the URL will say that gcsfs is missing
    return "grpc" not in sys.modules


def single_attempt_filesystem(fs: Any) -> None:
    """Turn off the retrying that lives on the filesystem object rather than in its options.

    One call against a server that fails every request, with the packages' defaults: s3fs 5
    tries of botocore's 5, 217 s; gcsfs 6 tries, 78 s with its bucket-layout lookup; adlfs 4
    tries (azure-storage-blob's 3 retries), 83 s (docs/reliability.md). After this: one request.

    - s3fs: its own loop is an attribute, ``retries``.
    - gcsfs: ``_request`` is wrapped in a loop of 6 tries fixed when the class is defined; this
      filesystem gets the unwrapped method. Its whole-object download goes through other wrapped
      methods that a subclass calls with ``super()``, out of reach, so
      `FsspecStore.get_file` streams gcsfs's objects through ``open()`` instead.
    - adlfs: the retry policy of azure-storage-blob's client, shared by every request it makes,
      is set to no retries.

    An unknown version whose internals differ is left as it is: its retries then add to ours.
    """
    module = type(fs).__module__
    if module.startswith("s3fs"):
        fs.retries = 1
    elif module.startswith("gcsfs"):
        inner = getattr(getattr(type(fs), "_request", None), "__wrapped__", None)
        if inner is not None:
            fs._request = types.MethodType(inner, fs)
    elif module.startswith("adlfs"):
        policy = getattr(getattr(getattr(fs, "service_client", None), "_config", None), "retry_policy", None)
        if policy is not None and isinstance(getattr(policy, "total_retries", None), int):
            policy.total_retries = 0


def _stream_to_file(fs: Any, remote: str, path: str) -> None:
    """Copy one object to the local file `path` in blocks read through ``fs.open``."""
    with fs.open(remote, "rb", block_size=DOWNLOAD_BLOCK, cache_type="none") as source, open(path, "wb") as target:
        shutil.copyfileobj(source, target, DOWNLOAD_BLOCK)


def merge_windows(windows: tuple[tuple[int, int], ...], *, size: int) -> list[tuple[int, int]]:
    """Clip `windows` to [0, size), sort them and merge those less than `MERGE_GAP` apart."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted((max(0, a), min(size, b)) for a, b in windows):
        if start >= stop:
            continue
        if merged and start - merged[-1][1] < MERGE_GAP:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged
