"""Run the test suite in two tiers: the fast tests first, then the tests marked ``slow``.

A failure in the fast tier stops the run before the slow tier starts, so a broken change is
reported in minutes. A tier with no tests (pytest's exit status 5, say after a ``-k`` that
selects none of them) is not a failure. Arguments go to both pytest runs.

Usage (what the README's test command and .ci/run call):
    python tools/run_tests.py
    python tools/run_tests.py tests/loader -x      # both tiers of one folder
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

TIERS = (("fast", "not slow"), ("slow", "slow"))
"""Each tier's name and its pytest mark expression, in the order they run."""
NO_TESTS_COLLECTED = 5
"""pytest's exit status when a run selects no test."""


def main(argv: Sequence[str]) -> int:
    for name, marks in TIERS:
        started = time.monotonic()
        code = subprocess.call([sys.executable, "-m", "pytest", "-m", marks, *argv])
        print(f"{name} tier: exit status {code} after {time.monotonic() - started:.0f} s", flush=True)
        if code == NO_TESTS_COLLECTED:
            continue
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
