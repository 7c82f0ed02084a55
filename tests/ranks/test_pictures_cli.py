"""The pictures as the commands write them: `reshard explain --png`, the HTML pages of `demo` and
`explain`, and a mesh picture's title (the commands start their ranks)."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from reshard.viz import pictures as viz
from tests.helpers.cli_run import reshard_cli


def test_explain_png_shows_every_rank_colour_and_the_file_is_named(tmp_path):
    out = tmp_path / "five.png"
    run = reshard_cli("explain", "--png", str(out))
    assert run.returncode == 0, run.stderr
    assert f"wrote {out} (PNG picture" in run.stdout
    pixels = (imread(out)[..., :3] * 255).round().astype(int).reshape(-1, 3)
    for r in range(3):
        assert (np.abs(pixels - np.array(to_rgb(viz.rank_colour(r))) * 255).sum(axis=1) < 6).sum() > 2000, f"rank {r}'s colour is missing"


def test_html_is_self_contained(tmp_path):
    for command in ("demo", "explain"):
        out = tmp_path / f"{command}.html"
        run = reshard_cli(command, "--html", str(out))
        assert run.returncode == 0 and f"wrote {out} (HTML page" in run.stdout
        text = out.read_text()
        assert "http://" not in text and "https://" not in text and "<link" not in text and " src=" not in text


def test_a_mesh_picture_names_the_placements_in_its_title(tmp_path, monkeypatch):
    titles = []
    monkeypatch.setattr(viz, "draw_png", lambda path, scenes, title, lang="en": titles.append(title))
    run = reshard_cli("demo", "--mesh", "2x2", "--png", str(tmp_path / "mesh.png"))
    assert run.returncode == 0, run.stderr
    assert titles == ["A[6 x 6] on a 2x2 mesh: (Shard(0), Shard(1)) -> (Shard(1), Shard(0))"]
