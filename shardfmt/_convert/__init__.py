"""Conversion: image folders, listings or WebDataset tars become a dataset, in parallel and
resumably (see `run` for the rules)."""

from __future__ import annotations

from .fields import convert_fields, needs_fields
from .run import ConvertResult, convert

__all__ = ["ConvertResult", "convert", "convert_fields", "needs_fields"]
