"""The pure layout layer: balanced sizes, placements, local shards (property tests)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.planning.layout import local_region, local_shape, normalize_dim
from tests.helpers.oracle import balanced, placement_slice

shapes = st.lists(st.integers(0, 9), min_size=1, max_size=4).map(tuple)


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_shard_sizes_balanced(length, parts):
    sizes = rs.shard_sizes(length, parts)
    assert len(sizes) == parts and sum(sizes) == length
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the first length % parts get one more
    assert sizes == balanced(length, parts)


def test_shard_sizes_examples():
    assert rs.shard_sizes(7, 3) == [3, 2, 2]
    assert rs.shard_sizes(0, 2) == [0, 0]
    assert rs.shard_sizes(2, 4) == [1, 1, 0, 0]


@pytest.mark.parametrize("bad", [(-1, 2), (3, 0), (True, 2), (3.0, 2), ("3", 2)])
def test_shard_sizes_rejects(bad):
    with pytest.raises(rs.InvalidArgument):
        rs.shard_sizes(*bad)


@settings(max_examples=200)
@given(shapes, st.integers(1, 6), st.data())
def test_local_shard_tiles_the_full_array(shape, n, data):
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    pieces = [rs.local_shard(full, rs.Shard(dim), r, n) for r in range(n)]
    assert np.array_equal(np.concatenate(pieces, axis=dim), full)
    for r, piece in enumerate(pieces):
        assert np.array_equal(piece, placement_slice(full, ("shard", dim), r, n))
        assert piece.shape == local_shape(shape, rs.Shard(dim), r, n)
        region = local_region(shape, rs.Shard(dim), r, n)
        assert np.array_equal(piece, full[tuple(slice(a, b) for a, b in region)])


@given(shapes, st.integers(1, 6))
def test_replicate_and_partial_local_shards(shape, n):
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) + 1
    for r in range(n):
        assert rs.local_shard(full, rs.Replicate(), r, n) is full
    parts = [rs.local_shard(full, rs.Partial(), r, n) for r in range(n)]
    assert np.array_equal(sum(parts), full)
    assert all(np.array_equal(rs.local_shard(full, rs.Partial("max"), r, n), full) for r in range(n))


def test_local_shard_works_on_torch():
    torch = pytest.importorskip("torch")
    full = torch.arange(35).reshape(7, 5)
    assert torch.equal(rs.local_shard(full, rs.Shard(1), 1, 3), full[:, 2:4])
    assert torch.equal(rs.local_shard(full, rs.Partial(), 2, 3), torch.zeros_like(full))


def test_local_shard_takes_a_nested_list_and_names_what_is_not_an_array():
    rows = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    full = np.array(rows)
    for rank in range(2):
        assert np.array_equal(rs.local_shard(rows, rs.Shard(1), rank, 2), full[:, [[0, 1], [2]][rank]])
    assert np.array_equal(rs.local_shard(tuple(rows), (rs.Shard(0), rs.Shard(1)), (1, 0), (2, 2)), full[2:, :2])
    for bad, named in (([[1, 2], [3]], "nested list"), ("abc", "got str"), (None, "got NoneType"), (7, "got int")):
        with pytest.raises(rs.InvalidArgument, match=f"local_shard: full .*{named}"):
            rs.local_shard(bad, rs.Shard(0), 0, 2)


def test_reprs_and_parsing():
    assert repr(rs.Shard(-1)) == "Shard(-1)"
    assert repr(rs.Replicate()) == "Replicate()"
    assert repr(rs.Partial()) == "Partial()" and repr(rs.Partial("max")) == "Partial('max')"
    for text, want in [("row", rs.Shard(0)), ("col", rs.Shard(1)), ("Shard(2)", rs.Shard(2)), ("shard(-1)", rs.Shard(-1)),
                       ("replicate", rs.Replicate()), ("Replicate()", rs.Replicate()), ("Partial(max)", rs.Partial("max")),
                       ("partial", rs.Partial())]:
        assert rs.parse_placement(text) == want
    for bad in ["diagonal", "Shard(x)", 3, None]:
        with pytest.raises(rs.InvalidArgument):
            rs.parse_placement(bad)
    with pytest.raises(rs.InvalidArgument):
        rs.Partial("median")
    with pytest.raises(rs.InvalidArgument):
        rs.Shard(True)


def test_placements_are_made_once_per_value_and_behave_as_values():
    import copy
    import pickle

    # a call written with new placement objects each time gets the same objects back
    assert rs.Shard(0) is rs.Shard(0) and rs.Replicate() is rs.Replicate() and rs.Partial("max") is rs.Partial("max")
    assert rs.Partial() is rs.Partial("sum") and rs.Shard(np.int64(2)) is rs.Shard(2)
    assert type(rs.Shard(np.int64(2)).dim) is int and rs.Shard(-1).dim == -1 and rs.Partial("avg").op == "avg"
    assert rs.Shard(1) != rs.Shard(2) and rs.Shard(0) != rs.Replicate() and rs.Partial() != rs.Partial("max")
    assert len({rs.Shard(1), rs.Shard(1), rs.Replicate(), rs.Partial()}) == 3
    for p in (rs.Shard(3), rs.Shard(-2), rs.Replicate(), rs.Partial("min")):
        assert pickle.loads(pickle.dumps(p)) is p and copy.deepcopy(p) is p and eval(repr(p), vars(rs)) is p
    with pytest.raises(AttributeError):
        rs.Shard(0).dim = 1
    match rs.Shard(4):
        case rs.Shard(dim):
            assert dim == 4
    for bad in (True, np.bool_(False), 1.0, "0", None):
        with pytest.raises(rs.InvalidArgument):
            rs.Shard(bad)
    for bad in ("median", None, ["sum"]):
        with pytest.raises(rs.InvalidArgument):
            rs.Partial(bad)


@pytest.mark.parametrize("dim,ndim", [(2, 2), (-3, 2), (0, 0), (True, 2), (1.0, 2)])
def test_normalize_dim_rejects(dim, ndim):
    with pytest.raises(rs.InvalidArgument):
        normalize_dim(dim, ndim)


def test_import_pulls_no_engine():
    """The pure rooms import neither torch nor numpy; `import reshard` does not import torch."""
    code = (
        "import sys, reshard, reshard.planning.layout, reshard.planning.plan\n"
        "reshard.planning.plan.make_plan((8, 8), 'row', 'col', 4)\n"
        "bad = [m for m in ('torch', 'numpy', 'mpi4py') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=3), st.lists(st.integers(1, 3), min_size=1, max_size=3),
       st.data())
def test_the_global_shape_is_found_from_the_pieces_and_a_wrong_piece_is_named(shape, mesh_shape, data):
    ndim = len(shape)
    placements = [data.draw(st.one_of(st.just(rs.Replicate()), st.integers(0, ndim - 1).map(rs.Shard)))
                  for _ in mesh_shape]
    coords = [np.unravel_index(r, mesh_shape) for r in range(int(np.prod(mesh_shape)))]
    pieces = [[b - a for a, b in rs.layout.mesh_region(shape, placements, c, mesh_shape)] for c in coords]
    assert rs.layout.global_shape_of(pieces, placements, mesh_shape) == (tuple(shape), None)
    wrong = data.draw(st.integers(0, len(pieces) - 1))
    d = data.draw(st.integers(0, ndim - 1))
    pieces[wrong][d] += 1  # one rank holds a row too many along d
    found, bad = rs.layout.global_shape_of(pieces, placements, mesh_shape)
    if bad is None:  # accepted only where the pieces are exactly those of the shape found
        assert pieces == [[b - a for a, b in rs.layout.mesh_region(found, placements, c, mesh_shape)] for c in coords]
    else:  # the rank named holds what the shape found does not give it
        want = [b - a for a, b in rs.layout.mesh_region(found, placements, coords[bad], mesh_shape)]
        assert pieces[bad] != want, (found, bad)
