"""Every public collective runs the steps of its plan: on every rank, the steps
``rs.last_exchange()`` reports (collective, bytes out, bytes in) are the planner's steps for
that rank with the bytes the plan gives, and the results are numpy's."""

from __future__ import annotations

import numpy as np
import pytest

import reshard as rs
from reshard.planning import planner
from tests.helpers import moe_rank, rank_fns
from tests.helpers.oracle import pattern

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


@pytest.mark.parametrize(("engine", "arrays"), [("gloo", "torch"), ("mpi", "numpy")])
def test_two_level_moe_moves_what_its_routing_says(engine, arrays):
    """Two hosts of two ranks: the hierarchical dispatch's steps carry, each, the bytes worked out
    here from the expert ids alone (a token crosses to a host once, however many of its slots are
    there; inside a host each pair goes from its forwarder to its expert's rank), combine the same
    back, and the results are the flat path's."""
    n, hidden, top_k, per_rank = 4, 4, 2, 2
    results = rs.spawn(moe_rank.two_level_steps, n, engine=engine, args=(arrays,), timeout=240)
    row, route_row = hidden * ITEM, top_k * 8  # a token's row; its routing row (k int64 ids)
    ids = [moe_rank.two_level_inputs(n, q)[1] for q in range(n)]

    def host(q):
        return q // 2

    def pairs_to(q, h):  # the (token, slot) pairs of source q whose expert is on host h
        return [(t, e) for t in range(len(ids[q])) for e in ids[q][t] if host(e // per_rank) == h]

    def tokens_to(q, h):  # source q's tokens with a slot on host h: its rows to h
        return len({t for t, _ in pairs_to(q, h)})

    for r in range(n):
        me, mate = host(r), [q for q in range(n) if host(q) != host(r) and q % 2 == r % 2][0]  # its forwarder across
        sent_across, recv_across = tokens_to(r, 1 - me), tokens_to(mate, me)
        # inside the host: the forwarder r passes on its own host's pairs (its own) and those that
        # came from its mate, each to its expert's rank; pairs for r itself stay
        own_pairs = [e // per_rank for _, e in pairs_to(r, me)]
        other_pairs = [e // per_rank for _, e in pairs_to(mate, me)]
        peer = [q for q in range(n) if host(q) == me and q != r][0]
        from_peer_own = [e // per_rank for _, e in pairs_to(peer, me)].count(r)
        from_peer_other = [e // per_rank for _, e in pairs_to([q for q in range(n) if host(q) != me and q % 2 == peer % 2][0],
                                                                  me)].count(r)
        algorithm, inputs, back, dispatched, combined = results[r]["hierarchical"]
        assert algorithm == "hierarchical"
        want = [("all_to_all_v (routing across hosts)", sent_across * route_row, recv_across * route_row),
                ("all_to_all_v (inside the host, own host's tokens)", sum(q != r for q in own_pairs) * row, from_peer_own * row),
                ("all_to_all_v (across hosts)", sent_across * row, recv_across * row),
                ("all_to_all_v (inside the host, other hosts' tokens)", sum(q != r for q in other_pairs) * row,
                 from_peer_other * row)]
        assert sorted(dispatched) == sorted(want), f"rank {r}: dispatch ran {dispatched}, the routing gives {want}"
        want_back = [("all_to_all_v (inside the host, other hosts' tokens)", from_peer_other * row,
                      sum(q != r for q in other_pairs) * row),
                     ("all_to_all_v (inside the host, own host's tokens)", from_peer_own * row,
                      sum(q != r for q in own_pairs) * row),
                     ("all_to_all_v (across hosts)", recv_across * row, sent_across * row)]
        assert sorted(combined) == sorted(want_back), f"rank {r}: combine ran {combined}, the routing gives {want_back}"
        flat_algorithm, flat_inputs, flat_back, _, _ = results[r]["flat"]
        assert flat_algorithm == "flat" and inputs == flat_inputs, f"rank {r}: the experts' inputs differ from flat's"
        tokens = moe_rank.two_level_inputs(n, r)[0]
        assert np.array_equal(np.asarray(back, dtype=np.float32), top_k * tokens) and back == flat_back, f"rank {r}"
