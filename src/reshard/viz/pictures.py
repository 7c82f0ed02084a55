"""Pictures of layouts and exchanges: blocks A00... in each rank's box, coloured by the rank
their values came from (``scenes``). A PNG (matplotlib) shows each scene before and after; a
self-contained HTML page (no network resources) plays each one, with a caption, step and
replay controls (buttons and keys), and a final view at ``#final`` (or ``#NAME/final``).
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Sequence
from typing import Any

from ..messages import say
from .scenes import Cell, Scene

PALETTE = ["#d62728", "#2ca02c", "#1f77b4", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
CELL = 56  # px per block in the HTML page
BOX_GAP = 40
MARGIN_X, MARGIN_Y = 20, 172  # the title, caption (two lines), controls and legend sit above the boxes


# The words of the pictures themselves (captions come with the scenes), by language.
WORDS = {
    "en": {"before": "before", "after": "after", "previous": "previous", "play": "play", "step": "step",
           "replay": "replay", "next": "next", "keys": "keys: \u2190 \u2192 scenes, space step, r replay",
           "scene": "scene {k} of {n}", "pre": "before the exchange",
           "post": "after the exchange ({m} block copies travelled)", "moving": "moving: {m} block copies",
           "nothing": "nothing (None)"},
    "ko": {"before": "이전", "after": "이후", "previous": "이전 장면", "play": "재생", "step": "한 단계",
           "replay": "다시", "next": "다음 장면", "keys": "키: \u2190 \u2192 장면, space 한 단계, r 다시",
           "scene": "장면 {k} / {n}", "pre": "교환 전", "post": "교환 후 (블록 사본 {m}개 이동)",
           "moving": "이동 중: 블록 사본 {m}개", "nothing": "없음 (None)"},
}


def rank_colour(rank: int) -> str:
    return PALETTE[rank % len(PALETTE)]


LABEL_GAP = 44  # px from a row of boxes to the next row's boxes, their labels between


def box_origin(n: int, rank: int, grid: tuple[int, int] | None = None, boxes: tuple[int, int] | None = None
               ) -> tuple[int, int]:
    """Top-left pixel of rank ``rank``'s box (``grid``: blocks per box; ``boxes``: the boxes'
    rows and columns, one row of ``n`` by default)."""
    rows, cols = grid or (n, n)
    down, across = divmod(rank, (boxes or (1, n))[1])
    return MARGIN_X + across * (cols * CELL + BOX_GAP), MARGIN_Y + down * (rows * CELL + LABEL_GAP)


def position(n: int, rank: int, i: int, j: int, grid: tuple[int, int] | None = None,
             boxes: tuple[int, int] | None = None) -> tuple[int, int]:
    """Top-left pixel of block (i, j) drawn inside rank ``rank``'s box."""
    x, y = box_origin(n, rank, grid, boxes)
    return x + j * CELL, y + i * CELL


def page_size(n: int, grid: tuple[int, int] | None = None, boxes: tuple[int, int] | None = None) -> tuple[int, int]:
    rows, cols = grid or (n, n)
    down, across = boxes or (1, n)
    return (max(MARGIN_X * 2 + across * (cols * CELL + BOX_GAP), 760),
            MARGIN_Y + down * (rows * CELL + LABEL_GAP) - LABEL_GAP + 40)


# -- PNG -------------------------------------------------------------------------------------

KOREAN_FONTS = ("Noto Sans CJK KR", "NanumGothic")  # Debian's fonts-noto-cjk; the one koreanize-matplotlib ships
KOREAN_FONT_PACKAGE = "koreanize_matplotlib"  # in reshard's [plot] extra: it carries Nanum Gothic


def korean_fonts() -> list[str]:
    """The fonts with Hangul that matplotlib can draw with: those installed on the system, else
    the Nanum Gothic that koreanize-matplotlib ships (added to matplotlib's list, not imported:
    importing that package changes matplotlib's default font for the whole process)."""
    import importlib.util
    import os

    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    found = [f for f in KOREAN_FONTS if f in installed]
    if found:
        return found
    spec = importlib.util.find_spec(KOREAN_FONT_PACKAGE)  # finds the folder without running the package
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        faces = [os.path.join(folder, "fonts", name) for name in ("NanumGothic.ttf", "NanumGothicBold.ttf")]
        if os.path.exists(faces[0]):
            for face in faces:  # the regular face and the bold one (titles and labels are bold)
                if os.path.exists(face):
                    font_manager.fontManager.addfont(face)
            return ["NanumGothic"]
    return []


def draw_png(path: str, scenes: Sequence[Scene], title: str, lang: str = "en") -> str | None:
    """Each scene as a row: its title, the boxes before, the boxes after; a legend below.
    Returns a note for the user, in ``lang``, where the picture could not be drawn as asked
    (Korean text without a font for it), else None."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # matplotlib falls back along the list glyph by glyph: Latin from DejaVu, Hangul from the next
    korean = korean_fonts() if lang == "ko" else []
    plt.rcParams["font.family"] = ["DejaVu Sans", *korean]
    note = say("picture.no_korean_font", lang) if lang == "ko" and not korean else None
    # Nanum Gothic's bold face says it weighs 600, not 700: matplotlib takes it, with a log line each time
    fonts_log = logging.getLogger("matplotlib.font_manager")
    level = fonts_log.level
    fonts_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            if note is not None:  # one note, not matplotlib's warning for every glyph it lacks
                warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
            _draw_scenes(plt, path, scenes, title, lang)
    finally:
        fonts_log.setLevel(level)
    return note


def _draw_scenes(plt: Any, path: str, scenes: Sequence[Scene], title: str, lang: str) -> None:
    n = scenes[0].n
    rows, cols = scenes[0].shape
    down, across = scenes[0].boxes or (1, n)
    height = 1.4 + (0.9 + 0.8 * down * (rows + 1.4)) * len(scenes)  # inches; the legend takes about the last 0.8
    fig, axes = plt.subplots(len(scenes), 2, figsize=(2 * (0.6 + 0.8 * across * (cols + 1)), height), squeeze=False)
    for row, scene in zip(axes, scenes):
        for ax, (when, cells) in zip(row, (("before", scene.before), ("after", scene.after))):
            _draw_boxes(ax, scene, cells, lang)
            said = WORDS.get(lang, WORDS["en"])[when]
            ax.set_title(f"{scene.title}: {said}" if when == "before" else said, loc="left", fontsize=13,
                         fontweight="bold" if when == "before" else "normal")
    fig.legend(handles=legend_entries(scenes, lang), loc="lower center", ncol=min(n + 2, 4), fontsize=11, frameon=False)
    fig.suptitle(title, fontsize=14)
    fig.tight_layout(rect=(0, 0.85 / height, 1, 1 - 0.35 / height))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def legend_entries(scenes: Sequence[Scene], lang: str = "en") -> list:
    """The legend's swatches: one per rank (a solid block takes the colour of the rank its values
    came from), and one for each other style a scene draws, looking as it is drawn."""
    from matplotlib.patches import Patch

    handles = [Patch(fc=rank_colour(r), label=say("picture.values", lang, rank=r)) for r in range(scenes[0].n)]
    words = dict(w for scene in scenes for w in scene.legend())
    if "partial" in words:
        handles.append(Patch(fc="white", ec=rank_colour(0), hatch="////", lw=1.5, label=words["partial"]))
    if "sum" in words:
        handles.append(Patch(fc=rank_colour(0), ec="#222222", hatch="||", label=words["sum"]))
    return handles


def _draw_boxes(ax, scene: Scene, cells: dict[int, list[Cell]], lang: str = "en") -> None:
    from matplotlib.patches import Rectangle

    n = scene.n
    rows, cols = scene.shape
    down, across = scene.boxes or (1, n)
    ys, xs = scene.edges()
    pitch = rows + 1.4  # a box and the label of the one below
    for r in range(n):
        box_row, box_col = scene.box_at(r)
        ox, oy = box_col * (cols + 1), box_row * pitch
        ax.add_patch(Rectangle((ox - 0.1, oy - 0.1), cols + 0.2, rows + 0.2, fill=False, ls="--", ec="#bbbbbb"))
        ax.text(ox + cols / 2, oy - 0.3, scene.label(r), ha="center", va="bottom", color=rank_colour(r),
                fontweight="bold", fontsize=12)
        if r not in cells:
            ax.text(ox + cols / 2, oy + rows / 2, say("picture.nothing", lang), ha="center", va="center", color="#888888",
                    fontsize=11)
            continue
        for c in cells[r]:
            x, y = ox + xs[c.j] + 0.05, oy + ys[c.i] + 0.05
            w, h = xs[c.j + 1] - xs[c.j] - 0.1, ys[c.i + 1] - ys[c.i] - 0.1
            cx, cy = x + w / 2, y + h / 2
            name = scene.cell_name(c)
            if c.style == "sum":
                width = w / len(c.sources)
                for k, s in enumerate(c.sources):
                    ax.add_patch(Rectangle((x + k * width, y), width, h, fc=rank_colour(s), ec="none"))
                label, box = "Σ" + name, {"boxstyle": "round,pad=0.15", "fc": "#222222", "ec": "none"}
                ax.text(cx, cy, label, ha="center", va="center", color="white", fontsize=10,
                        fontweight="bold", bbox=box, zorder=5)
            elif c.style == "partial":
                ax.add_patch(Rectangle((x, y), w, h, fc="white", ec=rank_colour(c.colour_rank), hatch="////", lw=1.5))
                ax.text(cx, cy, name, ha="center", va="center", color=rank_colour(c.colour_rank), fontsize=10,
                        fontweight="bold", bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none"}, zorder=5)
            else:
                ax.add_patch(Rectangle((x, y), w, h, fc=rank_colour(c.colour_rank), ec="white"))
                ax.text(cx, cy, name, ha="center", va="center", color="white", fontsize=11,
                        fontweight="bold", zorder=5)
    ax.set_xlim(-0.4, across * (cols + 1) - 0.6)
    ax.set_ylim(down * pitch - 1.2, -0.8)
    ax.set_aspect("equal")
    ax.axis("off")


# -- HTML ------------------------------------------------------------------------------------

def _cells_json(scene: Scene, cells: dict[int, list[Cell]]) -> list[dict]:
    out = []
    for r, row in cells.items():
        for c in row:
            x, y = position(scene.n, r, c.i, c.j, scene.shape, scene.boxes)
            colours = [rank_colour(s) for s in c.sources] if c.style == "sum" else [rank_colour(c.colour_rank)]
            out.append({"x": x, "y": y, "name": scene.cell_name(c), "style": c.style, "colours": colours})
    return out


def _scene_json(scene: Scene) -> dict:
    moves = []
    for m in scene.moves:
        x0, y0 = position(scene.n, m.src, m.i, m.j, scene.shape, scene.boxes)
        x1, y1 = position(scene.n, m.dst, *(m.to or (m.i, m.j)), scene.shape, scene.boxes)
        moves.append({"from": [x0, y0], "to": [x1, y1], "name": scene.cell_name(m), "style": m.style,
                      "colour": rank_colour(m.src)})
    return {"name": scene.name, "title": scene.title, "caption": scene.caption,
            "before": _cells_json(scene, scene.before), "after": _cells_json(scene, scene.after),
            "empty": [r for r in range(scene.n) if r not in scene.after], "moves": moves,
            "legend": scene.legend()}


def write_html(path: str, scenes: Sequence[Scene], title: str, lang: str = "en") -> None:
    """A self-contained page that plays each scene: before, the copies travelling, after."""
    words = WORDS.get(lang, WORDS["en"])
    n = scenes[0].n
    rows, cols = scenes[0].shape
    layout = scenes[0].boxes
    width, height = page_size(n, scenes[0].shape, layout)
    origins = [box_origin(n, r, scenes[0].shape, layout) for r in range(n)]
    boxes = "".join(
        f'<div class="box" style="left:{x - 4}px;top:{y - 4}px;'
        f'width:{cols * CELL + 8}px;height:{rows * CELL + 8}px"><span class="none" id="none{r}">{html.escape(words["nothing"])}</span></div>'
        f'<div class="label" style="left:{x}px;top:{y - 26}px;'
        f'color:{rank_colour(r)}">{html.escape(scenes[0].label(r))}</div>'
        for r, (x, y) in enumerate(origins)
    )
    ranks = "".join(f'<span class="key"><i style="background:{rank_colour(r)}"></i>rank {r}</span>' for r in range(n))
    data = json.dumps([_scene_json(s) for s in scenes], ensure_ascii=False)
    words = {**words, "styles": {k: say(f"page.style.{k}", lang) for k in ("solid", "partial", "sum")}}
    with open(path, "w", encoding="utf-8") as f:
        f.write(_PAGE.format(title=html.escape(title), width=width, height=height, x=MARGIN_X, cell=CELL,
                             inner=CELL - 6, boxes=boxes, ranks=ranks, data=data, words=json.dumps(words, ensure_ascii=False),
                             lang=lang, **{k: html.escape(words[k]) for k in ("previous", "play", "step", "replay", "next", "keys")}))


_PAGE = """<!doctype html>
<html lang="{lang}"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ margin:0; font-family:sans-serif; background:#fff; width:{width}px; height:{height}px; position:relative; }}
#head {{ position:absolute; left:{x}px; top:8px; right:{x}px; }}
h1 {{ font-size:16px; margin:0 0 4px 0; }}
#caption {{ font-size:13px; color:#333; min-height:34px; }}
#step {{ font-size:12px; color:#666; margin:2px 0; }}
#controls button {{ font-size:12px; margin-right:4px; }}
#legend {{ font-size:11px; color:#444; margin-top:4px; }}
.key {{ margin-right:10px; white-space:nowrap; }}
.key i {{ display:inline-block; width:11px; height:11px; margin-right:3px; vertical-align:-1px; border:1px solid #777; }}
.box {{ position:absolute; border:2px dashed #bbb; border-radius:6px; }}
.none {{ display:none; position:absolute; width:100%; top:45%; text-align:center; color:#888; font-size:12px; }}
.label {{ position:absolute; font-weight:bold; font-size:14px; }}
.blk {{ position:absolute; width:{inner}px; height:{inner}px; border-radius:4px; box-sizing:border-box;
        display:flex; align-items:center; justify-content:center; }}
.blk b {{ font:bold 13px monospace; color:#fff; padding:1px 3px; border-radius:3px; }}
.partial b {{ background:#fff; }}
.sum b {{ background:#222; }}
.ghost {{ opacity:0.3; }}
</style></head>
<body><div id="head"><h1>{title}</h1><div id="caption"></div><div id="step"></div>
<div id="controls"><button id="prev">&#9664; {previous}</button><button id="play">&#9654; {play}</button>
<button id="next-step">{step}</button><button id="replay">&#8634; {replay}</button><button id="next">{next} &#9654;</button>
<span style="font-size:11px;color:#777"> {keys}</span></div>
<div id="legend">{ranks}<span id="styles"></span></div></div>{boxes}
<script>
const scenes = {data};
const W = {words};
const fill = (t, v) => Object.keys(v).reduce((a, key) => a.split("{{" + key + "}}").join(v[key]), t);
let k = 0, phase = "before", timer = null;
const FRAMES = 36, TICK = 30;
function paint(d, style, colours) {{
  if (style === "solid") d.style.background = colours[0];
  else if (style === "partial") {{
    d.style.border = "2px solid " + colours[0];
    d.style.background = "repeating-linear-gradient(45deg, " + colours[0] + " 0 3px, #fff 3px 8px)";
    d.firstChild.style.color = colours[0];
  }} else {{
    const w = 100 / colours.length;
    d.style.background = "linear-gradient(90deg, " + colours.map((c, i) => c + " " + (i * w) + "% " + ((i + 1) * w) + "%").join(", ") + ")";
  }}
}}
function block(x, y, name, style, colours, cls) {{
  const d = document.createElement("div");
  d.className = "blk drawn " + style + (cls ? " " + cls : "");
  const b = document.createElement("b"); b.textContent = (style === "sum" ? "\\u03a3" : "") + name; d.appendChild(b);
  d.style.left = x + "px"; d.style.top = y + "px"; paint(d, style, colours);
  document.body.appendChild(d); return d;
}}
function clear() {{ for (const d of Array.from(document.querySelectorAll(".drawn"))) d.remove(); }}
function legend(s) {{
  document.getElementById("styles").textContent = s.legend.map(l => W.styles[l[0]]).join("; ");
}}
function show(which) {{
  const s = scenes[k]; clear(); phase = which;
  for (let r = 0; document.getElementById("none" + r); r++)
    document.getElementById("none" + r).style.display = (which === "after" && s.empty.includes(r)) ? "block" : "none";
  for (const c of s[which]) block(c.x, c.y, c.name, c.style, c.colours);
  document.getElementById("caption").textContent = s.title + ": " + s.caption;
  document.getElementById("step").textContent = fill(W.scene, {{k: k + 1, n: scenes.length}}) + ", " +
    (which === "before" ? W.pre : fill(W.post, {{m: s.moves.length}}));
  legend(s);
  location.hash = s.name + (which === "after" ? "/final" : "");
}}
function play() {{
  if (timer) return;
  const s = scenes[k]; show("before");
  for (const d of Array.from(document.querySelectorAll(".drawn"))) d.classList.add("ghost");
  const flying = s.moves.map(m => [m, block(m.from[0], m.from[1], m.name, m.style, [m.colour])]);
  document.getElementById("step").textContent = fill(W.scene, {{k: k + 1, n: scenes.length}}) + ", " + fill(W.moving, {{m: s.moves.length}});
  let f = 0;
  // Timer-driven frames (not CSS transitions), so a headless browser reaches the same last frame.
  const tick = () => {{
    f += 1; const t = f / FRAMES, e = t * t * (3 - 2 * t);
    for (const [m, d] of flying) {{
      d.style.left = (m.from[0] + (m.to[0] - m.from[0]) * e) + "px";
      d.style.top = (m.from[1] + (m.to[1] - m.from[1]) * e) + "px";
    }}
    if (f < FRAMES) timer = setTimeout(tick, TICK); else {{ timer = null; show("after"); }}
  }};
  timer = setTimeout(tick, TICK);
}}
function stop() {{ if (timer) {{ clearTimeout(timer); timer = null; }} }}
function go(to, which) {{ stop(); k = (to + scenes.length) % scenes.length; show(which || "before"); }}
function step() {{ if (timer) return; if (phase === "before") play(); else go(k + 1); }}
document.getElementById("prev").onclick = () => go(k - 1);
document.getElementById("next").onclick = () => go(k + 1);
document.getElementById("play").onclick = () => {{ stop(); play(); }};
document.getElementById("replay").onclick = () => {{ stop(); play(); }};
document.getElementById("next-step").onclick = step;
document.addEventListener("keydown", ev => {{
  if (ev.key === "ArrowRight") go(k + 1); else if (ev.key === "ArrowLeft") go(k - 1);
  else if (ev.key === " ") {{ ev.preventDefault(); step(); }} else if (ev.key === "r") {{ stop(); play(); }}
}});
const want = decodeURIComponent(location.hash.slice(1)).split("/");
const at = scenes.findIndex(s => s.name === want[0]);
if (want[0] === "final") go(0, "after");
else if (at >= 0) go(at, want[1] === "final" ? "after" : "before");
else {{ go(0); setTimeout(play, 800); }}
</script></body></html>
"""
