"""Starting ranks on this machine: ``rs.spawn`` (torch ranks forked from a preloaded server,
MPI ranks through the installed launcher) and the process settings both share."""

from __future__ import annotations

from .local import spawn

__all__ = ["spawn"]
