"""Object storage end to end, against moto's S3-compatible server on 127.0.0.1: convert straight
to S3 (and from it), load from it with range reads and with the cache, survive a connection cut
mid-shard, name a corrupt object, keep secrets out of errors, and split epochs exactly across a
2-process torchrun job that resumes exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

pytest.importorskip("s3fs", reason="S3 URLs need s3fs")
pytest.importorskip("moto.server", reason="the S3-compatible test server is moto's")

from click.testing import CliRunner
from conftest import jpeg_bytes, tree_bytes
from converting import convert
from remote_servers import (
    DroppingProxy,
    make_bucket,
    moto_server,
    s3_options,
    upload_tree,
)

from shardfmt import (
    ChecksumError,
    ConvertError,
    DatasetWriter,
    ImageTransform,
    Loader,
    Output,
    RemoteError,
    RemoteOptions,
    RetryPolicy,
    Sampling,
    open_dataset,
)
from shardfmt._cli import main
from shardfmt._convert import loop as convert_pipeline
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import RandomCrop

REPO = Path(__file__).resolve().parents[2]
FAST = RetryPolicy(attempts=4, first_delay=0.02, max_delay=0.1)
NUM_RECORDS = 61


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        make_bucket(url, "data")
        yield url


@pytest.fixture(scope="module")
def s3(endpoint: str) -> Any:
    import s3fs

    return s3fs.S3FileSystem(**s3_options(endpoint))


def options(endpoint: str, **kwargs: Any) -> RemoteOptions:
    return RemoteOptions(storage_options=s3_options(endpoint), retry=FAST, **kwargs)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory, s3: Any) -> tuple[Path, str]:
    """61 records labelled with their index, in several shards, locally and at s3://data/indexed."""
    out = tmp_path_factory.mktemp("indexed") / "ds"
    rng = np.random.default_rng(5)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=24_000) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"image": jpeg_bytes(int(rng.integers(30, 70)), int(rng.integers(30, 70)), seed=i), "label": i, "key": f"r{i}"})
    upload_tree(s3, out, "data/indexed")
    return out, "s3://data/indexed"


def s3_tree(s3: Any, prefix: str) -> dict[str, bytes]:
    s3.invalidate_cache()
    return {name[len(prefix) + 1 :]: s3.cat_file(name) for name in sorted(s3.find(prefix))}


def test_convert_to_s3_writes_the_bytes_of_a_local_conversion(imagefolder: Path, tmp_path: Path, endpoint: str, s3: Any) -> None:
    local = convert(imagefolder, tmp_path / "local", workers=1, shard_size=6000)
    remote = convert(imagefolder, "s3://data/converted", workers=2, shard_size=6000, remote=options(endpoint))
    assert remote.path == "s3://data/converted" and len(local.manifest.shards) >= 3
    assert s3_tree(s3, "data/converted") == tree_bytes(tmp_path / "local")
    ds = open_dataset("s3://data/converted", remote=options(endpoint))
    assert [r["key"] for r in ds] == [r["key"] for r in open_dataset(tmp_path / "local")]
    with pytest.raises(ConvertError, match="not empty"):
        convert(imagefolder, "s3://data/converted", workers=1, shard_size=6000, remote=options(endpoint))


def test_convert_from_s3_source_and_by_cli(imagefolder: Path, tmp_path: Path, endpoint: str, s3: Any) -> None:
    upload_tree(s3, imagefolder, "data/src")
    convert(imagefolder, tmp_path / "local", workers=1, shard_size=6000)
    runner = CliRunner()
    result = runner.invoke(main, ["convert", "s3://data/src", "s3://data/from-s3", "--shard-size", "6000", "--workers", "1", "--quiet",
                                  "--storage-options", json.dumps(s3_options(endpoint))])
    assert result.exit_code == 0, result.output
    assert s3_tree(s3, "data/from-s3") == tree_bytes(tmp_path / "local")
    result = convert("s3://data/src", tmp_path / "to-local", workers=1, shard_size=6000, remote=options(endpoint))
    assert tree_bytes(tmp_path / "to-local") == tree_bytes(tmp_path / "local")


def test_an_interrupted_conversion_to_s3_resumes(
    imagefolder: Path, tmp_path: Path, endpoint: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_pipeline, "build_outputs", interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert(imagefolder, "s3://data/resumed", workers=1, shard_size=6000, remote=options(endpoint))
    monkeypatch.undo()
    s3.invalidate_cache()
    assert not s3.exists("data/resumed/manifest.json")
    assert s3.exists("data/resumed/.shardfmt-work/plan.json") and s3.exists("data/resumed/.shardfmt-work/shard-00000.json")
    s3.rm_file("data/resumed/shard-00001.shard")
    result = convert(imagefolder, "s3://data/resumed", workers=1, shard_size=6000, resume=True, remote=options(endpoint))
    assert result.reused_shards == len(result.manifest.shards) - 1
    convert(imagefolder, tmp_path / "local", workers=1, shard_size=6000)
    assert s3_tree(s3, "data/resumed") == tree_bytes(tmp_path / "local")


def test_loader_from_s3_survives_a_connection_cut_mid_shard(indexed: tuple[Path, str], endpoint: str, tmp_path: Path) -> None:
    host, port = endpoint.removeprefix("http://").split(":")
    proxy = DroppingProxy((host, int(port)), drop_after=20_000)
    try:
        for mode in ("cache", "range"):
            proxy.armed = True
            remote = RemoteOptions(mode=mode, cache_dir=str(tmp_path / "cache"), storage_options=s3_options(proxy.endpoint), retry=FAST)
            with Loader(
                indexed[1],
                batch_size=8,
                num_workers=2,
                remote=remote,
                seed=3,
                transform=ImageTransform(size=16),
                sampling=Sampling(window=2),
            ) as loader:
                labels = sorted(x for _, batch in loader for x in batch.tolist())
            assert labels == list(range(NUM_RECORDS))
        assert proxy.drops >= 1
    finally:
        proxy.close()


def test_an_outage_surfaces_after_shardfmts_own_attempts(
    indexed: tuple[Path, str], endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RetryPolicy is the one retry layer: botocore and s3fs try each call once, so an outage
    costs `attempts` tries (before: 5 x 5 x 2 connections per try, minutes of waiting)."""
    host, port = endpoint.removeprefix("http://").split(":")
    proxy = DroppingProxy((host, int(port)), drop_after=1 << 40)
    try:
        policy = RetryPolicy(attempts=3, first_delay=0.01, max_delay=0.02)
        reader = open_dataset(indexed[1], remote=RemoteOptions(storage_options=s3_options(proxy.endpoint), retry=policy))
        proxy.take_down()
        with caplog.at_level("WARNING", logger="shardfmt._storage"), pytest.raises(RemoteError, match="failed after 3 attempts"):
            reader[0]["image"]
        assert len([r for r in caplog.records if "retrying in" in r.getMessage()]) == 2
        # per try, one connection, and one more that the HTTP client opens when the first is dropped
        assert proxy.turned_away <= 2 * policy.attempts
    finally:
        proxy.close()


def test_a_cache_smaller_than_a_shard_says_what_to_raise_it_to(indexed: tuple[Path, str], endpoint: str, tmp_path: Path) -> None:
    largest = max(path.stat().st_size for path in indexed[0].glob("*.shard"))
    remote = options(endpoint, mode="cache", cache_dir=str(tmp_path), cache_size=largest - 1)
    with pytest.raises(RemoteError, match=f"raise cache_size to at least {largest}"):
        Loader(indexed[1], batch_size=8, num_workers=1, remote=remote, transform=ImageTransform(size=16))
    Loader(
        indexed[1],
        batch_size=8,
        num_workers=0,
        remote=options(endpoint, mode="cache", cache_dir=str(tmp_path), cache_size=largest),
        transform=ImageTransform(size=16),
    ).close()


def test_a_corrupt_s3_object_is_named(indexed: tuple[Path, str], endpoint: str, s3: Any, tmp_path: Path) -> None:
    upload_tree(s3, indexed[0], "data/corrupt")
    data = bytearray(s3.cat_file("data/corrupt/shard-00001.shard"))
    data[400] ^= 0x55
    s3.pipe_file("data/corrupt/shard-00001.shard", bytes(data))
    reader = open_dataset("s3://data/corrupt", remote=options(endpoint, mode="cache", cache_dir=str(tmp_path)))
    with pytest.raises(ChecksumError, match="downloaded twice") as info:
        reader[int(reader.cumulative[1])]["image"]
    assert info.value.path == "s3://data/corrupt/shard-00001.shard"
    assert not list(tmp_path.rglob("*.shard"))


def test_s3_errors_hold_no_secret(endpoint: str) -> None:
    secret = {**s3_options(endpoint), "secret": "Sup3rS3cretValue", "key": "AKIASECRETKEY1234"}
    remote = RemoteOptions(storage_options=secret, retry=RetryPolicy(attempts=2, first_delay=0.01))
    with pytest.raises((RemoteError, FileNotFoundError)) as info:
        open_dataset("s3://no-such-bucket/ds", remote=remote)
    texts = [str(info.value), repr(remote)]
    cause = info.value.__cause__
    while cause is not None:
        texts.append(str(cause))
        cause = cause.__cause__
    assert not any("Sup3rS3cretValue" in t or "AKIASECRETKEY1234" in t for t in texts)


@pytest.mark.slow
def test_tar_shards_convert_to_s3_resume_and_read_back_by_url(
    imagefolder: Path, tmp_path: Path, endpoint: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = convert(imagefolder, tmp_path / "local", workers=1, shard_size=6000, shard_format="tar")
    remote = convert(imagefolder, "s3://data/tar", workers=2, shard_size=6000, shard_format="tar", remote=options(endpoint))
    assert remote.manifest.shard_format == "tar" and len(local.manifest.shards) >= 3
    assert s3_tree(s3, "data/tar") == tree_bytes(tmp_path / "local")
    expected = [(r["key"], r["label"], bytes(r["image"])) for r in open_dataset(tmp_path / "local")]
    for mode in ("range", "cache"):
        ds = open_dataset("s3://data/tar", remote=options(endpoint, mode=mode, cache_dir=str(tmp_path / "cache")))
        assert [(r["key"], r["label"], bytes(r["image"])) for r in ds] == expected
        assert ds.shard_path(1) == "s3://data/tar/shard-00001.tar"
    settings: dict[str, Any] = dict(
        batch_size=4, seed=2, transform=ImageTransform(size=16), sampling=Sampling(window=2), output=Output(copy=True)
    )
    with (
        Loader(tmp_path / "local", num_workers=0, **settings) as here,
        Loader("s3://data/tar", num_workers=2, remote=options(endpoint), **settings) as there,
    ):
        for (a, label_a), (b, label_b) in zip(here, there, strict=True):
            assert torch.equal(a, b) and torch.equal(label_a, label_b)

    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(convert_pipeline, "build_outputs", interrupt)
    with pytest.raises(KeyboardInterrupt):
        convert(imagefolder, "s3://data/tar-resumed", workers=1, shard_size=6000, shard_format="tar", remote=options(endpoint))
    monkeypatch.undo()
    s3.invalidate_cache()
    assert s3.exists("data/tar-resumed/shard-00001.tar.idx") and not s3.exists("data/tar-resumed/manifest.json")
    s3.rm_file("data/tar-resumed/shard-00001.tar.idx")  # a lost member index redoes its shard
    result = convert(
        imagefolder, "s3://data/tar-resumed", workers=1, shard_size=6000, shard_format="tar", resume=True, remote=options(endpoint)
    )
    assert result.reused_shards == len(result.manifest.shards) - 1
    assert s3_tree(s3, "data/tar-resumed") == tree_bytes(tmp_path / "local")


def sr_folders(root: Path) -> Path:
    """LR/ and HR/ folders of PNG pairs, HR 2x the LR's size."""
    rng = np.random.default_rng(8)
    for name in ("LR", "HR"):
        (root / name).mkdir(parents=True)
    for i in range(9):
        hr = rng.integers(0, 255, (16 + 8 * (i % 3), 24, 3), dtype=np.uint8)
        Image.fromarray(hr).save(root / "HR" / f"{i:03d}.png")
        Image.fromarray(hr[::2, ::2]).save(root / "LR" / f"{i:03d}.png")
    return root


def test_multi_field_records_convert_into_s3_and_load_by_url(tmp_path: Path, endpoint: str, s3: Any) -> None:
    src = sr_folders(tmp_path / "sr")
    args: dict[str, Any] = dict(scale=2, store="raw", shard_size=3000)
    convert([src / "LR", src / "HR"], tmp_path / "local", workers=1, **args)
    result = convert([src / "LR", src / "HR"], "s3://data/fields", workers=2, remote=options(endpoint), **args)
    assert result.path == "s3://data/fields" and len(result.manifest.shards) >= 3
    assert s3_tree(s3, "data/fields") == tree_bytes(tmp_path / "local")
    with pytest.raises(ConvertError, match="not empty"):
        convert([src / "LR", src / "HR"], "s3://data/fields", workers=1, remote=options(endpoint), **args)
    settings: dict[str, Any] = dict(
        batch_size=3, num_workers=0, fields={"lr": 6, "hr": 12}, seed=4, transform=RandomCrop(6), sampling=Sampling(window=2)
    )
    with Loader(tmp_path / "local", **settings) as here, Loader("s3://data/fields", remote=options(endpoint), **settings) as there:
        pairs = list(zip(here, there, strict=True))
    assert len(pairs) == 3
    for a, b in pairs:
        assert torch.equal(a["lr"], b["lr"]) and torch.equal(a["hr"], b["hr"])


def test_what_object_storage_does_not_take_is_refused(imagefolder: Path, tmp_path: Path, endpoint: str, s3: Any) -> None:
    tars = convert(imagefolder, tmp_path / "tars", workers=1, shard_size=6000, shard_format="tar")
    for shard in tars.manifest.shards:
        s3.put_file(str(tmp_path / "tars" / shard.path), f"data/wds/{shard.path}")
    for source in ("s3://data/wds/shard-00000.tar", "s3://data/wds/shard-{00000..00001}.tar", "s3://data/wds"):
        with pytest.raises(ConvertError, match="tars given by URL cannot be a conversion source"):
            convert(source, tmp_path / "out", workers=1, remote=options(endpoint))
    upload_tree(s3, imagefolder, "data/fields-src")
    with pytest.raises(ConvertError, match="several sources are folders of one image field each, and must be local"):
        convert(["s3://data/fields-src/class_000", "s3://data/fields-src/class_001"], tmp_path / "out", remote=options(endpoint))
    result = CliRunner().invoke(
        main,
        [
            "convert",
            "s3://data/fields-src/class_000",
            "s3://data/fields-src/class_001",
            str(tmp_path / "out"),
            "--storage-options",
            json.dumps(s3_options(endpoint)),
        ],
    )
    assert result.exit_code == 1 and "must be local" in result.output, result.output
    for url in ("s3://data/wds/shard-00000.tar", "s3://data/wds/shard-{00000..00001}.tar"):
        with pytest.raises(ValueError, match="only local tars can be opened directly"):
            open_dataset(url, remote=options(endpoint))
        with pytest.raises(ValueError, match="only local tars"):
            Loader(url, batch_size=2, remote=options(endpoint))


RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    from shardfmt import ImageTransform, Loader, RemoteOptions, RetryPolicy, Sampling
    url, options, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    remote = RemoteOptions(mode="cache", cache_dir=out + "/cache", storage_options=options, retry=RetryPolicy(attempts=4, first_delay=0.02))
    settings = dict(batch_size=6, num_workers=2, seed=11, remote=remote, transform=ImageTransform(size=16), sampling=Sampling(window=2))
    with Loader(url, **settings) as loader:
        epoch = [b.tolist() for _, b in loader]
    with Loader(url, **settings) as first:
        iterator = iter(first)
        head = [next(iterator)[1].tolist() for _ in range(3)]
        state = first.state_dict()
    with Loader(url, **settings) as second:
        second.load_state_dict(state)
        tail = [b.tolist() for _, b in second]
    dist.barrier()
    dist.destroy_process_group()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"epoch": epoch, "resumed": head + tail, "world": 2}, f)
    """
)


@pytest.mark.slow
def test_torchrun_two_ranks_of_two_workers_read_s3_exactly_and_resume(indexed: tuple[Path, str], endpoint: str, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        "--max-restarts=0",
        str(script),
        indexed[1],
        json.dumps(s3_options(endpoint)),
        str(tmp_path),
    ]
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    per_rank = -(-NUM_RECORDS // 2)  # records a rank gets, rounded up
    assert len(ranks[0]["epoch"]) == len(ranks[1]["epoch"]) == -(-per_rank // 6)
    flat = sorted(x for rank in ranks for batch in rank["epoch"] for x in batch)
    assert flat == list(range(NUM_RECORDS))
    for rank in ranks:
        assert rank["resumed"] == rank["epoch"]


def test_info_and_verify_take_an_s3_url(indexed: tuple[Path, str], endpoint: str) -> None:
    local, url = indexed
    storage = ["--storage-options", json.dumps(s3_options(endpoint))]
    runner = CliRunner()
    remote_info = runner.invoke(main, ["info", url, "--json", *storage])
    local_info = runner.invoke(main, ["info", str(local), "--json"])
    assert remote_info.exit_code == 0, remote_info.output
    assert {**json.loads(remote_info.stdout), "path": ""} == {**json.loads(local_info.stdout), "path": ""}
    assert json.loads(remote_info.stdout)["path"] == url
    remote_verify = runner.invoke(main, ["verify", url, *storage])
    local_verify = runner.invoke(main, ["verify", str(local)])
    assert remote_verify.exit_code == 0, remote_verify.output
    assert remote_verify.stdout == local_verify.stdout
    assert remote_verify.stdout.startswith(f"ok: {len(list(local.glob('*.shard')))} shards, {NUM_RECORDS} records")
