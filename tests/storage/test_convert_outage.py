"""An outage of the store is never a reject: a conversion from or into S3 (moto on 127.0.0.1,
behind a proxy that can be taken down) stops with `RemoteError` and exit status 1, keeps what it
finished, rejects nothing for the outage, and `--resume` after the store is back gives the bytes
of an uninterrupted conversion. A conversion into S3 that cannot remove its lock says so."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs", reason="S3 URLs need s3fs")
pytest.importorskip("moto.server", reason="the S3-compatible test server is moto's")

from click.testing import CliRunner
from conftest import tree_bytes
from converting import convert
from remote_servers import DroppingProxy, make_bucket, moto_server, s3_options, upload_tree

from shardfmt import RemoteError, RemoteOptions, RetryPolicy
from shardfmt._cli import main
from shardfmt._convert import destination

FAST = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.02)
SHARD_SIZE = 6000


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        make_bucket(url, "data")
        yield url


@pytest.fixture
def proxy(endpoint: str) -> Iterator[DroppingProxy]:
    host, port = endpoint.removeprefix("http://").split(":")
    relay = DroppingProxy((host, int(port)), drop_after=1 << 40)
    try:
        yield relay
    finally:
        relay.close()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's default RetryPolicy, 5 attempts, with waits of 0.01 s."""
    monkeypatch.setattr(RetryPolicy, "delay", lambda self, retry: 0.01)


def outage_after_first_shard(monkeypatch: pytest.MonkeyPatch, proxy: DroppingProxy) -> list[int]:
    """Take the store down as soon as shard 0's sidecar is written; return the sidecars written."""
    written: list[int] = []
    write_sidecar = destination.Output.write_sidecar

    def then_down(self: destination.Output, index: int, sidecar: dict[str, Any]) -> None:
        write_sidecar(self, index, sidecar)
        written.append(index)
        if index == 0:
            proxy.take_down()

    monkeypatch.setattr(destination.Output, "write_sidecar", then_down)
    return written


def sidecars(out: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_bytes()) for path in sorted((out / destination.WORK_DIR).glob("shard-*.json"))]


def test_an_outage_of_the_source_stops_the_conversion_and_resume_finishes_it(
    imagefolder: Path, tmp_path: Path, endpoint: str, proxy: DroppingProxy, quick_retries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    upload_tree(s3fs.S3FileSystem(**s3_options(endpoint)), imagefolder, "data/outage-src")
    convert(imagefolder, tmp_path / "clean", workers=1, shard_size=SHARD_SIZE)
    out = tmp_path / "out"
    args = ["convert", "s3://data/outage-src", str(out), "--shard-size", str(SHARD_SIZE), "--workers", "1", "--quiet",
            "--storage-options", json.dumps(s3_options(proxy.endpoint))]
    written = outage_after_first_shard(monkeypatch, proxy)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: s3://data/outage-src/class_")
    assert "failed after 5 attempts" in lines[0]
    assert lines[0].endswith(
        "the conversion stopped: the shards finished so far are kept, no input was rejected for this failure and "
        "manifest.json is not written; once the store answers again, run the same conversion with --resume"
    )
    assert written == [0]
    assert [s["index"] for s in sidecars(out)] == [0] and sidecars(out)[0]["rejects"] == []
    assert not (out / "manifest.json").exists() and not (out / "rejects.jsonl").exists()
    assert (out / "shard-00000.shard").is_file() and not (out / "shard-00001.shard").exists()
    monkeypatch.undo()
    proxy.down = False
    result = CliRunner().invoke(main, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert tree_bytes(out) == tree_bytes(tmp_path / "clean")


def test_python_callers_are_told_the_keyword_and_the_error_is_transient(
    imagefolder: Path, tmp_path: Path, endpoint: str, proxy: DroppingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    upload_tree(s3fs.S3FileSystem(**s3_options(endpoint)), imagefolder, "data/outage-py")
    outage_after_first_shard(monkeypatch, proxy)
    remote = RemoteOptions(storage_options=s3_options(proxy.endpoint), retry=FAST)
    with pytest.raises(RemoteError, match=r"failed after 3 attempts: .*run the same conversion with resume=True\Z") as caught:
        convert("s3://data/outage-py", tmp_path / "out", workers=2, shard_size=SHARD_SIZE, remote=remote)
    assert caught.value.transient is True
    assert caught.value.path is not None and caught.value.path.startswith("s3://data/outage-py/class_")
    found = sidecars(tmp_path / "out")  # shard 0, and those the two workers had built before the outage
    assert found and all(s["rejects"] == [] for s in found) and not (tmp_path / "out" / "manifest.json").exists()


def test_an_outage_of_the_output_store_names_the_lock_left_and_how_to_resume(
    imagefolder: Path, tmp_path: Path, endpoint: str, proxy: DroppingProxy, quick_retries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    s3 = s3fs.S3FileSystem(**s3_options(endpoint))
    convert(imagefolder, tmp_path / "clean", workers=1, shard_size=SHARD_SIZE)
    args = ["convert", str(imagefolder), "s3://data/outage-out", "--shard-size", str(SHARD_SIZE), "--workers", "1", "--quiet",
            "--storage-options", json.dumps(s3_options(proxy.endpoint))]
    outage_after_first_shard(monkeypatch, proxy)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: s3://data/outage-out/shard-00001.shard: upload failed after 5 attempts")
    assert lines[0].endswith(
        "once the store answers again, run the same conversion with --resume and --break-lock: this run's lock object "
        "s3://data/outage-out/.shardfmt-lock could not be removed, and breaking it is safe while no other run converts into "
        "this output"
    )
    monkeypatch.undo()
    proxy.down = False
    s3.invalidate_cache()
    assert s3.exists("data/outage-out/.shardfmt-lock") and not s3.exists("data/outage-out/manifest.json")
    assert CliRunner().invoke(main, [*args, "--resume"]).exit_code == 1  # the lock is still there
    result = CliRunner().invoke(main, [*args, "--resume", "--break-lock"])
    assert result.exit_code == 0, result.output
    s3.invalidate_cache()
    tree = {name.removeprefix("data/outage-out/"): s3.cat_file(name) for name in sorted(s3.find("data/outage-out"))}
    assert tree == tree_bytes(tmp_path / "clean")


def test_python_callers_are_told_break_lock(
    imagefolder: Path, tmp_path: Path, endpoint: str, proxy: DroppingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    outage_after_first_shard(monkeypatch, proxy)
    remote = RemoteOptions(storage_options=s3_options(proxy.endpoint), retry=FAST)
    with pytest.raises(RemoteError, match=r"with resume=True and break_lock=True: this run's lock object") as caught:
        convert(imagefolder, "s3://data/outage-out-py", workers=1, shard_size=SHARD_SIZE, remote=remote)
    assert caught.value.transient is True
