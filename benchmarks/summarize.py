"""Markdown tables from `reshard bench --json` files: the tables page of the performance docs.

    python benchmarks/summarize.py benchmarks/results/*.json > docs/performance-tables.md
"""

from __future__ import annotations

import json
import sys

from reshard.viz import human_bytes as human


def _ratio(entry: dict, key: str) -> str:
    return f"{entry[key]:.2f}x" if key in entry else "-"


def targets_table(data: dict) -> str:
    lines = [f"**targets, {data['engine']}** (`python benchmarks/targets.py --engine {data['engine']}`)", "",
             "| target | where | measured | limit | met | bare call | the table behind it |",
             "|---|---|---|---|---|---|---|"]
    for t in data["targets"]:
        sign = "<=" if t["at_most"] else ">="
        verdict = "yes" if t["met"] else "no" if t.get("reachable", True) else "no (out of reach)"
        bound = "-" if t.get("bound") is None else f"{t['bound']:.2f}{t['unit']}"
        lines.append(f"| {t['goal']} | {t['where']} | {t['measured']:.2f}{t['unit']} | {sign} {t['limit']:.2f}{t['unit']} | "
                     f"{verdict} | {bound} | `{t['command']}` |")
    return "\n".join(lines) + "\n"


def table(path: str) -> str | None:
    """The file's table, or None for a file of another script (its own page has its table)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        return None
    if "targets" in data:
        return targets_table(data)
    if not {"meta", "rows", "ratios"} <= data.keys():
        return None
    meta, rows = data["meta"], data["rows"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    command = " ".join(["reshard", *meta["command"][1:]])  # whatever path the program was run by
    lines = [f"**{meta['op']}, {meta['ranks']} ranks, {meta['engine']}** (`{command}`)", ""]
    counted = any(r.get("sent_bytes", -1) >= 0 for r in rows)
    lines.append("| size | " + " | ".join(f"{m} (us)" for m in methods) + " | reshard / raw | reshard-nocheck / raw | "
                 "dtensor / reshard | reshard / memcpy | #wrong | extra mem |"
                 + (" sent per rank: " + ", ".join(methods) + " |" if counted else ""))
    lines.append("|" + "---|" * (len(methods) + 7 + counted))
    for entry in data["ratios"]:
        size = entry["size"]
        at = {r["method"]: r for r in rows if r["size"] == size}
        cells = [f"{at[m]['time_us']:,.0f}" for m in methods]
        dt = f"{entry['dtensor speedup']:.1f}x" if "dtensor speedup" in entry else "-"
        wrong = sum(r["wrong"] for r in at.values())
        extra = at.get("reshard", {}).get("extra_bytes", -1)
        sent = (" " + ", ".join(human(at[m]["sent_bytes"]) for m in methods) + " |") if counted else ""
        lines.append(f"| {human(size)} | " + " | ".join(cells) + f" | {_ratio(entry, 'reshard / raw')} | "
                     f"{_ratio(entry, 'reshard-nocheck / raw')} | {dt} | {_ratio(entry, 'reshard / memcpy')} | {wrong} | "
                     f"{human(extra) if extra >= 0 else '-'} |" + sent)
    return "\n".join(lines) + "\n"


HEADER = """# Tables of this machine

Written by `bash benchmarks/run_all.sh` (each table names the command that made it); see
[the method](performance.md) for what the columns mean. Machine: 2 cores, 24 GiB, no GPU;
torch 2.13.0 (CPU), gloo over loopback; mpi4py 4.1.2 with Open MPI 5.0.11 (shared memory).
3 and 4 ranks oversubscribe the cores, so two runs differ by 10-30%.
"""


if __name__ == "__main__":
    print(HEADER)
    print("\n".join(t for t in map(table, sys.argv[1:]) if t is not None))
