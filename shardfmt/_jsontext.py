"""Strict JSON text: the one parser for every JSON value the format stores.

Schemas, manifests and ``json`` fields are JSON (RFC 8259), read with the rules of spec/format.md
section 7 ("JSON text") so that every conforming reader finds the same value or refuses the same
text: UTF-8 without a byte-order mark; no ``NaN``, ``Infinity`` or ``-Infinity``; no object with a
name twice; no ``\\u`` escape of a lone surrogate; an integer (a number without fraction or
exponent) from -2^63 to 2^64 - 1; a number with a fraction or exponent finite as a binary64.
Python's `json` module accepts all of these, so they are refused here with the hooks it offers.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["JsonTextError", "parse_json"]

_BOM: Final = b"\xef\xbb\xbf"
_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 64) - 1
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A ``\\u`` escape of a surrogate (or text that looks like one after an escaped backslash)."""


class JsonTextError(ValueError):
    """The bytes are not JSON text under the format's rules; the message says which rule."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise JsonTextError(f"an object has the name {_show(name)} twice")
            seen.add(name)
    return value


def _constant(name: str) -> Any:
    raise JsonTextError(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JsonTextError(f"the number {_show(text)} is beyond the range of a binary64 float")
    return value


def _int(text: str) -> int:
    if len(text) > 21:  # more digits than any 64-bit integer has; int() of huge text is slow
        raise JsonTextError(f"the integer {_show(text)} is outside [-2^63, 2^64 - 1]")
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        raise JsonTextError(f"the integer {text} is outside [-2^63, 2^64 - 1]")
    return value


def _show(text: str, limit: int = 40) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[: limit - 5]}...{shown[-2:]}"


def _check_strings(value: Any) -> None:
    """Refuse a string (or object name) that holds a lone surrogate, without recursion."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                raise JsonTextError(f"a string holds the lone surrogate U+{ord(item[err.start]):04X}") from err
        elif isinstance(item, dict):
            todo.extend(item)
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)


def parse_json(data: bytes | bytearray | memoryview) -> Any:
    """Return the value of JSON text `data`, read strictly (see the module docstring).

    Raises:
        JsonTextError: the bytes are not UTF-8, start with a byte-order mark, are not JSON, or
            break one of the rules above; the message says which.
    """
    raw = bytes(data)
    if raw.startswith(_BOM):
        raise JsonTextError("the text starts with a byte-order mark (EF BB BF)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise JsonTextError(f"not UTF-8: byte {err.start} (0x{raw[err.start]:02x}) starts no valid sequence") from err
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except JsonTextError:
        raise
    except RecursionError as err:
        raise JsonTextError("nested too deeply for this reader") from err
    except ValueError as err:
        raise JsonTextError(f"not JSON: {err}") from err
    if _SURROGATE_ESCAPE.search(text):
        _check_strings(value)
    return value
