"""``reshard demo``: the card's exchange, run for real on local ranks, drawn and checked."""

from __future__ import annotations

from typing import Any

from .layout import Partial, Placement, Replicate, Shard, local_region, shard_sizes
from .messages import placement_words, say
from .plan import describe_region, make_plan
from .viz import block_name, blocks, holders

RANK_STYLES = ["bold red", "bold green", "bold blue", "bold magenta", "bold cyan", "bold yellow", "bold white", "red", "green", "blue"]


def global_matrix(shape: tuple[int, int], dtype: str) -> Any:
    """A[i, j] = i * cols + j: every value names its own position."""
    import torch

    rows, cols = shape
    return torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols).to(getattr(torch, dtype))


def demo_rank(comm: Any, shape: tuple[int, int], src: Placement, dst: Placement, dtype: str) -> tuple:
    """One rank: take my part of A under ``src``, redistribute to ``dst``, report what moved."""
    from . import ops
    from .layout import local_shard

    full = global_matrix(shape, dtype)
    mine = local_shard(full, src, comm.rank, comm.size).contiguous()
    out = ops.redistribute(mine, src, dst)
    stats = ops.last_exchange()
    return mine, out, (stats.bytes_sent, stats.bytes_received) if stats else (0, 0)


def blocks_held(shape: tuple[int, int], placement: Placement, rank: int, n: int) -> list[str]:
    """The card's block names (row block i, column block j of the N x N grid) that ``rank`` holds."""
    return [block_name(i, j, n) for i, j in blocks(shape, n) if rank in holders(placement, i, j, n)]


def _bits_equal(a: Any, b: Any) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))) if a.numel() else True


def verify(shape: tuple[int, int], dtype: str, dst: Placement, outs: list[Any]) -> dict[int, str]:
    """Rank -> what is wrong with its result; checked against the full matrix."""
    from .layout import local_shard

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


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render(console: Any, lang: str, shape: tuple[int, int], n: int, src: Placement, dst: Placement,
           dtype: str, engine: str, ins: list[Any], outs: list[Any], moved: list[tuple[int, int]]) -> None:
    from rich.table import Table
    from rich.text import Text

    plan = make_plan(shape, src, dst, n, dtype)
    collective = plan.collective if plan.collective not in ("none", "local") else "no communication"
    console.print(say("demo.title", lang, collective="AllToAll", rows=shape[0], cols=shape[1], dtype=dtype, ranks=n, engine=engine))
    console.print()

    def layout_table(title: str, placement: Placement, arrays: list[Any]) -> None:
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("rank")
        table.add_column(say("demo.holds", lang))
        table.add_column(say("demo.region", lang))
        table.add_column(say("demo.shape", lang))
        for r in range(n):
            region = local_region(shape, placement, r, n)
            blocks = blocks_held(shape, placement, r, n)
            held = " ".join(blocks) if blocks and all(b > a for a, b in region) else say("demo.nothing", lang)
            if isinstance(placement, Partial):
                held = say("demo.partial_sum", lang)
            dims = " x ".join(str(s) for s in arrays[r].shape)
            table.add_row(Text(f"rank {r}", style=RANK_STYLES[r % len(RANK_STYLES)]), held, describe_region(region), f"[{dims}]")
        console.print(table)
        console.print(grid(shape, placement, n))

    layout_table(say("demo.before", lang, placement=placement_words(src, lang)), src, ins)
    if plan.collective == "all_to_all":
        console.print(say("demo.cut_rule", lang))
        for t in plan.transfers:
            stays = " " + say("demo.stays", lang) if t.src == t.dst else ""
            line = Text(f"  rank {t.src}: ", style=RANK_STYLES[t.src % len(RANK_STYLES)])
            line.append(f"{describe_region(t.region)} -> ")
            line.append(f"rank {t.dst}", style=RANK_STYLES[t.dst % len(RANK_STYLES)])
            line.append(stays)
            console.print(line)
        console.print()
    layout_table(say("demo.after", lang, placement=placement_words(dst, lang), collective=collective), dst, outs)
    summed = any(step.sums_values for step in plan.steps)
    sent = max(m[0] for m in moved)
    received = max(m[1] for m in moved)
    console.print(say("demo.moved", lang, sent=_human_bytes(sent), received=_human_bytes(received),
                      summed=say("demo.summed" if summed else "demo.not_summed", lang)))


def grid(shape: tuple[int, int], placement: Placement, n: int) -> Any:
    """The N x N block grid coloured by the rank holding each block (as the card draws it)."""
    from rich.text import Text

    rows, cols = shard_sizes(shape[0], n), shard_sizes(shape[1], n)
    text = Text()
    for i in range(n):
        if rows[i] == 0:
            continue
        text.append("  ")
        for j in range(n):
            if cols[j] == 0:
                continue
            if isinstance(placement, Shard):
                holder = i if placement.dim == 0 else j
                text.append(f" {block_name(i, j, n)} ", style=f"reverse {RANK_STYLES[holder % len(RANK_STYLES)]}")
            else:
                mark = "*" if isinstance(placement, Replicate) else "+"
                text.append(f" {block_name(i, j, n)}{mark}", style="reverse bold white")
            text.append(" ")
        text.append("\n")
    return text


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
    render(console, lang, shape, ranks, src, dst, dtype, engine, ins, outs, [r[2] for r in results])
    problems = verify(shape, dtype, dst, outs)
    for rank, detail in sorted(problems.items()):
        console.print(say("demo.bad", lang, rank=rank, detail=detail), style="bold red")
    if problems:
        return 1
    console.print(say("demo.ok", lang, ranks=ranks, placement=repr(dst)), style="bold green")
    return 0
