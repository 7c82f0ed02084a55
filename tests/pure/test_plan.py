"""The planner, checked by executing its transfers on numpy arrays and comparing with slices."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.planning.plan import make_plan
from tests.helpers.oracle import placement_slice

PLACEMENTS = ["shard", "replicate", "partial"]


def _placement(kind: str, dim: int):
    return {"shard": rs.Shard(dim), "replicate": rs.Replicate(), "partial": rs.Partial()}[kind]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=4).map(tuple), st.integers(1, 6), st.data())
def test_transfers_rebuild_every_destination(shape, n, data):
    src_kind, dst_kind = data.draw(st.sampled_from(list(itertools.product(PLACEMENTS, repeat=2))))
    src = _placement(src_kind, data.draw(st.integers(0, len(shape) - 1)))
    dst = _placement(dst_kind, data.draw(st.integers(0, len(shape) - 1)))
    plan = make_plan(shape, src, dst, n, "int32")
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    # sent and received bytes agree with the traffic matrix
    m = plan.traffic_matrix
    assert plan.bytes_sent_per_rank == [sum(m[i][j] for j in range(n) if j != i) for i in range(n)]
    assert plan.bytes_received_per_rank == [sum(m[i][j] for i in range(n) if i != j) for j in range(n)]
    if plan.collective not in ("all_to_all", "all_gather"):
        return
    # movement collectives: writing every transfer's region into each destination rebuilds it
    for r in range(n):
        want = placement_slice(full, ("shard", dst.dim) if isinstance(dst, rs.Shard) else ("replicate",), r, n)
        got = np.full(want.shape, -1)
        origin = [a for a, _ in rs.layout.local_region(shape, dst, r, n)]
        covered = np.zeros(want.shape, dtype=int)
        for t in plan.transfers:
            if t.dst != r:
                continue
            src_region = rs.layout.local_region(shape, src, t.src, n)
            assert all(a0 <= a and b <= b0 for (a, b), (a0, b0) in zip(t.region, src_region)), "sent what it does not hold"
            index = tuple(slice(a - o, b - o) for (a, b), o in zip(t.region, origin))
            got[index] = full[tuple(slice(a, b) for a, b in t.region)]
            covered[index] += 1
        assert np.array_equal(got, want)
        if plan.collective == "all_to_all":
            assert covered.size == 0 or covered.max() == 1, "an element arrived twice"


def test_row_to_column_plan():
    plan = make_plan((6, 6), "row", "col", 3, "float32")
    assert plan.collective == "all_to_all"
    assert plan.traffic_matrix == [[16] * 3] * 3  # a 2x2 float32 block per pair
    assert plan.bytes_sent_per_rank == [32, 32, 32]  # own block excluded
    assert (plan.pack_copies, plan.unpack_copies) == (1, 0)
    assert (make_plan((6, 6), "col", "row", 3).pack_copies, make_plan((6, 6), "col", "row", 3).unpack_copies) == (0, 1)


@pytest.mark.parametrize(("shape", "src", "dst"), [((0, 8), "row", "col"), ((8, 0), "col", "row"), ((0, 4, 2), "S(2)", "S(0)"),
                                                  ((6, 0), "P(sum)", "S(1)"), ((0, 6), "S(1)", "R")])
def test_an_empty_tensor_is_planned_without_pack_or_unpack_copies(shape, src, dst):
    plan = make_plan(shape, src, dst, 3)
    assert (plan.pack_copies, plan.unpack_copies) == (0, 0)
    assert all(m["peak"] == 0 for m in plan.memory_per_rank())


def test_a_plan_near_8_eib_counts_exactly_and_a_larger_one_is_refused():
    rows = [333333334, 333333333, 333333333]  # 10**9 over 3 ranks, balanced
    plan = make_plan((10**9, 10**9), "row", "col", 3, "float64")
    sent = [sum(rows[r] * rows[d] * 8 for d in range(3) if d != r) for r in range(3)]
    assert [int(v) for v in plan.bytes_sent_per_rank] == sent
    with pytest.raises(rs.InvalidArgument, match=r"global_shape \[9999999999999, 9999999999999\] holds 4e\+26 bytes"):
        make_plan((9999999999999, 9999999999999), "row", "col", 3)


@pytest.mark.parametrize(("shape", "itemsize", "named"), [
    (8, None, "global_shape is a sequence of ints, got 8"), ("8x8", None, "global_shape is a sequence of ints"),
    ((8, 8), 0, "itemsize is the bytes of one element, at least 1, got 0"), ((8, 8), 2.5, "itemsize must be an int"),
])
def test_a_shape_or_itemsize_that_is_not_one_is_refused_by_name(shape, itemsize, named):
    with pytest.raises(rs.InvalidArgument, match=named):
        make_plan(shape, "row", "col", 3, itemsize=itemsize)


def test_collective_choice():
    shape = (8, 4)
    cases = {
        ("row", "col"): "all_to_all", ("row", "replicate"): "all_gather", ("partial", "row"): "reduce_scatter",
        ("partial", "replicate"): "all_reduce", ("replicate", "row"): "local", ("replicate", "partial"): "local",
        ("row", "partial"): "local", ("row", "row"): "none",
    }
    for (src, dst), want in cases.items():
        assert make_plan(shape, src, dst, 4).collective == want, (src, dst)


def test_a_report_works_out_regions_per_rank_and_lists_each_pair_once(monkeypatch):
    # the whole-world report reads every pair from many tables (split table, traffic matrix,
    # bytes per rank, memory, the time estimate): regions are worked out per rank, not per pair,
    # and each pair's transfer is listed once, so 64 ranks stay fast without a timed assertion
    from reshard import plan as plan_module

    calls = []
    real = plan_module.local_region
    monkeypatch.setattr(plan_module, "local_region", lambda *a: calls.append(a[1:3]) or real(*a))
    n = 64
    plan = make_plan((8192, 8192), "row", "col", n, "bfloat16")
    report = plan_module.plan_report(plan)
    plan_module.estimate_seconds(plan, 1e-6, 1e-9)
    assert len(set(calls)) == 2 * n and len(calls) <= 4 * n, len(calls)  # per rank (the memory table too), not per pair
    table = report["split_table"]
    assert len(table) == n * n and {(t["src_rank"], t["dst_rank"]) for t in table} == {(s, d) for s in range(n) for d in range(n)}
    # 8192 rows and cols over 64 ranks: 128 x 128 bfloat16 per pair
    assert {t["bytes"] for t in table} == {128 * 128 * 2} and report["total_bytes"] == 128 * 128 * 2 * n * (n - 1)


def test_a_plan_that_moves_nothing_runs_no_step():
    plan = make_plan((4, 4), "S(0)", "S(0)", 2)
    assert plan.steps == []
    assert [s.collective for s in make_plan((4, 4), "P(sum)", "P(max)", 2).steps] == ["reduce_scatter", "all_gather", "local"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple), st.integers(1, 7), st.data())
def test_the_tables_from_the_arrays_are_the_listing_of_every_pair(shape, n, data):
    """``reshard plan``'s tables come from each step's arrays (``Step.pairs``); the per-pair listing
    (``transfers``, checked against numpy slices above) must give the same split table, traffic
    matrix, bytes per rank and memory."""
    import json

    from reshard.planning.plan import plan_report, region_numel, report_json

    kinds = [*(f"S({d})" for d in range(len(shape))), "R", "P(sum)", "P(max)"]
    src, dst = data.draw(st.sampled_from(kinds)), data.draw(st.sampled_from(kinds))
    plan = make_plan(shape, src, dst, n, "int16")
    report = plan_report(plan)
    listed = [{"src_rank": t.src, "dst_rank": t.dst, "region": [list(r) for r in t.region], "bytes": t.nbytes,
               "step": step.collective} for step in plan.steps for t in step.transfers]
    assert report["split_table"] == listed[:4096] and report["split_table_truncated"] == (len(listed) > 4096)
    assert report_json(report) == json.dumps(report, indent=2)  # what `reshard plan --json` prints
    matrix = [[0] * n for _ in range(n)]
    received_all = [0] * n
    for t in plan.transfers:
        matrix[t.src][t.dst] += region_numel(t.region) * 2
        received_all[t.dst] += t.nbytes
    assert plan.traffic_matrix == matrix
    assert plan.bytes_sent_per_rank == [sum(row) - row[i] for i, row in enumerate(matrix)]
    assert plan.bytes_received_per_rank == [sum(matrix[i][j] for i in range(n)) - matrix[j][j] for j in range(n)]
    for step in plan.steps:
        assert step.participants == tuple(sorted({t.src for t in step.transfers} | {t.dst for t in step.transfers}))
    if plan.collective in ("reduce_scatter", "all_reduce"):
        extra = [plan.local_bytes(plan.src, r) * plan.pack_copies + received_all[r] for r in range(n)]
        assert [m["peak"] - m["before"] - m["after"] for m in plan.memory_per_rank()] == extra


@pytest.mark.parametrize("src,dst", [("row", "col"), ("row", "replicate"), ("partial", "row"), ("partial", "replicate"),
                                     ("replicate", "col"), ("col", "partial")])
def test_one_rank_runs_nothing_for_any_change(src, dst):
    # one rank holds the whole tensor under every layout, as redistribute's own plan says
    plan = make_plan((6, 4), src, dst, 1)
    assert plan.collective == "none" and plan.steps == [] and plan.total_bytes == 0
