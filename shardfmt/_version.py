"""The package's version, read once from the installed distribution's metadata."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("shardfmt")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
