"""The ``reshard`` command: demo, plan (and more as they land)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from .engines.available import ENGINES
from .errors import InvalidArgument, ReshardError
from .messages import LANGS, say
from .planning.layout import Shard
from .planning.spec import normalize_placements
from .tools.cli_common import (
    at_least,
    layout_text,
    make_console,
    mesh_placements,
    non_negative_number,
    parse_mesh_shape,
    parse_shape,
    parse_shapes,
    placement,
    positive,
    positive_number,
)
from .tools.cli_plan import cmd_plan

# Here rather than in bench (which imports numpy), so the CLI starts light; bench's docstring
# says what each method measures.
BENCH_METHODS = ("reshard", "reshard-nocheck", "raw", "dtensor", "memcpy")  # the default set
BENCH_METHODS_ALL = (*BENCH_METHODS, "raw+pack", "raw+round", "raw+local")
DEMO_DTYPES = ("float64", "float32", "float16", "bfloat16", "int8", "int32", "int64", "complex64")


def build_parser() -> argparse.ArgumentParser:
    from .version import VERSION

    parser = argparse.ArgumentParser(prog="reshard", description="AllToAll as a layout exchange, on real ranks.")
    parser.add_argument("--version", action="version", version=f"reshard {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the row -> column example (a 6x6 matrix row-sharded over 3 ranks becomes column-sharded) on local ranks and check it")
    demo.add_argument("--ranks", type=positive, default=3, help="number of local ranks (default 3)")
    demo.add_argument("--shape", type=parse_shape, default=(6, 6), help="matrix shape RxC (default 6x6)")
    demo.add_argument("--src", type=layout_text, default=None, help="row, col, replicate, partial or Shard(d) (default row); with --mesh one per mesh dim, or a Spec: 'Spec((1, 0), None)'")
    demo.add_argument("--dst", type=layout_text, default=None, help="same choices (default col); with --mesh one per mesh dim")
    demo.add_argument("--mesh", type=parse_mesh_shape, help="run on a process mesh of local ranks, e.g. 2x2 (default: a 1-D world of --ranks)")
    demo.add_argument("--dtype", choices=DEMO_DTYPES, default="float32", help="element type of the matrix (default float32)")
    demo.add_argument("--engine", choices=("gloo", "mpi"), help="gloo (torch.distributed) or mpi (mpi4py); default gloo, or mpi where torch is not installed")
    demo.add_argument("--lang", choices=LANGS, default="en", help="language of the text: en or ko (default en)")
    demo.add_argument("--timeout", type=positive_number, default=60.0, help="seconds before the job is stopped")
    demo.add_argument("--no-color", action="store_true", help="plain text even in a terminal")
    demo.add_argument("--png", metavar="FILE", help="also draw the before/after picture as a PNG")
    demo.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page animating the exchange")

    explain = sub.add_parser("explain", help="run Gather, AllGather, ReduceScatter, AllToAll, AllReduce side by side and answer what each one sums, replicates and moves")
    explain.add_argument("--ranks", type=positive, default=None,
                         help="number of local ranks (default 3; with --moe two per host)")
    explain.add_argument("--shape", type=parse_shape, default=(6, 6), help="matrix shape RxC (default 6x6)")
    explain.add_argument("--dtype", choices=("float32", "float64", "float16", "int32", "int64"), default="float32",
                         help="element type of the matrix, which sets every byte count shown (default float32)")
    explain.add_argument("--engine", choices=("gloo", "mpi"), help="gloo (torch.distributed) or mpi (mpi4py); default gloo, or mpi where torch is not installed")
    explain.add_argument("--lang", choices=LANGS, default="en", help="language of the text: en or ko (default en)")
    explain.add_argument("--json", action="store_true", help="the measured facts, machine-readable")
    explain.add_argument("--timeout", type=positive_number, default=60.0, help="seconds before the job is stopped (default 60)")
    explain.add_argument("--no-color", action="store_true", help="plain text even in a terminal")
    explain.add_argument("--png", metavar="FILE", help="draw the layout before and after each collective as a PNG")
    explain.add_argument("--html", metavar="FILE", help="a self-contained HTML page animating each of the five "
                         "collectives (with --moe: the dispatch, flat and in two levels)")
    explain.add_argument("--moe", action="store_true", help="a small MoE dispatch and combine instead, on --ranks ranks grouped into --hosts hosts: flat against two levels, and what crossed between hosts")
    explain.add_argument("--hosts", type=positive, default=2, help="with --moe: hosts the ranks are grouped into (default 2)")
    explain.add_argument("--top-k", type=positive, default=2, help="with --moe: experts per token (default 2)")

    plan = sub.add_parser("plan", help="plan an exchange without starting ranks")
    plan.add_argument("--shape", type=parse_shapes, help="global shape, e.g. 8192x8192 or 64x32x16 (required with --ranks and --mesh; with --hosts default 65536x65536); several, comma-separated (8x8,16x4): the tensors of one call")
    where = plan.add_mutually_exclusive_group()
    where.add_argument("--ranks", type=positive, help="number of ranks (a 1-D world)")
    where.add_argument("--mesh", type=parse_mesh_shape, help="a process mesh, e.g. 2x2 or 64x64; then --src and --dst give one placement per mesh dim")
    where.add_argument("--hosts", type=positive, help="hosts of --ranks-per-host ranks each: the row -> column all_to_all flat against two-level, on paper")
    plan.add_argument("--ranks-per-host", type=positive, default=8, help="with --hosts: ranks on each host (default 8)")
    plan.add_argument("--levels", metavar="FILE", help="with --hosts: the cost model's numbers as reshard bench --calibrate wrote them")
    plan.add_argument("--moe", action="store_true", help="MoE dispatch and combine across --hosts (default 2) on paper: bytes per rank and per host link, flat against deduplicated; defaults are DeepEP's normal-kernel setting")
    plan.add_argument("--tokens", type=positive, default=4096, help="with --moe: tokens per rank (default 4096)")
    plan.add_argument("--hidden", type=positive, default=7168, help="with --moe: elements per token (default 7168)")
    plan.add_argument("--top-k", type=positive, default=8, help="with --moe: experts per token (default 8)")
    plan.add_argument("--experts", type=positive, default=256, help="with --moe: experts in all (default 256)")
    plan.add_argument("--link-gbps", type=positive_number, default=50.0, help="with --moe: GB/s of each rank's link across hosts (default 50: a 400 Gb/s NIC)")
    plan.add_argument("--src", type=layout_text, default=None, help="row, col, replicate, partial or Shard(d) (default row); on a mesh one per mesh dim: 'S(0),S(1)', or a Spec (each tensor dim's mesh dims, outermost first): 'Spec((1, 0), None)'")
    plan.add_argument("--dst", type=layout_text, default=None, help="same choices (default col); on a mesh one per mesh dim: 'S(1),S(0)'")
    plan.add_argument("--dtype", default="float32", help="element type, for the byte counts (default float32)")
    plan.add_argument("--rank", type=int, help="plan only this rank's part: its steps, peers and bytes, worked out from that rank alone")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument("--no-color", action="store_true", help="plain text even in a terminal")
    plan.add_argument("--lang", choices=LANGS, default="en", help="language of the text: en or ko (default en)")
    plan.add_argument("--alpha", type=non_negative_number, default=20e-6, help="seconds per message (latency), default 20e-6")
    plan.add_argument("--beta", type=non_negative_number, default=1 / 5e9, help="seconds per byte (1 / bandwidth), default 1/5e9")
    bench = sub.add_parser("bench", help="time reshard's collectives beside the raw engine, DTensor and memcpy")
    bench.add_argument("--engine", choices=("gloo", "mpi"), help="gloo (torch.distributed) or mpi (mpi4py); default gloo, or mpi where torch is not installed")
    bench.add_argument("--ranks", type=positive, default=4, help="number of local ranks (default 4)")
    bench.add_argument("--mesh", type=parse_mesh_shape, help="time a layout change on a process mesh (e.g. 2x2), beside DTensor on the same mesh")
    bench.add_argument("--src", type=layout_text, help="with --mesh: the source, one placement per mesh dim, e.g. 'S(0),S(1)', or a Spec: 'Spec((1, 0), None)'")
    bench.add_argument("--dst", type=layout_text, help="with --mesh: the destination, e.g. 'S(1),S(0)'")
    bench.add_argument("--op", choices=("all_to_all", "redistribute", "all_gather", "reduce_scatter", "moe"), default="redistribute", help="the collective to time (default redistribute, Shard(0) -> Shard(1))")
    bench.add_argument("--overlap", action="store_true", help="time compute hidden behind started calls (async_op=True): an all_to_all of the first --sizes with a matrix multiply, and a MoE layer through rs.moe.pipeline whose experts compute about as long as its exchanges, in 1, 2, 4 and 8 parts (on two hosts with a shaped link: benchmarks/overlap.py)")
    bench.add_argument("--timeline", metavar="PNG", help="with --overlap: draw one 4-part MoE step, every rank's dispatches, expert passes and combines, to this PNG")
    bench.add_argument("--sizes", default="64K..64M", help="bytes per rank: START..END (x4 steps) or a list 1M,16M (default 64K..64M)")
    bench.add_argument("--factor", type=at_least(2), default=4, help="step between sizes in START..END (default 4)")
    bench.add_argument("--dtype", choices=("float32", "float64", "float16", "int32", "int64", "int8"), default="float32", help="element type (default float32)")
    bench.add_argument("--methods", default=",".join(BENCH_METHODS), help=f"comma list of {', '.join(BENCH_METHODS_ALL)} (default: the first five)")
    bench.add_argument("--iters", type=at_least(0), default=0, help="timed iterations per method and size (default: by size)")
    bench.add_argument("--warmup", type=at_least(0), default=2, help="untimed runs per method and size first (default 2)")
    bench.add_argument("--numpy", action="store_true", help="MPI engine: time numpy arrays instead of torch tensors")
    bench.add_argument("--json", metavar="FILE", help="write every row, sample and ratio as JSON")
    bench.add_argument("--calibrate", action="store_true", help="started by torchrun or mpirun on every host: time the all_to_all inside the hosts and across them, and fit the two-level cost model's numbers per level (with --json FILE, rank 0 writes them for reshard plan --levels)")
    bench.add_argument("--plot", metavar="FILE.png", help="draw busbw against size for each method, floor included")
    bench.add_argument("--timeout", type=positive_number, default=1800.0, help="seconds before the whole run is stopped (default 1800)")
    bench.add_argument("--no-color", action="store_true", help="plain text even in a terminal")
    doctor = sub.add_parser("doctor", help="what is installed here and which engines work (paste it into a bug report)")
    doctor.add_argument("--engine", choices=ENGINES, help="the engine you need: exit 1 when it cannot work here")
    doctor.add_argument("--ranks", type=positive, help="also run a real exchange on this many local ranks of each working engine")
    doctor.add_argument("--timeout", type=positive_number, default=60.0, help="seconds before a --ranks trial is stopped (default 60)")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--no-color", action="store_true", help="plain text even in a terminal")
    return parser


def _missing_extra(args: argparse.Namespace) -> str | None:
    """One line naming what to install, when a flag needs a library that is not installed;
    picks the engine first where none was given (gloo, or MPI without torch, saying so)."""
    from .engines.available import default_engine, missing_for

    if getattr(args, "png", None):
        try:  # imported, not only found: a broken install counts as missing
            import matplotlib  # noqa: F401
        except ImportError:
            return "reshard: --png needs matplotlib, which is not installed: pip install matplotlib (reshard's [plot] extra)"
    if hasattr(args, "engine"):
        if args.engine is None:
            args.engine, note = default_engine()
            if note is not None:
                print(f"reshard: {note}", file=sys.stderr)
        missing = missing_for(args.engine)
        if missing is not None:
            return f"reshard: {missing}"
    return None


def _unwritable_output(args: argparse.Namespace) -> str | None:
    """One line naming a FILE to write (``--png``, ``--html``, ``--json``, ``--plot``,
    ``--timeline``) that cannot be written, found before any rank starts (the job would
    otherwise run to its end and then fail to save)."""
    for flag in ("png", "html", "json", "plot", "timeline"):
        path = getattr(args, flag, None)
        if not isinstance(path, str):  # --json is a switch on the commands that print it
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            return f"reshard: --{flag} {path} is a folder: give the file to write"
        if not os.path.isdir(folder):
            return f"reshard: --{flag} {path}: the folder {folder} does not exist"
        if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            return f"reshard: --{flag} {path} cannot be written here (permission denied)"
    return None


def cmd_demo(args: argparse.Namespace) -> int:
    from .tools.demo import run_demo

    console = make_console(args.no_color)
    if args.mesh:
        return _demo_mesh(args, console)
    if len(args.shape) != 2:
        console.print(say("cli.error", args.lang, error=f"demo draws a matrix: --shape needs two sizes, got {len(args.shape)}"))
        return 2
    args.src, args.dst = placement(args.src or "row", "--src", 2), placement(args.dst or "col", "--dst", 2)
    bad = _off_the_matrix((args.src, args.dst))
    if bad is not None:
        console.print(say("cli.error", args.lang, error=f"{bad!r} does not exist for a matrix (use Shard(0) or Shard(1))"))
        return 2
    src = Shard(args.src.dim % 2) if isinstance(args.src, Shard) else args.src
    dst = Shard(args.dst.dim % 2) if isinstance(args.dst, Shard) else args.dst
    status = run_demo(args.ranks, args.shape, src, dst, args.dtype, args.engine, args.lang, console, args.timeout)
    from .viz.scenes import change_scene

    title = say("picture.title_demo", args.lang, rows=args.shape[0], cols=args.shape[1], ranks=args.ranks,
                src=repr(src), dst=repr(dst))
    _pictures(args, [change_scene(args.shape, args.ranks, src, dst, "redistribute", args.lang)], title, console)
    return status


def _off_the_matrix(placements: Sequence[object]) -> Shard | None:
    """The first Shard of a dim a matrix lacks (it has 0 and 1, or -2 and -1), or None."""
    return next((p for p in placements if isinstance(p, Shard) and p.dim not in (0, 1, -1, -2)), None)


def _demo_mesh(args: argparse.Namespace, console) -> int:
    import math

    from .planning.spec import layout_text
    from .tools.demo import run_demo_mesh

    if len(args.shape) != 2:
        console.print(say("cli.error", args.lang, error="demo draws a matrix: --shape needs two sizes"))
        return 2
    n = len(args.mesh)
    src = mesh_placements(args.src, "--src", n, 2) if args.src else (Shard(0),) + tuple(Shard(1) for _ in range(n - 1))
    dst = mesh_placements(args.dst, "--dst", n, 2) if args.dst else tuple(reversed(src))
    bad = _off_the_matrix((*src, *dst))
    if bad is not None:
        console.print(say("cli.error", args.lang, error=f"{bad!r} does not exist for a matrix (use Shard(0) or Shard(1))"))
        return 2
    # the pictures read each Shard's dim as given: count them from the front, as the world demo does
    src, dst = normalize_placements(src, 2), normalize_placements(dst, 2)
    args.ranks = math.prod(args.mesh)
    status, scene = run_demo_mesh(tuple(args.mesh), args.shape, src, dst, args.dtype, args.engine, args.lang, console,
                                  args.timeout)
    if scene is not None:
        placements = f"{layout_text(src)} -> {layout_text(dst)}"
        title = say("picture.title_mesh", args.lang, rows=args.shape[0], cols=args.shape[1],
                    mesh="x".join(map(str, args.mesh)), placements=placements)
        _pictures(args, [scene], title, console)
    return status


def _pictures(args: argparse.Namespace, scenes: list, title: str, console) -> None:
    """Write the PNG and HTML pictures asked for, and say where."""
    from .viz import pictures

    if args.png:
        note = pictures.draw_png(args.png, scenes, title, args.lang)
        console.print(say("cli.wrote", args.lang, path=args.png, what=say("cli.png", args.lang)))
        if note is not None:
            print(f"reshard: {note}", file=sys.stderr)
    if args.html:
        pictures.write_html(args.html, scenes, title, args.lang)
        console.print(say("cli.wrote", args.lang, path=args.html, what=say("cli.html", args.lang)))


def _explain_moe(args: argparse.Namespace) -> int:
    """``reshard explain --moe``: run a small dispatch and combine both ways, then say and draw it."""
    from .tools.explain_moe import run_explain_moe
    from .viz.moe_scenes import moe_scenes
    from .viz.terminal import render_explain_moe

    ranks = args.ranks if args.ranks is not None else 2 * args.hosts
    if ranks % args.hosts:
        raise ReshardError(f"--ranks {ranks} cannot be grouped into --hosts {args.hosts} of equal size")
    if args.top_k > ranks:
        raise ReshardError(f"--top-k {args.top_k} is more than the {ranks} experts (one per rank)")
    facts = run_explain_moe(ranks, args.hosts, args.top_k, args.engine, args.timeout)
    console = make_console(args.no_color)
    if args.json:
        print(json.dumps(facts, indent=2, ensure_ascii=False))
    else:
        render_explain_moe(console, facts, args.lang)
    scenes = moe_scenes(facts["ids"], [[tuple(r) for r in rows] for rows in facts["expert_rows"]], args.hosts,
                        lambda key, **kw: say(key, args.lang, **kw), args.lang)
    title = say("picture.title_moe", args.lang, what=say("moe.flat.title", args.lang).split(",")[0], ranks=ranks,
                hosts=args.hosts)
    _pictures(args, scenes, title, console if not args.json else make_console(True, stderr=True))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from .tools.explain import run_explain
    from .viz.terminal import render_explain

    if args.moe:
        return _explain_moe(args)
    if args.ranks is None:
        args.ranks = 3
    if len(args.shape) != 2:
        print(say("cli.error", args.lang, error="explain works on a matrix: --shape needs two sizes"), file=sys.stderr)
        return 2
    try:
        facts = run_explain(args.ranks, args.shape, args.engine, args.timeout, args.dtype)
    except InvalidArgument as exc:
        print(say("cli.error", args.lang, error=str(exc)), file=sys.stderr)
        return 2
    from .viz.scenes import FIVE, collective_scene

    console = make_console(args.no_color)
    if args.json:
        collectives = facts.pop("collectives")
        facts = {**facts, **collectives}
        print(json.dumps(facts, indent=2, ensure_ascii=False))
    else:
        render_explain(console, facts, args.lang)
    title = say("picture.title_explain", args.lang, rows=args.shape[0], cols=args.shape[1], ranks=args.ranks)
    scenes = [collective_scene(name, args.shape, args.ranks, args.lang) for name in FIVE]
    _pictures(args, scenes, title, console if not args.json else make_console(True, stderr=True))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .tools.doctor import collect, render

    report = collect(engine=args.engine, ranks=args.ranks, timeout=args.timeout)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(make_console(args.no_color), report)
    return 1 if report["problems"] else 0


def _bench_calibrate(args: argparse.Namespace) -> int:
    """The two-level cost model fitted on the hosts this job spans (every rank runs this)."""
    from .bench.calibrate import calibrate_job
    from .comm import init

    comm = init(engine=args.engine, timeout=args.timeout)
    try:
        result = calibrate_job(comm, repeats=max(3, args.iters or 9))
    except ValueError as exc:
        raise ReshardError(str(exc)) from exc
    finally:
        rank = comm.rank
        comm.close()
    if rank == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        lv = result["levels"]
        print(f"{result['hosts']} hosts x {result['ranks_per_host']} ranks: inside a host {lv['alpha_local'] * 1e6:.1f} us per "
              f"message and {1 / lv['beta_local'] / 1e9 if lv['beta_local'] else float('inf'):.3g} GB/s per rank; across "
              f"{lv['alpha_link'] * 1e6:.1f} us per message and {1 / lv['beta_link'] / 1e9 if lv['beta_link'] else float('inf'):.3g} "
              f"GB/s per host link; {lv['step'] * 1e6:.1f} us per exchange step")
    return 0


def _bench_overlap(args: argparse.Namespace, nbytes: int) -> int:
    from .bench.overlap import overlap_job, overlap_table, write_timeline
    from .launch import spawn

    if 8 % args.ranks:
        print("reshard bench --overlap: --ranks must be 1, 2, 4 or 8 (the MoE layer places 8 experts)", file=sys.stderr)
        return 2
    result = spawn(overlap_job, args.ranks, engine=args.engine or "gloo", args=(nbytes, max(1, args.iters or 3)),
                   timeout=args.timeout)[0]
    result["engine"] = args.engine or "gloo"
    print(overlap_table(result))
    if args.timeline:
        write_timeline(args.timeline, result["moe"], f"{args.ranks} local {result['engine']} ranks")
        print(f"wrote {args.timeline} (PNG picture: one MoE step's timeline)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    try:
        sizes = bench.parse_sizes(args.sizes, args.factor)
    except (ValueError, IndexError) as exc:
        print(f"reshard bench: cannot read --sizes {args.sizes!r}: {exc}", file=sys.stderr)
        return 2
    if args.timeline and not args.overlap:
        print("reshard bench: --timeline draws the MoE step of --overlap; give both", file=sys.stderr)
        return 2
    if args.overlap:
        return _bench_overlap(args, sizes[0])
    if args.calibrate:
        return _bench_calibrate(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.mesh:
        if not (args.src and args.dst):
            print("reshard bench: --mesh needs --src and --dst, one placement per mesh dim", file=sys.stderr)
            return 2
        import math

        for text, option in ((args.src, "--src"), (args.dst, "--dst")):  # refused here, before any rank starts
            if _off_the_matrix(mesh_placements(text, option, len(args.mesh), 2)) is not None:
                print(f"reshard bench: {option} {text}: the benchmark's matrix has dims 0 and 1: use Shard(0) or Shard(1)",
                      file=sys.stderr)
                return 2
        args.ranks = math.prod(args.mesh)
    unknown = [m for m in methods if m not in BENCH_METHODS_ALL]
    if unknown or not methods:
        what = f"unknown method(s) {', '.join(unknown)}" if unknown else "--methods names no method"
        print(f"reshard bench: {what}; choose from {', '.join(BENCH_METHODS_ALL)}", file=sys.stderr)
        return 2
    mesh = tuple(args.mesh) if args.mesh else None
    skipped = {m: why for m in methods if (why := bench.method_unavailable(m, args.op, args.engine, args.ranks, mesh))}
    if args.methods != ",".join(BENCH_METHODS):  # the default set drops what does not apply without a word
        for m, why in skipped.items():
            print(f"reshard bench: --methods {m} is not timed here: {why}", file=sys.stderr)
    if len(skipped) == len(methods):
        print("reshard bench: none of --methods can be timed here", file=sys.stderr)
        return 2
    if args.op == "moe" and 8 % args.ranks:
        print("reshard bench: --op moe places 8 experts, so --ranks must be 1, 2, 4 or 8", file=sys.stderr)
        return 2
    console = make_console(args.no_color)
    if not console.is_terminal:
        console.width = 160  # a log or a pipe: keep every column whole
    rows = bench.run_bench(args.engine, args.ranks, args.op, sizes, args.dtype, methods, args.iters, args.warmup,
                           args.timeout, show_progress=console.is_terminal, numpy_arrays=args.numpy,
                           mesh=args.mesh, src=args.src, dst=args.dst)
    op = f"redistribute {args.src} -> {args.dst} on mesh {'x'.join(map(str, args.mesh))}" if args.mesh else args.op
    bench.render(console, rows, args.engine, args.ranks, op)
    meta = {"engine": args.engine, "ranks": args.ranks, "op": op, "dtype": args.dtype, "command": sys.argv}
    if args.json:
        bench.write_json(args.json, rows, meta)
    if args.plot:
        bench.plot(args.plot, rows, f"{args.op}, {args.ranks} ranks, {args.engine}")
    return 1 if any(r.wrong for r in rows) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = _unwritable_output(args) or (None if args.command == "doctor" else _missing_extra(args))
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    try:
        return {"demo": cmd_demo, "plan": cmd_plan, "explain": cmd_explain, "bench": cmd_bench,
                "doctor": cmd_doctor}[args.command](args)
    except ReshardError as exc:
        print(say("cli.error", getattr(args, "lang", "en"), error=exc), file=sys.stderr)
        return 2
    except BrokenPipeError:  # `reshard plan --json | head` is fine
        sys.stderr.close()
        return 0



if __name__ == "__main__":
    sys.exit(main())
