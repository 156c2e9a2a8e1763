"""Types and lint are kept: mypy (strict, configured in pyproject.toml) finds nothing in the
package, and ruff (pyflakes, import order, bugbear, complexity, line length) nothing in the
repository. Both run as the test suite runs, so CI keeps them at zero."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, cwd=ROOT)


def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_mypy_strict_finds_nothing() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
