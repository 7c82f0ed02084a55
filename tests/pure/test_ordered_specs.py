"""Ordered splits in one process: ``rs.Spec`` means what JAX's PartitionSpec means, a Spec in
the default order IS its placements tuple, and every change between two ordered layouts
(uneven shapes and Partial included) rebuilds each rank's piece from the plan's boxes, each
element once, at the byte lower bound. The oracle cuts the full array with ``np.array_split``
(the balanced rule) in the given order, independently of the planner."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.planning.layout import Layout, mesh_region, parse_placements, unravel
from reshard.planning.mesh_plan import MeshPlan
from reshard.planning.planner import redistribute as plan_redistribute
from reshard.planning.spec import Spec, layout_text
from reshard.planning.steps import ExchangeBoxes

S, R, P = rs.Shard, rs.Replicate, rs.Partial


def nested_piece(full, entries, coord, mesh_shape):
    """The oracle: for each tensor dim, ``np.array_split`` by each of its mesh dims, outermost
    first, keeping the piece at this coordinate."""
    out = full
    for d, dims in enumerate(entries):
        for m in dims:
            out = np.array_split(out, mesh_shape[m], axis=d)[coord[m]]
    return out


def test_rows_on_a_2x2_mesh_in_either_order():
    names = ("a", "b")
    rows = np.arange(8)
    first = rs.local_shard(rows, Spec(("a", "b")).resolve(2, names), (0, 1), (2, 2))
    second = rs.local_shard(rows, Spec(("b", "a")).resolve(2, names), (0, 1), (2, 2))
    assert first.tolist() == [2, 3] and second.tolist() == [4, 5]


def test_a_spec_in_the_default_order_is_its_placements_tuple():
    assert Spec(0, 1) == (S(0), S(1)) and (S(0), S(1)) == Spec(0, 1)
    assert hash(Spec(0, 1)) == hash((S(0), S(1)))
    assert Spec((0, 1), None).resolve(2) == (S(0), S(0)) and type(Spec((0, 1), None).resolve(2)) is tuple
    assert Spec(None, 0, partial=1) == (S(1), P())
    assert parse_placements(Spec(0, 1)) == (S(0), S(1))
    assert len({Spec(0, 1), (S(0), S(1))}) == 1
    named = Spec(("a", "b"), None)
    assert named.resolve(2, ("a", "b")) == (S(0), S(0))


def test_another_order_is_another_layout():
    ordered = Spec((1, 0), None).resolve(2)
    assert isinstance(ordered, Layout) and ordered.order == ((0, (1, 0)),)
    assert ordered != (S(0), S(0)) and (S(0), S(0)) != ordered
    assert Spec((1, 0)) != (S(0), S(0)) and hash(Spec((1, 0))) != hash((S(0), S(0)))
    assert Spec((1, 0)) == ordered and hash(Spec((1, 0))) == hash(ordered)
    assert pickle.loads(pickle.dumps(ordered)) == ordered
    assert pickle.loads(pickle.dumps(Spec(("b", "a"), partial={"c": "max"}))) == Spec(("b", "a"), partial={"c": "max"})
    assert layout_text(ordered) == "Spec((1, 0))" and repr(ordered) == "Spec((1, 0))"
    assert parse_placements("Spec((1, 0), None)", 2) == ordered
    assert parse_placements("spec((1,0), None, partial=2)", 3) == Spec((1, 0), partial=2).resolve(3)


def test_a_spec_on_the_world_is_its_one_placement():
    full = np.arange(7 * 5).reshape(7, 5)
    for spec, placement in [(Spec(0, None), S(0)), (Spec(None, 0), S(1)), (Spec(None, None), R()),
                            (Spec(None, partial=0), P()), ("Spec(None, 0)", S(1))]:
        assert rs.parse_placement(spec) == placement
        for rank in range(3):
            assert np.array_equal(rs.local_shard(full, spec, rank, 3), rs.local_shard(full, placement, rank, 3))
    with pytest.raises(rs.InvalidArgument, match="1-D mesh"):
        rs.parse_placement(Spec(0, 1))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(2, 2), (2, 3), (2, 1, 2), (4,)]), st.integers(1, 3), st.data())
def test_a_printed_layout_reads_back_as_itself(mesh_shape, ndim, data):
    entries, partial = _entries(data, ndim, len(mesh_shape))
    layout = Spec(*entries, partial=partial).resolve(len(mesh_shape))
    printed = layout_text(layout)
    assert parse_placements(printed, len(mesh_shape)) == layout, printed
    if not isinstance(layout, Layout) or not layout.order:
        listed = "[" + ", ".join(map(repr, layout)) + "]"
        assert parse_placements(listed, len(mesh_shape)) == layout, listed
        torch_printed = printed.replace("Shard(", "Shard(dim=")  # how DTensor prints a Shard
        assert parse_placements(torch_printed, len(mesh_shape)) == layout, torch_printed


@pytest.mark.parametrize("bad,words", [
    (lambda: Spec((0, 0)), "more than once"),
    (lambda: Spec(0, partial=0), "more than once"),
    (lambda: Spec(-1), "start at 0"),
    (lambda: Spec(1.5), "a name or a number"),
    (lambda: Spec(0, partial={1: "mean"}), "partial op"),
    (lambda: Spec(("a", "c")).resolve(2, ("a", "b")), "'c'"),
    (lambda: Spec("a").resolve(2), "no mesh names"),
    (lambda: Spec(0, 2).resolve(2), "mesh has 2 dims"),
    (lambda: parse_placements("Spec(__import__('os'))", 2), "cannot read"),
    (lambda: parse_placements("Spec(0, mesh=1)", 2), "cannot read"),
])
def test_a_bad_spec_says_what_is_wrong(bad, words):
    with pytest.raises(rs.InvalidArgument, match=words):
        bad()


@pytest.mark.parametrize("call,name,written,dim", [
    (lambda x: rs.local_shard(x, Spec(None, None, 0), 1, 2), "placement", "Spec(None, None, 0)", 2),
    (lambda x: rs.local_shard(x, "Spec(None, None, (1, 0))", (0, 1), (2, 2)), "placements", "Spec(None, None, (1, 0))", 2),
    (lambda x: rs.mesh_plan(x.shape, "S(0),R", Spec(None, None, (0, 1)), (2, 2)), "dst", "Spec(None, None, (0, 1))", 2),
    (lambda x: rs.plan.make_plan(x.shape, "Spec(None, None, 0)", "col", 4), "src", "Spec(None, None, 0)", 2),
    (lambda x: rs.fft.output_layout(x.shape, (2, 2), Spec(None, 0, None, 1)), "src", "Spec(None, 0, None, 1)", 3),
])
def test_a_spec_past_the_tensors_dims_is_named_as_written(call, name, written, dim):
    """Resolved, such a Spec is only a Shard of a dim the tensor lacks: the error names the Spec."""
    with pytest.raises(rs.InvalidArgument) as caught:
        call(np.zeros((8, 6)))
    assert str(caught.value) == f"{name} {written} splits tensor dim {dim}, but the tensor is 2-d (dims 0..1)"


def _entries(data, ndim, mesh_ndim):
    where = [data.draw(st.sampled_from([None, *range(ndim)])) for _ in range(mesh_ndim)]
    partial = [m for m, d in enumerate(where) if d is None and data.draw(st.booleans())]
    entries = []
    for d in range(ndim):
        dims = [m for m, w in enumerate(where) if w == d]
        entries.append(tuple(data.draw(st.permutations(dims))))
    return entries, partial


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(2, 2), (2, 3), (3, 2), (2, 2, 2), (1, 3), (4,)]),
       st.lists(st.integers(0, 9), min_size=2, max_size=3), st.data())
def test_every_ordered_change_rebuilds_each_piece_from_the_minimum(mesh_shape, shape, data):
    ndim, mesh_ndim = len(shape), len(mesh_shape)
    src_entries, src_partial = _entries(data, ndim, mesh_ndim)
    dst_entries, _ = _entries(data, ndim, mesh_ndim)
    src = Spec(*src_entries, partial=src_partial or None).resolve(mesh_ndim)
    dst = Spec(*dst_entries).resolve(mesh_ndim)
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) + 1
    size = int(np.prod(mesh_shape))
    for r in range(size):  # the layout's own cut is the oracle's
        coord = unravel(r, mesh_shape)
        region = mesh_region(shape, src, coord, mesh_shape)
        assert np.array_equal(full[tuple(slice(a, b) for a, b in region)], nested_piece(full, src_entries, coord, mesh_shape))
    plan_redistribute(shape, src, dst, mesh_shape, 0)  # every rank plans; rank 0's steps are built
    if src == dst:
        return
    plan = MeshPlan(shape, src, dst, mesh_shape)
    for r in range(size):  # what the reductions leave: reduce_scatter cuts the piece a rank holds
        coord = unravel(r, mesh_shape)
        piece = nested_piece(full, src_entries, coord, mesh_shape)
        for red in plan.reductions:
            if red.collective == "reduce_scatter":
                piece = np.array_split(piece, mesh_shape[red.mesh_dim], axis=red.dim)[coord[red.mesh_dim]]
        region = mesh_region(shape, plan.mid, coord, mesh_shape)
        assert np.array_equal(full[tuple(slice(a, b) for a, b in region)], piece), (src, dst, r)
    for q in range(size):
        coord = unravel(q, mesh_shape)
        want = nested_piece(full, dst_entries, coord, mesh_shape)
        need = plan.target(q)
        got = np.zeros(want.shape, dtype=full.dtype)
        count = np.zeros(want.shape, dtype=int)
        boxes = [(q, b) for b in plan.kept(q)] + list(plan.rank_exchange(q)[1])
        for p, box in boxes:
            held = mesh_region(shape, plan.mid, unravel(p, mesh_shape), mesh_shape)
            assert all(h0 <= a and b <= h1 for (a, b), (h0, h1) in zip(box, held)), (p, box, held)
            idx = tuple(slice(a - n0, b - n0) for (a, b), (n0, _) in zip(box, need))
            got[idx] = full[tuple(slice(a, b) for a, b in box)]
            count[idx] += 1
        assert np.array_equal(got, want) and (count == 1).all(), (src, dst, q)
        received = sum(int(np.prod([b - a for a, b in box])) for _, box in plan.rank_exchange(q)[1])
        assert received == plan.exchange.lower_bound(q)


def test_the_planner_moves_a_changed_order_even_where_the_placements_are_the_same():
    mesh_shape, shape = (2, 2), (8, 3)
    a, b = Spec((0, 1), None).resolve(2), Spec((1, 0), None).resolve(2)
    plan = plan_redistribute(shape, a, b, mesh_shape, 1)
    assert plan.steps, "(S(0), S(0)) in two orders are two layouts: ranks (0, 1) and (1, 0) swap rows"
    received = [MeshPlan(shape, a, b, mesh_shape).exchange.lower_bound(r) for r in range(4)]
    assert received == [0, 6, 6, 0]


@pytest.mark.parametrize("mesh_shape", [(2, 2), (2, 3), (3, 2)])
def test_a_spec_and_its_placements_plan_alike(mesh_shape):
    for src, dst in itertools.product([Spec(0, 1), Spec((0, 1)), Spec(None, (0, 1)), Spec(1, 0)], repeat=2):
        as_tuple = (src.resolve(2), dst.resolve(2))
        assert plan_redistribute((6, 5), src.resolve(2), dst.resolve(2), mesh_shape, 1) == \
            plan_redistribute((6, 5), *map(tuple, as_tuple), mesh_shape, 1)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([(2, 2), (1, 4), (4, 1), (2, 1, 2)]), st.data())
def test_the_pure_mesh_plan_of_two_specs_moves_exactly_what_the_ranks_need(mesh_shape, data):
    """``rs.mesh_plan`` on Specs by number: the exchange's bytes and its lower bound equal,
    rank by rank, the elements a rank needs under ``dst`` and does not hold under ``src`` (the
    nested-split oracle on an array of indices)."""
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 7)) for _ in range(ndim))

    def entries():
        where = [data.draw(st.sampled_from([None, *range(ndim)])) for _ in mesh_shape]
        per_dim = [[m for m, d in enumerate(where) if d == k] for k in range(ndim)]
        return [data.draw(st.permutations(dims)) if len(dims) > 1 else dims for dims in per_dim]

    src, dst = entries(), entries()

    def spec(e):
        return rs.Spec(*[None if not dims else tuple(dims) if len(dims) > 1 else dims[0] for dims in e])

    report = rs.mesh_plan(shape, spec(src), spec(dst), mesh_shape, "int32")
    index = np.arange(int(np.prod(shape))).reshape(shape)
    needed = 0
    for r in range(int(np.prod(mesh_shape))):
        coord = np.unravel_index(r, mesh_shape)
        held = set(nested_piece(index, src, coord, mesh_shape).ravel().tolist())
        needed += sum(1 for v in nested_piece(index, dst, coord, mesh_shape).ravel().tolist() if v not in held)
    assert report["exchange_lower_bound_bytes"] == 4 * needed
    assert report["exchange_bytes_total"] == 4 * needed
    assert report["dtype"] == "int32" and report["global_shape"] == list(shape)


def test_the_pure_mesh_plan_takes_text_tuples_and_specs_alike_and_points_make_plan_there():
    by_text = rs.mesh_plan((8, 6), "S(0),S(1)", "S(1),S(0)", (2, 2))
    assert by_text == rs.mesh_plan((8, 6), (S(0), S(1)), rs.Spec(1, 0), (2, 2))
    ordered = rs.mesh_plan((8, 6), rs.Spec((1, 0), None), rs.Spec(None, (0, 1)), (2, 2))
    assert ordered["src_spec"] == "Spec((1, 0))" and "dst_spec" not in ordered
    with pytest.raises(rs.InvalidArgument, match=r"rs\.mesh_plan"):
        rs.plan.make_plan((8, 6), "row", "col", (2, 2))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([(2, 2), (2, 3), (2, 1, 2), (4,)]), st.lists(st.integers(1, 9), min_size=1, max_size=3),
       st.data())
def test_an_exchange_is_named_all_gather_exactly_where_every_rank_keeps_what_it_holds(mesh_shape, shape, data):
    ndim, mesh_ndim = len(shape), len(mesh_shape)
    src, dst = (Spec(*_entries(data, ndim, mesh_ndim)[0]).resolve(mesh_ndim) for _ in range(2))
    # the oracle, on a shape whose every piece holds something (the name is the layouts', not
    # the shape's): each rank's region after contains its region before, on every rank
    roomy = [24] * ndim
    keeps = True
    for rank in range(int(np.prod(mesh_shape))):
        coord = unravel(rank, mesh_shape)
        held, target = mesh_region(roomy, src, coord, mesh_shape), mesh_region(roomy, dst, coord, mesh_shape)
        if any(not (t0 <= h0 and h1 <= t1) for (h0, h1), (t0, t1) in zip(held, target)):
            keeps = False
    moves = [s["collective"] for s in rs.mesh_plan(shape, src, dst, mesh_shape)["steps"] if s["collective"] != "local"]
    assert moves in ([], ["all_gather" if keeps else "all_to_all"]), (src, dst, moves)
    step = plan_redistribute(shape, src, dst, mesh_shape, 0).steps
    if step and isinstance(step[-1], ExchangeBoxes) and step[-1].moves:
        assert step[-1].collective == ("all_gather" if keeps else "all_to_all"), (src, dst)
