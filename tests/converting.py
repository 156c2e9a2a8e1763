"""`convert`: `shardfmt.convert`'s full `ConvertResult` (inputs, shards kept on resume, the
manifest), for the tests that look at more than its summary; the same one entry underneath."""

from __future__ import annotations

from typing import Any

import shardfmt
from shardfmt._convert.loop import ConvertResult


def convert(src: Any, out: Any, **options: Any) -> ConvertResult:
    """``shardfmt.convert(src, out, **options).result``."""
    return shardfmt.convert(src, out, **options).result
