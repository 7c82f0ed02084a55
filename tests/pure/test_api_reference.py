"""The API reference covers every function and class the docs' pages call through ``rs.``."""

from __future__ import annotations

import inspect
import pathlib
import re

import reshard as rs

DOCS = pathlib.Path(__file__).parents[2] / "docs"


def _called_in_docs() -> dict[str, str]:
    """{name as written after ``rs.``: the page} for every function or class a page names."""
    called = {}
    for page in DOCS.rglob("*.md"):
        for m in re.finditer(r"\brs\.((?:\w+\.)*\w+)", page.read_text(encoding="utf-8")):
            obj = rs
            try:
                for part in m.group(1).split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                called.setdefault(m.group(1), page.name)
    return called


def test_every_function_the_pages_call_is_in_the_api_reference():
    reference = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = {line.rsplit(".", 1)[-1].strip() for line in reference.splitlines() if line.startswith(":::")}
    called = _called_in_docs()
    assert "layout.mesh_region" in called  # the FFT page's check uses it
    missing = {name: page for name, page in called.items() if name.rsplit(".", 1)[-1] not in documented}
    assert not missing, missing
