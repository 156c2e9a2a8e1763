"""The GPU machine's tools where there is no GPU: tools/bench_loader.py --scaling runs end to end,
tools/bench_gpu.py and tools/bench_train.py say that they skip, and tools/gpu_record.py builds the
record from its inputs. Timings are not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"

pytest.importorskip("psutil", reason="the bench needs the 'bench' extra")


def run_tool(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), str(TOOLS), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(TOOLS / script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)


@pytest.mark.slow
def test_scaling_against_the_decode_limit(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    done = run_tool(
        "bench_loader.py", "--images", "40", "--batch-size", "8", "--epochs", "1", "--min-seconds", "0", "--rounds", "1",
        "--scaling", "1,2", "--work-dir", str(tmp_path), "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "target >= 0.85x of the limit at 2 workers:" in done.stdout
    document = json.loads(out.read_text())
    one_core = document["decode_limit_one_core"]["one_core_exact_images_per_second"]
    assert [row["workers"] for row in document["scaling"]] == [1, 2]
    for row in document["scaling"]:
        assert row["decode_limit_images_per_second"] == pytest.approx(one_core * row["workers"])
        assert row["ratio_to_limit"] == pytest.approx(row["images_per_second"] / row["decode_limit_images_per_second"])
        assert row["images"] == 40


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("script", ["bench_gpu.py", "bench_train.py"])
@pytest.mark.slow
def test_gpu_benches_skip_without_cuda(tmp_path: Path, script: str) -> None:
    done = run_tool(script, "--work-dir", str(tmp_path), "--json", str(tmp_path / "out.json"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{script[:-3]}: skipped: no CUDA device")
    assert not (tmp_path / "out.json").exists()


def test_the_record_gathers_every_figure(tmp_path: Path) -> None:
    loader = {
        "device": "NVIDIA H200",
        "machine": {"cpu_model": "x", "cpu_count": 16, "torch": "2.11"},
        "settings": {"workers": 16, "batch_size": 256, "images": 5000},
        "results": [
            {"name": "cpu, 16 workers", "images_per_second": 1000.0, "gpu_share": None},
            {"name": "gpu, 16 workers", "images_per_second": 800.0, "gpu_share": 1.0},
            {"name": "hybrid, 16 workers", "images_per_second": 1600.0, "gpu_share": 0.4},
        ],
        "nvjpeg": {"images_per_second": 900.0},
        "hybrid_over_cpu": 1.6,
        "pixels": {"mean_abs_difference": 0.5},
    }
    train = {
        "device": "NVIDIA H200",
        "settings": {"batch_size": 256, "steps": 50},
        "synthetic_images_per_second": 3000.0,
        "results": [
            {"name": "shardfmt cpu workers", "images_per_second": 2900.0, "gpu_wait_fraction": 0.01},
            {"name": "shardfmt hybrid", "images_per_second": 2950.0, "gpu_wait_fraction": 0.005},
            {"name": "PIL DataLoader", "images_per_second": 1500.0, "gpu_wait_fraction": 0.5},
        ],
        "overlap": {"side_stream": {"step_ms": 85.0}, "training_stream": {"step_ms": 86.5}, "step_ms_saved": 1.5},
    }
    scaling = {
        "decode_limit_one_core": {"one_core_exact_images_per_second": 500.0},
        "scaling": [
            {"workers": w, "images_per_second": 480.0 * w, "decode_limit_images_per_second": 500.0 * w, "ratio_to_limit": 0.96}
            for w in (1, 2)
        ],
    }
    for name, document in (("loader", loader), ("train", train), ("scaling", scaling)):
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    (tmp_path / "commands.txt").write_text("one\ntwo\n")
    done = run_tool(
        "gpu_record.py", "--scaling", str(tmp_path / "scaling.json"), "--loader", str(tmp_path / "loader.json"),
        "--train", str(tmp_path / "train.json"),
        "--commands", str(tmp_path / "commands.txt"), "--json", str(tmp_path / "record.json"), "--chart", str(tmp_path / "record.png"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["device"] == "NVIDIA H200" and record["cpu_workers"] == 16
    assert (record["cpu_loader_images_per_s"], record["gpu_decode_images_per_s"], record["hybrid_images_per_s"]) == (1000.0, 800.0, 1600.0)
    assert (record["train_images_per_s_shardfmt"], record["train_images_per_s_dataloader_pil"]) == (2900.0, 1500.0)
    assert (record["gpu_wait_fraction_shardfmt"], record["gpu_wait_fraction_dataloader_pil"]) == (0.01, 0.5)
    assert record["side_stream"]["step_ms_saved"] == 1.5
    assert [row["workers"] for row in record["scaling"]] == [1, 2]
    assert record["commands"] == ["one", "two"] and record["date"].endswith("Z")
    assert (tmp_path / "record.png").stat().st_size > 1000
