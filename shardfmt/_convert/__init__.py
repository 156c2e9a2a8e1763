"""Conversion: every source (image folders, listings, WebDataset tars, Parquet and Arrow tables,
records in memory) becomes a dataset of typed records, in parallel and resumably, through one
entry (`api.convert` checks the keywords, `run.convert` does the work; see `run` for the rules)."""

from __future__ import annotations

from .api import ConvertSummary, convert
from .loop import ConvertResult
from .options import ConvertOptions, RecordRequest

__all__ = ["ConvertOptions", "ConvertResult", "ConvertSummary", "RecordRequest", "convert"]
