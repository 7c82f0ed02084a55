"""Every public collective runs the steps of its plan: on every rank, the steps
``rs.last_exchange()`` reports (collective, bytes out, bytes in) are the planner's steps for
that rank with the bytes the plan gives, and the results are numpy's."""

from __future__ import annotations

import numpy as np
import pytest

import rank_fns
import reshard as rs
from oracle import pattern
from reshard.planning import planner

ITEM = 4  # float32


def _plan_steps(plan, in_shape):
    return [(name, sum(sent.values()) * ITEM, sum(received.values()) * ITEM)
            for name, sent, received in planner.rank_traffic(plan, in_shape)]


def _expected(n, r):
    """(plan steps, numpy result) per op for rank r, from the inputs ``every_op_steps`` builds."""
    want = {}
    shapes = [(n + 2, 3 + i) for i in range(n)]
    fulls = [pattern(s, "float32") + i for i, s in enumerate(shapes)]
    rows = rs.shard_sizes(n + 2, n)
    start = sum(rows[:r])
    result = np.concatenate([f[start:start + rows[r]] for f in fulls], axis=1)
    want["all_to_all"] = (_plan_steps(planner.all_to_all(r, shapes, 0, 1), shapes[r]), result)

    sizes = [(j + 1) % 3 for j in range(n)]
    shapes = [(sum(sizes), 2)] * n
    fulls = [pattern(shapes[0], "float32") + 10 * i for i in range(n)]
    start = sum(sizes[:r])
    result = np.concatenate([f[start:start + sizes[r]] for f in fulls], axis=0)
    want["all_to_all split_sizes"] = (_plan_steps(planner.all_to_all(r, shapes, 0, 0, sizes), shapes[r]), result)

    sends = [[(i + j) % 3 for j in range(n)] for i in range(n)]
    fulls = [pattern((sum(s), 4), "float32") + 100 * i for i, s in enumerate(sends)]
    got = [sends[i][r] for i in range(n)]
    result = np.concatenate([f[sum(sends[i][:r]):sum(sends[i][:r]) + got[i]] for i, f in enumerate(fulls)], axis=0)
    plan = planner.all_to_all_v(r, n, [(sends[r], got)])
    want["all_to_all_v"] = (_plan_steps(plan, (sum(sends[r]), 4)), result)

    shapes = [(2, i + 1) for i in range(n)]
    result = np.concatenate([pattern(s, "float32") + i for i, s in enumerate(shapes)], axis=1)
    want["all_gather"] = (_plan_steps(planner.all_gather(r, shapes, 1), shapes[r]), result)

    shapes = [(i, 3) for i in range(n)]
    result = np.concatenate([pattern(s, "float32") for s in shapes], axis=0) if r == n - 1 else None
    want["gather"] = (_plan_steps(planner.gather(r, shapes, 0, n - 1), shapes[r]), result)

    full = np.max([pattern((7, 3), "float32") * (i + 1) for i in range(n)], axis=0)
    part = rs.shard_sizes(7, n)
    result = full[sum(part[:r]):sum(part[:r]) + part[r]]
    want["reduce_scatter"] = (_plan_steps(planner.reduce_scatter(r, n, 0, "max"), (7, 3)), result)

    result = pattern((5, 2), "float32") + 0  # the sum in rank order, as the reduction runs
    for i in range(1, n):
        result = result + (pattern((5, 2), "float32") + i)
    want["all_reduce"] = (_plan_steps(planner.all_reduce(r, n, (5, 2), "sum"), (5, 2)), result)
    return want


@pytest.mark.parametrize(("engine", "arrays", "n"), [("gloo", "torch", 3), ("mpi", "numpy", 4)])
def test_every_collective_runs_its_plans_steps(engine, arrays, n):
    results = rs.spawn(rank_fns.every_op_steps, n, engine=engine, args=(arrays,), timeout=240)
    for r in range(n):
        want = _expected(n, r)
        for op, (plan_steps, result) in want.items():
            got, ran = results[r][op]
            assert ran == plan_steps, f"{op}, rank {r}: ran {ran}, the plan gives {plan_steps}"
            if result is None:
                assert got is None, f"{op}, rank {r}: a rank that is not the root got a result"
            else:
                got = np.asarray(got, dtype=np.float32)
                if got.size == 0 == result.size:  # an empty list keeps no shape
                    got = got.reshape(result.shape)
                assert np.array_equal(got, result), f"{op}, rank {r}: wrong values"
        (inputs, back), (dispatched, combined), (seg_send, seg_recv) = results[r]["moe"]
        plan = planner.all_to_all_v(r, n, list(zip(seg_send, seg_recv)))
        assert dispatched == _plan_steps(plan, (sum(map(sum, seg_send)), 4)), f"moe.dispatch, rank {r}"
        assert combined == _plan_steps(plan.reverse(), (sum(map(sum, seg_recv)), 4)), f"moe.combine, rank {r}"
        tokens = pattern((6, 4), "float32") + r
        assert np.array_equal(np.asarray(back, dtype=np.float32), 2 * tokens), f"moe round trip, rank {r}"
        assert all(step[0] == "all_to_all_v" for step in dispatched + combined)
