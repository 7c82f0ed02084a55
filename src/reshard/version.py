"""The package's version: set here and nowhere else (pyproject.toml reads it from this file),
so ``import reshard`` never reads package metadata."""

from __future__ import annotations

VERSION = "0.2.0"
