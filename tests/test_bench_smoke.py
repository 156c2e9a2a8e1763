"""tools/bench_loader.py runs end to end on a tiny configuration and prints its table and ratios.

Timings are not asserted: only that every contender ran, delivered its images and was reported.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "bench_loader.py"

pytest.importorskip("psutil", reason="the bench needs the 'bench' extra")


def run_bench(*args: str, work_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [
        sys.executable,
        str(SCRIPT),
        "--images",
        "40",
        "--batch-size",
        "8",
        "--workers",
        "1",
        "--epochs",
        "1",
        "--min-seconds",
        "0",
        "--rounds",
        "1",
        "--work-dir",
        str(work_dir),
        *args,
    ]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)


def ratio_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("ratio ")]


@pytest.mark.slow
def test_shardfmt_and_decode_limit(tmp_path: Path) -> None:
    done = run_bench("--only", "shardfmt,decode", "--json", str(tmp_path / "out.json"), "--rounds", "2", work_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "best of" in done.stdout, "two rounds: each row says which rates it is the best of"
    assert "shardfmt fast_decode=True / PIL DataLoader" in done.stdout
    assert "Loader.shared_memory_bytes" in done.stdout
    lines = ratio_lines(done.stdout)
    assert any(
        "shardfmt fast_decode=True / decode limit, exact IDCT" in line and line.rstrip().endswith(("met", "NOT met")) for line in lines
    )
    assert any("/ PIL DataLoader" in line and "n/a (not run)" in line for line in lines)
    document = json.loads((tmp_path / "out.json").read_text())
    names = {result["name"].strip() for result in document["results"]}
    assert {"shardfmt fast_decode=True", "shardfmt fast_decode=False", "decode limit, exact IDCT", "decode limit, fast IDCT"} <= names
    assert all(result["images"] == 40 for result in document["results"])


@pytest.mark.slow
def test_every_contender_with_chart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    chart = tmp_path / "bench.png"
    done = run_bench("--chart", str(chart), work_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in (
        "shardfmt fast_decode=True",
        "shardfmt on tar shards",
        "shardfmt raw pixels",
        "PIL DataLoader",
        "webdataset",
        "decode limit, exact IDCT",
    ):
        assert name in done.stdout
    lines = ratio_lines(done.stdout)
    if importlib.util.find_spec("albumentations") is not None:  # the recipe contender runs by default where it can
        assert (
            "shardfmt + TrivialAugmentWide + RandomErasing" in done.stdout
            and "Albumentations DataLoader + TrivialAugmentWide" in done.stdout
        )
    else:  # without the bench extra the recipe's ratios are named and marked as not run
        recipe = [line for line in lines if "TrivialAugmentWide" in line]
        assert recipe and all("n/a (not run)" in line for line in recipe)
        lines = [line for line in lines if line not in recipe]
    assert not any("n/a" in line for line in lines)
    assert chart.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_raw_pixels_beside_the_jpeg_path(tmp_path: Path) -> None:
    done = run_bench("--only", "shardfmt,raw,patches", "--json", str(tmp_path / "out.json"), work_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = ratio_lines(done.stdout)
    assert any("shardfmt raw pixels / shardfmt fast_decode=True" in line and line.rstrip().endswith("x") for line in lines)
    assert any("shardfmt raw patches / shardfmt JPEG patches" in line and line.rstrip().endswith(("met", "NOT met")) for line in lines)
    results = {r["name"].strip(): r for r in json.loads((tmp_path / "out.json").read_text())["results"]}
    for name in ("shardfmt raw pixels", "shardfmt JPEG patches", "shardfmt raw patches"):
        assert results[name]["images"] == 40 and results[name]["cpu_seconds"] > 0, name
    # Both patch copies come from `shardfmt convert --patch 256`: 256x256 records, as JPEG and as pixels.
    for store, kind in (("jpeg", "jpeg"), ("raw", "raw")):
        (folder,) = tmp_path.glob(f"derived-*/patches-256-{store}")
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["num_records"] == 40
        assert kind in json.dumps(manifest["schema"])


@pytest.mark.slow
def test_unknown_contender_is_refused(tmp_path: Path) -> None:
    done = run_bench("--only", "shardfmt,dali", work_dir=tmp_path)
    assert done.returncode == 2
    assert "--only" in done.stderr


@pytest.mark.slow
def test_s3_contender_beside_local_disk(tmp_path: Path) -> None:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    done = run_bench("--only", "shardfmt,s3", work_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("shardfmt fast_decode=True", "shardfmt over S3, range reads", "shardfmt over S3, shard cache"):
        assert any(line.startswith(name) for line in done.stdout.splitlines()), name
    assert any("shardfmt over S3, shard cache / shardfmt fast_decode=True" in line and "x" in line for line in ratio_lines(done.stdout))


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 140 s on two cores under a load of 10
def test_convert_bench_prints_every_writer_and_the_ceiling(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [
        sys.executable,
        str(ROOT / "tools" / "bench_convert.py"),
        "--images",
        "40",
        "--workers",
        "1",
        "2",
        "--repeat",
        "1",
        "--keep",
        str(tmp_path / "src"),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr
    for name in (
        "shardfmt convert, 1 worker",
        "shardfmt convert, 2 workers",
        "webdataset.ShardWriter (no checks)",
        "webdataset.ShardWriter, then fsync",
        "the checks alone, 1 core x 2",
        "the checks alone, on 2 cores at once",
    ):
        assert any(line.startswith(name) for line in done.stdout.splitlines()), name
    assert "speed-up from 1 to 2 workers" in done.stdout
    assert "of the checks alone on 2 cores" in done.stdout
    # The verdict depends on the machine and its load, so only its presence is checked.
    target = "target >= 2,500 images/s with 2 workers"
    assert any(line.startswith(target) and line.rstrip().endswith(("met", "NOT met")) for line in done.stdout.splitlines())


@pytest.mark.slow
def test_augment_contender_prints_each_steps_cost(tmp_path: Path) -> None:
    done = run_bench("--only", "shardfmt,pil,augment", "--json", str(tmp_path / "out.json"), work_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    for step in ("ColorJitter hue 0.1", "ColorJitter(0.4, 0.4, 0.4, 0.1)", "RandomRotation(15)", "Normalize(mean, std), float32 out"):
        assert any(line.startswith(step) for line in done.stdout.splitlines()), step
    lines = ratio_lines(done.stdout)
    assert any(
        "shardfmt + ColorJitter + RandomRotation / PIL DataLoader + ColorJitter + RandomRotation" in line
        and line.rstrip().endswith(("met", "NOT met"))
        for line in lines
    )
    assert any(
        "shardfmt fast_decode=True, 1st epoch / its later epochs" in line and line.rstrip().endswith(("met", "NOT met")) for line in lines
    )
    document = json.loads((tmp_path / "out.json").read_text())
    steps = {step["step"].strip(): step for step in document["steps"]}
    assert len(document["steps"]) == 33  # 11 steps and rows of before, the recipe's 4, its 14 operations, 4 resizes
    for name in ("TrivialAugmentWide()", "RandAugment(2, 9)", "AutoAugment(imagenet)", "RandomErasing(p=1.0)", "ShearX (wide range)"):
        assert steps[name]["shardfmt_us"] > 0
        if importlib.util.find_spec("albumentations") is not None:
            assert steps[name]["albumentations_us"] > 0  # its equivalent, timed in the same run
    results = {r["name"]: r for r in document["results"]}
    assert results["shardfmt + ColorJitter + RandomRotation"]["images"] == 40
    # the shardfmt contenders read the converter's copy: every JPEG kept byte for byte, strictly decoded
    (folder,) = tmp_path.glob("derived-*/shardfmt-converted")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["strict_jpeg"] is True and manifest["stats"]["passthrough"] == 40


@pytest.mark.slow
def test_restart_bench_checks_the_pixels_of_every_transcode(tmp_path: Path) -> None:
    """tools/bench_jpeg_restarts.py transcodes losslessly, decodes every box five ways and exits
    non-zero if any differs from the stored JPEG's pixels; the table names each way."""
    from shardfmt.ops._jpegcrop import CropDecoder

    if not CropDecoder.available():
        pytest.skip("libjpeg-turbo's partial decoding (Pillow's Linux wheel) is not available here")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tools")]))
    script = ROOT / "tools" / "bench_jpeg_restarts.py"
    command = [sys.executable, str(script), "--images", "12", "--generate", "20", "--repeats", "1", "--work-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    assert "every variant's pixels equal the stored JPEG's" in done.stdout
    rows = {line[:50].strip(): line.split() for line in done.stdout.splitlines() if line.endswith("x")}
    assert set(rows) == {
        "stored JPEG",
        "optimised Huffman tables",
        "restart marker every MCU row",
        "+ decode from the box's MCU row",
        "optimised tables + restarts + from the box's row",
    }
    assert rows["stored JPEG"][-1] == "1.000x"
    assert float(rows["optimised Huffman tables"][-3]) < 1.0  # an optimised table codes these JPEGs in fewer bytes
    assert "transcoding, CPU ms a JPEG: optimised Huffman tables" in done.stdout


@pytest.mark.slow
def test_restart_bench_refuses_a_progressive_jpeg_by_name(tmp_path: Path) -> None:
    """libjpeg ends the process on an error, so the tool checks its JPEGs first and names the one
    it cannot measure."""
    from PIL import Image

    folder = tmp_path / "src" / "class_a"
    folder.mkdir(parents=True)
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "flat.jpg", quality=90, progressive=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tools")]))
    script = ROOT / "tools" / "bench_jpeg_restarts.py"
    command = [sys.executable, str(script), "--src", str(tmp_path / "src"), "--repeats", "1", "--work-dir", str(tmp_path / "work")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 1
    assert "flat.jpg: not a baseline JPEG" in done.stderr


def test_rounds_keep_each_measure_at_its_best() -> None:
    """The later epochs come from the round with the best rate; the first epoch and the first
    batch from their own best rounds, which may be others."""
    import bench_loader

    def result(seconds: float, warmup_seconds: float, first_batch: float) -> bench_loader.Result:
        return bench_loader.Result(
            "loader", 1000, seconds, warmup_images=500, warmup_seconds=warmup_seconds, first_batch_seconds=first_batch
        )

    rounds = [[result(1.0, 0.5, 0.2)], [result(0.8, 0.9, 0.3)]]
    (best,) = bench_loader.best_of(rounds)
    assert best.images_per_second == pytest.approx(1250)
    assert best.warmup_images_per_second == pytest.approx(1000)
    assert best.first_batch_seconds == pytest.approx(0.2)
    assert "best of 1000, 1250" in best.note and "1st epoch best of 1000, 556" in best.note


def test_the_median_interval_holds_the_median_with_the_stated_coverage() -> None:
    """Order statistics: for 24 values the 7th smallest to the 7th largest (97.7%); the coverage
    stated is the binomial one; and over many draws the interval holds the true median at least
    as often as it says."""
    import math

    import bench_loader
    import numpy as np

    low, middle, high, coverage = bench_loader.median_interval([float(v) for v in range(24, 0, -1)])
    assert (low, middle, high) == (7.0, 12.5, 18.0)
    assert coverage == pytest.approx(1 - 2 * sum(math.comb(24, i) for i in range(7)) / 2**24)
    assert bench_loader.median_interval([3.0]) == (3.0, 3.0, 3.0, 0.0)
    assert bench_loader.median_interval([1.0, 2.0, 3.0, 4.0, 5.0])[::3] == (1.0, pytest.approx(1 - 2 / 32))
    rng = np.random.default_rng(0)
    held = 0
    for _ in range(2000):  # a skewed spread, whose median is log(2)
        low, _, high, coverage = bench_loader.median_interval(list(rng.exponential(1.0, 13)))
        held += low <= math.log(2) <= high
    assert coverage > 0.95 and held / 2000 > 0.95
    for values, confidence in (([], 0.95), ([1.0], 1.0), ([1.0], 0.0)):
        with pytest.raises(ValueError):
            bench_loader.median_interval(values, confidence)


@pytest.mark.slow
def test_augment_bench_repeats_the_measure_and_states_the_median(tmp_path: Path) -> None:
    pytest.importorskip("albumentations", reason="the Albumentations contender needs the 'bench' extra")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tools"), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, str(ROOT / "tools" / "bench_augment.py"), "--images", "24", "--batch-size", "8", "--workers", "1"]
    command += ["--epochs", "1", "--rounds", "1", "--repeats", "2", "--work-dir", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("ratio ") for line in lines) == 2
    assert any(line.startswith("ratios in images/s, in order: ") for line in lines)
    (summary,) = (line for line in lines if line.startswith("median "))
    assert "interval for the median" in summary and summary.endswith(("target met", "target NOT met"))
    refused = subprocess.run([*command[:2], "--repeats", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--repeats" in refused.stderr


@pytest.mark.slow
def test_outage_bench_counts_one_request_per_attempt() -> None:
    pytest.importorskip("gcsfs", reason="gs:// URLs need gcsfs")
    pytest.importorskip("adlfs", reason="az:// URLs need adlfs")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    script = str(ROOT / "tools" / "bench_outage.py")
    command = [sys.executable, script, "--store", "gcs", "--store", "azure", "--attempts", "2", "--runs", "2"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if " attempts=" in line]
    assert [line.split(":")[0] for line in lines] == ["gcs attempts=2", "azure attempts=2"]
    assert all(line.endswith(", 2, 2 requests") for line in lines), lines
