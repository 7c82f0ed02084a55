"""``reshard demo``: the row -> column example, run for real on local ranks, drawn and checked."""

from __future__ import annotations

from typing import Any

from .layout import Partial, Placement, local_shard
from .messages import say
from .viz.terminal import render_demo


def global_matrix(shape: tuple[int, int], dtype: str) -> Any:
    """A[i, j] = i * cols + j: every value names its own position."""
    import torch

    rows, cols = shape
    return torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols).to(getattr(torch, dtype))


def demo_rank(comm: Any, shape: tuple[int, int], src: Placement, dst: Placement, dtype: str) -> tuple:
    """One rank: take my part of A under ``src``, redistribute to ``dst``, report what moved."""
    from . import ops

    full = global_matrix(shape, dtype)
    mine = local_shard(full, src, comm.rank, comm.size).contiguous()
    out = ops.redistribute(mine, src, dst)
    stats = ops.last_exchange()
    return mine, out, (stats.bytes_sent, stats.bytes_received) if stats else (0, 0)


def _bits_equal(a: Any, b: Any) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))) if a.numel() else True


def verify(shape: tuple[int, int], dtype: str, dst: Placement, outs: list[Any]) -> dict[int, str]:
    """Rank -> what is wrong with its result; checked against the full matrix."""

    full = global_matrix(shape, dtype)
    n = len(outs)
    if isinstance(dst, Partial):
        total = outs[0].clone()
        for o in outs[1:]:
            total += o
        return {} if _bits_equal(total, full) else {0: "the partial results do not sum to A"}
    problems = {}
    for r, out in enumerate(outs):
        want = local_shard(full, dst, r, n)
        if not _bits_equal(out, want.contiguous()):
            problems[r] = f"got shape {list(out.shape)}, want {list(want.shape)}" if out.shape != want.shape else "values differ"
    return problems


def run_demo(ranks: int, shape: tuple[int, int], src: Placement, dst: Placement, dtype: str,
             engine: str, lang: str, console: Any, timeout: float = 60.0) -> int:
    """Run, draw and check the exchange; the exit status (0 when every rank is right)."""
    from .errors import ReshardError
    from .launch import spawn

    try:
        results = spawn(demo_rank, ranks, engine=engine, args=(shape, src, dst, dtype), timeout=timeout)
    except ReshardError as exc:
        console.print(say("demo.failed", lang, error=exc))
        return 1
    ins = [r[0] for r in results]
    outs = [r[1] for r in results]
    render_demo(console, lang, shape, ranks, src, dst, dtype, engine, ins, outs, [r[2] for r in results])
    problems = verify(shape, dtype, dst, outs)
    for rank, detail in sorted(problems.items()):
        console.print(say("demo.bad", lang, rank=rank, detail=detail), style="bold red")
    if problems:
        return 1
    console.print(say("demo.ok", lang, ranks=ranks, placement=repr(dst)), style="bold green")
    return 0
