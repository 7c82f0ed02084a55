"""The message catalogue: English counts one rank in the singular; other languages as written."""

from __future__ import annotations

from string import Formatter

import pytest

from reshard.errors import ranks_text
from reshard.messages import CATALOGUE, say


@pytest.mark.parametrize("key,fields,one,many", [
    ("demo.ok", dict(placement="Shard(1)"), "OK: the 1 rank holds exactly its part of A under Shard(1)",
     "OK: all 3 ranks hold exactly their part of A under Shard(1)"),
    ("plan.head", dict(collective="none", src="Shard(0)", dst="Shard(1)", shape="[4, 6]", dtype="float32"),
     "over 1 rank", "over 3 ranks"),
    ("explain.sums", dict(cols="cols 0-5"), "the sum of the 1 rank's partial values", "the sum of the 3 ranks' partial"),
])
def test_one_rank_reads_in_the_singular_in_english(key, fields, one, many):
    assert one in say(key, "en", ranks=1, **fields)
    assert many in say(key, "en", ranks=3, **fields)
    assert say(key, "ko", ranks=1, **fields) == CATALOGUE[key]["ko"].format(ranks=1, **fields)


def test_no_english_message_left_with_one_ranks():
    checked = 0
    for key, entry in CATALOGUE.items():
        names = {name for _, name, _, _ in Formatter().parse(entry["en"]) if name}
        if "ranks" in names:
            text = say(key, "en", **{**{name: "x" for name in names}, "ranks": 1})
            assert "1 ranks" not in text and "1 local ranks" not in text, (key, text)
            checked += 1
    assert checked >= 7  # every message that counts ranks


@pytest.mark.parametrize("ranks,text", [
    ([2], "rank 2"), ([0, 1], "ranks 0, 1"), ([3, 0, 2], "ranks 0, 2, 3"), ([0, 1, 2, 3], "ranks 0-3"),
    ([0, 2, 3, 4, 7], "ranks 0, 2-4, 7"), ([5, 6, 1], "ranks 1, 5, 6"),
])
def test_a_set_of_ranks_is_named_one_way(ranks, text):
    assert ranks_text(ranks) == text
    assert ranks_text(ranks, word=False) == text.split(" ", 1)[1]


def test_every_command_takes_no_color_as_the_cli_page_says():
    import argparse

    from reshard.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) >= {"demo", "explain", "plan", "bench", "doctor"}
    for name, sub in commands.items():
        flags = {flag for action in sub._actions for flag in action.option_strings}
        assert "--no-color" in flags, name
    import pathlib

    with open(pathlib.Path(__file__).parents[2] / "docs" / "cli.md", encoding="utf-8") as f:
        assert "All commands\nprint plain text when piped or with `--no-color`" in f.read()


def test_explain_help_says_its_page_plays_every_collective():
    from reshard.cli import build_parser

    parser = build_parser()
    explain = next(a for a in parser._actions if a.dest == "command").choices["explain"]
    html = next(a for a in explain._actions if "--html" in a.option_strings)
    assert "each of the five collectives" in html.help and "animating AllToAll" not in html.help
