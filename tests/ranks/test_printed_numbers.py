"""The numbers the docs show are the numbers the commands print, and the commands' output fits
the width it is given: the concepts page's table against ``reshard explain``, the README's demo
output against ``reshard demo``, byte summaries on uneven shapes per rank."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from tests.helpers.cli_run import reshard_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = {"Gather (to rank 0)": "gather", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
         "AllToAll": "all_to_all", "AllReduce": "all_reduce"}


def _reshard(*args: str, columns: int | None = None) -> str:
    """``reshard *args``'s stdout as a pipe gets it (``COLUMNS`` unset unless ``columns``)."""
    run = reshard_cli(*args, columns=columns)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _concepts_table() -> dict[str, str]:
    text = (ROOT / "docs" / "concepts.md").read_text()
    rows = re.findall(r"^\| (.+?) \| .+ \| ([^|]+) \|$", text, re.M)
    return {NAMES[name]: cell.strip() for name, cell in rows if name in NAMES}


def test_the_concepts_table_is_what_explain_measures():
    facts = json.loads(_reshard("explain", "--json"))
    assert facts["dtype"] == "float32" and facts["itemsize"] == 4
    text = (ROOT / "docs" / "concepts.md").read_text()
    assert f"{facts['dtype']}, so a 2x2 block is {4 * facts['itemsize']} B" in text
    table = _concepts_table()
    assert set(table) == set(NAMES.values())
    for name, cell in table.items():
        sent = facts[name]["bytes_sent_per_rank"]
        every, *_ = re.match(r"(\d+) B", cell).groups()
        exceptions = {int(r): int(b) for r, b in re.findall(r"rank (\d+): (\d+) B", cell)}
        want = [exceptions.get(r, int(every)) for r in range(len(sent))]
        assert sent == want, (name, cell, sent)


def test_explain_states_its_dtype_and_takes_another():
    assert "float32 (4 B an element)" in _reshard("explain").splitlines()[0]
    facts = json.loads(_reshard("explain", "--json", "--dtype", "float64"))
    assert facts["dtype"] == "float64" and facts["all_to_all"]["bytes_sent_per_rank"] == [64, 64, 64]


def test_the_readme_shows_what_the_demo_prints():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```text\n", readme.index("## The row -> column example")) + len("```text\n")
    shown = readme[start : readme.index("```", start)]
    printed = "\n".join(line.rstrip() for line in _reshard("demo").splitlines()) + "\n"
    assert shown == printed


def test_an_uneven_demo_gives_each_rank_its_own_byte_counts():
    lines = _reshard("demo", "--shape", "7x5", "--ranks", "4", columns=80).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Moved"))
    assert "by each rank" in lines[at], lines[at]
    # 7x5 over 4 ranks: rows 2,2,2,1 and cols 2,1,1,1 (float32); each rank's own piece stays;
    # a line each, so that a narrow terminal never splits one rank's figures
    rows, cols = [2, 2, 2, 1], [2, 1, 1, 1]
    for r in range(4):
        sent = 4 * rows[r] * (5 - cols[r])
        received = 4 * cols[r] * (7 - rows[r])
        assert lines[at + 1 + r] == f"  rank {r}: {sent} B / {received} B", lines[at:]


@pytest.mark.parametrize("columns", [80, 100])
def test_explain_fits_the_width_without_breaking_words(columns):
    out = _reshard("explain", columns=columns)
    assert max(len(line) for line in out.splitlines()) <= columns
    assert "…" not in out  # nothing cut off
    for name in ("ReduceScatter (sum, cols)", "AllToAll", "AllGather", "Gather (to rank 0)"):
        assert name in out, name
    assert "Aij:r is block (i, j) of A" in out  # the grids' legend


@pytest.mark.parametrize("args", [
    ("plan", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "S(1),S(0)", "--shape", "8x8,6x10"),
    ("plan", "--hosts", "2"),
    ("explain",),
])
@pytest.mark.parametrize("columns", [80, 100])
def test_a_line_past_the_width_breaks_after_a_clause_never_between_a_number_and_its_unit(args, columns):
    lines = _reshard(*args, columns=columns).splitlines()
    assert max(len(line) for line in lines) <= columns
    units = {"B", "KiB", "MiB", "GiB", "GB/s", "us", "ms"}
    for first, second in zip(lines, lines[1:]):
        if first and first[-1].isdigit() and second.split():
            assert second.split()[0] not in units, (first, second)


def test_piped_output_without_columns_has_a_fixed_readable_width():
    out = _reshard("explain")
    assert max(len(line) for line in out.splitlines()) <= 100
