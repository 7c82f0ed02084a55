"""``reshard plan``: an exchange planned without starting ranks (a world, a mesh, one rank's
part, hosts, a MoE layer across hosts)."""

from __future__ import annotations

import argparse
import json

from ..errors import ReshardError
from ..planning.layout import check_spec_dims
from .cli_common import SMALL_PLAN_RANKS, make_console, mesh_placements, placement

HOSTS_DEFAULT_SHAPE = (65536, 65536)  # with --hosts and no --shape: a layer-sized matrix


def _plan_hosts(args: argparse.Namespace) -> int:
    """The row -> column all_to_all on ``--hosts`` x ``--ranks-per-host`` ranks: flat against two-level."""
    import math

    from ..planning.host_costs import Levels, two_level_table
    from ..planning.plan import ITEMSIZE

    if args.dtype not in ITEMSIZE:
        raise ReshardError(f"unknown dtype {args.dtype!r}; known: {', '.join(ITEMSIZE)}")
    n = args.hosts * args.ranks_per_host
    if args.rank is not None:  # that rank's part of the two-level exchange
        from ..viz.terminal import render_rank_plan
        from .rank_report import hosts_rank_report

        if not 0 <= args.rank < n:
            raise ReshardError(f"--rank {args.rank} is outside the {n} ranks (0 to {n - 1})")
        report = hosts_rank_report(args.shape, args.rank, args.hosts, args.ranks_per_host, args.dtype)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            render_rank_plan(make_console(args.no_color), report)
        return 0
    levels = Levels()
    if args.levels is not None:
        try:
            with open(args.levels) as f:
                levels = Levels(**json.load(f)["levels"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReshardError(f"cannot read the cost model's numbers from {args.levels}: {exc}") from exc
    table = two_level_table(math.prod(args.shape) * ITEMSIZE[args.dtype] // n, args.hosts, args.ranks_per_host, levels)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    from rich.table import Table

    lv = table["levels"]
    grid = Table(title=f"all_to_all of {'x'.join(map(str, args.shape))} {args.dtype} rows -> columns on {args.hosts} hosts "
                       f"x {args.ranks_per_host} ranks ({n:,} ranks, {table['bytes_per_rank']:,} B per rank)")
    for name in ("algorithm", "messages per rank inside / across", "bytes per rank inside a host",
                 "bytes per host link, each way", "estimate"):
        grid.add_column(name, justify="right" if name != "algorithm" else "left")
    for name in ("flat", "hierarchical"):
        r = table[name]
        grid.add_row(name, f"{r['messages_inside_per_rank']:,} / {r['messages_across_per_rank']:,}",
                     f"{r['bytes_inside_per_rank']:,}", f"{r['bytes_per_host_link']:,}", f"{r['estimate_s'] * 1e3:.3f} ms")
    console = make_console(args.no_color)
    console.print(grid)
    def rate(beta: float) -> float:  # a fitted level may cost nothing per byte
        return 1 / beta / 1e9 if beta else float("inf")

    console.print(f"cost model: inside a host {lv['alpha_local_s'] * 1e6:g} us per message and {rate(lv['beta_local_s_per_byte']):g} GB/s "
                  f"per rank; across, {lv['alpha_link_s'] * 1e6:g} us per message and {rate(lv['beta_link_s_per_byte']):g} GB/s "
                  f"per host link, shared by its ranks; {lv['step_s'] * 1e6:g} us per exchange step")
    return 0


def _plan_moe(args: argparse.Namespace) -> int:
    """MoE dispatch (FP8 with its scales) and combine (BF16) across hosts, on paper."""
    from ..planning.host_costs import moe_table

    hosts = args.hosts or 2
    if args.top_k > args.experts:
        raise ReshardError(f"--top-k {args.top_k} is more than --experts {args.experts}")
    try:
        table = moe_table(args.tokens, args.hidden, args.top_k, args.experts, hosts, args.ranks_per_host,
                          link_bytes_per_s=args.link_gbps * 1e9)
    except ValueError as exc:
        raise ReshardError(str(exc)) from exc
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    from rich.table import Table

    grid = Table(title=f"MoE across {hosts} host{'s' if hosts != 1 else ''} x {args.ranks_per_host} ranks: {args.tokens:,} tokens of {args.hidden:,} "
                       f"per rank, top-{args.top_k} of {args.experts} experts (uniform routing), FP8 dispatch, BF16 combine")
    for name in ("path", "rows across per rank", "dispatch: bytes per rank / per host link", "combine: bytes per rank / per host link",
                 f"time at {args.link_gbps:g} GB/s per rank: dispatch / combine"):
        grid.add_column(name, justify="left" if name == "path" else "right")
    for name in ("flat", "deduplicated"):
        r = table[name]
        grid.add_row(name, f"{r['rows_across_per_rank']:,.0f}",
                     f"{r['dispatch_bytes_per_rank'] / 1e6:,.1f} MB / {r['dispatch_bytes_per_host_link'] / 1e6:,.1f} MB",
                     f"{r['combine_bytes_per_rank'] / 1e6:,.1f} MB / {r['combine_bytes_per_host_link'] / 1e6:,.1f} MB",
                     f"{r['dispatch_s'] * 1e3:.3f} ms / {r['combine_s'] * 1e3:.3f} ms")
    console = make_console(args.no_color)
    console.print(grid)
    console.print(f"a token's {args.top_k} slots: {table['pairs_across_per_token']:.3f} on other hosts (flat rows), "
                  f"{table['remote_hosts_per_token']:.3f} other hosts reached (deduplicated rows); "
                  f"{table['dispatch_bytes_per_element']:g} B per dispatched element (FP8 and a float32 scale per 128)")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from ..planning.plan import estimate_seconds, make_plan, plan_report, report_json

    shapes = args.shape or ()
    args.shape = shapes[0] if len(shapes) == 1 else None if not shapes else args.shape
    for k, shape in enumerate(shapes):  # a Spec past a shape's dims, named as written (resolved, only its Shard is)
        for flag, text in (("--src", args.src), ("--dst", args.dst)):
            try:
                check_spec_dims(text, len(shape), flag)
            except ReshardError as exc:
                raise type(exc)(f"tensor {k} ({'x'.join(map(str, shape))}): {exc}" if len(shapes) > 1 else str(exc)) from None
    if len(shapes) > 1:
        other = "--moe" if args.moe else "--hosts" if args.hosts is not None else "--rank" if args.rank is not None else None
        if other is not None:
            raise ReshardError(f"several --shape values (the tensors of one call) go with --ranks or --mesh, not {other}")
        if (args.ranks, args.mesh) == (None, None):
            raise ReshardError("several --shape values (the tensors of one call) need --ranks or --mesh")
        return _plan_many(args, shapes)
    if args.moe:
        return _plan_moe(args)
    if args.hosts is not None:
        if args.shape is None:
            args.shape = HOSTS_DEFAULT_SHAPE
        return _plan_hosts(args)
    if args.shape is None or (args.ranks, args.mesh) == (None, None):
        raise ReshardError("plan needs --shape and one of --ranks or --mesh (or --hosts, or --moe)")
    if args.rank is not None:
        return _plan_rank(args)
    mesh = args.mesh or ((args.ranks,) if args.ranks > SMALL_PLAN_RANKS else None)
    if mesh is None:
        src, dst = placement(args.src or "row", "--src"), placement(args.dst or "col", "--dst")
        plan = make_plan(args.shape, src, dst, args.ranks, args.dtype)
        if args.json:
            report = plan_report(plan)
            report["time_estimate_s"] = estimate_seconds(plan, args.alpha, args.beta)
            report["cost_model"] = {"alpha_s": args.alpha, "beta_s_per_byte": args.beta}
            print(report_json(report))
        else:
            from ..viz.terminal import render_plan

            render_plan(make_console(args.no_color), plan, args.lang, alpha=args.alpha, beta=args.beta)
        return 0
    from ..planning.mesh_plan import mesh_plan

    if args.mesh and (args.src is None or args.dst is None):
        raise ReshardError("on a mesh, give --src and --dst: one placement per mesh dim, e.g. --src 'S(0),S(1)'")
    src = mesh_placements(args.src or "row", "--src", len(mesh))
    dst = mesh_placements(args.dst or "col", "--dst", len(mesh))
    report = mesh_plan(args.shape, src, dst, mesh, args.dtype)
    if args.json:
        if report["ranks"] > 4096:  # per-rank lists of tens of thousands of numbers: summarised
            for step in report["steps"]:
                for key in ("bytes_sent_per_rank", "bytes_received_per_rank"):
                    v = step.pop(key)
                    step[key.replace("per_rank", "summary")] = {"min": min(v), "max": max(v), "total": sum(v)}
        print(json.dumps(report, indent=2))
    else:
        from ..viz.terminal import render_mesh_plan

        render_mesh_plan(make_console(args.no_color), report, args.lang)
    return 0


def _plan_many(args: argparse.Namespace, shapes: tuple) -> int:
    """``reshard plan --shape A,B,...``: each tensor's plan, then the call that moves them all
    (one check, one shared exchange of boxes; reduced tensors take their own steps after it)."""
    from ..planning import planner
    from ..planning.mesh_plan import mesh_plan

    mesh = tuple(args.mesh) if args.mesh else (args.ranks,)
    if args.mesh and (args.src is None or args.dst is None):
        raise ReshardError("on a mesh, give --src and --dst: one placement per mesh dim, e.g. --src 'S(0),S(1)'")
    src = mesh_placements(args.src or "row", "--src", len(mesh))
    dst = mesh_placements(args.dst or "col", "--dst", len(mesh))
    reports = []
    for k, shape in enumerate(shapes):
        try:
            reports.append(mesh_plan(shape, src, dst, mesh, args.dtype))
        except ReshardError as exc:  # which of the shapes it is
            raise type(exc)(f"tensor {k} ({'x'.join(map(str, shape))}): {exc}") from None
    size = reports[0]["ranks"]
    own_steps = [src != dst and planner.exchange_boxes(shape, src, dst, mesh, 0) is None for shape in shapes]
    shared = [st for r, own in zip(reports, own_steps) if not own for st in r["steps"] if st["collective"] != "local"]
    sent = [sum(st["bytes_sent_per_rank"][q] for st in shared) for q in range(size)]
    received = [sum(st["bytes_received_per_rank"][q] for st in shared) for q in range(size)]
    own = sum(own_steps)
    call = {"tensors": len(shapes), "checks": 1, "shared_exchange_steps": 1 if any(sent) else 0,
            "shared_bytes_sent_per_rank": sent, "shared_bytes_received_per_rank": received,
            "tensors_with_their_own_steps": own}
    if args.json:
        print(json.dumps({"tensors": reports, "one_call": call}, indent=2))
        return 0
    from ..messages import byte_span, say
    from ..viz.terminal import render_mesh_plan
    from ..viz.text import human_bytes

    console = make_console(args.no_color)
    for report in reports:
        render_mesh_plan(console, report, args.lang)
    console.print(say("meshplan.many", args.lang, n=len(shapes), amount=byte_span(human_bytes(min(sent)), human_bytes(max(sent)),
                                                                                 args.lang),
                      most_in=human_bytes(max(received))) + (say("meshplan.own", args.lang, own=own) if own else ""))
    return 0


def _plan_rank(args: argparse.Namespace) -> int:
    """``reshard plan --rank R``: that rank's part alone."""
    import math

    from ..planning.plan import ITEMSIZE
    from ..viz.terminal import render_rank_plan
    from .rank_report import rank_report

    size = math.prod(args.mesh) if args.mesh else args.ranks
    if not 0 <= args.rank < size:
        raise ReshardError(f"--rank {args.rank} is outside the {size} ranks (0 to {size - 1})")
    if args.dtype not in ITEMSIZE:
        raise ReshardError(f"unknown dtype {args.dtype!r}; known: {', '.join(ITEMSIZE)}")
    if args.mesh:
        if args.src is None or args.dst is None:
            raise ReshardError("on a mesh, give --src and --dst: one placement per mesh dim, e.g. --src 'S(0),S(1)'")
        report = rank_report(args.shape, mesh_placements(args.src, "--src", len(args.mesh)),
                             mesh_placements(args.dst, "--dst", len(args.mesh)), args.rank, args.dtype, mesh=args.mesh)
    else:
        report = rank_report(args.shape, placement(args.src or "row", "--src"), placement(args.dst or "col", "--dst"), args.rank,
                             args.dtype, ranks=args.ranks)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render_rank_plan(make_console(args.no_color), report)
    return 0
