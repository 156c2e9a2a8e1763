"""The documentation: the MkDocs site builds with --strict (a broken link, a missing page or an
API reference to a missing object fails), and the README's and changelog's links lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shardfmt

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
               "--site-dir", str(tmp_path / "site")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "format" / "format" / "index.html").is_file()  # spec/ served under format/
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert 'id="shardfmt.Loader"' in api and 'id="shardfmt.open_dataset"' in api
    # The public names, not the internal modules they live in: shardfmt.convert, each error of __all__.
    assert not re.findall(r'id="shardfmt\._[^"]*"', api)
    assert 'id="shardfmt.convert"' in api
    assert all(f'id="shardfmt.{name}"' in api for name in shardfmt.__all__ if name.endswith("Error"))
    # Grouped docstring entries ("store, scale, patch: ...") get their defaults, not "required".
    section = api[api.index('id="shardfmt.convert"'):]
    parameters = re.sub(r"<[^>]+>", " ", section[:section.index("Returns:")]).split("Parameters:")[1]
    after_out = parameters[re.search(r"\bstore\b", parameters).start():]
    assert "required" not in after_out and re.search(r"\bbreak_lock\b\s+bool\s.*?\bFalse\b", after_out, flags=re.DOTALL)


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_relative_links_lead_to_files(name: str) -> None:
    text = (ROOT / name).read_text()
    targets = [target for target in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in target]
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert not missing, f"{name} links to missing files: {missing}"


def test_the_readme_stays_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; reference material belongs in docs/"
