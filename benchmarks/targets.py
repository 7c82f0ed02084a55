"""The performance scorecard: each target measured in one command per engine, next to the
``reshard bench`` command that shows the full table behind it.

    python benchmarks/targets.py --engine gloo [--json FILE] [--no-color]


Every figure comes from ``bench.run_bench`` (interleaved methods, slowest rank, median), so a
line here and the table of its command agree up to the machine's run-to-run noise. Start-up is
timed as a user sees it: a fresh ``python -m reshard demo`` / ``plan`` process.

Where a baseline of the same run says how far the machine itself lets a target go, the line
carries that ``bound``: the figure a reshard costing nothing of its own would get (the bare
engine call, after the check's one small all-gather where the target has the check on; for
MoE, the bare exchanges plus the row gather and weighted sum written by hand). A target whose
bound misses its limit is out of reach on this machine, whatever reshard does.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from reshard import bench

MiB = 1 << 20


@dataclass
class Target:
    goal: str  # what the target measures
    where: str  # ranks and size
    measured: float
    limit: float
    unit: str  # "x" (a ratio), "ms" or "s"
    at_most: bool  # measured <= limit (else >=)
    command: str  # the command whose table shows this figure
    bound: float | None = None  # the figure of a reshard that cost nothing of its own (None: not measured)

    def _within(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit

    @property
    def met(self) -> bool:
        return self._within(self.measured)

    @property
    def reachable(self) -> bool:
        """False when even the bare engine call (the bound) misses the limit on this machine."""
        return self.bound is None or self._within(self.bound)


def _row(rows: list[bench.Row], size: int, method: str) -> bench.Row:
    return next(r for r in rows if r.size == size and r.method == method)


def _time(rows: list[bench.Row], size: int, method: str) -> float:
    return _row(rows, size, method).time_us


def _command(engine: str, ranks: int, op: str, sizes: list[int], methods: list[str]) -> str:
    listed = ",".join(bench.human(s).replace(" ", "").replace("iB", "") for s in sizes)
    return f"reshard bench --engine {engine} --ranks {ranks} --op {op} --sizes {listed} --methods {','.join(methods)}"


def _memory(rows: list[bench.Row], ranks: int, size: int, command: str) -> Target:
    extra = _row(rows, size, "reshard").extra_bytes
    return Target("peak extra memory per rank <= one shard", f"{ranks} ranks, {bench.human(size)}",
                  extra / size, 1.0, "x", True, command)


def _startup(seconds: Callable[[list[str]], float]) -> list[Target]:
    demo = seconds(["demo"])
    plan = seconds(["plan", "--shape", "4096x4096", "--ranks", "64"])
    return [Target("start-up: `reshard demo` (3 ranks, gloo)", "fresh process", demo, 4.0, "s", True, "reshard demo"),
            Target("start-up: `reshard plan`", "fresh process", plan, 0.5, "s", True,
                   "reshard plan --shape 4096x4096 --ranks 64")]


def _wall_seconds(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "reshard", *args, "--no-color"] if args[0] == "demo"
                   else [sys.executable, "-m", "reshard", *args], check=True, capture_output=True)
    return time.perf_counter() - start


def measure(engine: str, ranks_list: tuple[int, ...] = (2, 3, 4), progress: Callable[[str], None] = print,
            startup: Callable[[list[str]], float] | None = None) -> list[Target]:
    """Run every measurement the engine's targets need; return one Target per promise and place.
    ``startup(args)`` times ``reshard <args>`` (default: a fresh process, wall clock)."""
    out: list[Target] = []

    def run(ranks: int, op: str, sizes: list[int], methods: list[str]) -> tuple[list[bench.Row], str]:
        command = _command(engine, ranks, op, sizes, methods)
        progress(command)
        rows = bench.run_bench(engine, ranks, op, sizes, "float32", methods, show_progress=False)
        wrong = sum(r.wrong for r in rows)
        if wrong:
            raise RuntimeError(f"{command}: {wrong} wrong elements; no timing of a wrong result counts")
        return rows, command

    if engine == "gloo":
        for n in ranks_list:
            methods = ["reshard", "reshard-nocheck", "raw", "raw+round"] + (["dtensor"] if n >= 3 else [])
            rows, command = run(n, "redistribute", [MiB, 16 * MiB], methods)
            where = f"{n} ranks"
            raw = _time(rows, 16 * MiB, "raw")
            out.append(Target("redistribute / bare all_to_all_single, check off", f"{where}, 1 MiB",
                              _time(rows, MiB, "reshard-nocheck") / _time(rows, MiB, "raw"), 1.15, "x", True, command))
            out.append(Target("redistribute / bare all_to_all_single, check on", f"{where}, 16 MiB",
                              _time(rows, 16 * MiB, "reshard") / raw, 1.15, "x", True, command,
                              bound=_time(rows, 16 * MiB, "raw+round") / raw))
            if n >= 3:
                dtensor = _time(rows, 16 * MiB, "dtensor")
                out.append(Target("DTensor redistribute / reshard (speed-up)", f"{where}, 16 MiB",
                                  dtensor / _time(rows, 16 * MiB, "reshard"), 5.0, "x", False, command,
                                  bound=dtensor / raw))
            out.append(_memory(rows, n, 16 * MiB, command))
        out.extend(_startup(startup or _wall_seconds))
    else:
        for n in ranks_list:
            sizes = ([64 * 1024] if n == 4 else []) + [16 * MiB, 64 * MiB]
            methods = ["reshard", "raw", "memcpy"] + (["raw+round"] if n == 4 else [])
            rows, command = run(n, "redistribute", sizes, methods)
            for size in (16 * MiB, 64 * MiB):
                floor = _time(rows, size, "memcpy")
                out.append(Target("redistribute / concurrent memcpy floor", f"{n} ranks, {bench.human(size)}",
                                  _time(rows, size, "reshard") / floor, 1.5, "x", True, command,
                                  bound=_time(rows, size, "raw") / floor))
            if n == 4:
                out.append(Target("latency of a checked redistribute", "4 ranks, 64 KiB",
                                  _time(rows, 64 * 1024, "reshard") / 1000, 0.15, "ms", True, command,
                                  bound=_time(rows, 64 * 1024, "raw+round") / 1000))
            out.append(_memory(rows, n, 64 * MiB, command))
    rows, command = run(4, "moe", [16 * MiB], ["reshard", "raw", "raw+local"])
    raw = _time(rows, 16 * MiB, "raw")
    out.append(Target("MoE dispatch + combine / the two bare exchanges", "4 ranks, 16 MiB of tokens",
                      _time(rows, 16 * MiB, "reshard") / raw, 1.3, "x", True, command,
                      bound=_time(rows, 16 * MiB, "raw+local") / raw))
    return out


def render(console: Any, engine: str, targets: list[Target]) -> None:
    from rich.table import Table

    table = Table(title=f"performance targets on this machine ({engine}); each line's table: its command",
                  title_justify="left")
    for col in ("target", "where", "measured", "limit", "met", "bare call", "command"):
        table.add_column(col, justify="right" if col in ("measured", "limit", "bare call") else "left",
                         overflow="fold")
    for t in targets:
        sign = "<=" if t.at_most else ">="
        fmt = "{:.2f}"
        verdict = "[green]yes[/]" if t.met else "[red]no[/]" if t.reachable else "[red]no[/] (out of reach)"
        bound = "-" if t.bound is None else fmt.format(t.bound) + t.unit
        table.add_row(t.goal, t.where, fmt.format(t.measured) + t.unit, f"{sign} {fmt.format(t.limit)}{t.unit}",
                      verdict, bound, t.command)
    console.print(table)
    console.print(summary(targets))
    console.print("[dim]bare call: the figure of a reshard that cost nothing of its own (the engine's bare call, "
                  "after the check's 16-byte all-reduce where the check is on; for MoE the bare exchanges plus the "
                  "row gather and weighted sum by hand); out of reach: that misses the limit too[/]")


def summary(targets: list[Target]) -> str:
    met = sum(t.met for t in targets)
    beyond = sum(not t.reachable for t in targets)
    return f"{met} of {len(targets)} met; {beyond} out of reach on this machine (the bare engine call misses them too)"


def as_json(targets: list[Target]) -> list[dict]:
    return [dict(asdict(t), met=t.met, reachable=t.reachable) for t in targets]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from rich.console import Console

    parser = argparse.ArgumentParser(description="Measure reshard's performance targets on one engine.")
    parser.add_argument("--engine", choices=("gloo", "mpi"), default="gloo", help="the engine to measure")
    parser.add_argument("--json", help="also write the targets to this JSON file")
    parser.add_argument("--no-color", action="store_true", help="plain text, no colour")
    args = parser.parse_args(argv)
    console = Console(no_color=args.no_color, highlight=False)
    if not console.is_terminal:
        console.width = 200
    found = measure(args.engine, progress=lambda command: console.print(f"[dim]running: {command}[/]"))
    render(console, args.engine, found)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"engine": args.engine, "targets": as_json(found)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
