"""MkDocs hook: the format specification in spec/ becomes the site's format/ section, and
CHANGELOG.md its changelog page.

spec/ stays where implementers of other readers look for it, with its golden vectors beside it;
the site serves the same files (Markdown rendered, everything else copied) under format/, so the
spec's relative links to its vectors and schema work on the site as they do in the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"


def on_files(files: Files, config: Any) -> Files:
    """Add spec/ under format/ and CHANGELOG.md as changelog.md."""
    for path in sorted(SPEC.rglob("*")):
        if path.is_file():
            files.append(File.generated(config, "format/" + path.relative_to(SPEC).as_posix(), abs_src_path=str(path)))
    files.append(File.generated(config, "changelog.md", abs_src_path=str(ROOT / "CHANGELOG.md")))
    return files
