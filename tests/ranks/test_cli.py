"""`reshard demo` and `reshard plan` as a user runs them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reshard.planning.layout import Shard, local_shard
from reshard.tools.demo import global_matrix, verify
from tests.helpers.cli_run import reshard_cli


def test_demo_shows_the_row_to_column_example():
    run = reshard_cli("demo")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "\x1b[" not in out  # piped: plain text
    for line in ["rows 0-1, cols 0-5", "rows 0-5, cols 0-1", "rows 0-5, cols 4-5"]:
        assert line in out
    assert "A00 A01 A02" in out and "A00 A10 A20" in out and "A02 A12 A22" in out
    assert "rows 0-1, cols 2-3 -> rank 1" in out
    assert "no values were summed" in out
    assert "OK: all 3 ranks" in out


@pytest.mark.parametrize("args,needles", [
    (("--shape", "7x5", "--ranks", "4"), ["rows 0-1, cols 0-4", "row 6, cols 0-4", "rows 0-6, col 4", "OK: all 4 ranks"]),
    (("--shape", "5x7", "--ranks", "2", "--src", "col", "--dst", "row", "--dtype", "int8"), ["rows 0-4, cols 0-3", "rows 0-2, cols 0-6", "OK"]),
    (("--src", "Shard(0)", "--dst", "replicate", "--dtype", "bfloat16"), ["replicated", "OK"]),
    (("--ranks", "2", "--lang", "ko"), ["행(row) 분할", "값을 더하지 않는다", "확인"]),
    # ordered splits: the check takes the order of --dst, as the exchange does
    (("--mesh", "2x2", "--shape", "8x4", "--src", "Spec((0, 1), None)", "--dst", "Spec((1, 0), None)"),
     ["OK: all 4 ranks hold exactly their part of A under Spec((1, 0))"]),
])
def test_demo_options(args, needles):
    run = reshard_cli("demo", *args)
    assert run.returncode == 0, run.stdout + run.stderr
    for needle in needles:
        assert needle in run.stdout, (needle, run.stdout)


def test_demo_rejects_bad_options():
    assert reshard_cli("demo", "--shape", "6x6x6").returncode != 0
    assert reshard_cli("demo", "--ranks", "0").returncode != 0
    assert reshard_cli("demo", "--src", "Shard(2)").returncode != 0


def test_verify_catches_a_wrong_result():
    shape, n = (6, 6), 3
    full = global_matrix(shape, "float32")
    outs = [local_shard(full, Shard(1), r, n).contiguous() for r in range(n)]
    assert verify(shape, "float32", Shard(1), outs) == {}
    outs[1] = outs[1].clone()
    outs[1][0, 0] += 1
    assert set(verify(shape, "float32", Shard(1), outs)) == {1}
    outs[2] = torch.zeros(5, 2)
    assert set(verify(shape, "float32", Shard(1), outs)) == {1, 2}


def test_plan_json_is_exact():
    run = reshard_cli("plan", "--shape", "8192x8192", "--dtype", "bfloat16", "--ranks", "64", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    per_pair = (8192 // 64) * (8192 // 64) * 2
    assert report["collective"] == "all_to_all"
    assert report["bytes_sent_per_rank"] == [63 * per_pair] * 64
    assert report["total_bytes"] == 64 * 63 * per_pair


def test_plan_text():
    run = reshard_cli("plan", "--shape", "6x6", "--ranks", "3")
    assert run.returncode == 0
    assert "rows 0-1, cols 2-3 -> rank 1" in run.stdout


def test_plan_takes_several_shapes_as_the_tensors_of_one_call():
    run = reshard_cli("plan", "--shape", "8x6,4x4,6x5", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "P,S(1)", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert [t["global_shape"] for t in report["tensors"]] == [[8, 6], [4, 4], [6, 5]]
    # S(0) -> Partial on mesh dim 0 fills values: each tensor takes its own steps, none shares
    assert report["one_call"]["tensors_with_their_own_steps"] == 3
    run = reshard_cli("plan", "--shape", "6x6,9x3", "--ranks", "3", "--json")
    call = json.loads(run.stdout)["one_call"]
    # rank r sends each peer a 2x2 block of the 6x6 and a 3x1 block of the 9x3, 4 bytes each
    assert call["shared_bytes_sent_per_rank"] == [2 * (2 * 2 + 3 * 1) * 4] * 3 and call["checks"] == 1
    run = reshard_cli("plan", "--shape", "6x6,9x3", "--ranks", "3")
    assert run.returncode == 0 and "In one call: 2 tensors" in run.stdout
    run = reshard_cli("plan", "--shape", "6x6,9x3", "--ranks", "3", "--rank", "1")
    said = run.stdout + run.stderr
    assert run.returncode != 0 and "several --shape values" in said and "not --rank" in said, said


def test_plan_text_gives_one_amount_where_every_rank_sends_alike_and_speaks_korean_throughout():
    run = reshard_cli("plan", "--shape", "8x8,16x4", "--ranks", "4")
    # each rank sends 16 B to each of 3 peers per tensor: 48 B each, 96 B for the two
    assert "each rank sends 48 B (192 B in all)" in run.stdout and "48 B to 48 B" not in run.stdout, run.stdout
    assert "each rank sending 96 B and" in run.stdout, run.stdout
    run = reshard_cli("plan", "--shape", "9x7", "--ranks", "4")
    assert "12 rank pairs exchange 8 B to 24 B each" in run.stdout, run.stdout  # 2x2 up to 3x2 float32 blocks
    run = reshard_cli("plan", "--shape", "9x7", "--mesh", "2x2", "--src", "P,S(1)", "--dst", "S(0),S(0)", "--lang", "ko")
    assert "mesh 차원 0에서 reduce_scatter" in run.stdout and "mesh 전체에서 all_to_all" in run.stdout, run.stdout
    assert "the whole mesh" not in run.stdout and "mesh dim" not in run.stdout, run.stdout


def test_plan_on_several_shapes_over_ranks_speaks_of_ranks_not_of_a_mesh():
    run = reshard_cli("plan", "--shape", "8x8,16x4", "--ranks", "3", "--dst", "replicate")
    assert run.returncode == 0, run.stderr
    assert "redistribute Shard(0) -> Replicate() of [8 x 8] float32 over 3 ranks:" in run.stdout, run.stdout
    assert "1. all_gather over the 3 ranks: each rank sends" in run.stdout, run.stdout
    assert "mesh" not in run.stdout and "(Shard(0))" not in run.stdout, run.stdout
    run = reshard_cli("plan", "--shape", "8x8,16x4", "--ranks", "3", "--lang", "ko")
    assert "rank 3개에서 all_to_all" in run.stdout and "mesh" not in run.stdout, run.stdout
    run = reshard_cli("plan", "--shape", "8x8,16x4", "--mesh", "3x1", "--src", "S(0),R", "--dst", "S(1),R")
    assert "on mesh 3x1 (3 ranks)" in run.stdout and "over mesh dim 0" in run.stdout, run.stdout


def test_plan_on_several_shapes_names_the_one_a_layout_does_not_fit():
    run = reshard_cli("plan", "--shape", "8x8,3", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "S(1),S(0)")
    said = run.stdout + run.stderr
    assert run.returncode != 0 and "tensor 1 (3): src Shard dim=1 is out of range for a 1-d tensor" in said, said
    run = reshard_cli("plan", "--shape", "8x8", "--mesh", "2x2", "--src", "S(0)", "--dst", "S(1),S(0)")
    assert "src has 1 placement for a 2-d mesh" in run.stdout + run.stderr


@pytest.mark.parametrize("command", [("plan", "--shape", "3x3"), ("demo",), ("bench",)])
def test_a_mesh_with_a_zero_size_dim_is_refused_naming_the_mesh(command):
    # it was refused as if --src and --dst were missing, or as an internal "mesh_shape"
    run = reshard_cli(*command, "--mesh", "2x0", "--src", "S(0),S(1)", "--dst", "S(1),S(0)")
    said = run.stdout + run.stderr
    assert run.returncode == 2 and "argument --mesh: mesh '2x0' needs sizes of at least 1" in said, said


def test_plan_prints_an_ordered_layout_as_its_spec():
    run = reshard_cli("plan", "--shape", "8x6", "--mesh", "2x2", "--src", "Spec((1, 0), None)", "--dst", "S(1),S(0)",
                      "--json")
    report = json.loads(run.stdout)
    assert report["src_spec"] == "Spec((1, 0))" and "dst_spec" not in report
    # (0, 1) holds rows 4-5 and (1, 0) rows 2-3: each keeps two of its rows' columns, sends the rest
    assert report["exchange_lower_bound_bytes"] == report["exchange_bytes_total"]


@pytest.mark.parametrize("hosts", [2, 8])
def test_plan_moe_counts_what_crosses_as_routing_drawn_at_random_does(hosts):
    run = reshard_cli("plan", "--moe", "--hosts", str(hosts), "--json")  # DeepEP's normal-kernel setting
    assert run.returncode == 0, run.stderr
    table = json.loads(run.stdout)
    # the oracle: 40,000 tokens routed to 8 distinct experts of 256 drawn at random, counted
    rng = np.random.default_rng(hosts)
    host_of_slot = np.argsort(rng.random((40_000, 256)), axis=1)[:, :8] // (256 // hosts)
    remote = host_of_slot != 0  # a token of host 0
    reached = sum(((host_of_slot == h).any(axis=1)).mean() for h in range(1, hosts))
    assert table["pairs_across_per_token"] == pytest.approx(remote.sum(axis=1).mean(), rel=0.02)
    assert table["remote_hosts_per_token"] == pytest.approx(reached, rel=0.02)
    flat, dedup = table["flat"], table["deduplicated"]
    assert dedup["dispatch_bytes_per_rank"] == pytest.approx(4096 * reached * 7168 * (1 + 4 / 128), rel=0.02)
    assert dedup["combine_bytes_per_host_link"] == pytest.approx(8 * 4096 * reached * 7168 * 2, rel=0.02)
    assert flat["dispatch_s"] == pytest.approx(flat["dispatch_bytes_per_rank"] / 50e9)
    text = reshard_cli("plan", "--moe").stdout
    assert "deduplicated" in text and "per host link" in text
    bad = reshard_cli("plan", "--moe", "--hosts", "3")
    assert bad.returncode == 2 and "256 experts do not spread evenly over 3 hosts" in bad.stderr


@pytest.mark.parametrize("rank", range(4))
def test_plan_rank_on_hosts_gives_that_ranks_two_level_steps(rank):
    from tests.helpers.oracle import balanced

    run = reshard_cli("plan", "--hosts", "2", "--ranks-per-host", "2", "--shape", "10x7", "--rank", str(rank), "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    rows, cols = balanced(10, 4), balanced(7, 4)
    host, local = divmod(rank, 2)
    other_local, other_host = host * 2 + (1 - local), (1 - host) * 2 + local
    inside, across = report["steps"][1], report["steps"][2]
    # inside: to the other local rank, this rank's rows of the columns of that local index on both hosts
    assert inside["sends_to"] == [other_local]
    assert inside["sent_bytes"] == rows[rank] * (cols[1 - local] + cols[2 + 1 - local]) * 4
    # across: to its twin on the other host, the host's rows of the twin's columns (one message)
    assert across["sends_to"] == [other_host]
    assert across["sent_bytes"] == (rows[host * 2] + rows[host * 2 + 1]) * cols[other_host] * 4
    assert report["algorithm"] == "hierarchical" and report["peers"] == sorted({other_local, other_host})


def test_explain_moe_shows_what_each_path_sent_across_hosts(tmp_path):
    png, page = tmp_path / "moe.png", tmp_path / "moe.html"
    run = reshard_cli("explain", "--moe", "--json", "--lang", "ko", "--png", str(png), "--html", str(page))
    assert run.returncode == 0, run.stderr
    facts = json.loads(run.stdout)
    n, hosts, tokens = facts["ranks"], facts["hosts"], facts["tokens_per_rank"]
    assert (n, hosts, facts["top_k"]) == (4, 2, 2)
    host = [r // 2 for r in range(n)]
    ids = facts["ids"]
    # the oracle, from the routing alone: expert d's rows by source rank then token, and the copies across
    for d in range(n):
        want = [[s, t] for s in range(n) for t in range(tokens) if d in ids[s][t]]
        assert facts["expert_rows"][d] == want, d
    flat = sum(host[e] != host[s] for s in range(n) for t in range(tokens) for e in ids[s][t])
    once = sum(len({host[e] for e in ids[s][t]} - {host[s]}) for s in range(n) for t in range(tokens))
    assert facts["rows_across"] == {"flat": flat, "hierarchical": once}
    assert facts["same_expert_inputs"] and facts["combine_ok"]
    row = facts["row_bytes"]
    # what rs.last_exchange() counted: rows out and back; the two-level dispatch adds k int64 routing ids a row
    assert facts["bytes_across"]["flat"] == {"dispatch": flat * row, "combine": flat * row}
    assert facts["bytes_across"]["hierarchical"] == {"dispatch": once * (row + 16), "combine": once * row}
    assert png.stat().st_size > 10_000
    text = page.read_text(encoding="utf-8")
    assert "교환 전" in text and "rank 3 · host 1" in text  # the page's own words in Korean too
    words = reshard_cli("explain", "--moe", "--top-k", "1").stdout
    assert "Flat:" in words and "A0" in words and "host 사이" not in words


def test_explain_moe_runs_on_the_ranks_given_or_says_why_it_cannot():
    # --ranks 3, the plain explain's default, was taken for "not given" and run on 4 ranks
    bad = reshard_cli("explain", "--moe", "--ranks", "3")
    said = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "--ranks 3 cannot be grouped into --hosts 2 of equal size" in said, said
    run = reshard_cli("explain", "--moe", "--ranks", "2", "--json")
    assert run.returncode == 0, run.stderr
    facts = json.loads(run.stdout)
    assert (facts["ranks"], facts["hosts"], len(facts["ids"])) == (2, 2, 2)


def test_plan_on_hosts_takes_the_calibrated_levels(tmp_path):
    levels = tmp_path / "levels.json"  # as reshard bench --calibrate writes it: only the link costs here
    levels.write_text(json.dumps({"levels": {"alpha_local": 0.0, "beta_local": 0.0, "alpha_link": 0.0,
                                             "beta_link": 1e-9, "step": 0.0}}))
    run = reshard_cli("plan", "--hosts", "2", "--ranks-per-host", "2", "--shape", "1024x1024", "--json",
                      "--levels", str(levels))
    assert run.returncode == 0, run.stderr
    table = json.loads(run.stdout)
    link = 2 * (1 << 20) * 2 // 4  # 2 ranks a host, 1 MiB each, half of it to the other host
    assert table["flat"]["estimate_s"] == pytest.approx(link * 1e-9)
    assert table["hierarchical"]["estimate_s"] == pytest.approx(link * 1e-9)
    levels.write_text("{}")
    bad = reshard_cli("plan", "--hosts", "2", "--shape", "8x8", "--levels", str(levels))
    assert bad.returncode == 2 and "cannot read the cost model" in bad.stderr


def test_plan_on_hosts_sets_flat_beside_two_level():
    run = reshard_cli("plan", "--hosts", "512", "--ranks-per-host", "8", "--shape", "65536x65536", "--dtype", "bfloat16",
                      "--json")
    assert run.returncode == 0, run.stderr
    table = json.loads(run.stdout)
    per_rank = 65536 * 65536 * 2 // 4096  # 2 MiB: 512 B to each of 4,096 ranks
    link = 8 * 512 * (4096 - 8)  # every rank of a host sends 512 B to each rank on the other 511 hosts
    assert table["bytes_per_rank"] == per_rank
    assert (table["flat"]["messages_inside_per_rank"], table["flat"]["messages_across_per_rank"]) == (7, 4088)
    assert (table["hierarchical"]["messages_inside_per_rank"], table["hierarchical"]["messages_across_per_rank"]) == (7, 511)
    assert table["flat"]["bytes_per_host_link"] == table["hierarchical"]["bytes_per_host_link"] == link
    assert table["hierarchical"]["bytes_inside_per_rank"] == per_rank * 7 // 8
    assert table["hierarchical"]["estimate_s"] < table["flat"]["estimate_s"]
    text = reshard_cli("plan", "--hosts", "2", "--ranks-per-host", "2", "--shape", "8x8").stdout
    assert "flat" in text and "hierarchical" in text and "per host link" in text


def test_plan_on_hosts_without_a_shape_takes_a_65536_square():
    run = reshard_cli("plan", "--hosts", "512", "--ranks-per-host", "8", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["bytes_per_rank"] == 65536 * 65536 * 4 // 4096  # float32, 4,096 ranks
    text = reshard_cli("plan", "--hosts", "512", "--ranks-per-host", "8").stdout
    assert "65536x65536" in text and "4,096 ranks" in text and "hierarchical" in text


@pytest.mark.parametrize("args", [("plan", "--shape", "7x5", "--ranks", "4", "--dst", "S1"),
                                  ("plan", "--shape", "7x5", "--ranks", "4", "--rank", "1", "--src", "rows?"),
                                  ("demo", "--src", "bogus")])
def test_a_placement_the_cli_cannot_read_is_one_line_naming_the_option(args):
    run = reshard_cli(*args)
    option = "--dst" if "--dst" in args else "--src"
    said = (run.stdout + run.stderr).strip()
    assert run.returncode == 2 and said.startswith(f"error: {option}: cannot read placement"), said
    assert "Traceback" not in said and len(said.splitlines()) == 1, said


@pytest.mark.parametrize("args,option", [
    (("plan", "--shape", "4x4", "--ranks", "3", "--alpha", "-1"), "--alpha"),
    (("plan", "--shape", "4x4", "--ranks", "3", "--beta", "nan"), "--beta"),
    (("plan", "--moe", "--link-gbps", "0"), "--link-gbps"),
    (("demo", "--timeout", "-1"), "--timeout"),
    (("explain", "--timeout", "0"), "--timeout"),
    (("doctor", "--timeout", "inf"), "--timeout"),
    (("bench", "--factor", "1"), "--factor"),
    (("bench", "--iters", "-3"), "--iters"),
    (("bench", "--warmup", "-1"), "--warmup"),
])
def test_a_number_option_out_of_its_range_is_refused_naming_the_option(args, option):
    """A negative latency, a zero bandwidth or timeout, a size step of 1 (which never reaches
    the end) and negative counts are refused before anything runs."""
    run = reshard_cli(*args)
    assert run.returncode == 2 and f"argument {option}: needs" in run.stderr, (run.stdout, run.stderr)
    assert "Traceback" not in run.stdout + run.stderr


@pytest.mark.parametrize("args,option", [
    (("plan", "--shape", "4x4", "--ranks", "2", "--dst", ""), "--dst"),
    (("plan", "--shape", "4x4", "--mesh", "2x2", "--src", "  "), "--src"),
    (("demo", "--dst", ""), "--dst"),
    (("bench", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", ""), "--dst"),
])
def test_a_blank_placement_is_refused_not_read_as_the_default(args, option):
    run = reshard_cli(*args)
    assert run.returncode == 2 and f"argument {option}: needs a placement" in run.stderr, (run.stdout, run.stderr)
    assert "split table" not in run.stdout and "OK" not in run.stdout, run.stdout


def test_plan_and_demo_list_no_piece_that_holds_nothing():
    # 3 rows over 4 ranks: rank 3 owns no row after the reduce_scatter, so nobody sends it anything
    run = reshard_cli("plan", "--shape", "3x5", "--ranks", "4", "--src", "partial", "--dst", "row")
    assert run.returncode == 0, run.stderr
    assert "split table (9 transfers between ranks)" in run.stdout, run.stdout
    assert "(0 B)" not in run.stdout and "9 rank pairs exchange 20 B each" in run.stdout, run.stdout
    # 3 rows over 4 ranks, row -> column: rank 3 holds no row, so it has no piece to keep
    run = reshard_cli("demo", "--shape", "3x5", "--ranks", "4")
    assert run.returncode == 0 and "rank 2: row 2, col 4 -> rank 3" in run.stdout, run.stdout
    assert "rows none, col 4 -> rank 3" not in run.stdout, run.stdout


@pytest.mark.parametrize("command,said", [
    (("plan", "--shape", "4x4", "--mesh", "2x2", "--src", "S(a),S(1)", "--dst", "S(1),S(0)"),
     "--src: cannot read placement 'S(a)'"),
    (("plan", "--shape", "4x4,8x2", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "Spec((1, 0), (1, 0))"),
     "--dst: Spec names mesh dim 0, 1 more than once"),
    (("plan", "--shape", "1x2", "--mesh", "2x3x4", "--src", "R,S(0),S(2)", "--dst", "R,R,R", "--rank", "4"),
     "src Shard dim=2 is out of range for a 2-d tensor"),
    (("plan", "--shape", "6x5", "--mesh", "2x1x1", "--src", "col,R", "--dst", "R,R,R", "--rank", "1"),
     "--src has 2 placements for a 3-d mesh"),
    (("demo", "--mesh", "2x2", "--src", "S(0),S(x)", "--dst", "S(1),S(0)"), "--src: cannot read placement 'S(x)'"),
    (("bench", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "S(1)"), "--dst has 1 placement for a 2-d mesh"),
    (("bench", "--mesh", "2x2", "--src", "S(2),R", "--dst", "S(1),S(0)"),
     "--src S(2),R: the benchmark's matrix has dims 0 and 1"),
    (("bench", "--mesh", "2x2", "--src", "S(0),R", "--dst", "Spec(None, None, 1)"),
     "--dst Spec(None, None, 1) splits tensor dim 2, but the tensor is 2-d (dims 0..1)"),
    (("plan", "--shape", "8x6", "--mesh", "2x2", "--src", "Spec(None, None, (1, 0))", "--dst", "S(1),R"),
     "--src Spec(None, None, (1, 0)) splits tensor dim 2, but the tensor is 2-d (dims 0..1)"),
    (("plan", "--shape", "4x4x2,8x6", "--ranks", "4", "--src", "Spec(None, None, 0)", "--dst", "S(1)"),
     "tensor 1 (8x6): --src Spec(None, None, 0) splits tensor dim 2, but the tensor is 2-d (dims 0..1)"),
    (("demo", "--mesh", "2x2", "--src", "S(0),R", "--dst", "Spec(None, None, 0)"),
     "--dst Spec(None, None, 0) splits tensor dim 2, but the tensor is 2-d (dims 0..1)"),
])
def test_a_bad_mesh_placement_is_named_by_its_option_before_any_rank_starts(command, said):
    run = reshard_cli(*command)
    text = run.stdout + run.stderr
    assert run.returncode == 2 and said in text, text
    assert "every rank" not in text and "Traceback" not in text, text


@pytest.mark.parametrize("command,option", [
    (("explain", "--png"), "--png"), (("demo", "--html"), "--html"), (("explain", "--moe", "--html"), "--html"),
    (("bench", "--sizes", "64K", "--json"), "--json"), (("bench", "--sizes", "64K", "--plot"), "--plot"),
])
@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_an_output_file_that_cannot_be_written_is_named_before_any_rank_starts(tmp_path, command, option, where):
    path = tmp_path / "no such folder" / "out" if where == "missing folder" else tmp_path
    run = reshard_cli(*command, str(path))
    text = run.stdout + run.stderr
    said = "does not exist" if where == "missing folder" else "is a folder"
    assert run.returncode == 2 and f"{option} {path}" in text and said in text, text
    assert "Traceback" not in text and "every rank" not in text, text
