"""Terminal drawings (rich): layout tables and block grids for ``demo``, the comparison table
of ``explain``, and the plan of ``plan``."""

from __future__ import annotations

from typing import Any

from ..messages import byte_span, over_words, placement_words, say
from ..planning.layout import Partial, Placement, Replicate, Shard, local_region, shard_sizes
from ..planning.plan import describe_region, estimate_seconds, make_plan, summarize_matrix
from .blocks import block_name, blocks_held, holders
from .text import human_bytes

RANK_STYLES = ["bold red", "bold green", "bold blue", "bold magenta", "bold cyan", "bold yellow", "bold white", "red", "green", "blue"]


def render_demo(console: Any, lang: str, shape: tuple[int, int], n: int, src: Placement, dst: Placement,
           dtype: str, engine: str, ins: list[Any], outs: list[Any], moved: list[tuple[int, int]]) -> None:
    from rich.table import Table
    from rich.text import Text

    plan = make_plan(shape, src, dst, n, dtype)
    collective = plan.collective if plan.collective not in ("none", "local") else "no communication"
    console.print(say("demo.title", lang, collective="AllToAll", rows=shape[0], cols=shape[1], dtype=dtype, ranks=n, engine=engine))
    console.print()

    def layout_table(title: str, placement: Placement, arrays: list[Any]) -> None:
        console.print(title)
        table = Table(show_edge=False, pad_edge=False)
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
            table.add_row(Text(f"rank {r}", style=RANK_STYLES[r % len(RANK_STYLES)]), held, describe_region(region, lang), f"[{dims}]")
        console.print(table)
        console.print(grid(shape, placement, n))

    layout_table(say("demo.before", lang, placement=placement_words(src, lang)), src, ins)
    if plan.collective == "all_to_all":
        console.print(say("demo.cut_rule", lang))
        for t in (t for t in plan.transfers if t.nbytes):  # a rank that holds nothing cuts nothing
            stays = " " + say("demo.stays", lang) if t.src == t.dst else ""
            line = Text(f"  rank {t.src}: ", style=RANK_STYLES[t.src % len(RANK_STYLES)])
            line.append(f"{describe_region(t.region, lang)} -> ")
            line.append(f"rank {t.dst}", style=RANK_STYLES[t.dst % len(RANK_STYLES)])
            line.append(stays)
            console.print(line)
        console.print()
    layout_table(say("demo.after", lang, placement=placement_words(dst, lang), collective=collective), dst, outs)
    console.print(grid_legend((src, dst), lang))
    summed = any(step.sums_values for step in plan.steps)
    sent, received = [m[0] for m in moved], [m[1] for m in moved]
    said = "demo.summed" if summed else "demo.not_summed"
    if len(set(sent)) == 1 and len(set(received)) == 1:  # every rank alike: one figure says it
        console.print(say("demo.moved", lang, sent=human_bytes(sent[0]), received=human_bytes(received[0]),
                          summed=say(said, lang)))
    else:  # uneven: each rank's own figures, a line each (a wrapped list splits "32 B / 20 B")
        console.print(say("demo.moved_each", lang, summed=say(said, lang)))
        for r, (s, v) in enumerate(moved):
            console.print(Text(f"  rank {r}: {human_bytes(s)} / {human_bytes(v)}"))


def grid(shape: tuple[int, int], placement: Placement, n: int) -> Any:
    """The N x N block grid, each block with the rank holding it (``A01:1``) and, in a terminal
    with colour, that rank's colour: the row -> column example's picture, readable without colour."""
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
                holder = holders(placement, i, j, n)[0]
                text.append(f" {block_name(i, j, n)}:{holder} ", style=f"reverse {RANK_STYLES[holder % len(RANK_STYLES)]}")
            else:
                mark = "*" if isinstance(placement, Replicate) else "+"  # every rank holds it (a share of it)
                text.append(f" {block_name(i, j, n)}:{mark} ", style="reverse bold white")
            text.append(" ")
        text.append("\n")
    return text


def grid_legend(drawn: tuple[Placement, ...], lang: str) -> str:
    """What the grids' labels mean: only the kinds of label the grids of ``drawn`` show."""
    parts = [say("explain.grid_legend", lang)]
    if any(isinstance(p, Replicate) for p in drawn):
        parts.append(say("explain.grid_legend.replicated", lang))
    if any(isinstance(p, Partial) for p in drawn):
        parts.append(say("explain.grid_legend.partial", lang))
    return " ".join(parts)


def render_explain(console: Any, facts: dict[str, Any], lang: str) -> None:
    from rich.table import Table


    n = facts["ranks"]
    rows, cols = facts["shape"]
    console.print(say("explain.title", lang, rows=rows, cols=cols, ranks=n, engine=facts["engine"], dtype=facts["dtype"],
                      itemsize=facts["itemsize"]))
    console.print(say("explain.inputs", lang, sizes=", ".join(str(s) for s in shard_sizes(rows, n))))
    console.print()
    yes, no = say("word.yes", lang), say("word.no", lang)
    table = Table(show_lines=True)
    headers = ("explain.col.collective", "explain.col.holds", "explain.col.sums", "explain.col.full",
               "explain.col.bytes", "explain.col.memory")
    for header in headers:
        table.add_column(say(header, lang))
    stacked: list[str] = []  # the same facts, one collective after another, for a narrow console
    for name, f in facts["collectives"].items():
        if "error" in f:
            table.add_row(say(f"name.{name}", lang), say("explain.not_applicable", lang, reason=f["error"]), "", "", "", "")
            stacked += [say(f"name.{name}", lang), "  " + say("explain.not_applicable", lang, reason=f["error"])]
            continue
        holds = []
        for r, h in enumerate(f["holds_per_rank"]):
            shape = f["result_shape_per_rank"][r]
            if h["kind"] == "nothing":
                what = say("demo.nothing", lang)
            elif h["kind"] == "region":
                what = describe_region(tuple(tuple(x) for x in h["region"]), lang)
            elif h["kind"] == "sums" and h.get("columns"):
                span = describe_region(((0, rows), tuple(h["columns"])), lang).split(", ")[1]
                what = say("explain.sums", lang, ranks=h["ranks"], cols=span)
            else:
                what = h["kind"]
            holds.append(f"rank {r}: {what}" + (f" [{' x '.join(map(str, shape))}]" if shape else ""))
        full = yes if f["full_tensor_on_every_rank"] else (say("explain.some_rank", lang) if f["full_tensor_on_some_rank"] else no)
        traffic = "\n".join(f"rank {r}: {human_bytes(s)} / {human_bytes(v)}" for r, (s, v) in
                            enumerate(zip(f["bytes_sent_per_rank"], f["bytes_received_per_rank"])))
        memory = ", ".join(f"{m:g}x" for m in f["peak_memory_per_rank_in_shards"])
        summed = yes if f["sums_values"] else no
        table.add_row(say(f"name.{name}", lang), "\n".join(holds), summed, full, traffic, memory)
        stacked.append(f"{say(f'name.{name}', lang)}: {say(headers[2], lang)} {summed}; {say(headers[3], lang)} {full}")
        stacked += [f"  {h}" for h in holds]
        stacked.append(f"  {say(headers[4], lang)}: " + "; ".join(traffic.splitlines()))
        stacked.append(f"  {say(headers[5], lang)}: {memory}")
    if console.measure(table, options=console.options.update_width(1 << 16)).maximum <= console.width:
        console.print(table)
    else:
        console.print("\n".join(stacked), overflow="fold")
    console.print(say("explain.partial_inputs", lang))
    console.print()
    console.print(say("explain.grids", lang))
    console.print(grid((rows, cols), Shard(0), n))
    console.print(grid((rows, cols), Shard(1), n))
    console.print(grid_legend((Shard(0), Shard(1)), lang))
    a = facts["answers"]
    console.print(say("explain.q1", lang))
    ev = a["adds_values"]["evidence"]
    console.print("  " + say("explain.a1.yes" if a["adds_values"]["answer"] else "explain.a1.no", lang, elements=ev["output_elements"]))
    console.print(say("explain.q2", lang))
    ev = a["full_tensor_on_every_rank"]["evidence"]
    shapes = _shapes_by_rank(ev["result_shape_per_rank"], lang)
    key = "explain.a2.yes" if a["full_tensor_on_every_rank"]["answer"] else "explain.a2.no"
    console.print("  " + say(key, lang, shapes=shapes, full=" x ".join(map(str, ev["global_shape"]))))
    console.print(say("explain.q3", lang))
    console.print("  " + say("explain.a3", lang))
    for e in a["cut_rule"]:
        region = tuple(tuple(x) for x in e["region"])
        console.print(f"    rank {e['src_rank']}: {describe_region(region, lang)} -> rank {e['dst_rank']}")


def render_plan(console, plan, lang: str = "en", limit: int = 12, alpha: float = 0.0, beta: float = 0.0) -> None:
    """The plan as text: collective, split table (first rows when large), bytes, memory, time."""
    console.print(say("plan.head", lang, collective=plan.collective, src=repr(plan.src), dst=repr(plan.dst),
                      shape=list(plan.global_shape), dtype=plan.dtype, ranks=plan.size))
    moves = [t for t in plan.transfers if t.src != t.dst and t.nbytes]  # an empty piece moves nothing
    console.print(say("plan.split_table", lang, count=len(moves)))
    for t in moves[:limit]:
        console.print(f"  rank {t.src}: {describe_region(t.region, lang)} -> rank {t.dst}  ({human_bytes(t.nbytes)})")
    if len(moves) > limit:
        console.print("  " + say("plan.more", lang, count=len(moves) - limit))
    summary = summarize_matrix(plan.traffic_matrix)
    console.print(say("plan.traffic", lang, pairs=summary["nonzero_pairs"], amount=byte_span(
        human_bytes(summary["min_pair_bytes"]), human_bytes(summary["max_pair_bytes"]), lang)))
    console.print(say("plan.bytes", lang, most=human_bytes(max(plan.bytes_sent_per_rank)), total=human_bytes(plan.total_bytes)))
    worst = max(plan.memory_per_rank(), key=lambda m: m["peak"])
    console.print(say("plan.memory", lang, before=human_bytes(worst["before"]), peak=human_bytes(worst["peak"]),
                      after=human_bytes(worst["after"]), pack=plan.pack_copies, unpack=plan.unpack_copies))
    console.print(say("plan.time", lang, ms=f"{estimate_seconds(plan, alpha, beta) * 1e3:.3f}", alpha=alpha * 1e6, beta=beta * 1e9))


def _shapes_by_rank(per_rank: list, lang: str) -> str:
    """``rank 0: [7 x 2], ranks 1-3: [7 x 1]``: each run of ranks holding one shape (None:
    nothing); Korean keeps the loanword's one form (``rank 1-3``)."""
    runs: list[list] = []
    for r, shape in enumerate(per_rank):
        if runs and runs[-1][2] == shape:
            runs[-1][1] = r
        else:
            runs.append([r, r, shape])
    told = []
    for first, last, shape in runs:
        held = "-" if shape is None else "[" + " x ".join(map(str, shape)) + "]"
        told.append(f"rank {first}: {held}" if first == last else
                    f"{'rank' if lang == 'ko' else 'ranks'} {first}-{last}: {held}")
    return ", ".join(told)


def render_mesh_plan(console: Any, report: dict, lang: str = "en") -> None:
    """A mesh plan as text: the change, each step with its bytes per rank, the lower bound. A
    1-D mesh is a world of ranks: told as one, with one placement each side."""
    mesh = "x".join(str(s) for s in report["mesh"])
    world = len(report["mesh"]) == 1
    src = report.get("src_spec") or (report["src"][0] if world else f"({', '.join(report['src'])})")
    dst = report.get("dst_spec") or (report["dst"][0] if world else f"({', '.join(report['dst'])})")
    console.print(say("meshplan.head_world" if world else "meshplan.head", lang, src=src, dst=dst,
                      shape=" x ".join(str(s) for s in report["global_shape"]), dtype=report["dtype"], mesh=mesh,
                      ranks=report["ranks"]))
    if not report["steps"]:
        console.print("  " + say("meshplan.nothing", lang))
    for k, step in enumerate(report["steps"], 1):
        sent, received = step["bytes_sent_per_rank"], step["bytes_received_per_rank"]
        over = (say("over.the ranks", lang, ranks=report["ranks"]) if world and step["over"] != "this rank"
                else over_words(step["over"], lang))
        console.print(say("meshplan.step", lang, k=k, collective=step["collective"], over=over,
                          amount=byte_span(human_bytes(min(sent)), human_bytes(max(sent)), lang), total=human_bytes(sum(sent)),
                          most_in=human_bytes(max(received))))
    console.print(say("meshplan.bound", lang, total=human_bytes(report["exchange_bytes_total"]),
                      bound=human_bytes(report["exchange_lower_bound_bytes"])))
    matrix = report.get("traffic_matrix")
    if matrix:
        console.print(say("meshplan.matrix", lang))
        for r, row in enumerate(matrix):
            console.print(f"  rank {r}: " + "  ".join(human_bytes(v).rjust(9) for v in row))


def render_mesh_demo(console: Any, lang: str, shape: tuple[int, int], mesh_shape: tuple, src: tuple, dst: tuple,
                     dtype: str, engine: str, coords: list, ins: list, outs: list, moved: list) -> None:
    """The ranks of the mesh drawn as a grid, each cell saying what that rank holds, before and after."""
    from rich.table import Table
    from rich.text import Text

    from ..planning.layout import map_placements, mesh_region
    from ..planning.spec import layout_text

    mesh = "x".join(str(s) for s in mesh_shape)
    console.print(say("demo.title_mesh", lang, rows=shape[0], cols=shape[1], dtype=dtype, mesh=mesh, engine=engine))
    console.print()
    grid_cols = mesh_shape[-1]

    def layout(title: str, placements: tuple, arrays: list) -> None:
        table = Table(title=title, title_justify="left", show_lines=True)
        for k in range(grid_cols):
            table.add_column(say("demo.mesh_column", lang, dim=len(mesh_shape) - 1, k=k))
        whole = map_placements(placements, lambda p: Replicate() if isinstance(p, Partial) else p)
        cells = []
        for r, coord in enumerate(coords):
            region = mesh_region(shape, whole, coord, mesh_shape)
            dims = " x ".join(str(s) for s in arrays[r].shape)
            text = Text(f"rank {r} {tuple(coord)}\n", style=RANK_STYLES[r % len(RANK_STYLES)])
            words = describe_region(region, lang) if all(b > a for a, b in region) else say("demo.nothing", lang)
            if any(isinstance(p, Partial) for p in placements):
                words += " (" + say("demo.partial_word", lang) + ")"
            text.append(f"{words}\n[{dims}]")
            cells.append(text)
        for start in range(0, len(cells), grid_cols):
            table.add_row(*cells[start : start + grid_cols])
        console.print(table)

    layout(say("demo.before_mesh", lang, placement=layout_text(src)), src, ins)
    layout(say("demo.after_mesh", lang, placement=layout_text(dst)), dst, outs)
    sent = max(m[0] for m in moved)
    received = max(m[1] for m in moved)
    console.print(say("demo.moved_mesh", lang, sent=human_bytes(sent), received=human_bytes(received)))


def render_rank_plan(console: Any, report: dict) -> None:
    """One rank's part of a plan: each step with its peers and bytes, then the totals."""
    where = (f"the {'x'.join(map(str, report['mesh']))} mesh (at {tuple(report['coord'])})" if "mesh" in report
             else f"{report['hosts']} hosts x {report['ranks_per_host']} ranks (host {report['host']}), "
                  f"the {report['algorithm']} all_to_all" if "hosts" in report
             else f"a world of {report['ranks']} ranks")
    src = ", ".join(report["src"]) if isinstance(report["src"], list) else report["src"]
    dst = ", ".join(report["dst"]) if isinstance(report["dst"], list) else report["dst"]
    console.print(f"Rank {report['rank']} of {where}: {src} -> {dst}, "
                  f"{' x '.join(map(str, report['global_shape']))} {report['dtype']}")
    if not report["steps"]:
        console.print("  nothing to do: this layout change moves nothing")
    for k, step in enumerate(report["steps"], 1):
        what = step.get("action", "")
        console.print(f"  step {k}: {step['collective']} over {step['over']}{': ' + what if what else ''}; "
                      f"sends {human_bytes(step['sent_bytes'])} to {len(step['sends_to'])} peers, receives "
                      f"{human_bytes(step['received_bytes'])} from {len(step['receives_from'])}")
        for side, verb in (("sends", "to"), ("receives", "from")):
            for row in step.get(side, [])[:8]:
                region = f" {describe_region(tuple(map(tuple, row['region'])))}" if row["region"] else ""
                console.print(f"    {'send' if side == 'sends' else 'receive'}{region} {verb} rank {row['peer']} "
                              f"({human_bytes(row['bytes'])})")
    console.print(f"In all: {human_bytes(report['sent_bytes'])} sent, {human_bytes(report['received_bytes'])} "
                  f"received, {len(report['peers'])} peers; planned in {report['plan_seconds'] * 1e3:.2f} ms")


def render_explain_moe(console: Any, facts: dict, lang: str = "en") -> None:
    """``reshard explain --moe``: the routing, what crossed between hosts on each path, the rows
    each expert got, and the way back."""
    from ..messages import say
    from .moe_scenes import token_name

    n, hosts = facts["ranks"], facts["hosts"]
    host = [r * hosts // n for r in range(n)]
    console.print(say("moe.title", lang, tokens=facts["tokens_per_rank"], ranks=n, engine=facts["engine"], hosts=hosts,
                      top_k=facts["top_k"], experts=facts["experts"]))
    console.print(say("moe.routing", lang))
    for r, tokens in enumerate(facts["ids"]):
        for t, experts in enumerate(tokens):
            console.print(say("moe.token_line", lang, token=token_name(r, t), rank=r, host=host[r],
                              experts=", ".join(map(str, experts)), hosts=", ".join(str(host[e]) for e in experts)))
    pairs = n * facts["tokens_per_rank"] * facts["top_k"]
    console.print(say("moe.flat", lang, crossing=facts["rows_across"]["flat"], pairs=pairs))
    console.print(say("moe.two", lang, crossing=facts["rows_across"]["hierarchical"]))
    if facts["same_expert_inputs"]:
        console.print(say("moe.same", lang))
        for d, rows in enumerate(facts["expert_rows"]):
            console.print(say("moe.expert_line", lang, rank=d, rows=" ".join(token_name(s, t) for s, t in rows) or "-"))
    else:
        console.print(say("moe.differ", lang))
    console.print(say("moe.combine", lang, flat=facts["rows_across"]["flat"], two=facts["rows_across"]["hierarchical"],
                      top_k=facts["top_k"], ok=say("moe.yes" if facts["combine_ok"] else "moe.no", lang)))
    b = facts["bytes_across"]
    console.print(say("moe.bytes", lang, flat=human_bytes(b["flat"]["dispatch"] + b["flat"]["combine"]),
                      two=human_bytes(b["hierarchical"]["dispatch"] + b["hierarchical"]["combine"])))
