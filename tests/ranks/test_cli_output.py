"""What a person sees from the command line: output piped to a file stays whole and readable
without colour, Korean covers every cell, every flag has help, and a missing optional library
is one line naming the extra to install, before any work starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reshard.cli import build_parser
from tests.helpers.cli_run import reshard_cli


def _cli(*args: str, env_extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # as a plain pipe has it
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "reshard.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("command", ["demo", "explain"])
def test_piped_output_is_whole_and_readable_without_colour(command):
    run = _cli(command)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "\x1b[" not in out and "…" not in out  # no colour codes, no cell cut short
    # the grids say which rank holds each block in plain text
    assert "A00:0" in out and "A01:0" in out and "A01:1" in out  # before (rank 0) and after (rank 1)
    if command == "explain":
        assert "rank 2: the sum of the 3 ranks' partial values, cols 4-5 [6 x 2]" in out
        assert "rank 0: 0 B / 96 B" in out  # float32: Gather's 6x6 on rank 0
    else:
        assert "rank 2 │ A02 A12 A22 │ rows 0-5, cols 4-5 │ [6 x 2]" in out
    if command == "demo":  # the two grids differ in plain text too
        before, _, after = out.partition("Each rank cuts")
        assert "A01:0" in before and "A01:1" in after


def test_korean_translates_every_cell():
    run = reshard_cli("explain", "--lang", "ko", columns=250)  # wide enough for the table
    assert run.returncode == 0, run.stderr
    table = run.stdout.split("┏", 1)[1].split("┘", 1)[0]
    for english in ("rows", "cols", "nothing", "sum of", "yes", "no ", "one rank"):
        assert english not in table, english
    assert "행 0-5, 열 0-1" in table and "없음" in table and "부분합의 합" in table
    demo = reshard_cli("demo", "--lang", "ko", columns=None)
    assert "행 0-1, 열 0-5" in demo.stdout and "rows" not in demo.stdout


def test_a_korean_picture_says_once_in_korean_when_no_font_draws_it(tmp_path):
    from matplotlib import font_manager

    from reshard.viz.pictures import KOREAN_FONTS

    has_font = any(f.name in KOREAN_FONTS for f in font_manager.fontManager.ttflist)
    run = reshard_cli("demo", "--lang", "ko", "--png", str(tmp_path / "ko.png"))
    assert run.returncode == 0 and (tmp_path / "ko.png").exists(), run.stderr
    said = [line for line in run.stderr.splitlines() if "fonts-noto-cjk" in line]
    assert said == ([] if has_font else ["reshard: 한글 글꼴이 설치되어 있지 않아 그림의 한글이 네모로 보인다 "
                                         "(Debian: apt-get install fonts-noto-cjk)"]), run.stderr


def test_every_flag_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = [f"{name} {act.option_strings}" for name, p in sub.choices.items() for act in p._actions
               if act.option_strings and act.dest != "help" and not act.help]
    assert missing == []


def test_a_missing_optional_library_is_one_line_before_any_work(tmp_path):
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib (hidden by the test)')\n")
    run = _cli("explain", "--png", str(tmp_path / "x.png"), env_extra={"PYTHONPATH": str(tmp_path)})
    assert run.returncode == 2
    assert run.stderr.strip() == "reshard: --png needs matplotlib, which is not installed: pip install matplotlib (reshard's [plot] extra)"
    assert run.stdout == ""  # nothing ran
    assert not (tmp_path / "x.png").exists()


def test_version():
    run = _cli("--version")
    assert run.returncode == 0 and run.stdout.startswith("reshard ")


@pytest.mark.parametrize("args,needles", [
    ((), ["rank 3 (1, 1)", "rows 4-7, cols 0-3", "[4 x 4]", "OK: all 4 ranks hold exactly their part of A under (Shard(1), Shard(0))"]),
    (("--src", "P,S(1)", "--dst", "S(0),R", "--lang", "ko"), ["rank 0 (0, 0)", "확인: 4개 rank 모두"]),
    (("--engine", "mpi", "--src", "S(0),R", "--dst", "S(1),R"), ["OK: all 4 ranks"]),
    (("--src", "Spec((1, 0), None)", "--dst", "S(1),S(0)"), ["Before: Spec((1, 0)); the ranks", "rows 4-5, cols 0-7",
                                                              "After: (Shard(1), Shard(0))"]),
    (("--src", "S(-1),R", "--dst", "R,S(-2)"), ["rows 0-7, cols 0-3",
                                                "OK: all 4 ranks hold exactly their part of A under (Replicate(), Shard(0))"]),
])
def test_demo_on_a_mesh_draws_the_ranks_as_a_grid(args, needles, tmp_path):
    png, page = tmp_path / "m.png", tmp_path / "m.html"
    run = reshard_cli("demo", "--mesh", "2x2", "--shape", "8x8", *args, "--png", str(png), "--html", str(page), columns=None)
    assert run.returncode == 0, run.stdout + run.stderr
    for needle in needles:
        assert needle in run.stdout, (needle, run.stdout)
    assert png.exists() and page.exists() and f"{png}" in run.stdout


def test_demo_on_a_mesh_refuses_a_shard_the_matrix_lacks_by_name():
    run = reshard_cli("demo", "--mesh", "2x2", "--src", "S(2),R", "--dst", "R,S(0)", columns=None)
    assert run.returncode == 2
    assert "Shard(2) does not exist for a matrix (use Shard(0) or Shard(1))" in run.stdout + run.stderr
