"""``reshard bench``, the report: ratios against the baselines, the table, JSON and the plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..viz.text import human_bytes as human


@dataclass
class Row:
    size: int  # bytes per rank (the local shard; for moe, the tokens)
    count: int  # elements per rank
    dtype: str
    method: str
    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int
    extra_bytes: int = -1  # memory an op allocated beyond its result (max over ranks); -1 unknown
    samples: list[float] = field(default_factory=list)
    sent_bytes: int = -1  # bytes the busiest rank sent (mesh runs); -1 not counted


def ratios(rows: list[Row]) -> list[dict[str, Any]]:
    """Per size: reshard against each baseline (time ratios; < 1 means reshard is faster)."""
    out = []
    for size in sorted({r.size for r in rows}):
        t = {r.method: r.time_us for r in rows if r.size == size}
        entry: dict[str, Any] = {"size": size}
        for ours in ("reshard", "reshard-nocheck"):
            if ours not in t:
                continue
            for base in ("raw", "raw+pack", "raw+round", "raw+local", "dtensor", "memcpy"):
                if base in t:
                    entry[f"{ours} / {base}"] = t[ours] / t[base]
        if "dtensor" in t and "reshard" in t:
            entry["dtensor speedup"] = t["dtensor"] / t["reshard"]
        out.append(entry)
    return out


def render(console: Any, rows: list[Row], engine: str, ranks: int, op: str) -> None:
    from rich.table import Table

    title = f"reshard bench: {op} on {ranks} ranks ({engine}); median of interleaved runs, time = slowest rank"
    table = Table(title=title, title_justify="left")
    counted = any(r.sent_bytes >= 0 for r in rows)
    for col in ("size", "count", "type", "method", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong", "extra mem",
                *(("sent / rank",) if counted else ())):
        table.add_column(col, justify="right" if col not in ("type", "method") else "left")
    last = None
    for r in rows:
        if last is not None and r.size != last:
            table.add_section()
        last = r.size
        extra = "-" if r.extra_bytes < 0 else human(r.extra_bytes)
        table.add_row(human(r.size), str(r.count), r.dtype, r.method, f"{r.time_us:,.1f}", f"{r.algbw:.2f}",
                      f"{r.busbw:.2f}", str(r.wrong), extra,
                      *(("-" if r.sent_bytes < 0 else human(r.sent_bytes),) if counted else ()))
    console.print(table)
    entries = ratios(rows)
    keys = sorted({k for e in entries for k in e if k != "size"})
    if keys:  # none where no reshard row, or nothing beside it, was timed
        summary = Table(title="ratios (time / time; below 1 = reshard faster)", title_justify="left")
        summary.add_column("size", justify="right")
        for k in keys:
            summary.add_column(k, justify="right")
        for e in entries:
            summary.add_row(human(e["size"]), *[f"{e[k]:.2f}x" if k in e else "-" for k in keys])
        console.print(summary)
    if any(r.wrong for r in rows):
        console.print("[bold red]Some results were wrong: see #wrong.[/]")


def write_json(path: str, rows: list[Row], meta: dict) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows], "ratios": ratios(rows)}, f, indent=1)


def plot(path: str, rows: list[Row], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for method in dict.fromkeys(r.method for r in rows):
        pts = [(r.size, r.busbw) for r in rows if r.method == method]
        style = "--" if method == "memcpy" else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # the memcpy floor sits an order of magnitude above the exchanges
    sizes = sorted({r.size for r in rows})
    ax.set_xticks(sizes, [human(v).replace(" ", "").replace("iB", "") for v in sizes])
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("busbw (GB/s, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
