"""A pipelined MoE step as a timeline (PNG, matplotlib): per rank, three lanes (the dispatches,
the expert passes, the combines), each part's bar in its own colour, so what overlapped what is
seen at a glance. Drawn from the records ``rs.moe.pipeline(..., timeline=)`` appends, gathered
from every rank (``reshard.bench.overlap.moe_layer_job``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .pictures import PALETTE

KIND_WORDS = {"dispatch": "dispatch", "experts": "experts", "combine": "combine"}


def draw_timeline(path: str, ranks: Sequence[Sequence[Sequence[float]]], kinds: Sequence[str], title: str) -> None:
    """``ranks[r]``: rows ``(kind index, part, start s, end s)`` of rank r, times from the step's
    start on that rank (every rank starts the step after the same barrier)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes = len(kinds)
    parts = 1 + max((int(row[1]) for rows in ranks for row in rows), default=0)
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.42 * lanes * len(ranks)))
    labels, ticks = [], []
    for r, rows in enumerate(ranks):
        for row in rows:
            kind, part, start, end = int(row[0]), int(row[1]), float(row[2]), float(row[3])
            y = (len(ranks) - 1 - r) * (lanes + 1) + (lanes - 1 - kind)
            ax.broken_barh([(start, max(end - start, 1e-4))], (y + 0.1, 0.8), facecolors=PALETTE[part % len(PALETTE)],
                           edgecolors="#222222", linewidth=0.5)
            if end - start > 0:
                ax.text((start + end) / 2, y + 0.5, str(part + 1), ha="center", va="center", fontsize=8, color="white")
        for kind, name in enumerate(kinds):
            ticks.append((len(ranks) - 1 - r) * (lanes + 1) + (lanes - 1 - kind) + 0.5)
            labels.append(f"rank {r} {KIND_WORDS.get(name, name)}")
    ax.set_yticks(ticks, labels, fontsize=9)
    ax.set_xlabel("seconds from the step's start")
    ax.set_ylim(-0.5, len(ranks) * (lanes + 1) - 0.5)
    ax.grid(axis="x", color="#dddddd")
    ax.set_axisbelow(True)
    ax.legend(handles=[Patch(fc=PALETTE[p % len(PALETTE)], ec="#222222", label=f"part {p + 1}") for p in range(parts)],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.4 / len(ranks)), ncol=min(parts, 8), frameon=False)
    ax.set_title(title, loc="left", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
