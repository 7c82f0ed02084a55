"""Pictures of layouts: blocks A00... coloured by the rank holding them.

Two renderings share one geometry: a PNG (matplotlib) and a self-contained HTML page (no
network resources) whose blocks move from their source rank's box to their destination's.
"""

from __future__ import annotations

import html
import json

from ..layout import Partial, Placement, Replicate, Shard
from .blocks import block_name, blocks, holders, moves

PALETTE = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
CELL = 56  # px per block in the HTML page
BOX_GAP = 40
MARGIN_X, MARGIN_Y = 20, 90


def rank_colour(rank: int) -> str:
    return PALETTE[rank % len(PALETTE)]


def position(n: int, rank: int, i: int, j: int) -> tuple[int, int]:
    """Top-left pixel of block (i, j) drawn inside rank ``rank``'s box."""
    return MARGIN_X + rank * (n * CELL + BOX_GAP) + j * CELL, MARGIN_Y + i * CELL


def page_size(n: int) -> tuple[int, int]:
    return MARGIN_X * 2 + n * (n * CELL + BOX_GAP), MARGIN_Y + n * CELL + 60


def write_html(path: str, shape: tuple[int, int], n: int, src: Placement, dst: Placement, title: str) -> None:
    """A self-contained page: blocks start in their source rank's box and move to their destination's."""
    width, height = page_size(n)
    items = []
    for k, m in enumerate(moves(shape, n, src, dst)):
        x0, y0 = position(n, m["src"], m["i"], m["j"])
        x1, y1 = position(n, m["dst"], m["i"], m["j"])
        items.append({"id": k, "name": m["name"], "from": [x0, y0, rank_colour(m["src"])], "to": [x1, y1, rank_colour(m["dst"])]})
    boxes = "".join(
        f'<div class="box" style="left:{MARGIN_X + r * (n * CELL + BOX_GAP) - 4}px;top:{MARGIN_Y - 4}px;'
        f'width:{n * CELL + 8}px;height:{n * CELL + 8}px"></div>'
        f'<div class="label" style="left:{MARGIN_X + r * (n * CELL + BOX_GAP)}px;top:{MARGIN_Y - 30}px;color:{rank_colour(r)}">rank {r}</div>'
        for r in range(n)
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ margin:0; font-family: sans-serif; background:#fff; width:{width}px; height:{height}px; position:relative; }}
h1 {{ font-size:16px; margin:0; position:absolute; left:{MARGIN_X}px; top:12px; }}
#stage {{ position:absolute; left:{MARGIN_X}px; top:36px; font-size:13px; color:#444; }}
.box {{ position:absolute; border:2px dashed #bbb; border-radius:6px; }}
.label {{ position:absolute; font-weight:bold; font-size:14px; }}
.blk {{ position:absolute; width:{CELL - 6}px; height:{CELL - 6}px; border-radius:4px; color:#fff;
        font: bold 14px monospace; display:flex; align-items:center; justify-content:center; }}
</style></head>
<body><h1>{html.escape(title)}</h1><div id="stage">before: {html.escape(repr(src))}</div>{boxes}
<script>
const items = {json.dumps(items)};
const final = {json.dumps(repr(dst))};
for (const it of items) {{
  const d = document.createElement("div");
  d.className = "blk"; d.id = "b" + it.id; d.textContent = it.name;
  d.style.left = it.from[0] + "px"; d.style.top = it.from[1] + "px"; d.style.backgroundColor = it.from[2];
  document.body.appendChild(d);
}}
// Timer-driven frames (not CSS transitions) so a headless browser with virtual time always
// reaches the same final frame.
function hex(c) {{ return [1, 3, 5].map(k => parseInt(c.slice(k, k + 2), 16)); }}
function frame(t) {{
  const e = t * t * (3 - 2 * t);
  for (const it of items) {{
    const d = document.getElementById("b" + it.id);
    d.style.left = (it.from[0] + (it.to[0] - it.from[0]) * e) + "px";
    d.style.top = (it.from[1] + (it.to[1] - it.from[1]) * e) + "px";
    const a = hex(it.from[2]), b = hex(it.to[2]);
    d.style.backgroundColor = t >= 1 ? it.to[2] : "rgb(" + a.map((v, k) => Math.round(v + (b[k] - v) * e)).join(",") + ")";
  }}
  if (t >= 1) document.getElementById("stage").textContent = "after: " + final;
}}
const FRAMES = 40;
function play(k) {{ frame(k / FRAMES); if (k < FRAMES) setTimeout(() => play(k + 1), 30); }}
if (location.hash === "#final") frame(1); else setTimeout(() => play(1), 800);
</script></body></html>
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)


def draw_png(path: str, shape: tuple[int, int], n: int, panels: list[tuple[str, Placement]], title: str) -> None:
    """One panel per (caption, placement): each rank's box with the blocks it holds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(len(panels), 1, figsize=(1.2 + 1.1 * n * n, 1.0 + 1.6 * n * len(panels) / 2), squeeze=False)
    for ax, (caption, placement) in zip(axes[:, 0], panels):
        for r in range(n):
            ox = r * (n + 1)
            ax.add_patch(Rectangle((ox - 0.1, -0.1), n + 0.2, n + 0.2, fill=False, ls="--", ec="#bbbbbb"))
            ax.text(ox + n / 2, -0.35, f"rank {r}", ha="center", va="bottom", color=rank_colour(r), fontweight="bold")
        for i, j in blocks(shape, n):
            for r in holders(placement, i, j, n):
                ox = r * (n + 1)
                face = rank_colour(r)
                hatch = "//" if isinstance(placement, Partial) else None
                ax.add_patch(Rectangle((ox + j + 0.05, i + 0.05), 0.9, 0.9, fc=face, ec="white", hatch=hatch))
                ax.text(ox + j + 0.5, i + 0.5, block_name(i, j, n), ha="center", va="center", color="white", fontsize=9, fontweight="bold")
        ax.set_xlim(-0.5, n * (n + 1))
        ax.set_ylim(n + 0.3, -0.9)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(caption, loc="left", fontsize=11)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def placement_caption(p: Placement) -> str:
    if isinstance(p, Shard):
        return f"{'row' if p.dim % 2 == 0 else 'column'}-sharded ({p!r})"
    if isinstance(p, Replicate):
        return "replicated (Replicate())"
    return f"partial ({p!r})"
