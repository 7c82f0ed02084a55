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
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_every_spec_pair_equals_jax_on_each_rank(jax_pieces, engine, by_name, mesh_shape):
    cases_per_rank = [[] for _ in range(4)]
    wanted = []
    for shape in SHAPES:
        for a, b in itertools.product(specs(len(shape)), repeat=2):
            src = jax_pieces[(mesh_shape, shape, json.dumps(a))]
            dst = jax_pieces[(mesh_shape, shape, json.dumps(b))]
            for r in range(4):
                cases_per_rank[r].append((shape, a, b, src[r]))
            wanted.append((shape, a, b, dst))
    from tests.helpers import rank_fns

    def per_rank(comm):
        return rank_fns.spec_pairs(comm, mesh_shape, cases_per_rank[comm.rank], by_name)

    results = rs.spawn(per_rank, 4, engine=engine, timeout=600)
    wrong = [(shape, a, b, r) for k, (shape, a, b, dst) in enumerate(wanted) for r in range(4)
             if not (results[r][k].shape == dst[r].shape and np.array_equal(results[r][k], dst[r]))]
    assert not wrong, f"{len(wrong)} of {len(wanted) * 4} pieces differ from JAX's, e.g. {wrong[:3]}"
