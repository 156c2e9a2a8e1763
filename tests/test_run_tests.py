"""tools/run_tests.py: the fast tier, then the slow tier, as the README and CI run them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import run_tests

ROOT = Path(__file__).resolve().parents[1]


def calls_with(monkeypatch: pytest.MonkeyPatch, codes: list[int]) -> list[list[str]]:
    calls: list[list[str]] = []

    def call(command: list[str]) -> int:
        calls.append(command)
        return codes[len(calls) - 1]

    monkeypatch.setattr(run_tests.subprocess, "call", call)
    return calls


@pytest.mark.parametrize(
    ("codes", "status", "tiers_run"),
    [([0, 0], 0, 2), ([0, 5], 0, 2), ([5, 0], 0, 2), ([5, 5], 0, 2), ([1, 0], 1, 1), ([0, 1], 1, 2), ([2, 0], 2, 1)],
)
def test_the_fast_tier_runs_first_and_no_tests_collected_is_no_failure(
    monkeypatch: pytest.MonkeyPatch, codes: list[int], status: int, tiers_run: int
) -> None:
    calls = calls_with(monkeypatch, codes)
    assert run_tests.main(["tests/loader", "-x"]) == status
    expected = [[sys.executable, "-m", "pytest", "-m", marks, "tests/loader", "-x"] for marks in ("not slow", "slow")]
    assert calls == expected[:tiers_run]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    command = r"^python3 -m venv .*'\.\[torch,test\]'.*$"
    readme = re.findall(command, (ROOT / "README.md").read_text(), re.MULTILINE)
    ci = re.findall(r"^python3 -m venv .*$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    getting_started = re.findall(command, (ROOT / "docs" / "getting-started.md").read_text(), re.MULTILINE)
    assert readme == ci == getting_started
    assert readme[0].endswith(".venv/bin/python tools/run_tests.py")
