"""Converting, reading and verifying work without torch; `Loader`, `Dataset` and `shardfmt.ops`
name the ``shardfmt[torch]`` extra that installs it.

Torch is blocked in a child interpreter by a ``torch`` package, first on ``PYTHONPATH``, whose
import raises `ModuleNotFoundError` as a missing torch does: the conversion's worker processes
inherit the block, which ``sys.modules["torch"] = None`` would not give a spawned child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = 'raise ModuleNotFoundError("No module named \'torch\' (blocked by the test)", name="torch")\n'

SCRIPT = r"""
import io, json, sys
from pathlib import Path

import numpy as np
from PIL import Image

import shardfmt
from shardfmt._cli import main
from shardfmt._synthetic import make_imagefolder

work = Path(sys.argv[1])
src = make_imagefolder(work / "src", num_classes=2, per_class=3, size=(60, 90), seed=4)
Image.fromarray(np.full((50, 70, 3), 200, np.uint8)).save(src / sorted(p.name for p in src.iterdir())[0] / "z.png")
report = {}

def cli(*args):
    try:
        main(list(args), standalone_mode=False)
    except SystemExit as exit:
        return exit.code
    return 0

report["cli_convert"] = cli("convert", str(src), str(work / "cli"), "--max-side", "40", "--workers", "2", "--quiet")
report["cli_info"] = cli("info", str(work / "cli"), "--json")
report["cli_verify"] = cli("verify", str(work / "cli"))
summary = shardfmt.convert(src, work / "tars", shard_format="tar", workers=2)
report["tar_records"] = summary.records
report["cli_index"] = cli("index", str(work / "tars"), "--overwrite", "--quiet")
dataset = shardfmt.open_dataset(work / "cli")
report["records"] = len(dataset)
report["labels"] = [int(dataset[i]["label"]) for i in range(len(dataset))]
report["max_side"] = max(max(Image.open(io.BytesIO(bytes(dataset[i]["image"]))).size) for i in range(len(dataset)))
for name in ("Loader", "Dataset"):
    try:
        getattr(shardfmt, name)
    except ImportError as error:
        report[name] = [type(error).__name__, error.name, str(error)]
try:
    import shardfmt.ops
except ImportError as error:
    report["ops"] = [type(error).__name__, error.name, str(error)]
report["torch_loaded"] = sys.modules.get("torch") is not None
print(json.dumps(report))
"""


def test_convert_read_and_verify_without_torch(tmp_path: Path) -> None:
    (tmp_path / "blocked" / "torch").mkdir(parents=True)
    (tmp_path / "blocked" / "torch" / "__init__.py").write_text(BLOCKER, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "blocked"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=100)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    message = ("{} needs torch (No module named 'torch' (blocked by the test)): pip install 'shardfmt[torch]' installs it; "
               "converting, reading and verifying work without it")
    assert report == {
        "cli_convert": 0,
        "cli_info": 0,
        "cli_verify": 0,
        "tar_records": 7,
        "cli_index": 0,
        "records": 7,
        "labels": [0, 0, 0, 0, 1, 1, 1],
        "max_side": 40,
        "Loader": ["ModuleNotFoundError", "torch", message.format("shardfmt.Loader")],
        "Dataset": ["ModuleNotFoundError", "torch", message.format("shardfmt.Dataset")],
        "ops": ["ModuleNotFoundError", "torch", message.format("shardfmt.ops")],
        "torch_loaded": False,
    }
