"""Process meshes: where each rank sits, what it holds of a tensor laid out on the mesh (nested
sharding, balanced at each split), and every mesh dim's sub-communicator on both engines."""

from __future__ import annotations

import importlib.util
import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.mesh import hosts_mesh_shape, unravel
from tests.helpers import rank_fns

PLACEMENTS = [rs.Shard(0), rs.Shard(1), rs.Shard(2), rs.Replicate(), rs.Partial()]


def nested_oracle(full, placements, coord, mesh_shape):
    """What the rank at ``coord`` holds, by numpy's array_split (the balanced rule), mesh dim by mesh dim."""
    out = full
    for m, p in enumerate(placements):
        if isinstance(p, rs.Shard):
            out = np.array_split(out, mesh_shape[m], axis=p.dim)[coord[m]]
    if any(isinstance(p, rs.Partial) and c != 0 for p, c in zip(placements, coord)):
        out = np.zeros_like(out)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.lists(st.integers(0, 7), min_size=3, max_size=3), st.data())
def test_local_shard_on_a_mesh_nests_by_the_balanced_rule(mesh_shape, shape, data):
    placements = tuple(data.draw(st.sampled_from(PLACEMENTS)) for _ in mesh_shape)
    full = np.arange(int(np.prod(shape))).reshape(shape)
    pieces = []
    for coord in itertools.product(*(range(s) for s in mesh_shape)):
        got = rs.local_shard(full, placements, coord, tuple(mesh_shape))
        want = nested_oracle(full, placements, coord, mesh_shape)
        assert got.shape == want.shape and np.array_equal(got, want), (placements, coord)
        pieces.append(got)
    if all(isinstance(p, rs.Shard) for p in placements):  # shards tile the tensor: no element twice
        assert sum(p.size for p in pieces) == full.size


def test_placements_from_text_and_torch():
    assert rs.parse_placements("S(0),S(1)") == (rs.Shard(0), rs.Shard(1))
    assert rs.parse_placements("P(max), R") == (rs.Partial("max"), rs.Replicate())
    torch_tensor = pytest.importorskip("torch.distributed.tensor")
    assert rs.parse_placements([torch_tensor.Shard(1), torch_tensor.Replicate()]) == (rs.Shard(1), rs.Replicate())


def test_row_major_coordinates():
    assert [unravel(r, (2, 3)) for r in range(6)] == [tuple(int(c) for c in np.unravel_index(r, (2, 3))) for r in range(6)]


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
@pytest.mark.parametrize("shape", [(2, 2), (1, 4), (4, 1), (1, 2, 2)])
def test_every_mesh_dim_has_a_working_sub_communicator(engine, shape):
    results = rs.spawn(rank_fns.mesh_subs, 4, engine=engine, args=(shape, True), timeout=120)
    for rank, (coord, report) in enumerate(results):
        assert coord == unravel(rank, shape)
        for m, (sub_rank, sub_size, members, ok) in enumerate(report):
            assert sub_size == shape[m] and sub_rank == coord[m] and rank in members, (rank, m, report)
            assert ok, (rank, m)


def test_a_mesh_must_cover_the_communicator():
    with pytest.raises(rs.RankFailed, match="has 6 ranks, but the communicator has 4"):
        rs.spawn(rank_fns.mesh_subs, 4, args=((2, 3), True), timeout=60)


def _hosts_and_their_mesh(comm):
    return comm.hosts, comm.host, rs.Mesh.from_hosts(comm).shape


@pytest.mark.parametrize("engine", ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed"))])
def test_local_ranks_are_one_host(engine):
    for rank, (hosts, host, shape) in enumerate(rs.spawn(_hosts_and_their_mesh, 3, engine=engine)):
        assert (hosts, host, shape) == ([0, 0, 0], 0, (1, 3)), rank


@pytest.mark.parametrize(("hosts", "shape"), [([0], (1, 1)), ([0, 0, 1, 1], (2, 2)), ([0, 0, 0, 1, 1, 1], (2, 3)),
                                              ([0, 1, 2], (3, 1))])
def test_hosts_mesh_shape(hosts, shape):
    assert hosts_mesh_shape(hosts) == shape


@pytest.mark.parametrize(("hosts", "words"), [([0, 0, 1], "different numbers of ranks (host 0: 2, host 1: 1)"),
                                              ([0, 1, 0, 1], "not consecutive")])
def test_hosts_that_make_no_mesh_are_refused(hosts, words):
    with pytest.raises(rs.InvalidArgument, match=re.escape(words)):
        hosts_mesh_shape(hosts)


def _mesh_named_by(comm, names):
    try:
        rs.Mesh((comm.size,), names)
    except rs.InvalidArgument as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("names", ["comm", ["x", 1], 7, [None]])
def test_mesh_names_that_are_not_strings_are_refused(names):
    def job(comm, names):
        return _mesh_named_by(comm, comm if names == "comm" else names), rs.Mesh((1,), "x").names

    said, one_name = rs.spawn(job, 1, args=(names,))[0]
    assert said.startswith("a mesh's names are one string per mesh dim"), said
    assert ("pass the communicator as comm=" in said) == (names == "comm"), said
    assert one_name == ("x",)  # a string alone names a 1-D mesh's dim
