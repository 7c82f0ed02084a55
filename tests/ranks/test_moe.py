"""all_to_all_v and MoE dispatch/combine on real ranks against the numpy oracle, their bad
input, and gradients of every differentiable op against a one-process reference."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import reshard as rs
from tests.helpers import moe_rank
from tests.helpers.rank_fns import call_op, rank_processes

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
ENGINES = ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed"))]
# Each example starts real ranks, so shrinking (hundreds of jobs) would dominate the run; a
# failure still prints the whole failing example, which is small by construction.
SETTINGS = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])
DTYPES = ["float32", "float64", "int8", "int64", "bool", "complex64", "float16"]


def assert_every_case_passes(rank_fn, n, cases):
    """Run ``cases`` on ``n`` ranks; every rank must report None (no problem) for every case."""
    for rank, problems in enumerate(rs.spawn(rank_fn, n, args=(cases,), timeout=120)):
        assert problems == [None] * len(cases), (rank, [(c, p) for c, p in zip(cases, problems) if p])


@st.composite
def a2av_batch(draw):
    n = draw(st.integers(1, 4))
    cases = []
    for _ in range(draw(st.integers(1, 6))):
        counts = [draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)) for _ in range(n)]
        trail = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        cases.append(dict(counts=counts, trail=trail, dtype=draw(st.sampled_from(DTYPES)),
                          kind=draw(st.sampled_from(["torch", "numpy"])),
                          # grouped into hosts as a launcher would: two levels must give the same rows
                          hosts=draw(st.sampled_from([h for h in range(1, n + 1) if n % h == 0])),
                          algorithm=draw(st.sampled_from(["flat", "hierarchical", "flat"]))))
    return n, cases


@SETTINGS
@given(a2av_batch())
def test_all_to_all_v_matches_the_oracle(example):
    assert_every_case_passes(moe_rank.run_a2av, *example)


@st.composite
def moe_batch(draw):
    n = draw(st.integers(1, 4))
    cases = []
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.integers(1, 3))
        cases.append(dict(
            seed=draw(st.integers(0, 10_000)), tokens=draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)),
            hidden=draw(st.integers(1, 4)), experts=n * draw(st.integers(1, 3)), k=k,
            capacity=draw(st.one_of(st.none(), st.integers(0, 6))), dtype=draw(st.sampled_from(["float32", "float64"])),
            kind=draw(st.sampled_from(["torch", "numpy"])), flat_ids=draw(st.booleans()),
            # ranks grouped into hosts as a launcher would: the two-level path must give the same
            hosts=draw(st.sampled_from([h for h in range(1, n + 1) if n % h == 0])),
            algorithm=draw(st.sampled_from(["flat", "hierarchical", "auto"])),
        ))
    return n, cases


@SETTINGS
@given(moe_batch())
def test_dispatch_combine_match_the_oracle(example):
    assert_every_case_passes(moe_rank.run_moe, *example)


@settings(SETTINGS, max_examples=4)
@given(moe_batch(), st.lists(st.integers(1, 5), min_size=4, max_size=4))
def test_pipeline_equals_one_part_bit_for_bit(example, chunks):
    n, cases = example
    cases = [dict(case, chunks=c) for case, c in zip(cases, chunks)]
    assert_every_case_passes(moe_rank.run_pipeline, n, cases)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pipeline_asked_for_two_levels_on_one_host_runs_them(engine):
    # chunks > 1 puts the combines on the pipeline's own communicator, which lacked the hosts
    # mesh the two-level path runs on when every rank sits on one host
    cases = [dict(seed=s, tokens=t, hidden=3, experts=6, k=2, capacity=c, dtype="float64", kind=kind,
                  flat_ids=False, algorithm="hierarchical", chunks=chunks)
             for s, (t, c, kind, chunks) in enumerate([([5, 7, 0], None, "numpy", 2), ([9, 4, 6], 2, "torch", 3),
                                                       ([1, 0, 2], None, "torch", 5)])]
    for rank, problems in enumerate(rs.spawn(moe_rank.run_pipeline, 3, engine, args=(cases,), timeout=120)):
        assert problems == [None] * len(cases), (rank, problems)


FIXED_MOE = [
    dict(seed=1, tokens=[0, 0, 0], hidden=2, experts=3, k=1, capacity=None),  # nobody has tokens
    dict(seed=2, tokens=[5, 0, 7], hidden=3, experts=6, k=2, capacity=None),  # a rank without tokens
    dict(seed=3, tokens=[8, 8, 8], hidden=1, experts=3, k=3, capacity=0),  # everything dropped
    dict(seed=4, tokens=[9, 4, 6], hidden=2, experts=9, k=2, capacity=2),  # tight capacity
    dict(seed=5, tokens=[6, 6, 6], hidden=4, experts=3, k=1, capacity=100, flat_ids=True),
    # three hosts of one rank: the rows across on a thread of their own where the engine allows
    dict(seed=6, tokens=[9, 4, 6], hidden=3, experts=6, k=2, capacity=None, hosts=3, algorithm="hierarchical"),
    dict(seed=7, tokens=[0, 7, 5], hidden=2, experts=9, k=3, capacity=2, hosts=3, algorithm="hierarchical"),
    # numpy inputs read backwards (a negative stride along the tokens, even where there is one)
    dict(seed=8, tokens=[1, 3, 1], hidden=3, experts=6, k=1, capacity=None, reversed=True),
    dict(seed=9, tokens=[1, 2, 0], hidden=2, experts=3, k=2, capacity=None, reversed=True),
]


@pytest.mark.parametrize("engine", ENGINES)
def test_dispatch_combine_edge_cases(engine):
    cases = [dict(c, dtype="float32", kind=kind) for c in FIXED_MOE for kind in ("torch", "numpy")]
    for rank, problems in enumerate(rs.spawn(moe_rank.run_moe, 3, engine=engine, args=(cases,), timeout=120)):
        assert problems == [None] * len(cases), (rank, [(c, p) for c, p in zip(cases, problems) if p])


@pytest.mark.parametrize("op", ["dispatch", "combine"])
def test_a_failed_dispatch_or_combine_leaves_no_exchange_running_behind_it(op):
    """The rows across the hosts run on a thread of their own while the exchange inside the host
    runs here; when that one raises, dispatch (or combine) waits for the thread before the
    error goes on."""
    results = rs.spawn(moe_rank.across_left_behind, 4, engine="gloo", args=(op,), timeout=120)
    for rank, (seen, running) in enumerate(results):
        assert f"rank {rank}: refused here" in seen, (rank, seen)
        assert running == [], (rank, running)


@pytest.mark.parametrize("engine", ENGINES)
def test_all_to_all_v_on_every_engine(engine):
    cases = [dict(counts=[[0, 3, 1], [2, 0, 0], [4, 4, 4]], trail=(2,), dtype=d, kind=k)
             for d in ("float32", "int64", "bool") for k in ("torch", "numpy")]
    cases.append(dict(counts=[[0, 0, 0]] * 3, trail=(), dtype="float64", kind="numpy"))
    for problems in rs.spawn(moe_rank.run_a2av, 3, engine=engine, args=(cases,), timeout=120):
        assert problems == [None] * len(cases)


def test_handle_reports_drops_in_order():
    """Capacity 2 for one expert that every token picks: ranks 0's first two tokens win."""
    results = rs.spawn(moe_rank.capacity_winners, 2, timeout=60)
    assert results[0] == ([2, 0], [[2, 0], [3, 0]])  # rank 0 (expert 0, 1): two kept, its tokens 2, 3 dropped
    assert results[1] == ([0, 0], [[0, 0], [1, 0], [2, 0], [3, 0]])


A = ("array", (6, 2))
BAD = {
    "counts do not add up": ("all_to_all_v", [dict(x=A, send_counts=[2, 2, 2]), dict(x=A, send_counts=[1, 1, 1]),
                                              dict(x=A, send_counts=[3, 3, 0])], "InvalidArgument", "rank 1"),
    "negative count": ("all_to_all_v", dict(x=A, send_counts=[7, -1, 0]), "InvalidArgument", "negative"),
    "too few counts": ("all_to_all_v", dict(x=A, send_counts=[6]), "InvalidArgument", "one per rank"),
    "float counts": ("all_to_all_v", dict(x=A, send_counts=[2.0, 2, 2]), "InvalidArgument", "int"),
    "trailing dims differ": ("all_to_all_v", [dict(x=("array", (6, 3)), send_counts=[2, 2, 2])] + [dict(x=A, send_counts=[2, 2, 2])] * 2,
                             "MismatchError", "dim 1"),
    "recv_counts wrong": ("all_to_all_v", dict(x=A, send_counts=[2, 2, 2], recv_counts=[2, 2, 1]), "MismatchError", "recv_counts"),
    "experts not a multiple": ("moe.dispatch", dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=4), "InvalidArgument", "multiple"),
    "expert id out of range": ("moe.dispatch", [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3)] * 2
                               + [dict(tokens=A, expert_ids=("ids", [0, 1, 2, 3, 0, 0]), num_experts=3)], "InvalidArgument", "rank 2"),
    "float expert ids": ("moe.dispatch", dict(tokens=A, expert_ids=("array", (6,), "float32"), num_experts=3), "UnsupportedDType", "integers"),
    "ids shape": ("moe.dispatch", dict(tokens=A, expert_ids=("array", (5,), "int64"), num_experts=3), "InvalidArgument", "[T]"),
    "negative capacity": ("moe.dispatch", dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3, capacity=-1), "InvalidArgument", "capacity"),
    "unknown algorithm": ("moe.dispatch", [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3)] * 2
                          + [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3, algorithm="tree")],
                          "InvalidArgument", "rank 2"),
    "num_experts differs": ("moe.dispatch", [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3)] * 2
                            + [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=6)], "MismatchError", "num_experts"),
    # the records hold None as -1 and the algorithm as an index; the message shows what was passed
    "capacity differs": ("moe.dispatch", [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3)] * 2
                         + [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3, capacity=2)],
                         "MismatchError", "capacity differs across ranks: ranks 0, 1: None; rank 2: 2"),
    # the input is named as the signature names it: tokens, expert_outputs
    "tokens not an array": ("moe.dispatch", dict(tokens=[1.0, 2.0], expert_ids=("array", (6,), "int64"), num_experts=3),
                            "InvalidArgument", "tokens must be a torch.Tensor or numpy.ndarray"),
    "tokens of strings": ("moe.dispatch", dict(tokens=("array", (6, 2), "U1"), expert_ids=("array", (6,), "int64"),
                                               num_experts=3), "UnsupportedDType", "tokens has dtype <U1"),
    "0-d tokens to a pipeline": ("moe.pipeline", dict(tokens=("array", ()), expert_ids=("array", (6,), "int64"),
                                                      experts=[abs]), "InvalidArgument", "tokens is 0-d"),
    "algorithm differs": ("moe.dispatch", [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3, algorithm="flat")] * 2
                          + [dict(tokens=A, expert_ids=("array", (6,), "int64"), num_experts=3, algorithm="hierarchical")],
                          "MismatchError", "algorithm differs across ranks: ranks 0, 1: 'flat'; rank 2: 'hierarchical'"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_fails_on_every_rank(name):
    op, kwargs, cls, word = BAD[name]
    for rank, (kind, message) in enumerate(rs.spawn(call_op, 3, args=(op, kwargs), timeout=60)):
        assert kind == cls, f"rank {rank}: {kind}: {message}"
        assert word in message, f"rank {rank}: {message!r} does not mention {word!r}"


def test_bad_counts_fail_everywhere_with_the_check_off():
    kwargs = [dict(x=A, send_counts=[2, 2, 2], check=False), dict(x=A, send_counts=[1, 1, 1], check=False),
              dict(x=A, send_counts=[2, 2, 2], check=False)]
    for rank, (kind, message) in enumerate(rs.spawn(call_op, 3, args=("all_to_all_v", kwargs), timeout=60)):
        assert kind == "InvalidArgument" and "rank 1" in message, (rank, kind, message)


@pytest.mark.parametrize("engine", ENGINES)
def test_gradients_match_a_one_process_reference(engine):
    results = rs.spawn(moe_rank.gradients, 3, engine=engine, timeout=120)
    for rank, checks in enumerate(results):
        failed = [name for name, ok in checks.items() if not ok]
        assert not failed, (rank, failed)
        assert len(checks) >= 12 and any("hierarchical" in name for name in checks)


IDLE_RANKS = [
    dict(seed=11, tokens=[0, 3, 2, 1], hidden=2, experts=8, k=2, capacity=None, dtype="float64"),  # a rank without tokens
    dict(seed=12, tokens=[2, 0, 0, 3], hidden=3, experts=4, k=1, capacity=None, dtype="float64"),  # a host without tokens
    dict(seed=13, tokens=[0, 0, 0, 4], hidden=1, experts=8, k=2, capacity=1, dtype="float64"),  # one rank, capacity
    dict(seed=14, tokens=[0, 0, 0, 0], hidden=2, experts=4, k=2, capacity=None, dtype="float64"),  # nobody
]


@pytest.mark.parametrize("engine", ENGINES)
def test_two_level_gradients_reach_every_rank_where_ranks_hold_or_forward_no_tokens(engine):
    # every rank runs the reverse of every exchange, held rows or none: a rank whose result left
    # one exchange off the autograd tape skipped its reverse, and its peers waited for it
    results = rs.spawn(moe_rank.gradients_with_idle_ranks, 4, engine=engine, args=(IDLE_RANKS,), timeout=120)
    for rank, checks in enumerate(results):
        failed = [name for name, ok in checks.items() if not ok]
        assert not failed, (rank, failed)
        assert len(checks) == 2 * 3 * len(IDLE_RANKS), checks


@pytest.mark.parametrize("engine", ENGINES)
def test_example_moe_layer_matches_one_process(engine):
    examples = pathlib.Path(__file__).resolve().parents[2] / "examples"
    sys.path.insert(0, str(examples))
    try:
        import moe_layer
    finally:
        sys.path.remove(str(examples))
    sys.path.append(str(examples))  # rank processes import the example by name
    try:
        ours, reference = moe_layer.run(engine, steps=5)
    finally:
        sys.path.remove(str(examples))
    assert len(ours) == len(reference) == 5
    assert max(abs(a - b) for a, b in zip(ours, reference)) <= 1e-5, (ours, reference)
    assert ours[-1] < ours[0]  # it trains
    assert np.isfinite(ours).all()


@pytest.mark.parametrize("check", [True, False])
def test_last_exchange_names_the_moe_op_alike_on_both_paths(check):
    # dispatch: the records and the counts (flat), and the rows per host (two levels);
    # combine: the records; with the check on, each op's vote too. Both paths report the op
    # by its public name.
    vote = int(check)
    for rank, seen in enumerate(rs.spawn(moe_rank.moe_reports, 2, args=(check,))):
        (d_op, d_meta, d_sent, d_steps), (c_op, c_meta, _, c_steps) = seen["flat"]
        assert (d_op, c_op) == ("moe.dispatch", "moe.combine"), seen
        assert (d_meta, c_meta) == (2 + vote, 1 + vote) and d_steps >= 1 and c_steps >= 1, seen
        assert d_sent == seen["flat rows out"], (rank, seen)
        (h_op, h_meta, _, _), (hc_op, hc_meta, _, _) = seen["hierarchical"]
        assert (h_op, hc_op) == ("moe.dispatch", "moe.combine"), seen
        assert (h_meta, hc_meta) == (3 + vote, 1 + vote), seen
        # the tokens (ordinary, small) are gathered once flat; on one host, two levels gather
        # only the own host's rows to forward inside it (none cross, none arrive)
        assert (seen["flat packs"], seen["hierarchical packs"]) == (1, 1), (rank, seen)
        # flat combine: the small rows take the engine's path and are put in (token, slot) order after it
        assert seen["flat combine unpacks"] == 1, (rank, seen)


@pytest.mark.parametrize(("engine", "kind", "hosts"), [("gloo", "numpy", None), ("gloo", "torch", 2),
                                                        ("gloo", "torch-grad", None), ("mpi", "numpy", None)])
def test_pipeline_combines_travel_on_a_lane_of_their_own_where_the_engine_allows(engine, kind, hosts):
    """With more than one part, on gloo and off the autograd tape, every combine is started on the
    pipeline's own communicator (a second worker: it travels while a dispatch does); on the tape,
    and on MPI without THREAD_MULTIPLE, all follow the dispatches on one worker. The result, and on
    the tape the gradient, equals one part's bit for bit either way."""
    per_rank = rs.spawn(moe_rank.pipeline_lanes, 4, engine=engine, args=(kind, hosts), timeout=240)
    for rank, (out, two_groups_at_once) in enumerate(per_rank):
        assert two_groups_at_once == (engine == "gloo") or engine == "mpi", rank  # MPI: as its thread level allows
        one, _, started = out[1]
        assert started == [("moe.dispatch", False), ("moe.combine", False)], (rank, started)
        for chunks in (3, 4):
            got, grad, started = out[chunks]
            assert got == one and grad == out[1][1], f"rank {rank}: {chunks} parts differ from one"
            on_lane = two_groups_at_once and kind != "torch-grad"
            assert started == [("moe.dispatch", False)] * chunks + [("moe.combine", on_lane)] * chunks, (rank, started)


def test_a_two_level_dispatch_and_combine_count_each_gather_of_rows_as_a_pack():
    # dispatch: the rows crossing to the other host, the own host's rows to forward, the arrived
    # rows to forward; combine: the expert outputs of each host's tokens joined in arrival order
    assert rs.spawn(moe_rank.two_level_packs, 4, engine="gloo", timeout=120) == [(3, 2)] * 4


def test_a_rank_killed_while_two_exchanges_travel_ends_in_rank_failed():
    with pytest.raises(rs.RankFailed) as failed:
        rs.spawn(moe_rank.pipeline_rank_dies, 4, engine="gloo", args=(2,), timeout=60)
    assert "rank 2" in str(failed.value), str(failed.value)
    assert rank_processes() == [], "rank processes outlived the job"


def test_the_phases_of_a_two_level_step_are_recorded_where_someone_listens():
    """Every phase lies inside the step, on the main thread or the exchange across the hosts;
    the checks, the counts, the exchanges, the packs and sums are there, and each message to the
    other host names its bytes; after the listening ends nothing more is recorded."""
    os.environ["RESHARD_SHM"] = "0"  # every message as gloo's own, as between hosts
    try:
        per_rank = rs.spawn(moe_rank.phase_spans, 4, engine="gloo", timeout=120)
    finally:
        del os.environ["RESHARD_SHM"]
    for rank, (spans, later, start, end) in enumerate(per_rank):
        names = {name for name, *_ in spans}
        assert {"check", "moe.dispatch (counts)", "moe.dispatch (inside the host)", "moe.combine (inside the host)",
                "pack rows", "sums", "join", "wait for the rows across"} <= names, (rank, sorted(names))
        assert all(start <= a <= b <= end for _, _, a, b, _ in spans), rank
        threads = {s[1] for s in spans}
        assert "MainThread" in threads and any(t.endswith("(across hosts)") for t in threads), (rank, threads)
        across = [s for s in spans if s[0].startswith("message to rank") and s[1].endswith("(across hosts)")]
        assert across and all(nbytes > 0 for *_, nbytes in across), (rank, across)
        assert later == [], rank
