"""Repeated calls of one signature replay the plan of the first (ops.py, "repeated calls"):
results against the numpy oracle on every call, what a replay still exchanges, and every way
the plan must be dropped (a peer changes its shard, bad input after good, freed datatypes,
a flipped check, autograd, a rank that never arrives)."""

from __future__ import annotations

import functools
import importlib.util
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import reshard as rs
from tests.helpers import replay_rank

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
NEEDS_MPI = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed")
ENGINES = ["gloo", pytest.param("mpi", marks=NEEDS_MPI)]
SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


REPLAYED_OPS = ("redistribute", "redistribute_global", "all_gather", "gather", "reduce_scatter")


@functools.cache
def replays_of_every_op(engine: str, check: bool) -> list[dict]:
    """One job per engine and check runs every op's calls (each op its own signatures)."""
    return rs.spawn(replay_rank.replay_stats_of_ops, 3, engine=engine, args=(REPLAYED_OPS, "torch", check))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("op", REPLAYED_OPS)
@pytest.mark.parametrize("check", [True, False])
def test_second_call_replays_and_matches_the_oracle(engine, op, check):
    per_rank = [by_op[op] for by_op in replays_of_every_op(engine, check)]
    for rank, calls in enumerate(per_rank):
        assert [ok for ok, *_ in calls] == [True] * 3, (rank, calls)
        assert [replayed for _, replayed, *_ in calls] == [False, True, True], (rank, calls)
        first = calls[0][2:]
        for later in calls[1:]:
            assert later[3:] == first[1:], (rank, calls)  # the same traffic
        # The first call agrees (a round of records) after a vote wherever a replay votes: with
        # the check on, or off where the shards' lengths are needed (every rank's plan made from
        # the same records), and on every first redistribute (whether lengths are needed comes
        # from each rank's own arguments); with check off and everything known (global_shape),
        # a replay moves nothing but data.
        knows_all = not check and op in ("redistribute_global", "reduce_scatter")
        assert first[0] == (1 if knows_all and op == "reduce_scatter" else 2), calls
        rounds = [c[2] for c in calls[1:]]
        assert rounds == [0 if knows_all else 1] * 2, calls


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("op", ["redistribute", "redistribute_global"])
@pytest.mark.parametrize("check", [True, False])
def test_numpy_in_numpy_out_on_replay(engine, op, check):
    for calls in rs.spawn(replay_rank.replay_stats, 2, engine=engine, args=(op, "numpy", check)):
        assert [(ok, replayed) for ok, replayed, *_ in calls] == [(True, False), (True, True), (True, True)]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_unchecked_replay_that_needs_nothing_from_its_peers_builds_no_call(engine):
    # the path a training loop's repeated call takes: signature, plan, steps; nothing else
    for built, outcomes in rs.spawn(replay_rank.calls_built_per_replay, 2, engine=engine):
        assert all(ok and replayed for ok, replayed in outcomes), outcomes
        assert built == {"check off, global_shape given": 0, "check off, shapes learned": 1, "check on": 1}, built


@st.composite
def shard_histories(draw):
    """A world, an all_to_all, and per call how long every rank's shard along concat_dim is:
    calls repeat or change on any subset of ranks (a change on one rank only is the case a
    replay must catch)."""
    n = draw(st.integers(2, 4))
    ndim = draw(st.integers(2, 3))
    s, c = draw(st.permutations(range(ndim)))[:2]
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    shape[s] = draw(st.integers(0, 7))
    history = [draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))]
    for _ in range(draw(st.integers(2, 5))):
        prev = list(history[-1])
        if draw(st.booleans()):
            prev[draw(st.integers(0, n - 1))] = draw(st.integers(0, 4))
        history.append(prev)
    return n, tuple(shape), s, c, history, draw(st.sampled_from(["torch", "numpy"]))


ZERO_SIZE_STRIDES = (2, (5, 4, 1), 1, 2, [[4, 3], [4, 0], [0, 0], [1, 0], [1, 0], [4, 0]], "numpy")


@SETTINGS
@given(shard_histories())
@example(ZERO_SIZE_STRIDES)
def test_shards_changing_under_a_plan(case):
    _replays_exactly_when_every_rank_holds_a_current_plan("gloo", case)


# The replay decision is the engine-independent part; on MPI (a job costs a few seconds more to
# start) fewer drawn histories check that its datatype plans follow the same decision.
@NEEDS_MPI
@settings(SETTINGS, max_examples=2)
@given(shard_histories())
@example(ZERO_SIZE_STRIDES)
def test_shards_changing_under_a_plan_on_mpi(case):
    _replays_exactly_when_every_rank_holds_a_current_plan("mpi", case)


def _replays_exactly_when_every_rank_holds_a_current_plan(engine, case):
    n, shape, s, c, history, kind = case
    per_rank = rs.spawn(replay_rank.repeated_all_to_all, n, engine=engine, args=(shape, s, c, history, kind))
    for rank, calls in enumerate(per_rank):
        assert all(ok for ok, _, _ in calls), (rank, calls, case)
    for i in range(len(history)):
        # The model: a rank keeps one plan per signature of its own input (shape and layout;
        # dtype and arguments are fixed here), made by the latest call with that signature.
        # Every rank replays exactly when every rank holds such a plan, made when every
        # rank's shard was what it is now; otherwise none does.
        def holds_current_plan(calls, i=i):
            earlier = [j for j in range(i) if calls[j][2] == calls[i][2]]
            return bool(earlier) and history[earlier[-1]] == history[i]

        want = all(holds_current_plan(calls) for calls in per_rank)
        assert [calls[i][1] for calls in per_rank] == [want] * n, (i, case)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("change", ["dtype", "shape", "dims", "collective"])
def test_bad_input_after_a_plan_raises_on_every_rank(engine, change):
    n, bad = 3, 1
    per_rank = rs.spawn(replay_rank.mismatch_after_replay, n, engine=engine, args=(bad, change))
    for rank, steps in enumerate(per_rank):
        assert steps[0] == ("ok", False) and steps[1] == ("ok", True), (rank, steps)
        kind, message = steps[2]
        assert kind == "MismatchError", (rank, steps)
        assert "rank 1" in message, message
        assert steps[3][0] == "ok", (rank, steps)  # the good signature works again afterwards


@NEEDS_MPI
def test_votes_left_by_a_call_that_raised_are_not_taken_by_the_next():
    # taken, rank 0 would skip its vote while the others wait for it until the timeout
    assert rs.spawn(replay_rank.after_stale_votes, 3, engine="mpi", timeout=20) == [True] * 3


@NEEDS_MPI
def test_freed_datatypes_are_never_replayed():
    for calls in rs.spawn(replay_rank.types_freed_between_calls, 3, engine="mpi"):
        assert [ok for ok, _ in calls] == [True] * 3, calls


@pytest.mark.parametrize("engine", ENGINES)
def test_flipping_the_check_makes_a_new_signature(engine):
    for seen in rs.spawn(replay_rank.toggled_check, 2, engine=engine):
        # a first call votes and exchanges the records, check on or off; a replay votes (a
        # replay of all_to_all with the check off still needs every shard's length)
        assert seen == [(False, 2), (True, 1), (False, 2), (True, 1), (True, 1)], seen


def test_vote_through_shared_memory_names_the_rank_that_never_votes():
    # gloo ranks on one host vote through their outboxes: the wait is reshard's own polling
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(replay_rank.late_voter, 3, engine="gloo", args=(1, 2.0), timeout=15)
    assert time.monotonic() - start < 40
    for rank in (0, 2):  # the vote's own bound ran out first, on both, naming the rank
        assert "CommTimeout" in info.value.failures[rank] and "for rank 1 " in info.value.failures[rank], \
            info.value.failures


def test_vote_through_shared_memory_is_on_where_every_rank_shares_memory():
    boards = rs.spawn(replay_rank.vote_path, 3, engine="gloo")
    assert boards == [True] * 3, boards


@pytest.mark.parametrize("engine", ENGINES)
def test_gradient_through_a_replay(engine):
    n = 3
    per_rank = rs.spawn(replay_rank.grad_through_replay, n, engine=engine)
    for call in range(2):
        weights = [per_rank[r][call][1] for r in range(n)]
        full_weight = np.concatenate(weights, axis=1)  # w is laid out Shard(1), like y
        for r in range(n):
            grad, _, replayed = per_rank[r][call]
            assert np.array_equal(grad, full_weight[2 * r : 2 * r + 2]), (call, r)
            assert replayed == (call == 1)


@NEEDS_MPI
def test_rank_that_never_arrives_at_a_replay_times_out_the_others():
    # MPI, where the bounded wait is reshard's own polling (gloo's is the process group's)
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(replay_rank.replay_then_late, 3, engine="mpi", args=(1, 600), timeout=5)
    assert time.monotonic() - start < 40
    waiting = [info.value.failures.get(rank, "") for rank in (0, 2)]
    assert any("CommTimeout" in text for text in waiting), waiting


@pytest.mark.parametrize("engine", ENGINES)
def test_rank_that_dies_before_a_replay_stops_the_others(engine):
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(replay_rank.replay_then_late, 3, engine=engine, args=(1, None), timeout=30)
    assert time.monotonic() - start < 40
    assert 1 in info.value.failures
    # A survivor raised (never returned data) or was stopped: by spawn, or on MPI by mpirun,
    # which ends the whole job when a rank exits early.
    words = ("RankFailed", "CommTimeout", "stopped") + (("ended before reporting",) if engine == "mpi" else ())
    for rank in (0, 2):
        text = info.value.failures.get(rank, "stopped")
        assert any(word in text for word in words), text


@functools.cache
def hot_replay_cases(engine: str) -> list[dict]:
    """One job per engine runs every hot-replay case (``replay_rank.hot_replay_cases``)."""
    return rs.spawn(replay_rank.hot_replay_cases, 3, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_hot_replays_match_the_oracle_and_report_what_a_replay_reports(engine, kind):
    # calls 3 and 4 run the replay that call 2 made, without looking the plan up again
    for rank, cases in enumerate(hot_replay_cases(engine)):
        for op, calls in cases[kind].items():
            assert [ok for ok, _, _ in calls] == [True] * 4, (rank, op, calls)
            stats = [fields for _, fields, _ in calls]
            assert [s[1] for s in stats] == [False, True, True, True], (rank, op, stats)  # replayed
            assert stats[2] == stats[1] and stats[3] == stats[1], (rank, op, stats)
            assert stats[1][2] + stats[1][3] > 0 and stats[1][7] == 0, (rank, op, stats)  # data moved, no records
            assert [built for _, _, built in calls][2:] == [0, 0], (rank, op, calls)


@pytest.mark.parametrize("engine", ENGINES)
def test_checked_hot_replays_vote_and_report_what_a_checked_replay_reports(engine):
    # calls 3 and 4 cast the vote of call 2's plan and run it, without building a Call
    for rank, cases in enumerate(hot_replay_cases(engine)):
        for op, calls in cases["numpy, checked"].items():
            assert [ok for ok, _, _ in calls] == [True] * 4, (rank, op, calls)
            stats = [fields for _, fields, _ in calls]
            assert [s[1] for s in stats] == [False, True, True, True], (rank, op, stats)  # replayed
            assert stats[2] == stats[1] and stats[3] == stats[1], (rank, op, stats)
            assert stats[1][7] == 1, (rank, op, stats)  # the vote
            assert [built for _, _, built in calls][2:] == [0, 0], (rank, op, calls)


@pytest.mark.parametrize("engine", ENGINES)
def test_hot_replay_refuses_what_the_full_path_refuses(engine):
    for rank, cases in enumerate(hot_replay_cases(engine)):
        outcomes = cases["refusals"]
        got = {name: rest for name, *rest in outcomes}
        after_freed = ("world after freed types", "mesh after freed types 0", "mesh after freed types 1")
        for name in ("world 0", "world 1", "world 2", "world again", "global_shape as an array", "mesh 0", "mesh 1", "mesh 2",
                     "mesh, dst changed in place", "strided input", "mesh, strided input 0", "mesh, strided input 1",
                     "mesh, strided input 2", *after_freed):
            if name in got or name not in after_freed:
                assert got[name] == ["ok", True], (rank, name, outcomes)
        for name in ("a float in global_shape", "a bool in global_shape"):
            kind, message = got[name]
            assert kind == "InvalidArgument" and "global_shape" in message, (rank, name, outcomes)
        assert all((name in got) == (engine == "mpi") for name in after_freed), outcomes


@pytest.mark.parametrize("engine", ENGINES)
def test_a_loop_alternating_two_signatures_keeps_both_hot(engine):
    for rank, cases in enumerate(hot_replay_cases(engine)):
        outcomes = cases["alternating"]
        assert all(forth and back for forth, back, _ in outcomes), (rank, outcomes)
        # the first round plans, the second replays (and leaves both hot), the rest build nothing
        assert [built for _, _, built in outcomes][2:] == [0, 0, 0], (rank, outcomes)
