"""examples/train.py runs for a few steps on the demo data: in one process, under torchrun with two
processes (gloo on CPU), and resumed from a checkpoint taken mid-epoch, seeing exactly the batches
an uninterrupted run sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from shardfmt._demo import run_demo

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "train.py"
# 60 demo images, batches of 8: 7 steps an epoch in one process, 3 in each of two.
SHORT = ["--size", "32", "--batch-size", "8", "--workers", "1", "--val-batches", "1"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo data (`shardfmt demo`), 60 images in 10 classes."""
    directory = tmp_path_factory.mktemp("demo")
    run_demo(directory, images=60, workers=1, batch_size=8)
    return directory / "dataset"


def train(*args: str | Path, torchrun: int | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(SCRIPT)]
    if torchrun is not None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}", str(SCRIPT)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, *map(str, args)], capture_output=True, text=True, env=env, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def plain(demo: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    log = tmp_path_factory.mktemp("plain") / "steps.jsonl"
    done = train(demo, *SHORT, "--max-steps", "9", "--step-log", log)
    return done, read_log(log)


@pytest.mark.slow
def test_one_process_trains_across_an_epoch_with_a_progress_bar(
    plain: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]],
) -> None:
    done, log = plain
    assert done.stdout.startswith("9 steps, 72 images in ") and "images/s over 1 process); validation accuracy " in done.stdout
    assert "train: 100%" in done.stderr and "img/s" in done.stderr
    assert [line["step"] for line in log[:-1]] == list(range(1, 10))
    assert [line["epoch"] for line in log[:-1]] == [0] * 7 + [1] * 2
    assert [len(line["labels"]) for line in log[:-1]] == [8] * 9
    assert log[-1]["done"] == 9


@pytest.mark.slow
def test_a_run_resumed_mid_epoch_sees_the_same_batches_and_ends_with_the_same_weights(
    demo: Path, plain: tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]], tmp_path: Path
) -> None:
    checkpoint, log = tmp_path / "run.pt", tmp_path / "steps.jsonl"
    train(demo, *SHORT, "--max-steps", "9", "--checkpoint", checkpoint, "--save-every", "2", "--stop-at", "4", "--step-log", log)
    saved = torch.load(checkpoint, weights_only=False)
    assert (saved["step"], saved["loaders"][0]["epoch"], saved["loaders"][0]["position"]) == (4, 0, 4)  # mid-epoch
    done = train(demo, *SHORT, "--max-steps", "9", "--checkpoint", checkpoint, "--resume", "--step-log", log)
    assert done.stdout.startswith("9 steps, 40 images in ")
    resumed = read_log(log)
    assert [line.get("step", line.get("done")) for line in resumed] == [1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 9]
    steps = [line for line in resumed if "step" in line]
    expected = [line for line in plain[1] if "step" in line]
    assert [(s["labels"], s["pixels"], s["epoch"]) for s in steps] == [(s["labels"], s["pixels"], s["epoch"]) for s in expected]
    assert [s["loss"] for s in steps] == [s["loss"] for s in expected]
    assert resumed[-1]["weights"] == plain[1][-1]["weights"]


@pytest.mark.slow
def test_torchrun_trains_two_processes_with_gloo(demo: Path, tmp_path: Path) -> None:
    log, checkpoint = tmp_path / "steps.jsonl", tmp_path / "run.pt"
    done = train(demo, *SHORT, "--max-steps", "4", "--step-log", log, "--checkpoint", checkpoint, torchrun=2)
    assert "4 steps, 64 images in " in done.stdout and "images/s over 2 processes" in done.stdout
    ranks = [read_log(tmp_path / f"steps-rank{rank}.jsonl") for rank in (0, 1)]
    for lines in ranks:
        assert [line.get("step", line.get("done")) for line in lines] == [1, 2, 3, 4, 4]
        assert [line["epoch"] for line in lines[:-1]] == [0, 0, 0, 1]
    assert ranks[0][-1]["weights"] == ranks[1][-1]["weights"]  # DistributedDataParallel kept them equal
    saved = torch.load(checkpoint, weights_only=False)
    assert [(s["settings"]["rank"], s["settings"]["world_size"], s["epoch"], s["position"]) for s in saved["loaders"]] == [
        (0, 2, 1, 1),
        (1, 2, 1, 1),
    ]


RECIPE = ["--auto-augment", "ta_wide", "--random-erase", "0.5", "--mixup-alpha", "0.2", "--cutmix-alpha", "1.0", "--ra-reps", "2",
          "--interpolation", "bicubic", "--val-resize-size", "40", "--val-crop-size", "32"]


@pytest.mark.slow
def test_the_reference_recipe_runs_and_resumes_mid_epoch_with_the_same_batches(demo: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    train(demo, *SHORT, *RECIPE, "--max-steps", "8", "--step-log", whole)
    straight = read_log(whole)
    steps = [line for line in straight if "step" in line]
    assert [line["epoch"] for line in steps] == [0] * 8  # 60 images, 2 copies each: 15 steps an epoch
    assert all(len(line["labels"]) == 8 and len(line["labels"][0]) == 10 for line in steps)  # soft labels of 10 classes
    assert any(0 < value < 1 for line in steps for row in line["labels"] for value in row)  # MixUp or CutMix mixed them
    checkpoint, log = tmp_path / "run.pt", tmp_path / "resumed.jsonl"
    train(demo, *SHORT, *RECIPE, "--max-steps", "8", "--checkpoint", checkpoint, "--save-every", "3", "--stop-at", "3", "--step-log", log)
    assert torch.load(checkpoint, weights_only=False)["loaders"][0]["position"] == 3  # mid-epoch
    train(demo, *SHORT, *RECIPE, "--max-steps", "8", "--checkpoint", checkpoint, "--resume", "--step-log", log)
    resumed = [line for line in read_log(log) if "step" in line]
    assert [line["step"] for line in resumed] == list(range(1, 9))
    assert [(s["labels"], s["pixels"], s["loss"]) for s in resumed] == [(s["labels"], s["pixels"], s["loss"]) for s in steps]
    assert read_log(log)[-1]["weights"] == straight[-1]["weights"]
