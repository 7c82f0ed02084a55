"""Long lines of the CLI's text broken as a reader expects (``viz.text.fit_line``): within the
width, after a clause where one ends, the words in their order, a number beside its unit and a
short bracketed group whole, continuation lines indented."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from reshard.viz.text import fit_line

UNITS = ["B", "KiB", "MiB", "GB/s", "ms", "us", "ranks"]
words = st.one_of(
    st.text(alphabet="abcdefghij:/-", min_size=1, max_size=9),
    st.builds(lambda n, u: f"{n} {u}", st.integers(0, 10**6), st.sampled_from(UNITS)),
    st.builds(lambda a, b: f"(Shard({a}), Shard({b}))", st.integers(0, 3), st.integers(0, 3)),
    st.sampled_from(["한국어", "rank마다", "수신"]),
)
clauses = st.lists(words, min_size=1, max_size=8).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(clauses, min_size=1, max_size=8), st.sampled_from([", ", "; "]), st.integers(0, 4),
       st.integers(40, 120))
def test_a_long_line_breaks_within_the_width_keeping_words_numbers_and_groups(parts, sep, lead, width):
    line = " " * lead + sep.join(parts)
    out = fit_line(line, width, cell_len)
    lines = out.split("\n")
    if cell_len(line) <= width:
        assert out == line
        return
    assert lines[0].startswith(" " * lead) and not lines[0][lead:].startswith(" ")
    for later in lines[1:]:
        assert later.startswith(" " * min(lead + 4, width // 3)), lines
    # the words in their order, nothing lost or added
    assert " ".join(out.split()) == " ".join(line.split())
    # every piece fits: no word, number with its unit or short group here is wider than a line
    assert max(cell_len(piece) for piece in lines) <= width, lines
    for first, second in zip(lines, lines[1:]):
        assert not (re.search(r"\d$", first) and second.split()[0] in UNITS), (first, second)  # "64" / "B"
        assert not re.search(r"\(Shard\(\d\),$", first), (first, second)  # a short group split


def test_the_plan_line_that_ran_past_100_columns_breaks_after_its_clause():
    line = "  1. all_to_all over the whole mesh: each rank sends 0 B to 64 B (128 B in all), receives at most 64 B"
    assert fit_line(line, 100) == ("  1. all_to_all over the whole mesh: each rank sends 0 B to 64 B (128 B in all),\n"
                                   "      receives at most 64 B")
