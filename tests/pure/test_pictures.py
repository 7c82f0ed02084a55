"""The pictures: what each scene holds (pure), the PNG's colours, and the HTML page played,
stepped and shown at its final frame in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from matplotlib.image import imread

from reshard.planning.layout import Partial, Shard
from reshard.viz import pictures as viz
from reshard.viz.blocks import blocks
from reshard.viz.scenes import FIVE, change_scene, collective_scene

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian package chromium)")


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[k : k + 2], 16) for k in (1, 3, 5)])


@pytest.mark.parametrize("n,shape", [(3, (6, 6)), (4, (7, 5)), (2, (2, 3))])
def test_scenes_keep_where_each_block_came_from(n, shape):
    scenes = {name: collective_scene(name, shape, n) for name in FIVE}
    a2a = scenes["all_to_all"]
    assert {(c.i, c.j, c.colour_rank) for r in a2a.after for c in a2a.after[r] if c.j == r} == {
        (c.i, c.j, c.i) for r in a2a.after for c in a2a.after[r]}  # rank j holds column j, each block in its source's colour
    assert all(m.dst == m.j and m.src == m.i and m.i != m.j for m in a2a.moves)
    gather = scenes["gather"]
    assert set(gather.after) == {0} and len(gather.after[0]) == sum(len(v) for v in gather.before.values())
    for name in ("reduce_scatter", "all_reduce"):  # Partial inputs: every rank holds every block, partially
        s = scenes[name]
        assert all(c.style == "partial" for r in s.before for c in s.before[r])
        assert all(c.style == "sum" and c.sources == tuple(range(n)) for r in s.after for c in s.after[r])
    cells = {name: sum(len(v) for v in s.after.values()) for name, s in scenes.items()}
    blocks = sum(len(v) for v in scenes["all_to_all"].before.values())
    assert cells == {"gather": blocks, "all_gather": n * blocks, "reduce_scatter": blocks, "all_to_all": blocks,
                     "all_reduce": n * blocks}


def test_a_layout_change_scene_colours_by_source():
    s = change_scene((6, 6), 3, Shard(0), Shard(1), "t")
    assert all(c.colour_rank == c.i for r in s.after for c in s.after[r])
    p = change_scene((6, 6), 3, Partial(), Shard(0), "t")
    assert all(c.style == "sum" for r in p.after for c in p.after[r]) and len(p.moves) == 2 * 3 * 3


def _shoot(url: str, shot, tmp_path, width: int, height: int, files: bool = False) -> np.ndarray:
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         *(["--allow-file-access-from-files"] if files else []),
         f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--window-size={width},{height}", "--virtual-time-budget=8000", f"--screenshot={shot}", url],
        check=True, capture_output=True, timeout=120,
    )
    return (imread(shot)[..., :3] * 255).round().astype(int)


def _colour_at(pixels: np.ndarray, n: int, rank: int, i: int, j: int, dx: int = 4, dy: int = 4) -> np.ndarray:
    x, y = viz.position(n, rank, i, j)
    return pixels[y + dy, x + dx]


@needs_chromium
@pytest.mark.parametrize("ranks,shape", [(3, (6, 6)), (4, (7, 5))])
def test_demo_page_plays_to_the_final_layout(tmp_path, ranks, shape):
    page = tmp_path / "demo.html"
    viz.write_html(str(page), [change_scene(shape, ranks, Shard(0), Shard(1), "t")], "test")
    width, height = viz.page_size(ranks)
    pixels = _shoot(page.as_uri(), tmp_path / "shot.png", tmp_path, width, height)
    for i, j in blocks(shape, ranks):
        # after Shard(1): block (i, j) sits in rank j's box, still in rank i's colour
        assert np.abs(_colour_at(pixels, ranks, j, i, j) - _rgb(viz.rank_colour(i))).sum() < 40, (i, j)
        if i != j:  # ... and no longer in its source rank's box
            assert np.abs(_colour_at(pixels, ranks, i, i, j) - _rgb(viz.rank_colour(i))).sum() > 40, (i, j)


@needs_chromium
def test_explain_page_final_views(tmp_path):
    page = tmp_path / "explain.html"
    n = 3
    viz.write_html(str(page), [collective_scene(name, (6, 6), n) for name in FIVE], "test")
    width, height = viz.page_size(n)
    a2a = _shoot(page.as_uri() + "#all_to_all/final", tmp_path / "a.png", tmp_path, width, height)
    for i in range(n):
        for j in range(n):
            assert np.abs(_colour_at(a2a, n, j, i, j) - _rgb(viz.rank_colour(i))).sum() < 40, (i, j)
    rs = _shoot(page.as_uri() + "#reduce_scatter/final", tmp_path / "r.png", tmp_path, width, height)
    for r in range(n):  # a summed block shows every rank's colour, in stripes
        x, y = viz.position(n, r, 0, r)
        stripe = viz.CELL // n
        seen = [rs[y + 3, x + k * stripe + 3] for k in range(n)]
        for k in range(n):
            assert np.abs(seen[k] - _rgb(viz.rank_colour(k))).sum() < 40, (r, k, seen)


@needs_chromium
def test_keys_step_to_the_next_collective_and_play_it(tmp_path):
    """ArrowRight selects the next collective; space plays it to its final frame."""
    n = 3
    page = tmp_path / "explain.html"
    viz.write_html(str(page), [collective_scene(name, (6, 6), n) for name in FIVE], "test")
    width, height = viz.page_size(n)
    driver = tmp_path / "keys.html"
    driver.write_text(f"""<!doctype html><html><body style="margin:0">
<iframe id="f" src="{page.name}#gather/final" style="border:0;width:{width}px;height:{height}px"></iframe>
<script>
const f = document.getElementById("f");
f.onload = () => {{
  const key = k => f.contentDocument.dispatchEvent(new KeyboardEvent("keydown", {{key: k}}));
  setTimeout(() => {{ key("ArrowRight"); key(" "); }}, 300);
}};
</script></body></html>""")
    pixels = _shoot(driver.as_uri(), tmp_path / "k.png", tmp_path, width, height, files=True)
    # AllGather's final frame: every rank's box holds every block, each in its source rank's colour
    for r in range(n):
        for i in range(n):
            assert np.abs(_colour_at(pixels, n, r, i, (i + 1) % n) - _rgb(viz.rank_colour(i))).sum() < 40, (r, i)


def test_a_mesh_scene_colours_each_block_by_the_rank_that_sent_it():
    from reshard.viz.scenes import mesh_scene

    s = mesh_scene((8, 8), (2, 2), (Shard(0), Shard(1)), (Shard(1), Shard(0)), "t")
    assert s.shape == (2, 2) and s.labels[3] == "rank 3 (1, 1)"
    held = {r: {(c.i, c.j): c.colour_rank for c in cells} for r, cells in s.after.items()}
    assert held == {0: {(0, 0): 0}, 1: {(1, 0): 2}, 2: {(0, 1): 1}, 3: {(1, 1): 3}}  # 1 and 2 swap blocks
    assert {(m.src, m.dst) for m in s.moves} == {(1, 2), (2, 1)}


@pytest.mark.parametrize("mesh_shape", [(2, 2), (2, 3), (3, 2)])
def test_a_mesh_is_drawn_as_its_grid(mesh_shape):
    from reshard.viz.scenes import mesh_scene

    scene = mesh_scene((12, 12), mesh_shape, (Shard(0), Shard(1)), (Shard(1), Shard(0)), "t")
    down, across = mesh_shape
    assert scene.boxes == (down, across)
    for r in range(down * across):  # rank r at its mesh coordinate, rank order row by row
        assert scene.box_at(r) == (r // across, r % across)
        x, y = viz.box_origin(scene.n, r, scene.shape, scene.boxes)
        x0, y0 = viz.box_origin(scene.n, 0, scene.shape, scene.boxes)
        assert (x > x0) == (r % across > 0) and (y > y0) == (r // across > 0)
    width, height = viz.page_size(scene.n, scene.shape, scene.boxes)
    last = viz.position(scene.n, scene.n - 1, *[k - 1 for k in scene.shape], scene.shape, scene.boxes)
    assert last[0] + viz.CELL <= width and last[1] + viz.CELL <= height


def test_uneven_blocks_are_drawn_at_their_size():
    from reshard.viz.scenes import mesh_scene

    scene = mesh_scene((9, 6), (2, 2), (Shard(0), Shard(1)), (Shard(1), Shard(0)), "t")
    rows, cols = scene.edges()  # rows of 5 and 4 elements, columns of 3 and 3, in units of a block
    assert rows == pytest.approx([0, 10 / 9, 2]) and cols == pytest.approx([0, 1, 2])
    world = collective_scene("all_to_all", (7, 5), 4)  # columns 2, 1, 1, 1 of 5
    assert world.edges()[1] == pytest.approx([0, 1.6, 2.4, 3.2, 4.0])


def test_the_legend_shows_only_what_is_drawn():
    moved = [change_scene((6, 6), 3, Shard(0), Shard(1), "t")]
    assert [h.get_label() for h in viz.legend_entries(moved)] == [f"rank {r}'s values" for r in range(3)]
    summed = [collective_scene("reduce_scatter", (6, 6), 3)]
    labels = [h.get_label() for h in viz.legend_entries(summed)]
    assert len(labels) == 5 and labels[3].startswith("a partial sum") and labels[4].startswith("the sum")




def test_a_korean_picture_without_a_korean_font_gives_one_note_naming_what_to_install(tmp_path, monkeypatch):
    import warnings

    monkeypatch.setattr(viz, "korean_fonts", lambda: [])  # a machine with no font with Hangul at all
    path = tmp_path / "ko.png"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        note = viz.draw_png(str(path), [change_scene((6, 6), 3, Shard(0), Shard(1), "redistribute", "ko")],
                            "행 -> 열", "ko")
    assert path.stat().st_size > 0
    assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught][:3]
    assert note.startswith("한글 글꼴을 찾지 못해") and "pip install koreanize-matplotlib" in note
    assert "fonts-noto-cjk" in note and "\n" not in note
    assert viz.draw_png(str(path), [change_scene((6, 6), 3, Shard(0), Shard(1), "redistribute")], "row -> col") is None


def test_a_korean_picture_draws_with_a_font_that_has_every_hangul_glyph_it_uses(tmp_path):
    import warnings

    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    fonts = viz.korean_fonts()  # the system's, else the one koreanize-matplotlib ([plot]) ships
    assert fonts, "no font with Hangul: the [plot] extra's koreanize-matplotlib is missing"
    face = FT2Font(font_manager.findfont(font_manager.FontProperties(family=fonts[0]), fallback_to_default=False))
    words = "".join(t for t in _korean_texts(tmp_path) if t)
    hangul = {c for c in words if "\uac00" <= c <= "\ud7a3"}
    assert hangul and all(face.get_char_index(ord(c)) for c in hangul), sorted(hangul)[:10]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        note = viz.draw_png(str(tmp_path / "ko.png"), [collective_scene(n, (6, 6), 3, "ko") for n in FIVE], "다섯", "ko")
    assert note is None and not [w for w in caught if "Glyph" in str(w.message)]


# Words the Korean pages keep in Latin letters, as the Korean teaching text does: the names of
# ranks, hosts, meshes, the collectives, the API's calls and placements, and block labels.
_KEPT_IN_LATIN = {"rank", "host", "mesh", "collective", "MoE", "dispatch", "redistribute", "Gather", "AllGather",
                  "ReduceScatter", "AllToAll", "AllReduce", "Shard", "Replicate", "Partial", "None", "row", "column",
                  "x", "A"}


def _english_words(text: str) -> list[str]:
    import re

    words = re.findall(r"[A-Za-z]+", re.sub(r"\b[A-Z]\d+\b", "", text))
    return [w for w in words if w not in _KEPT_IN_LATIN and len(w) > 1]  # one letter: an index, as block j


def _korean_texts(tmp_path) -> list[str]:
    """Every text the Korean PNGs of the demo (world and mesh), explain and explain --moe draw."""
    import functools

    import matplotlib.figure

    from reshard.messages import say
    from reshard.viz.moe_scenes import moe_scenes
    from reshard.viz.scenes import mesh_scene

    drawn: list[str] = []
    original = matplotlib.figure.Figure.savefig

    def keep_texts(fig, *args, **kwargs):
        drawn.extend(t.get_text() for t in fig.findobj(matplotlib.text.Text))
        return original(fig, *args, **kwargs)

    ko = functools.partial(say, lang="ko")
    pictures = [
        ([change_scene((6, 6), 3, Shard(0), Shard(1), "redistribute", "ko")],
         say("picture.title_demo", "ko", rows=6, cols=6, ranks=3, src="Shard(0)", dst="Shard(1)")),
        ([mesh_scene((6, 6), (2, 2), (Shard(0), Shard(1)), (Shard(1), Shard(0)), "redistribute", "ko")],
         say("picture.title_mesh", "ko", rows=6, cols=6, mesh="2x2", placements="(Shard(0), Shard(1)) -> ...")),
        ([collective_scene(n, (6, 6), 3, "ko") for n in FIVE], say("picture.title_explain", "ko", rows=6, cols=6, ranks=3)),
        (moe_scenes([[[1], [2]], [[0]], [[3, 0]], [[2]]], [[(1, 0), (2, 0)], [(0, 0)], [(0, 1), (3, 0)], [(2, 0)]], 2,
                    lambda key, **kw: ko(key, **kw), "ko"),
         say("picture.title_moe", "ko", what="MoE dispatch", ranks=4, hosts=2)),
    ]
    matplotlib.figure.Figure.savefig = keep_texts
    try:
        for scenes, title in pictures:
            viz.draw_png(str(tmp_path / "ko.png"), scenes, title, "ko")
            drawn.extend([s.caption for s in scenes] + [w for s in scenes for _, w in s.legend()])
    finally:
        matplotlib.figure.Figure.savefig = original
    return drawn


def test_every_word_of_a_korean_picture_is_korean(tmp_path):
    texts = [t for t in _korean_texts(tmp_path) if t.strip()]
    assert len(texts) > 50  # titles, box labels, blocks, legends, captions
    english = {t: _english_words(t) for t in texts if _english_words(t)}
    assert not english, english


def test_a_korean_page_has_a_korean_title_and_legend(tmp_path):
    from reshard.messages import say

    page = tmp_path / "ko.html"
    title = say("picture.title_explain", "ko", rows=6, cols=6, ranks=3)
    viz.write_html(str(page), [collective_scene(n, (6, 6), 3, "ko") for n in FIVE], title, "ko")
    text = page.read_text(encoding="utf-8")
    head = text.split("<title>", 1)[1].split("</title>", 1)[0]
    assert head == title and not _english_words(head)
    assert "단색: 그대로 옮겨진 블록" in text and "solid: a block moved" not in text
