"""tools/bench_scale.py runs end to end on tiny sizes and prints its table and ratios.

Timings are not asserted: only that every size was written, measured and reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "bench_scale.py"


@pytest.mark.slow
def test_bench_scale_prints_every_size(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, str(SCRIPT), "--sizes", "512", "1024", "--shard-records", "256", "--keep", str(tmp_path / "data")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith(("| 512 |", "| 1,024 |"))]
    assert len(rows) == 2 and all("(sorted-key)" in row for row in rows), done.stdout  # below 65,536 records "auto" is sorted-key
    assert "1,024 (2x records): Loader()" in done.stdout
    assert sorted(p.name for p in (tmp_path / "data" / "records-1024").iterdir()) == [
        "manifest.json", "shard-00000.shard", "shard-00001.shard", "shard-00002.shard", "shard-00003.shard",
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)  # ten fresh processes that import torch: minutes on a loaded 2-core machine
def test_bench_scale_first_batch_prints_both_trees_warm_and_cold(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [
        sys.executable, str(SCRIPT), "--first-batch", "--sizes", "512", "--shard-records", "256", "--rounds", "1",
        "--project", "5120", "--compare", str(ROOT), "--keep", str(tmp_path / "data"),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ")[2:4] for line in done.stdout.splitlines() if line.startswith("| 512 | 2 |")]
    assert sorted(rows) == [[str(ROOT), "cold"], [str(ROOT), "warm"], ["this tree", "cold"], ["this tree", "warm"]], done.stdout
