"""The block picture of a matrix layout: an N x N grid of blocks A00..., and which ranks hold
each block. The one rule every drawing (terminal, PNG, HTML) uses."""

from __future__ import annotations

from typing import Any

from ..planning.layout import Placement, Shard, shard_sizes


def block_name(i: int, j: int, n: int) -> str:
    return f"A{i}{j}" if n <= 10 else f"A[{i},{j}]"


def holders(placement: Placement, i: int, j: int, n: int) -> list[int]:
    """Ranks holding block (i, j) of the N x N block grid of a matrix under ``placement``."""
    if isinstance(placement, Shard):
        return [i if placement.dim % 2 == 0 else j]
    return list(range(n))  # Replicate, Partial: every rank holds (a share of) every block


def blocks(shape: tuple[int, int], n: int) -> list[tuple[int, int]]:
    rows, cols = shard_sizes(shape[0], n), shard_sizes(shape[1], n)
    return [(i, j) for i in range(n) for j in range(n) if rows[i] and cols[j]]


def moves(shape: tuple[int, int], n: int, src: Placement, dst: Placement) -> list[dict[str, Any]]:
    """One entry per block copy in the final layout: where it starts and where it ends."""
    out = []
    for i, j in blocks(shape, n):
        before = holders(src, i, j, n)
        for d in holders(dst, i, j, n):
            s = d if d in before else before[0]
            out.append({"i": i, "j": j, "name": block_name(i, j, n), "src": s, "dst": d})
    return out


def blocks_held(shape: tuple[int, int], placement: Placement, rank: int, n: int) -> list[str]:
    """The block names (row block i, column block j of the N x N grid) that ``rank`` holds."""
    return [block_name(i, j, n) for i, j in blocks(shape, n) if rank in holders(placement, i, j, n)]


