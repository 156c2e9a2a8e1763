"""The public API: `shardfmt.__all__` is sorted and lists every public top-level name."""

from __future__ import annotations
import __future__

import importlib.metadata
import types

import shardfmt


def isort_key(name: str) -> tuple[int, str]:
    """Constants (SCREAMING_SNAKE_CASE) first, then classes (CamelCase), then everything else."""
    if name.isupper():
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name


def test_all_is_sorted() -> None:
    assert shardfmt.__all__ == sorted(shardfmt.__all__, key=isort_key)
    assert len(set(shardfmt.__all__)) == len(shardfmt.__all__)


def test_all_lists_every_public_name() -> None:
    public = {
        name
        for name, value in vars(shardfmt).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)  # submodules appear as they are imported
        and not isinstance(value, __future__._Feature)  # `from __future__ import annotations`
    }
    assert public | set(shardfmt._LAZY) == set(shardfmt.__all__) - {"__version__"}


def test_lazy_names_keep_torch_out_of_the_reader() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, shardfmt; shardfmt.open_dataset; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert result.stdout.strip() == "False"


def test_every_listed_name_exists() -> None:
    for name in shardfmt.__all__:
        assert hasattr(shardfmt, name), name
    assert shardfmt.__version__ == importlib.metadata.version("shardfmt")
