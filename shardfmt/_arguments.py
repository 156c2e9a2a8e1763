"""Checks of a public argument's type and range, with the one message shape every constructor uses:
``NAME must be an int in [LOW, HIGH], got VALUE`` (TypeError) or ``NAME must be in [LOW, HIGH],
got VALUE`` (ValueError). Each step, option and mixture checks its own arguments with these when
it is made; the limits themselves live beside the objects they bound."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

__all__ = ["MAX_NAME_LENGTH", "MAX_PATH_LENGTH", "check_int", "check_number", "check_pair", "check_path"]

MAX_PATH_LENGTH = 4096
"""Bytes of a path or URL a loader takes: Linux's PATH_MAX; no longer local path can be opened."""
MAX_NAME_LENGTH = 255
"""Bytes of one component of a local path: NAME_MAX of Linux's file systems."""


def check_int(name: str, value: Any, low: int, high: int, *, note: str = "") -> int:
    """Return `value` as an int. Raises TypeError unless it is an int (not a bool), ValueError
    unless it lies in [low, high]; `note` follows the range in the message."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [{low}, {high}]{note}, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}]{note}, got {value}")
    return int(value)


def check_number(name: str, value: Any, low: float, high: float, *, low_open: bool = False, note: str = "") -> float:
    """Return `value` as a float. Raises TypeError unless it is a real number (not a bool),
    ValueError unless it lies in [low, high] (``(low, high]`` with `low_open`): NaN never does."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number in {interval}{note}, got {value!r}")
    number = float(value)
    if math.isnan(number) or not (low < number if low_open else low <= number) or not number <= high:
        raise ValueError(f"{name} must be in {interval}{note}, got {value!r}")
    return number


def check_pair(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> tuple[float, float]:
    """Return `value`, a (low, high) range, as two floats. Raises TypeError unless it is a list or
    tuple of two real numbers, ValueError unless each lies in [low, high] (``(low, high]`` with
    `low_open`) and the first is at most the second."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise TypeError(f"{name} must be (low, high), each in {interval}, got {value!r}")
    first, second = (check_number(name, v, low, high, low_open=low_open, note=" (each of (low, high))") for v in value)
    if first > second:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {value!r}")
    return first, second


def check_path(name: str, path: str | os.PathLike[str]) -> None:
    """Raise ValueError if `path` (a path or URL) is longer than `MAX_PATH_LENGTH` bytes, or a
    component of it longer than `MAX_NAME_LENGTH`: no such file can exist, and opening it fails
    with an OSError that does not say which argument is at fault."""
    encoded = os.fsencode(path)
    if len(encoded) > MAX_PATH_LENGTH:
        raise ValueError(f"{name} must be at most {MAX_PATH_LENGTH} bytes long (PATH_MAX), got {len(encoded)} bytes: {encoded[:60]!r}...")
    if b"://" in encoded or encoded.startswith(b"pipe:"):
        return  # a URL's key or a command: its parts are the store's business
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > MAX_NAME_LENGTH:
        raise ValueError(
            f"each part of {name} must be at most {MAX_NAME_LENGTH} bytes long (NAME_MAX), got one of {len(longest)} bytes: "
            f"{longest[:60]!r}..."
        )
