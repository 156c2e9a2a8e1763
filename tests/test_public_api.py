"""The public API has visible edges: the top level holds what users call, `shardfmt.ops` the
pipelines and steps, `shardfmt.format` and `shardfmt.tar` what format implementers use, and every
other module is private by name. The lists are pinned here, so a change to them is deliberate."""

from __future__ import annotations
import __future__

import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path

import shardfmt
import shardfmt.format
import shardfmt.ops
import shardfmt.tar

ROOT = Path(__file__).resolve().parents[1]

TOP = [
    "ChecksumError",
    "ConvertError",
    "ConvertSummary",
    "Dataset",
    "DatasetNotFoundError",
    "DatasetReader",
    "DatasetWriter",
    "DecodeError",
    "FormatError",
    "ImageTransform",
    "LimitError",
    "Loader",
    "LockedError",
    "ManifestError",
    "Mixture",
    "Output",
    "RejectError",
    "RemoteError",
    "RemoteOptions",
    "RetryPolicy",
    "Sampling",
    "SchemaError",
    "ShardNotFoundError",
    "ShardfmtError",
    "UnsupportedVersionError",
    "WorkerError",
    "Workers",
    "__version__",
    "convert",
    "index_tars",
    "open_dataset",
]
OPS = [
    "AugMix",
    "AugmentStep",
    "AutoAugment",
    "BatchStep",
    "CenterCrop",
    "ColorJitter",
    "CropPlan",
    "CutMix",
    "ImageOutput",
    "MixUp",
    "Pipeline",
    "RandAugment",
    "RandomChoice",
    "RandomCrop",
    "RandomErasing",
    "RandomGrayscale",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomVerticalFlip",
    "Resize",
    "TrivialAugmentWide",
    "apply_batch_steps",
]
FORMAT = [
    "FORMAT_VERSION",
    "IMAGE_CLASSIFICATION",
    "Field",
    "ImageInfo",
    "IndexEntry",
    "Manifest",
    "Record",
    "Schema",
    "ShardEntry",
    "ShardInfo",
    "ShardReader",
    "ShardWriter",
]
TAR = ["TarShardReader", "TarShardWriter", "index_tar", "iter_tar_samples"]
PUBLIC_MODULES = {"shardfmt", "shardfmt.format", "shardfmt.ops", "shardfmt.tar"}


def isort_key(name: str) -> tuple[int, str]:
    """Constants (SCREAMING_SNAKE_CASE) first, then classes (CamelCase), then everything else."""
    if name.isupper():
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name


def test_the_lists_are_pinned() -> None:
    assert shardfmt.__all__ == TOP
    assert shardfmt.ops.__all__ == OPS
    assert shardfmt.format.__all__ == FORMAT
    assert shardfmt.tar.__all__ == TAR


def test_each_list_is_sorted_and_names_what_exists() -> None:
    for module in (shardfmt, shardfmt.ops, shardfmt.format, shardfmt.tar):
        names = module.__all__
        assert names == sorted(names, key=isort_key) and len(set(names)) == len(names), module.__name__
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name}"
    assert shardfmt.__version__ == importlib.metadata.version("shardfmt")


def test_the_top_level_lists_every_public_name() -> None:
    public = {
        name
        for name, value in vars(shardfmt).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)  # submodules appear as they are imported
        and not isinstance(value, __future__._Feature)  # `from __future__ import annotations`
    }
    assert public | set(shardfmt._LAZY) == set(shardfmt.__all__) - {"__version__"}


def test_every_other_module_is_private_by_name() -> None:
    """A module outside the public namespaces has a component that starts with an underscore."""
    exposed = []
    for path in sorted((ROOT / "shardfmt").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name not in PUBLIC_MODULES and not any(part.startswith("_") for part in parts):
            exposed.append(name)
    assert exposed == []


def test_lazy_names_keep_torch_out_of_the_reader() -> None:
    code = "import sys, shardfmt; shardfmt.open_dataset; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "False"
