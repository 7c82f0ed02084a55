"""`reshard explain`: facts measured on real ranks, and answers that follow the facts."""

from __future__ import annotations

import copy
import functools
import json

from reshard.planning.plan import make_plan
from reshard.tools.explain import answer
from tests.helpers.cli_run import reshard_cli


@functools.cache
def facts(ranks: int = 3, shape: str = "6x6") -> dict:
    run = reshard_cli("explain", "--ranks", str(ranks), "--shape", shape, "--json")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_json_has_every_collective_with_its_facts():
    f = facts()
    for name in ("gather", "all_gather", "reduce_scatter", "all_to_all", "all_reduce"):
        for key in ("sums_values", "full_tensor_on_every_rank", "result_shape_per_rank", "bytes_sent_per_rank", "bytes_received_per_rank"):
            assert key in f[name], (name, key)


def test_measured_facts_match_the_row_to_column_example():
    f = facts()
    assert f["all_to_all"]["sums_values"] is False and f["all_to_all"]["full_tensor_on_every_rank"] is False
    assert f["all_to_all"]["result_shape_per_rank"] == [[6, 2]] * 3
    assert f["all_gather"]["full_tensor_on_every_rank"] is True and f["all_gather"]["sums_values"] is False
    assert f["gather"]["result_shape_per_rank"] == [[6, 6], None, None]
    assert f["reduce_scatter"]["sums_values"] is True and f["all_reduce"]["sums_values"] is True
    # the reduce collectives start from Partial inputs: AllReduce leaves the whole sum everywhere
    assert f["all_reduce"]["full_tensor_on_every_rank"] is True and f["all_reduce"]["result_shape_per_rank"] == [[6, 6]] * 3
    # a byte counts as sent only when it leaves its rank: 2 of 3 blocks of [2 x 2] float32
    assert f["dtype"] == "float32"
    assert f["all_to_all"]["bytes_sent_per_rank"] == make_plan((6, 6), "row", "col", 3, "float32").bytes_sent_per_rank == [32] * 3
    assert f["gather"]["bytes_sent_per_rank"] == [0, 48, 48]
    assert f["all_gather"]["bytes_received_per_rank"] == [96] * 3


def test_answers_follow_the_facts():
    f = facts()
    a = f["answers"]
    assert a["adds_values"]["answer"] is False and a["full_tensor_on_every_rank"]["answer"] is False
    assert {(e["src_rank"], e["dst_rank"], e["text"]) for e in a["cut_rule"]} >= {(0, 1, "rows 0-1, cols 2-3"), (2, 0, "rows 4-5, cols 0-1")}
    shaped = copy.deepcopy(f)
    shaped["collectives"] = {k: f[k] for k in ("gather", "all_gather", "reduce_scatter", "all_to_all", "all_reduce")}
    # the same logic fed AllGather's facts says every rank holds the full tensor, and ReduceScatter's that it sums
    assert answer(shaped, "all_gather")["full_tensor_on_every_rank"]["answer"] is True
    assert answer(shaped, "reduce_scatter")["adds_values"]["answer"] is True


def test_uneven_shape_and_other_world_size():
    f = facts(4, "7x5")
    assert f["all_to_all"]["result_shape_per_rank"] == [[7, 2], [7, 1], [7, 1], [7, 1]]
    # ReduceScatter starts from full-size partial sums, so uneven rows are no obstacle: each rank
    # gets its columns of the sum
    assert f["reduce_scatter"]["result_shape_per_rank"] == [[7, 2], [7, 1], [7, 1], [7, 1]]
    assert f["reduce_scatter"]["sums_values"] is True
    assert f["all_reduce"]["full_tensor_on_every_rank"] is True


def test_the_text_says_which_ranks_hold_which_shape():
    en = reshard_cli("explain", "--ranks", "4", "--shape", "7x5", "--no-color")
    assert en.returncode == 0, en.stderr
    # 5 columns over 4 ranks: rank 0 holds two, ranks 1-3 one each
    said = " ".join(en.stdout.split())
    assert "parts of the full [7 x 5] (rank 0: [7 x 2], ranks 1-3: [7 x 1])" in said, en.stdout
    ko = reshard_cli("explain", "--ranks", "4", "--shape", "7x5", "--lang", "ko", "--no-color")
    assert "(rank 0: [7 x 2], rank 1-3: [7 x 1])" in " ".join(ko.stdout.split()), ko.stdout


def test_text_in_english_and_korean():
    en = reshard_cli("explain")
    assert en.returncode == 0 and "Does AllToAll add values?" in en.stdout and "rows 0-1, cols 2-3 -> rank 1" in en.stdout
    ko = reshard_cli("explain", "--lang", "ko")
    assert ko.returncode == 0
    for words in ("값을 더하지 않는다", "layout을 바꾸는 것", "AllToAll은 값을 더하는가?"):
        assert words in ko.stdout
