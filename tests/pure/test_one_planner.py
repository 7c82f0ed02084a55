"""One planner for worlds and meshes: ``planner.redistribute`` plans a world of N ranks as the
mesh ``(N,)`` by the same code, and an exchange it runs as one collective on one mesh dim
(the engine's all_to_all or all_gather) moves, peer by peer, exactly the elements the box
exchange of the same change moves: each element a rank needs and lacks, once. Pure."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.planning import planner
from reshard.planning.layout import mesh_region, parse_placements, unravel
from reshard.planning.mesh_plan import MeshPlan
from reshard.planning.steps import AllGather, AllToAll, ExchangeBoxes, OnMeshDim, RankPlan

PLACEMENTS = ["S(0)", "S(1)", "S(2)", "R", "P(sum)"]


def _as_boxes(plan: MeshPlan, rank: int) -> ExchangeBoxes:
    sends, recvs = plan.rank_exchange(rank)
    return ExchangeBoxes(plan.exchange.held(rank), plan.target(rank), tuple(sends), tuple(recvs),
                         tuple(plan.kept(rank)), plan.fill_op, plan.moves())


def _check_change(shape, mesh, src, dst, rule):
    s_pl, d_pl = parse_placements(src), parse_placements(dst)
    mesh_plan = MeshPlan(shape, s_pl, d_pl, mesh, rule)
    lowered = 0
    for r in range(mesh_plan.size):
        plan = planner.redistribute(shape, s_pl, d_pl, mesh, r, rule)
        if not plan.steps or mesh_plan.collective is None:
            continue
        lowered += 1
        in_shape = tuple(b - a for a, b in mesh_region(shape, planner.normalized(s_pl, len(shape)),
                                                       unravel(r, mesh), mesh, rule))
        got = planner.rank_traffic(plan, in_shape, mesh)[-1]
        boxes = RankPlan("redistribute", r, plan.size, (*plan.steps[:-1], _as_boxes(mesh_plan, r)))
        want = planner.rank_traffic(boxes, in_shape, mesh)[-1]
        assert got[1:] == want[1:], (shape, mesh, src, dst, rule, r, got, want)
        m, name = mesh_plan.collective
        last = plan.steps[-1]
        inner = last.steps[0] if isinstance(last, OnMeshDim) else last
        assert isinstance(inner, AllToAll if name == "all_to_all" else AllGather), (src, dst, last)
        assert isinstance(last, OnMeshDim) == (len(mesh) > 1), (mesh, last)
    return lowered


@pytest.mark.parametrize("mesh", [(4,), (3,), (2, 2), (3, 2)])
@pytest.mark.parametrize("rule", ["balanced", "chunk"])
def test_an_exchange_run_as_a_collective_moves_what_the_boxes_move(mesh, rule):
    lowered = 0
    for shape in [(5, 7, 3), (2, 9, 4), (0, 3, 2)]:
        for src in itertools.product(PLACEMENTS, repeat=len(mesh)):
            for dst in itertools.product(PLACEMENTS, repeat=len(mesh)):
                if src == dst or (rule == "chunk" and "P(sum)" in src):
                    continue
                lowered += _check_change(shape, mesh, ",".join(src), ",".join(dst), rule)
    assert lowered > 0  # the comparison ran


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=3), st.sampled_from([(2,), (5,), (2, 3), (2, 1, 2)]),
       st.data())
def test_any_lowered_exchange_matches_its_boxes(shape, mesh, data):
    ndim = len(shape)
    names = [f"S({d})" for d in range(ndim)] + ["R"]
    src = ",".join(data.draw(st.sampled_from(names)) for _ in mesh)
    dst = ",".join(data.draw(st.sampled_from(names)) for _ in mesh)
    _check_change(tuple(shape), mesh, src, dst, data.draw(st.sampled_from(["balanced", "chunk"])))


def test_a_world_and_its_one_d_mesh_get_the_same_steps():
    for src, dst in itertools.product(PLACEMENTS, repeat=2):
        s, d = parse_placements(src), parse_placements(dst)
        for r in range(3):
            world = planner.redistribute((7, 5, 2), s, d, (3,), r)
            assert world.steps == planner.redistribute((7, 5, 2), s, d, [3], r).steps


def test_a_world_shard_change_is_the_engines_all_to_all_and_a_nested_one_is_boxes():
    world = planner.redistribute((8, 6), parse_placements("S(0)"), parse_placements("S(1)"), (4,), 1)
    assert [type(s) for s in world.steps] == [AllToAll]
    assert world.steps[0].send_sizes == (2, 2, 1, 1) and world.steps[0].recv_lengths == (2, 2, 2, 2)
    # mesh dim 1 splits rows inside mesh dim 0's row blocks: changing mesh dim 0 moves boxes
    nested = planner.redistribute((8, 6), parse_placements("S(0),S(0)"), parse_placements("S(1),S(0)"), (2, 2), 0)
    assert [type(s) for s in nested.steps] == [ExchangeBoxes]
    one_dim = planner.redistribute((8, 6), parse_placements("R,S(0)"), parse_placements("R,S(1)"), (2, 2), 3)
    assert [type(s) for s in one_dim.steps] == [OnMeshDim] and one_dim.steps[0].mesh_dim == 1


@pytest.mark.parametrize("mesh", [(3,), (2, 2), (2, 3)])
def test_a_change_the_layouts_say_moves_nothing_receives_nothing(mesh):
    """``MeshPlan.moves`` answers from the layouts where every rank holds its target already;
    the box listing of every rank agrees, and where it does not say so the geometry decides."""
    said = 0
    for src in itertools.product(["S(0)", "S(1)", "R"], repeat=len(mesh)):
        for dst in itertools.product(["S(0)", "S(1)", "R"], repeat=len(mesh)):
            plan = MeshPlan((7, 5), parse_placements(",".join(src)), parse_placements(",".join(dst)), mesh)
            if plan._held_covers_target():
                said += 1
                assert not any(plan.recvs(q) for q in range(plan.size)), (src, dst)
                assert not plan.moves()
            else:
                assert plan.moves() == plan.geometry.moves(), (src, dst)
    assert said > 0
