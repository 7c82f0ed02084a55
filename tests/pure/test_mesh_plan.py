"""The mesh planner, executed on numpy arrays in one process: every rank ends with exactly its
part under the destination layout, every piece comes from a rank that holds it, no element
arrives twice, and what a rank receives is exactly what it needs and did not hold."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.planning import planner
from reshard.planning.mesh_plan import BoxExchange, box_size, box_subtract

MOVABLE = [rs.Shard(0), rs.Shard(1), rs.Shard(2), rs.Replicate()]
MESHES = [(4,), (1, 4), (4, 1), (2, 2), (3, 4), (2, 3, 2), (1, 2, 2)]


def _contains(outer, inner):
    return all(a0 <= a and b <= b0 for (a, b), (a0, b0) in zip(inner, outer))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MESHES), st.lists(st.integers(0, 7), min_size=3, max_size=3), st.data())
def test_box_exchange_rebuilds_every_destination_from_the_minimum(mesh_shape, shape, data):
    src = tuple(data.draw(st.sampled_from(MOVABLE)) for _ in mesh_shape)
    dst = tuple(data.draw(st.sampled_from(MOVABLE)) for _ in mesh_shape)
    plan = BoxExchange(shape, src, dst, mesh_shape)
    full = np.arange(int(np.prod(shape))).reshape(shape) + 1
    for q in range(plan.size):
        need, held = plan.needed(q), plan.held(q)
        origin = [a for a, _ in need]
        got = np.zeros([b - a for a, b in need], dtype=full.dtype)
        count = np.zeros(got.shape, dtype=int)
        own = [(max(n0, h0), min(n1, h1)) for (n0, n1), (h0, h1) in zip(need, held)]
        if all(a < b for a, b in own):  # what it keeps of its own
            idx = tuple(slice(a - o, b - o) for (a, b), o in zip(own, origin))
            got[idx] = full[tuple(slice(a, b) for a, b in own)]
            count[idx] += 1
        received = 0
        for p, box in plan.recvs(q):
            assert p != q and _contains(plan.held(p), box), (q, p, box)  # sent by a rank that holds it
            idx = tuple(slice(a - o, b - o) for (a, b), o in zip(box, origin))
            got[idx] = full[tuple(slice(a, b) for a, b in box)]
            count[idx] += 1
            received += box_size(box)
        assert np.array_equal(got, full[tuple(slice(a, b) for a, b in need)]), (src, dst, q)
        assert count.size == 0 or count.max() == 1, "an element arrived twice"
        assert received == plan.lower_bound(q)


def test_the_holder_aligned_with_the_receiver_sends():
    """(Shard(0), Replicate) -> (Shard(1), Replicate) on 2x2: each rank fetches from its own
    column of the mesh, so the replicas share the sending."""
    plan = BoxExchange((8, 8), (rs.Shard(0), rs.Replicate()), (rs.Shard(1), rs.Replicate()), (2, 2))
    for q in range(4):
        assert {p for p, _ in plan.recvs(q)} == {q ^ 2}  # the rank with the other row coordinate, same column
    sent, received = plan.bytes_per_rank(4)
    assert sent == received == [64] * 4  # a 4x4 float32 block each: the lower bound


def test_box_subtract_is_exact():
    a = ((0, 4), (0, 5))
    for b in (((1, 3), (2, 4)), ((0, 4), (0, 5)), ((5, 6), (0, 1)), ((0, 2), (0, 5))):
        parts = box_subtract(a, b)
        grid = np.zeros((4, 5), dtype=int)
        for part in parts:
            grid[tuple(slice(x, y) for x, y in part)] += 1
        inside = np.zeros((4, 5), dtype=int)
        lo = [max(x, y) for (x, _), (y, _) in zip(a, b)]
        hi = [min(x, y) for (_, x), (_, y) in zip(a, b)]
        if all(x < y for x, y in zip(lo, hi)):
            inside[tuple(slice(x, y) for x, y in zip(lo, hi))] = 1
        assert np.array_equal(grid + inside, np.ones((4, 5), dtype=int)), b


def test_every_pair_on_small_meshes_stays_at_the_lower_bound():
    for mesh_shape in [(1, 4), (4, 1), (2, 2), (1, 2, 2)]:
        for src in itertools.product(MOVABLE, repeat=len(mesh_shape)):
            for dst in itertools.product(MOVABLE, repeat=len(mesh_shape)):
                plan = BoxExchange((5, 6, 3), src, dst, mesh_shape)
                _, received = plan.bytes_per_rank(1)
                assert received == [plan.lower_bound(q) for q in range(plan.size)], (mesh_shape, src, dst)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MESHES), st.lists(st.integers(0, 9), min_size=3, max_size=3), st.data())
def test_totals_without_pairs_equal_the_boxes(mesh_shape, shape, data):
    from reshard.planning.mesh_plan import exchange_totals

    src = tuple(data.draw(st.sampled_from(MOVABLE)) for _ in mesh_shape)
    dst = tuple(data.draw(st.sampled_from(MOVABLE)) for _ in mesh_shape)
    sent, received = BoxExchange(shape, src, dst, mesh_shape).bytes_per_rank(1)
    assert exchange_totals(shape, src, dst, mesh_shape) == (sent, received), (src, dst)


@pytest.mark.parametrize("mesh_shape,src,dst", [
    ((1,), (rs.Shard(0),), (rs.Shard(1),)),
    ((2, 1, 2), (rs.Replicate(), rs.Shard(0), rs.Replicate()), (rs.Replicate(), rs.Shard(1), rs.Replicate())),
    ((2, 1), (rs.Shard(0), rs.Partial()), (rs.Shard(0), rs.Replicate())),
    ((1, 2), (rs.Partial("max"), rs.Shard(1)), (rs.Shard(0), rs.Shard(1))),
    ((2, 1), (rs.Replicate(), rs.Replicate()), (rs.Replicate(), rs.Partial())),
    ((2, 1, 2), rs.Spec((0, 1, 2), None), rs.Spec((0, 2), None)),  # an order through the one-rank dim
])
def test_a_change_only_on_mesh_dims_of_one_rank_takes_no_step(mesh_shape, src, dst):
    # a Shard over one rank splits nothing and a Partial over one rank is whole: nothing to do
    assert rs.mesh_plan((4, 6), src, dst, mesh_shape)["steps"] == []
    for rank in range(int(np.prod(mesh_shape))):
        assert planner.redistribute((4, 6), src, dst, mesh_shape, rank).steps == ()
