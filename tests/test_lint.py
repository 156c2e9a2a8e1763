"""Types and lint are kept: mypy (strict, configured in pyproject.toml) finds nothing in the
package, and ruff (pyflakes, import order, bugbear, complexity, line length) nothing in the
repository. Both run as the test suite runs, so CI keeps them at zero.

The code stays in pieces a reader can hold: no function or method of the package above
`MAX_FUNCTION_LINES` (from its ``def`` to its last line, decorators aside), no module of
shardfmt/_loader/ above `MAX_MODULE_LINES` lines, and no complexity check silenced with a noqa
in the package or its tools."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardfmt"
LOADER = PACKAGE / "_loader"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, cwd=ROOT)


def test_ruff_finds_nothing() -> None:
    result = run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_mypy_strict_finds_nothing() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def oversized(folder: Path, *, max_module_lines: int | None = MAX_MODULE_LINES) -> list[str]:
    """Every module of `folder` (at any depth) longer than `max_module_lines` (None: no bound)
    and every function longer than `MAX_FUNCTION_LINES`, as "path: lines" and
    "path:line Class.function: lines"."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        name = path.relative_to(folder).as_posix()
        text = path.read_text(encoding="utf-8")
        if max_module_lines is not None and len(text.splitlines()) > max_module_lines:
            found.append(f"{name}: {len(text.splitlines())} lines (at most {max_module_lines})")
        stack: list[tuple[str, ast.AST]] = [("", ast.parse(text, str(path)))]
        while stack:
            prefix, node = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    qualified = prefix + child.name
                    if not isinstance(child, ast.ClassDef) and child.end_lineno is not None:
                        length = child.end_lineno - child.lineno + 1
                        if length > MAX_FUNCTION_LINES:
                            found.append(f"{name}:{child.lineno} {qualified}: {length} lines (at most {MAX_FUNCTION_LINES})")
                    stack.append((qualified + ".", child))
                else:
                    stack.append((prefix, child))
    return sorted(found)


def test_the_loaders_modules_and_functions_stay_under_the_size_bound() -> None:
    assert oversized(LOADER) == []


def test_no_function_of_the_package_is_above_the_bound() -> None:
    assert oversized(PACKAGE, max_module_lines=None) == []


def test_the_size_bound_names_each_long_module_and_function(tmp_path: Path) -> None:
    statements = [f"x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1)]
    (tmp_path / "fits.py").write_text("def short():\n" + "".join(f"    {s}\n" for s in statements))  # exactly at the bound
    (tmp_path / "long.py").write_text("class Big:\n    def method(self):\n" + "".join(f"        {s}\n" for s in [*statements, "y = 0"]))
    (tmp_path / "many.py").write_text("x = 0\n" * (MAX_MODULE_LINES + 1))
    assert oversized(tmp_path) == [
        f"long.py:2 Big.method: {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})",
        f"many.py: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})",
    ]


def test_no_complexity_check_is_silenced() -> None:
    silenced = [
        f"{path.relative_to(ROOT).as_posix()}:{number}"
        for folder in (PACKAGE, ROOT / "tools")
        for path in sorted(folder.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "noqa: C901" in line
    ]
    assert silenced == []
