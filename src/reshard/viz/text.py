"""Numbers as people read them."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``, ``1048576 -> '1 MiB'``, ``32 -> '32 B'`` (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
