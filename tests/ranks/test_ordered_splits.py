"""Ordered splits on real ranks: a tensor dim split by several mesh dims in a chosen order
(JAX's PartitionSpec meaning). Every pair of specs over even 2-D and 3-D shapes on the meshes
2x2, 1x4 and 4x1, each rank's result equal to the piece JAX's own ``device_put`` gives the
device at that mesh position, bit for bit, on gloo and MPI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

import reshard as rs

pytest.importorskip("jax", reason="JAX is the oracle of these tests (a test dependency: pip install jax)")
MESHES = [(2, 2), (1, 4), (4, 1)]
SHAPES = [(8, 12), (4, 4, 8)]


def specs(ndim):
    """Every PartitionSpec of an ``ndim``-d tensor on the mesh axes (a, b): each axis on no
    dim or on one, and both orders where both split the same dim."""
    out = []
    for where in itertools.product([None, *range(ndim)], repeat=2):
        per_dim = [[n for n, d in zip("ab", where) if d == k] for k in range(ndim)]
        for flips in itertools.product([False, True], repeat=ndim):
            if any(f and len(axes) < 2 for f, axes in zip(flips, per_dim)):
                continue
            entries = [None if not axes else (axes[::-1] if f else axes) if len(axes) > 1 else axes[0]
                       for axes, f in zip(per_dim, flips)]
            out.append(entries)
    return out


@pytest.fixture(scope="module")
def jax_pieces(tmp_path_factory):
    """Every (mesh, shape, spec)'s pieces from JAX, computed once in a process of its own."""
    cases = [[list(m), list(s), e] for m in MESHES for s in SHAPES for e in specs(len(s))]
    where = tmp_path_factory.mktemp("jax")
    (where / "cases.json").write_text(json.dumps(cases))
    subprocess.run([sys.executable, "-m", "tests.helpers.jax_shards", str(where / "cases.json"), str(where / "out.npz")],
                   check=True, timeout=300)
    pieces = np.load(where / "out.npz")
    table = {}
    for k, (m, s, e) in enumerate(cases):
        table[(tuple(m), tuple(s), json.dumps(e))] = [pieces[f"{k}/{r}"] for r in range(4)]
    return table


def test_the_spec_list_holds_every_order():
    assert len(specs(2)) == 11 and len(specs(3)) == 19
    assert [["a", "b"], None] in specs(2) and [["b", "a"], None] in specs(2)


@pytest.mark.parametrize("engine,by_name", [("gloo", True), ("mpi", False)])
def test_every_spec_pair_equals_jax_on_each_rank(jax_pieces, engine, by_name):
    cases_per_rank = [[] for _ in range(4)]  # every mesh's cases, in one job per engine
    wanted = []
    for mesh_shape in MESHES:
        for shape in SHAPES:
            for a, b in itertools.product(specs(len(shape)), repeat=2):
                src = jax_pieces[(mesh_shape, shape, json.dumps(a))]
                dst = jax_pieces[(mesh_shape, shape, json.dumps(b))]
                for r in range(4):
                    cases_per_rank[r].append((mesh_shape, shape, a, b, src[r]))
                wanted.append((mesh_shape, shape, a, b, dst))
    from tests.helpers import rank_fns

    def per_rank(comm):
        return rank_fns.spec_pairs(comm, cases_per_rank[comm.rank], by_name)

    results = rs.spawn(per_rank, 4, engine=engine, timeout=600)
    wrong = [(mesh_shape, shape, a, b, r) for k, (mesh_shape, shape, a, b, dst) in enumerate(wanted) for r in range(4)
             if not (results[r][k].shape == dst[r].shape and np.array_equal(results[r][k], dst[r]))]
    assert len(wanted) == 3 * (11 * 11 + 19 * 19)
    assert not wrong, f"{len(wrong)} of {len(wanted) * 4} pieces differ from JAX's, e.g. {wrong[:3]}"


def _uneven_cases(seed, count):
    """Random ordered Specs (a mesh dim on no tensor dim may be Partial in the source) over
    uneven shapes, as (shape, src, dst)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        shape = tuple(int(v) for v in rng.integers(0, 8, size=int(rng.integers(2, 4))))
        sides = []
        for _side in range(2):
            where = [int(rng.integers(-1, len(shape))) for _ in range(2)]
            entries = [tuple(int(m) for m in rng.permutation([m for m in range(2) if where[m] == d]))
                       for d in range(len(shape))]
            partial = [m for m in range(2) if where[m] < 0 and rng.random() < 0.5]
            sides.append(rs.Spec(*entries, partial=partial or None))
        out.append((shape, *sides))
    return out


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_uneven_shapes_and_partial_follow_the_nested_balanced_rule(engine):
    from tests.helpers import rank_fns
    from tests.helpers.oracle import pattern

    mesh_shape = (2, 2)
    cases = _uneven_cases(7 if engine == "gloo" else 11, 60)
    results = rs.spawn(rank_fns.ordered_pairs, 4, engine=engine, args=(mesh_shape, cases), timeout=600)
    for k, (shape, src, dst) in enumerate(cases):
        full = pattern(shape, "int64")
        for r in range(4):
            coord = np.unravel_index(r, mesh_shape)
            piece = full  # the oracle: np.array_split by each mesh dim of a tensor dim, outermost first
            for d, dims in enumerate(dst.entries):
                for m in dims:
                    piece = np.array_split(piece, mesh_shape[m], axis=d)[coord[m]]
            got = results[r][k]
            partial = [m for m, _ in dst.partial]
            if partial:  # the group along the Partial mesh dims sums to the piece
                got = sum(results[q][k] for q in range(4)
                          if all(np.unravel_index(q, mesh_shape)[m] == coord[m] for m in range(2) if m not in partial))
            assert got.shape == piece.shape and np.array_equal(got, piece), (shape, src, dst, r)


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_a_spec_on_the_world_moves_as_its_one_placement(engine):
    from tests.helpers import rank_fns
    from tests.helpers.oracle import pattern

    shape = (7, 5)
    full = pattern(shape, "float64")
    placements = {"S(0)": rs.Shard(0), "S(1)": rs.Shard(1), "R": rs.Replicate()}
    for rank, pieces in enumerate(rs.spawn(rank_fns.world_specs, 3, engine=engine, args=(shape,), timeout=120)):
        for (a, b), piece in pieces.items():
            want = full if b == "R" else np.array_split(full, 3, axis=placements[b].dim)[rank]
            assert np.array_equal(piece, want), (a, b, rank)
