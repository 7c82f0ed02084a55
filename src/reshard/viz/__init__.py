"""Every drawing of a layout or an exchange: terminal tables and grids, PNG and HTML pictures.

``blocks`` holds the one rule for which rank holds a block; ``text`` the one byte formatter.
"""

from __future__ import annotations

from .blocks import block_name, blocks, blocks_held, holders, moves
from .text import human_bytes

__all__ = ["block_name", "blocks", "blocks_held", "holders", "moves", "human_bytes"]
