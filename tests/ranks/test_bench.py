"""reshard bench: every op and engine runs, checks its results and writes JSON and a plot.
Timing targets live in the performance docs, never here: these tests check behaviour."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from reshard import bench
from tests.helpers.cli_run import reshard_cli

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None


def test_sizes_parse():
    assert bench.parse_sizes("64K..1M") == [64 << 10, 256 << 10, 1 << 20]
    assert bench.parse_sizes("1M,16M") == [1 << 20, 16 << 20]
    assert bench.parse_sizes("4K..64K", factor=2) == [4096, 8192, 16384, 32768, 65536]
    with pytest.raises(ValueError):
        bench.parse_sizes("1M..64K")


@pytest.mark.parametrize(("text", "why"), [("infM", "not a finite number"), ("nan", "not a finite number"),
                                            ("1e30G", "more than this machine's memory"),
                                            ("0.5", "less than a byte"), ("1.5G,x", "'x' is not a size")])
def test_a_size_that_is_not_one_is_refused_before_any_rank_starts(text, why):
    with pytest.raises(ValueError, match=why):
        bench.parse_sizes(text)
    assert bench.parse_sizes("1.5K") == [1536]


def test_the_cli_names_a_bad_size_without_a_traceback():
    run = reshard_cli("bench", "--ranks", "2", "--sizes", "infM")
    assert run.returncode == 2 and "cannot read --sizes 'infM': " in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_wrong_counts_elements():
    want = np.arange(12.0).reshape(3, 4)
    got = want.copy()
    got[1, 2] = -1
    got[2, 0] = -1
    assert bench.count_wrong(got, want) == 2
    assert bench.count_wrong(want[:2], want) == want.size  # a wrong shape is all wrong


@pytest.mark.parametrize("op", ["redistribute", "all_to_all", "all_gather", "reduce_scatter", "moe"])
def test_bench_runs_and_checks(op, tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    run = reshard_cli("bench", "--ranks", "2", "--op", op, "--sizes", "64K,256K", "--iters", "2", "--warmup", "1",
                      "--json", str(out), "--plot", str(png))
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    methods = {r["method"] for r in data["rows"]}
    assert {"reshard", "reshard-nocheck", "raw", "memcpy"} <= methods
    if op in ("redistribute", "all_to_all"):
        assert "dtensor" in methods
    assert all(r["wrong"] == 0 for r in data["rows"])
    assert {r["size"] for r in data["rows"]} == {64 << 10, 256 << 10}
    assert all(r["time_us"] > 0 and len(r["samples"]) == 2 for r in data["rows"])
    assert "reshard / raw" in data["ratios"][0]
    for word in ("algbw", "busbw", "#wrong", "ratios"):
        assert word in run.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed")
def test_bench_on_mpi(tmp_path):
    out = tmp_path / "r.json"
    run = reshard_cli("bench", "--engine", "mpi", "--ranks", "2", "--sizes", "64K", "--iters", "2", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert {r["method"] for r in rows} == {"reshard", "reshard-nocheck", "raw", "memcpy"}
    assert all(r["wrong"] == 0 for r in rows)


def test_bench_rejects_bad_options():
    assert reshard_cli("bench", "--sizes", "lots").returncode == 2
    assert reshard_cli("bench", "--methods", "fast").returncode == 2
    assert reshard_cli("bench", "--op", "moe", "--ranks", "3").returncode == 2


def test_bench_says_an_empty_method_list_names_no_method():
    run = reshard_cli("bench", "--methods", " , ")
    assert run.returncode == 2
    assert "--methods names no method" in run.stderr and "[]" not in run.stderr


@pytest.mark.parametrize("engine, extra", [("gloo", ()), pytest.param("mpi", (), marks=pytest.mark.skipif(
    not HAVE_MPI, reason="mpi4py is not installed")), pytest.param("mpi", ("--numpy",), marks=pytest.mark.skipif(
    not HAVE_MPI, reason="mpi4py is not installed"))])
def test_moe_by_hand_baseline_is_checked(engine, extra, tmp_path):
    # raw+local gathers the routed rows, exchanges them there and back and sums each token's
    # k results: with identity experts and weights 1/k its output must be the tokens, exactly
    out = tmp_path / "r.json"
    run = reshard_cli("bench", "--engine", engine, "--ranks", "2", "--op", "moe", "--sizes", "256K", "--iters", "2",
                      "--methods", "reshard,raw,raw+local", "--json", str(out), *extra)
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    assert {r["method"] for r in data["rows"]} == {"reshard", "raw", "raw+local"}
    assert all(r["wrong"] == 0 for r in data["rows"])
    assert "reshard / raw+local" in data["ratios"][0]


def test_bench_on_a_mesh_counts_the_bytes_each_method_sends(tmp_path):
    out = tmp_path / "m.json"
    run = reshard_cli("bench", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "S(1),S(0)", "--sizes", "256K",
                      "--iters", "2", "--warmup", "1", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"reshard", "reshard-nocheck", "dtensor"} and all(r["wrong"] == 0 for r in rows.values())
    # two ranks of four keep their block and two swap theirs; DTensor gathers along both mesh dims
    assert rows["reshard"]["sent_bytes"] == 256 << 10
    assert rows["dtensor"]["sent_bytes"] >= 3 * rows["reshard"]["sent_bytes"]


@pytest.mark.parametrize("src,dst", [("S(0),S(0)", "Spec((1, 0), None)"), ("Spec(0)", "Spec(None, 1)")])
def test_bench_on_a_mesh_reads_specs_on_that_mesh_and_gives_dtensor_their_strided_shards(tmp_path, src, dst):
    """A Spec resolves on the mesh given, even where it names fewer mesh dims (``Spec(0)`` on
    2x2 is (Shard(0), Replicate())); DTensor moves the same ordered layout (its _StridedShard),
    so every method's results are right."""
    out = tmp_path / "m.json"
    run = reshard_cli("bench", "--mesh", "2x2", "--src", src, "--dst", dst, "--sizes", "64K",
                      "--iters", "1", "--warmup", "1", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"reshard", "reshard-nocheck", "dtensor"}
    assert all(r["wrong"] == 0 for r in rows.values()), {m: r["wrong"] for m, r in rows.items()}
    assert rows["dtensor"]["sent_bytes"] > 0  # two different layouts: not a no-op


def test_bench_overlap_times_started_calls_and_the_moe_pipeline(tmp_path):
    out, png = tmp_path / "o.json", tmp_path / "step.png"
    run = reshard_cli("bench", "--overlap", "--ranks", "2", "--sizes", "64K", "--iters", "1", "--json", str(out),
                      "--timeline", str(png))
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(out.read_text())
    want = {"all_to_all alone", "multiply alone", "reshard all_to_all, then multiply",
            "reshard all_to_all started, multiply, wait", "torch all_to_all_single started, multiply, wait"}
    assert set(data["seconds"]) == want and all(v > 0 for v in data["seconds"].values())
    assert data["bytes_per_rank"] == 64 << 10 and data["multiplies"] >= 1
    assert "faster than the blocking call" in run.stdout
    moe = data["moe"]
    assert moe["depth"] >= 1 and moe["exchange_s"] > 0 and moe["compute_s"] > 0
    assert set(moe["seconds"]) == {"1", "2", "4", "8"} and all(len(v) == 1 for v in moe["samples"].values())
    for k in ("2", "4", "8"):  # the fractions follow from the times printed beside them
        saved = moe["seconds"]["1"] - moe["seconds"][k]
        assert moe["hidden_fraction"][k] == pytest.approx(saved / min(moe["exchange_s"], moe["compute_s"]))
        assert f"| {k} | {moe['seconds'][k]:.3f} |" in run.stdout
    ranks = moe["timeline"]["ranks"]  # 2 ranks, each a dispatch, an expert pass and a combine per part
    assert len(ranks) == 2 and all(sorted((int(k), int(p)) for k, p, _, _ in r) == [(k, p) for k in range(3) for p in range(4)]
                                   for r in ranks)
    assert all(0 <= a <= b for r in ranks for _, _, a, b in r)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in run.stdout
    assert reshard_cli("bench", "--timeline", str(png)).returncode == 2
    assert reshard_cli("bench", "--overlap", "--ranks", "3").returncode == 2


@pytest.mark.parametrize("args,named,timed", [
    pytest.param(("--engine", "mpi", "--methods", "raw+local,dtensor"),
                 ["raw+local is not timed here: it is an MoE layer's", "dtensor is not timed here: DTensor runs on torch"],
                 None, marks=pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed")),
    (("--op", "all_gather", "--methods", "reshard,raw+pack"), ["raw+pack is not timed here"], ["reshard"]),
    (("--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "S(1),S(0)", "--methods", "reshard,raw"),
     ["raw is not timed here: a mesh run times reshard, reshard-nocheck and dtensor only"], ["reshard"]),
    (("--methods", "raw,memcpy"), [], ["raw", "memcpy"]),
])
def test_a_method_asked_for_that_cannot_run_here_is_named_with_why(tmp_path, args, named, timed):
    out = tmp_path / "bench.json"
    run = reshard_cli("bench", "--sizes", "16K", "--iters", "2", "--warmup", "0", "--json", str(out), *args)
    for words in named:
        assert words in run.stderr, run.stderr
    if timed is not None:
        assert run.returncode == 0 and [r["method"] for r in json.loads(out.read_text())["rows"]] == timed
        # a ratios table only where reshard was timed beside something
        assert ("ratios" in run.stdout) == ("reshard" in timed and len(timed) > 1), run.stdout
    else:  # nothing left to time: refused before any rank starts, no empty table
        assert run.returncode == 2 and "none of --methods can be timed here" in run.stderr and not out.exists()
        assert "time (us)" not in run.stdout, run.stdout


@pytest.mark.parametrize("args", [("--ranks", "3"), ("--ranks", "4", "--mesh", "2x2", "--src", "S(0),R", "--dst", "S(1),R")])
def test_every_reshard_method_counts_the_buffers_it_uses_whichever_ran_first(args, tmp_path):
    out = tmp_path / "r.json"
    run = reshard_cli("bench", *args, "--methods", "reshard,reshard-nocheck", "--sizes", "256K", "--iters", "1",
                      "--warmup", "0", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    extra = {r["method"]: r["extra_bytes"] for r in json.loads(out.read_text())["rows"]}
    assert extra["reshard"] > 0 and extra["reshard-nocheck"] == extra["reshard"], extra
