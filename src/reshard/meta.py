"""The installed package's version, from its metadata (pyproject.toml is the one place it is set)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("reshard")
except PackageNotFoundError:  # a source tree that was never installed
    VERSION = "0+unknown"
