"""The two-level all_to_all plan (``planner.all_to_all_hierarchical``), worked through on numpy
for every rank of H hosts x L ranks: its steps (reorder, the exchange inside each host, the one
across hosts) must give every rank what the flat exchange gives, element for element. The same
plans run on real ranks in test_multihost.py (two hosts) and on one host in test_conformance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.planning import host_costs, planner, steps
from tests.helpers.oracle import all_to_all_expected, balanced, pattern, starts, take


def _cut(x, dim, lengths):
    return [take(x, dim, a, a + k) for a, k in zip(starts(list(lengths)), lengths)]


def _exchange(inputs, members, step_of):
    """One AllToAll step among ``members`` (their ranks in group order): piece j of each to member j."""
    out = {}
    for j, r in enumerate(members):
        step = step_of[r]
        pieces = [_cut(inputs[q], step_of[q].split_dim, step_of[q].send_sizes)[j] for q in members]
        for i, q in enumerate(members):
            assert pieces[i].shape == step.recv_shapes[i], (r, q, pieces[i].shape, step.recv_shapes[i])
        out[r] = np.concatenate(pieces, axis=step.concat_dim)
        assert out[r].shape == step.out_shape
    return out


def _reorder(x, step):
    return np.concatenate([_cut(x, step.dim, step.lengths)[o] for o in step.order], axis=step.dim)


@settings(max_examples=300, deadline=None)
@given(hosts=st.integers(1, 4), per_host=st.integers(1, 4), ndim=st.integers(1, 3), data=st.data())
def test_two_level_plan_gives_every_rank_the_flat_result(hosts, per_host, ndim, data):
    n = hosts * per_host
    s = data.draw(st.integers(0, ndim - 1))
    c = data.draw(st.integers(0, ndim - 1))  # equal to s: all_to_all_single's form
    shape = [data.draw(st.integers(0, 4)) for _ in range(ndim)]
    shape[s] = data.draw(st.integers(0, 3 * n + 2))
    lengths = [data.draw(st.integers(0, 3 * n + 2 if s == c else 3)) for _ in range(n)]  # along concat_dim
    split = data.draw(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    if split is not None:
        shape[s] = sum(split)
        if s == c:
            lengths = [sum(split)] * n  # every rank cuts its own length by split_sizes
    full = pattern(tuple(shape[:c] + [sum(lengths)] + shape[c + 1 :]), "float64")
    held = dict(enumerate(_cut(full, c, lengths)))
    shapes = [x.shape for x in held.values()]
    plans = {r: planner.all_to_all_hierarchical(r, shapes, s, c, hosts, split) for r in range(n)}
    groups = {1: [[h * per_host + le for le in range(per_host)] for h in range(hosts)],  # inside each host
              0: [[h * per_host + le for h in range(hosts)] for le in range(per_host)]}  # across, per local index
    kinds = []
    for i in range(len(plans[0].steps)):  # every rank's plan has the same steps, walked in order
        if isinstance(plans[0].steps[i], steps.Reorder):
            held = {r: _reorder(x, plans[r].steps[i]) for r, x in held.items()}
            kinds.append("local")
            continue
        mesh_dim = plans[0].steps[i].mesh_dim
        step_of = {r: p.steps[i].steps[0] for r, p in plans.items()}
        moved = {}
        for members in groups[mesh_dim]:
            moved |= _exchange(held, members, step_of)
        held = moved
        kinds.append(mesh_dim)
    assert kinds == (["local", 1, 0] if s != c else ["local", 1, "local", 0]), kinds
    for r in range(n):
        want = all_to_all_expected(full, s, c, n, r, lengths, split)
        assert held[r].shape == want.shape and np.array_equal(held[r], want), r


def test_the_plan_back_is_the_two_level_exchange_back():
    shapes = [(6, 2), (6, 3), (6, 1), (6, 2)]
    plan = planner.all_to_all_hierarchical(1, shapes, 0, 1, 2)
    back = plan.reverse()
    assert [type(st) for st in back.steps] == [steps.OnMeshDim, steps.OnMeshDim, steps.Reorder]
    assert back.steps[0].mesh_dim == 0 and back.steps[1].mesh_dim == 1
    assert back.steps[2].reverse() == plan.steps[0]
    assert balanced(6, 4) == list(plan.steps[0].lengths)


def test_auto_asks_the_two_level_model():
    # two hosts of two: one message saved does not pay for a second step, at any size
    assert host_costs.cheaper(64 << 10, 2, 2) == "flat"
    assert host_costs.cheaper(1 << 30, 2, 2) == "flat"
    # many hosts: the messages saved across win, unless the bytes added inside outweigh them
    assert host_costs.cheaper(64 << 10, 16, 8) == "hierarchical"  # 120 messages across against 15
    assert host_costs.cheaper(2 << 20, 512, 8) == "hierarchical"  # 4,088 against 511
    assert host_costs.cheaper(1 << 34, 16, 8) == "flat"


def test_moe_model_takes_two_levels_only_where_the_link_bytes_saved_pay_for_them():
    # nothing saved across: the second step and the forwarding inside are pure cost
    assert not host_costs.moe_cheaper(1 << 20, 1 << 20, 1 << 20, 2, 2)
    # half the bytes on the busiest link at 64 MiB outweighs a step and 8 MiB forwarded inside
    assert host_costs.moe_cheaper(64 << 20, 32 << 20, 16 << 20, 2, 2)
    # a few bytes saved do not pay for the second step
    assert not host_costs.moe_cheaper(64 << 10, 60 << 10, 16 << 10, 2, 2)


@pytest.mark.parametrize(("hosts", "per_host"), [(2, 2), (3, 4), (8, 1)])
def test_levels_fitted_from_each_level_alone_give_back_its_times(hosts, per_host):
    truth = host_costs.Levels(alpha_local=3e-6, beta_local=1 / 40e9, alpha_link=40e-6, beta_link=1 / 2e9, step=90e-6)
    if per_host == 1:  # nothing moves inside a host: no local numbers to find
        truth = host_costs.Levels(alpha_local=0.0, beta_local=0.0, alpha_link=40e-6, beta_link=1 / 2e9, step=90e-6)

    def level_times(lv):  # each level alone, written out from the model's definition
        inside = {b: lv.step + (per_host - 1) * lv.alpha_local + b * (per_host - 1) / per_host * lv.beta_local
                  for b in (64 << 10, 16 << 20)}
        across = {b: lv.step + (hosts - 1) * lv.alpha_link + b * per_host * (hosts - 1) / hosts * lv.beta_link
                  for b in (64 << 10, 16 << 20)}
        return inside, across

    fitted = host_costs.fit_levels(*level_times(truth), hosts, per_host)
    # the bytes' costs are found; of the fixed costs, only each level's total is (step and the
    # per-message alphas are one sum per level): the fit puts the common part in the step
    assert fitted.beta_local == pytest.approx(truth.beta_local, rel=1e-6, abs=1e-18)
    assert fitted.beta_link == pytest.approx(truth.beta_link, rel=1e-6)
    for got, want in zip(level_times(fitted), level_times(truth)):
        assert got == pytest.approx(want, rel=1e-9)
    assert min(fitted.alpha_local, fitted.alpha_link) == 0.0 and fitted.step > 0


def _exchange_rows(inputs, members, step_of):
    """One AllToAllV step among ``members``: member j gets each member's rows for j, in member order."""
    out = {}
    for j, r in enumerate(members):
        pieces = []
        for i, q in enumerate(members):
            send, _ = step_of[q].segments[0]
            pieces.append(_cut(inputs[q], 0, send)[j])
            assert pieces[-1].shape[0] == step_of[r].segments[0][1][i], (r, q)
        out[r] = np.concatenate(pieces, axis=0)
    return out


def _reordered(x, step):
    return np.concatenate([_cut(x, step.dim, step.lengths)[o] for o in step.order], axis=step.dim)


@settings(max_examples=100, deadline=None)
@given(hosts=st.integers(1, 4), per_host=st.integers(1, 4), data=st.data())
def test_two_level_variable_plan_gives_every_rank_the_flat_rows(hosts, per_host, data):
    n = hosts * per_host
    matrix = [[data.draw(st.integers(0, 3)) for _ in range(n)] for _ in range(n)]
    rows = {r: pattern((sum(matrix[r]), 2), "float64", salt=r + 1) for r in range(n)}
    plans = {r: planner.all_to_all_v_hierarchical(r, matrix, hosts) for r in range(n)}
    held = {r: _reordered(rows[r], p.steps[0]) for r, p in plans.items()}
    inside = {}
    for h in range(hosts):
        inside |= _exchange_rows(held, [h * per_host + le for le in range(per_host)],
                                 {r: p.steps[1].steps[0] for r, p in plans.items()})
    by_host = {r: _reordered(inside[r], p.steps[2]) for r, p in plans.items()}
    result = {}
    for le in range(per_host):
        result |= _exchange_rows(by_host, [h * per_host + le for h in range(hosts)],
                                 {r: p.steps[3].steps[0] for r, p in plans.items()})
    for r in range(n):  # the oracle: each rank's rows for r, in rank order
        want = np.concatenate([_cut(rows[s], 0, matrix[s])[r] for s in range(n)], axis=0)
        assert np.array_equal(result[r], want), r
