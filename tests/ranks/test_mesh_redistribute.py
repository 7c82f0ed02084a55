"""redistribute on a process mesh, on real ranks: every placement pair, bit for bit against
numpy slices of the full tensor (Partial results summed over their mesh dims), and the bytes
each rank receives in the exchange equal to the lower bound: what it needs and did not hold."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import reshard as rs
from reshard.mesh import unravel
from reshard.planning.mesh_plan import MeshPlan, plan_summary
from tests.helpers import rank_fns
from tests.helpers.oracle import pattern

PLACEMENTS = ["S(0)", "S(1)", "S(2)", "R", "P(sum)"]


def _layouts(ndim):
    return [",".join(p) for p in itertools.product(PLACEMENTS, repeat=ndim)]


def _check(mesh_shape, shape, pairs, results):
    full = pattern(shape, "int64")
    size = int(np.prod(mesh_shape))
    for k, (src, dst) in enumerate(pairs):
        s_pl, d_pl = rs.parse_placements(src), rs.parse_placements(dst)
        plan = MeshPlan(shape, s_pl, d_pl, mesh_shape) if s_pl != d_pl else None
        summary = plan_summary(shape, s_pl, d_pl, mesh_shape, 8) if s_pl != d_pl else {"steps": []}
        partial_dims = [m for m, p in enumerate(d_pl) if isinstance(p, rs.Partial)]
        as_replicated = tuple(rs.Replicate() if isinstance(p, rs.Partial) else p for p in d_pl)
        for r in range(size):
            coord, per_pair = results[r]
            got, steps, same = per_pair[k]
            assert same, (src, dst, r, "the replay differs from the first call")
            want = rs.local_shard(full, as_replicated, coord, mesh_shape)
            if partial_dims:  # the group along the Partial dims sums to the tensor's part
                total = np.zeros_like(want)
                for q in range(size):
                    qc = unravel(q, mesh_shape)
                    if all(qc[m] == coord[m] for m in range(len(mesh_shape)) if m not in partial_dims):
                        total = total + results[q][1][k][0]
                got = total
            assert got.shape == want.shape and np.array_equal(got, want), (mesh_shape, src, dst, r)
            # the steps run are the plan's steps, with the plan's bytes for this rank
            want_steps = [(st["collective"], st["bytes_sent_per_rank"][r], st["bytes_received_per_rank"][r])
                          for st in summary["steps"]]
            assert steps == want_steps, (mesh_shape, src, dst, r, steps, want_steps)
            if plan is not None and not any(isinstance(p, rs.Partial) for p in (*s_pl, *d_pl)):
                exchange = [s for s in steps if s[0] in ("all_to_all", "all_gather")]
                received = sum(s[2] for s in exchange)
                assert received == plan.exchange.lower_bound(r) * 8, (src, dst, r, steps)


# gloo's own messages (as between hosts; on one host the messages go through shared memory)
# carry the same pieces: one mesh shape and every fourth pair suffice for them. A mesh with a
# dim of size 1 (a slab) takes every third pair on gloo, every other on MPI; each engine takes
# one of the two slabs (the planner is the engines' own, and both run the 2x2 mesh).
@pytest.mark.parametrize(("engine", "mesh_shape"), [
    ("gloo", (2, 2)), ("gloo", (1, 4)), ("mpi", (2, 2)), ("mpi", (4, 1)), ("gloo-messages", (2, 2))])
def test_every_pair_on_a_2d_mesh(engine, mesh_shape, monkeypatch):
    shm = engine == "gloo-messages"
    if shm:  # no shared memory: every message as gloo's own
        monkeypatch.setenv("RESHARD_SHM", "0")
        engine = "gloo"
    pairs = list(itertools.product(_layouts(2), repeat=2))
    if 1 in mesh_shape:
        pairs = pairs[::3] if engine == "gloo" else pairs[::2]
    elif shm:
        pairs = pairs[::4]
    results = rs.spawn(rank_fns.mesh_pairs, 4, engine=engine, args=(mesh_shape, (5, 6, 3), pairs, "numpy"), timeout=600)
    _check(mesh_shape, (5, 6, 3), pairs, results)


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_a_3d_mesh_torch_and_zero_sizes(engine):
    layouts = _layouts(3)[::7]  # a spread of the 125 layouts
    pairs = list(itertools.product(layouts, repeat=2))
    results = rs.spawn(rank_fns.mesh_pairs, 4, engine=engine, args=((1, 2, 2), (3, 1, 2), pairs, "torch"), timeout=600)
    _check((1, 2, 2), (3, 1, 2), pairs, results)


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_gradients_through_a_mesh_redistribute(engine):
    layouts = [",".join(p) for p in itertools.product(["S(0)", "S(1)", "R", "P(sum)"], repeat=2)]
    pairs = list(itertools.product(layouts, repeat=2))[::2]  # every other of the 256 pairs
    for rank_result in rs.spawn(rank_fns.mesh_grads, 4, engine=engine, args=((2, 2), (5, 6), pairs), timeout=300):
        bad = [(s, d) for s, d, ok in rank_result if not ok]
        assert bad == [], bad[:5]


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
@pytest.mark.parametrize(("case", "error"), [
    ("dst differs", "MismatchError"), ("too few placements", "InvalidArgument"), ("shard too big", "MismatchError"),
    ("global_shape wrong", "InvalidArgument"), ("check off, dst differs", "MismatchError"),
])
def test_bad_input_on_a_mesh_raises_on_every_rank(engine, case, error):
    assert rs.spawn(rank_fns.mesh_bad_input, 4, engine=engine, args=(case,), timeout=120) == [error] * 4


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize(("case", "says"), [
    ("dst on rank 0", "redistribute: dst differs across ranks: rank 0: Shard(0); ranks 1-3: Shard(1)"),
    ("global_shape on rank 0", "redistribute: global_shape differs across ranks: rank 0: (16, 4); ranks 1-3: None"),
    ("mesh dst on rank 3", "redistribute: dst differs across ranks: ranks 0-2: (Shard(1), Shard(0)); "
                           "rank 3: Spec(None, (1, 0))"),
])
def test_arguments_that_differ_are_named_with_every_ranks_value_check_on_or_off(check, case, says):
    # the records hold checksums: the error showed them ("rank 0: 1528233771"), and with the
    # check off a rank whose own arguments needed no lengths skipped the vote and its peers waited
    for rank, (kind, text) in enumerate(rs.spawn(rank_fns.arguments_that_differ, 4, args=(case, check), timeout=60)):
        assert kind == "MismatchError" and says in text, (rank, kind, text)


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
@pytest.mark.parametrize(("how", "says"), [("not a mesh", "mesh must be an rs.Mesh, got str"),
                                           ("none", "pass the mesh")])
def test_a_rank_without_a_mesh_raises_on_every_rank(engine, how, says):
    """One rank passes no mesh (or something else) while the others pass theirs: that rank
    takes its part in the check on its communicator, so every rank raises, naming it."""
    results = rs.spawn(rank_fns.redistribute_with_a_bad_mesh_on_one_rank, 4, engine=engine, args=(2, how), timeout=120)
    for rank, seen in enumerate(results):
        assert seen is not None and seen[0] == "InvalidArgument" and says in seen[1], (rank, seen)
        assert "rank 2" in seen[1], (rank, seen)


@pytest.mark.parametrize(("engine", "moves_in_place"), [("mpi", True), ("gloo", False)])
def test_mpi_moves_a_mesh_exchange_in_one_call_with_no_pack(engine, moves_in_place):
    """On MPI the boxes travel as datatypes in one Alltoallw: no pack, no unpack, first call and
    replay alike; gloo's point-to-point messages pack the pieces that are not runs (the same
    counters, so the check can tell the two apart)."""
    mesh_shape, shape, src, dst = (2, 2), (6, 10), "S(0),R", "S(1),R"
    results = rs.spawn(rank_fns.mesh_exchange_copies, 4, engine=engine, args=(mesh_shape, shape, src, dst),
                       timeout=180)
    full = pattern(shape, "float64")
    for coord, runs in results:
        region = rs.layout.mesh_region(shape, rs.parse_placements(dst), coord, mesh_shape)
        want = full[tuple(slice(a, b) for a, b in region)]
        for values, packs, unpacks in runs:
            assert np.array_equal(np.array(values).reshape(want.shape), want), coord
            if moves_in_place:
                assert (packs, unpacks) == (0, 0), (coord, packs, unpacks)
            else:
                assert packs + unpacks > 0, (coord, packs, unpacks)
