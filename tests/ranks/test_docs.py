"""The documentation: the site builds strictly (a broken link or a missing docstring reference
fails), and every Python block of the README and the docs runs as written, as a script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield pytest.param(match.group(1), id=f"{page.relative_to(ROOT)}:{line}")


def test_every_page_has_been_read():
    """The collector sees the pages it should: an empty reading would pass every block test."""
    found = [p.id for p in _blocks()]
    assert any(i.startswith("README.md") for i in found)
    assert any(i.startswith("docs/getting-started.md") for i in found)
    assert len(found) >= 8


@pytest.mark.parametrize("code", list(_blocks()))
def test_python_block_runs(code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH="")  # the installed package, as a reader has it
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_site_builds_strictly(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")  # installed by make setup (the docs extra)
    done = subprocess.run([str(mkdocs), "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for page in ("index.html", "concepts/index.html", "api/index.html", "ko/concepts/index.html"):
        assert (tmp_path / "site" / page).exists(), page
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "all_to_all" in api and "split_dim" in api  # the reference came from the docstrings
