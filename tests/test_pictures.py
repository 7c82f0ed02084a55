"""The pictures: a PNG via matplotlib, and an HTML page checked in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from matplotlib.image import imread

from reshard.layout import Shard
from reshard.viz import pictures as viz
from test_cli import reshard_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[k : k + 2], 16) for k in (1, 3, 5)])


def test_png_shows_every_rank_colour(tmp_path):
    out = tmp_path / "row_to_column.png"
    run = reshard_cli("demo", "--png", str(out))
    assert run.returncode == 0, run.stderr
    pixels = (imread(out)[..., :3] * 255).round().astype(int).reshape(-1, 3)
    for r in range(3):
        assert (np.abs(pixels - _rgb(viz.rank_colour(r))).sum(axis=1) < 6).sum() > 500, f"rank {r}'s colour is missing"


def test_html_is_self_contained(tmp_path):
    out = tmp_path / "row_to_column.html"
    assert reshard_cli("demo", "--html", str(out)).returncode == 0
    text = out.read_text()
    assert "http://" not in text and "https://" not in text and "<link" not in text and " src=" not in text


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian package chromium)")
@pytest.mark.parametrize("ranks,shape", [(3, (6, 6)), (4, (7, 5))])
def test_html_animation_ends_in_the_final_layout(tmp_path, ranks, shape):
    page = tmp_path / "row_to_column.html"
    viz.write_html(str(page), shape, ranks, Shard(0), Shard(1), "test")
    shot = tmp_path / "shot.png"
    width, height = viz.page_size(ranks)
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--force-device-scale-factor=1",
         f"--window-size={width},{height}", "--virtual-time-budget=8000", f"--screenshot={shot}", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    pixels = (imread(shot)[..., :3] * 255).round().astype(int)
    for i, j in viz.blocks(shape, ranks):
        x, y = viz.position(ranks, j, i, j)  # after Shard(1): block (i, j) sits in rank j's box
        got = pixels[y + 6, x + 6]
        assert np.abs(got - _rgb(viz.rank_colour(j))).sum() < 30, (i, j, got)
        # ... and no longer in its source rank's box (unless source and destination agree)
        if i != j:
            x0, y0 = viz.position(ranks, i, i, j)
            assert np.abs(pixels[y0 + 6, x0 + 6] - _rgb(viz.rank_colour(i))).sum() > 30
