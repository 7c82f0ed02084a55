"""Byte counts as people read them (``viz.text.human_bytes``): the largest binary unit that keeps
the number under 1024, at any size a plan can name."""

from __future__ import annotations

import pytest

from reshard.viz.text import fit_line, human_bytes


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (32, "32 B"), (1536, "1.5 KiB"), (1 << 20, "1 MiB"), (3 << 40, "3 TiB"),
    (1 << 50, "1 PiB"), (5 << 60, "5 EiB"), (1 << 70, "1 ZiB"), (1.5 * 2**80, "1.5 YiB"), (2048 * 2**80, "2048 YiB"),
])
def test_a_byte_count_takes_the_unit_that_keeps_it_under_1024(n, text):
    assert human_bytes(n) == text


def test_a_huge_plan_reads_in_a_short_number():
    # 9999999999999 x 9999999999999 float32 over 3 ranks: about 110 YiB a rank
    per_rank = 9999999999999 ** 2 * 4 / 3
    assert human_bytes(per_rank) == "110.3 YiB"
    lines = fit_line(f"memory per rank: before {human_bytes(per_rank)}, peak 331 YiB", 24).splitlines()
    assert any("110.3 YiB" in line for line in lines) and any("331 YiB" in line for line in lines), lines
