"""MkDocs hook: the format specification in spec/ becomes the site's format/ section, and
CHANGELOG.md its changelog page.

spec/ stays where implementers of other readers look for it, with its golden vectors beside it;
the site serves the same files (Markdown rendered, everything else copied) under format/, so the
spec's relative links to its vectors and schema work on the site as they do in the repository.
A page of docs/ that links into the repository's spec/ (``../spec/sampling.md``, as it reads on a
code host) is pointed at the site's copy.
"""

from __future__ import annotations

import re
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


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Point links from docs/ into ../spec/ at the site's format/ section."""
    depth = page.file.src_uri.count("/")
    if page.file.src_uri.startswith("format/"):
        return markdown
    spec = re.escape("../" * (depth + 1) + "spec/")
    return re.sub(rf"\]\({spec}", "](" + "../" * depth + "format/", markdown)
