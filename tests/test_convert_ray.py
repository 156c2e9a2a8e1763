"""`convert(engine="ray")` on a local Ray instance writes exactly the bytes of a local run."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import tree_bytes
from shardfmt.convert import convert

ray = pytest.importorskip("ray", reason="the Ray engine needs the 'ray' extra")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ray_engine_writes_the_bytes_of_a_local_run(awkward_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # Ray's workers import shardfmt from this checkout
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        result = convert(awkward_tree, tmp_path / "ray", shard_size=8000, engine="ray")
    finally:
        ray.shutdown()
    convert(awkward_tree, tmp_path / "local", shard_size=8000, workers=1)
    assert len(result.manifest.shards) >= 3 and result.num_rejects > 0
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")


def test_an_unknown_engine_is_refused(imagefolder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="engine"):
        convert(imagefolder, tmp_path / "out", engine="spark")
