"""`convert(engine="ray")` on a local Ray instance writes exactly the bytes of a local run, for
binary and tar shards and for records of several fields."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import tree_bytes
from converting import convert
from PIL import Image

ray = pytest.importorskip("ray", reason="the Ray engine needs the 'ray' extra")

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_ray_engine_writes_the_bytes_of_a_local_run(awkward_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # Ray's workers import shardfmt from this checkout
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    pairs = tmp_path / "pairs"
    rng = np.random.default_rng(3)
    for name in ("a", "b"):
        (pairs / name).mkdir(parents=True)
    for i in range(8):
        image = rng.integers(0, 255, (12 + 4 * (i % 3), 16, 3), dtype=np.uint8)
        Image.fromarray(image).save(pairs / "a" / f"{i}.png")
        Image.fromarray(image[:, ::-1]).save(pairs / "b" / f"{i}.png")
    fields = dict(store="raw", shard_size=1500)
    try:
        result = convert(awkward_tree, tmp_path / "ray", shard_size=8000, engine="ray")
        tars = convert(awkward_tree, tmp_path / "ray-tar", shard_size=8000, shard_format="tar", engine="ray")
        several = convert([pairs / "a", pairs / "b"], tmp_path / "ray-fields", engine="ray", **fields)
    finally:
        ray.shutdown()
    convert(awkward_tree, tmp_path / "local", shard_size=8000, workers=1)
    convert(awkward_tree, tmp_path / "local-tar", shard_size=8000, shard_format="tar", workers=1)
    convert([pairs / "a", pairs / "b"], tmp_path / "local-fields", workers=1, **fields)
    assert (len(result.manifest.shards), result.num_rejects) == (6, 8)  # as a local run of the same tree
    assert tree_bytes(tmp_path / "ray") == tree_bytes(tmp_path / "local")
    assert tars.manifest.shard_format == "tar" and tree_bytes(tmp_path / "ray-tar") == tree_bytes(tmp_path / "local-tar")
    assert len(several.manifest.shards) >= 2 and tree_bytes(tmp_path / "ray-fields") == tree_bytes(tmp_path / "local-fields")


def test_an_unknown_engine_is_refused(imagefolder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="engine"):
        convert(imagefolder, tmp_path / "out", engine="spark")
    with pytest.raises(ValueError, match="engine"):
        convert([imagefolder], tmp_path / "out", store="raw", engine="spark")
