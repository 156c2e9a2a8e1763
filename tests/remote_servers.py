"""Servers on 127.0.0.1 for the remote-storage tests: an S3-compatible server (moto), an HTTP
server with Range support and fault injection, a TCP proxy that drops one connection, and a
server that answers like GCS (or with 503 to everything, for any backend).

Every server binds to loopback only, on a port the kernel picks, and is stopped by its fixture.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

S3_CREDENTIALS = {"key": "shardfmt-test-key", "secret": "shardfmt-test-secret"}
_RANGE = re.compile(r"bytes=(\d*)-(\d*)\Z")


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1; yield its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_CREDENTIALS["key"],
        aws_secret_access_key=S3_CREDENTIALS["secret"],
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)


def s3_options(endpoint: str) -> dict[str, Any]:
    """fsspec storage options for the moto server."""
    return {**S3_CREDENTIALS, "endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}


class RangeServer(ThreadingHTTPServer):
    """Serves files under `root` with GET, HEAD and single byte ranges.

    Attributes:
        requests: GET and HEAD requests per path.
        drop_once: path suffixes whose next GET sends its headers and half its body, then closes
            the connection (each suffix once).
        corrupt_once: path suffixes whose next whole-object GET has byte 200 of its body flipped (each once).
    """

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _RangeHandler)
        self.root = root
        self.requests: Counter[str] = Counter()
        self.drop_once: set[str] = set()
        self.dropped: list[str] = []
        self.corrupt_once: set[str] = set()
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RangeHandler(BaseHTTPRequestHandler):
    server: RangeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _file(self) -> Path | None:
        relative = self.path.split("?", 1)[0].lstrip("/")
        path = (self.server.root / relative).resolve()
        if self.server.root.resolve() not in path.parents or not path.is_file():
            return None
        return path

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        path = self._file()
        with self.server.lock:
            self.server.requests[self.path] += 1
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = path.read_bytes()
        start, stop = 0, len(data)
        match = _RANGE.match(self.headers.get("Range", ""))
        if match:
            first, last = match.groups()
            if first:
                start, stop = int(first), min(len(data), int(last) + 1) if last else len(data)
            else:
                start = max(0, len(data) - int(last))
            if start >= stop:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not body:
            return
        payload = data[start:stop]
        with self.server.lock:
            victim = next((s for s in self.server.drop_once if self.path.endswith(s) and len(payload) > 256), None)
            if victim is not None:
                self.server.drop_once.discard(victim)
                self.server.dropped.append(self.path)
            whole = "Range" not in self.headers
            spoil = next((s for s in self.server.corrupt_once if self.path.endswith(s) and whole and len(payload) > 256), None)
            if spoil is not None:
                self.server.corrupt_once.discard(spoil)
        if spoil is not None:
            payload = payload[:200] + bytes([payload[200] ^ 0xFF]) + payload[201:]
        if victim is not None:
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(payload)


@contextlib.contextmanager
def range_server(root: Path) -> Iterator[RangeServer]:
    server = RangeServer(root)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 to `upstream` that cuts one connection once it has relayed
    `drop_after` bytes of responses (when armed): a connection dropped mid-response. While `down`
    is set (`take_down`) it is an outage instead: every connection is closed at once, and counted
    in `turned_away`."""

    def __init__(self, upstream: tuple[str, int], *, drop_after: int) -> None:
        self.upstream = upstream
        self.drop_after = drop_after
        self.armed = False
        self.drops = 0
        self.down = False
        self.turned_away = 0
        self._open: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            if self.down:
                self.turned_away += 1
                client.close()
                continue
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._open |= {client, upstream}
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, responses: bool) -> None:
        relayed = 0
        try:
            while chunk := source.recv(65536):
                if responses:
                    with self._lock:
                        cut = self.armed and relayed + len(chunk) > self.drop_after
                        if cut:
                            self.armed = False
                            self.drops += 1
                    if cut:
                        sink.sendall(chunk[: max(0, self.drop_after - relayed)])
                        break
                    relayed += len(chunk)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
                with self._lock:
                    self._open.discard(sock)

    def take_down(self) -> None:
        """Start an outage: cut every relayed connection and turn new ones away."""
        self.down = True
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(2)


def upload_tree(fs: Any, local: Path, remote: str) -> None:
    """Copy every file under `local` to `remote` (an fsspec path)."""
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.put_file(os.fspath(path), f"{remote}/{path.relative_to(local).as_posix()}")


# Azurite's published development account: a well-known key that guards nothing.
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_GCS_RANGE = re.compile(r"bytes=(\d+)-(\d*)\Z")


def gcs_options(endpoint: str) -> dict[str, Any]:
    """fsspec storage options for gcsfs against `endpoint`, anonymously."""
    return {"endpoint_url": endpoint, "token": "anon"}


AZURE_ACCOUNT = "devstoreaccount1"


def azure_options(endpoint: str) -> dict[str, Any]:
    """fsspec storage options for adlfs against `endpoint`, with Azurite's development account."""
    account = AZURE_ACCOUNT
    connection = f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{account};"
    return {"connection_string": connection}


class StorageServer(ThreadingHTTPServer):
    """Answers 503 to everything while `down`; otherwise serves `objects` (read-only, whatever
    the bucket or container) the way the GCS JSON API does (metadata at ``/storage/v1/b/B/o/K``,
    bytes with ``alt=media`` and a Range, listings at ``/storage/v1/b/B/o?prefix=P``), and the
    way Azure Blob Storage does for Get Blob and its properties (``/ACCOUNT/CONTAINER/K``)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _StorageHandler)
        self.down = True
        self.objects: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def serve_tree(self, root: Path, prefix: str) -> None:
        """Serve every file under `root` as the object ``prefix/<its relative path>``, and come up."""
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.objects[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
        self.down = False


class _StorageHandler(BaseHTTPRequestHandler):
    server: StorageServer

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes, content_type: str = "application/json", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on an answer it did not need

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.server.lock:
            self.server.requests.append(f"{self.command} {self.path}")
        if self.server.down:
            self._reply(503, json.dumps({"error": {"code": 503, "message": "service unavailable"}}).encode())
            return
        url = urlsplit(self.path)
        blob = re.match(rf"/{AZURE_ACCOUNT}/[^/]+/(.+)\Z", url.path)
        if blob is not None:
            self._blob(unquote(blob.group(1)))
            return
        listing = re.match(r"/storage/v1/b/([^/]+)/o/?\Z", url.path)
        if listing is not None and self.command == "GET":
            self._list(listing.group(1), parse_qs(url.query))
            return
        match = re.match(r"/(?:download/)?storage/v1/b/([^/]+)/o/(.+)\Z", url.path)
        data = self.server.objects.get(unquote(match.group(2))) if match else None
        if match is None or data is None:
            self._reply(404, json.dumps({"error": {"code": 404, "message": "no such object"}}).encode())
        elif "alt=media" not in url.query:
            name = unquote(match.group(2))
            meta = {"kind": "storage#object", "bucket": match.group(1), "name": name, "size": str(len(data)), "generation": "1"}
            self._reply(200, json.dumps(meta).encode())
        else:
            found = _GCS_RANGE.match(self.headers.get("Range", ""))
            start = int(found.group(1)) if found else 0
            stop = min(len(data), int(found.group(2)) + 1) if found and found.group(2) else len(data)
            status = 206 if found else 200
            self._reply(status, data[start:stop], "application/octet-stream", Content_Range=f"bytes {start}-{stop - 1}/{len(data)}")

    def _blob(self, name: str) -> None:
        """Azure Blob Storage's Get Blob and Get Blob Properties, with an ``x-ms-range``."""
        data = self.server.objects.get(name)
        if data is None:
            self._reply(404, b"", "application/xml", x_ms_error_code="BlobNotFound")
            return
        found = _GCS_RANGE.match(self.headers.get("x-ms-range") or self.headers.get("Range") or "")
        start = int(found.group(1)) if found else 0
        stop = min(len(data), int(found.group(2)) + 1) if found and found.group(2) else len(data)
        headers = {"Content_Range": f"bytes {start}-{stop - 1}/{len(data)}", "ETag": '"0x1"', "x_ms_blob_type": "BlockBlob"}
        headers["Last_Modified"] = "Thu, 26 Nov 2026 00:00:00 GMT"
        self._reply(206 if found else 200, data[start:stop], "application/octet-stream", **headers)

    def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
        """The JSON API's listing: objects under ``prefix``, folded at ``delimiter`` when given."""
        prefix, delimiter = query.get("prefix", [""])[0], query.get("delimiter", [""])[0]
        items, prefixes = [], set()
        for name, data in sorted(self.server.objects.items()):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
            else:
                items.append({"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)), "generation": "1"})
        self._reply(200, json.dumps({"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)}).encode())

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


@contextlib.contextmanager
def storage_server() -> Iterator[StorageServer]:
    """Run a `StorageServer` (down until told otherwise) on 127.0.0.1."""
    httpd = StorageServer()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
