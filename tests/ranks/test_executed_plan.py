"""``redistribute`` runs exactly the steps ``make_plan`` returns: for every placement pair, the
steps each rank reports through ``rs.last_exchange()`` (collective, bytes out, bytes in) are the
plan's steps with the plan's bytes for that rank, on the first call, a checked replay, the
first unchecked call, its replay and the hot replay that leaves, each result equal to numpy's.
And each rank runs the steps its own plan (``rank_report``, made from its coordinate alone) gives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import reshard as rs
from reshard.planning.plan import make_plan
from tests.helpers import rank_fns
from tests.helpers.oracle import pattern

PLACEMENTS = ["S(0)", "S(1)", "S(2)", "R", "P(sum)", "P(max)"]
PAIRS = list(itertools.product(PLACEMENTS, repeat=2))


def _expected(shape, src, dst, n):
    plan = make_plan(shape, src, dst, n, "float32")
    per_rank = []
    for r in range(n):
        steps = []
        for step in plan.steps:
            sent, received = plan.step_bytes(step)
            steps.append((step.collective, sent[r], received[r]))
        per_rank.append(steps)
    return plan, per_rank


@pytest.mark.parametrize(("engine", "arrays", "n", "shape"), [
    ("gloo", "torch", 3, (5, 7, 4)),
    ("gloo", "numpy", 2, (3, 0, 5)),
    ("mpi", "numpy", 3, (7, 4, 2)),
    ("mpi", "torch", 4, (2, 9, 3)),
])
def test_every_pair_runs_the_plans_steps(engine, arrays, n, shape):
    results = rs.spawn(rank_fns.executed_steps, n, engine=engine, args=(shape, PAIRS, arrays), timeout=240)
    full = pattern(shape, "float32")
    for k, (src, dst) in enumerate(PAIRS):
        plan, want = _expected(shape, src, dst, n)
        for r in range(n):
            seen, ok, _ = results[r][k]
            calls = ("first call", "checked replay", "first unchecked call", "unchecked replay", "hot replay")
            for call, (steps, replayed) in zip(calls, seen):
                assert steps == want[r], f"{src} -> {dst}, rank {r} ({call}): ran {steps}, plan {want[r]}"
                # src == dst returns x itself on every call: nothing is planned, so nothing replays
                assert replayed == ("replay" in call and src != dst), (src, dst, r, call)
            assert ok in (True, None), f"{src} -> {dst}: rank {r} holds wrong values on some call"
        if rs.parse_placement(dst) != rs.parse_placement(src) and isinstance(rs.parse_placement(dst), rs.Partial):
            outs = [np.asarray(results[r][k][2]) for r in range(n)]
            op = rs.parse_placement(dst).op
            total = outs[0].copy()
            for o in outs[1:]:
                total = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op](total, o)
            assert np.array_equal(total, full), f"{src} -> {dst}: the ranks' partial values do not reduce to the tensor"


WORLD = ["S(0)", "S(1)", "R", "P(sum)", "P(max)"]
MESH = ["S(0),S(1)", "S(1),S(0)", "S(0),R", "R,S(1)", "R,R", "P(sum),S(1)", "S(0),P(sum)", "S(0),S(0)", "P(sum),P(sum)"]


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
@pytest.mark.parametrize("where", [3, 4, (2, 2)], ids=["world-3", "world-4", "mesh-2x2"])
def test_each_rank_runs_the_steps_its_own_plan_gives(where, engine):
    mesh = where if isinstance(where, tuple) else None
    names = MESH if mesh else WORLD
    pairs = [(a, b) for a in names for b in names]
    size = 4 if mesh else where
    results = rs.spawn(rank_fns.executed_and_planned, size, engine=engine, args=((7, 5), pairs, mesh), timeout=300)
    for rank, per_pair in enumerate(results):
        for src, dst, ran, planned in per_pair:
            assert ran == planned, f"rank {rank}: {src} -> {dst}: ran {ran}, but its plan says {planned}"
