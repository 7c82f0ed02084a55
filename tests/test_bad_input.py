"""The bad-input suite: every case runs on 3 real ranks and must end in the named ReshardError
subclass on every rank (the check makes the innocent ranks raise too), never a hang."""

from __future__ import annotations

import importlib.util

import pytest

import reshard as rs
from rank_fns import call_op, grad_input_all_to_all

N = 3
NEEDS_MPI = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")
A = ("array", (6, 4))
T = ("tensor", (6, 4), "float32")


def a2a(x=A, s=1, c=0, **extra):
    return dict(x=x, split_dim=s, concat_dim=c, **extra)


def on_rank(rank, bad, good):
    """Per-rank kwargs: ``bad`` on ``rank``, ``good`` elsewhere."""
    return [bad if r == rank else good for r in range(N)]


CASES = {
    # things that must agree across ranks
    "shape differs": ("all_to_all", on_rank(2, a2a(("array", (6, 5))), a2a()), "MismatchError", "dim 1"),
    "ndim differs": ("all_to_all", on_rank(1, a2a(("array", (6, 4, 1))), a2a()), "MismatchError", "number of dims"),
    "dtype differs": ("all_to_all", on_rank(0, a2a(("array", (6, 4), "float64")), a2a()), "MismatchError", "dtype"),
    "torch vs numpy dtype": ("all_gather", on_rank(1, dict(x=("tensor", (2, 4), "int64")), dict(x=("array", (2, 4), "int32"))), "MismatchError", "dtype"),
    "split_dim differs": ("all_to_all", on_rank(2, a2a(s=0, c=1), a2a(s=1, c=1)), "MismatchError", "split_dim"),
    "concat_dim differs": ("all_to_all", on_rank(2, a2a(s=1, c=1), a2a(s=1, c=0)), "MismatchError", "concat_dim"),
    "split_sizes differ": ("all_to_all", on_rank(1, a2a(split_sizes=[1, 2, 1]), a2a(split_sizes=[2, 1, 1])), "MismatchError", "split_sizes"),
    "gather dim differs": ("all_gather", on_rank(0, dict(x=A, dim=1), dict(x=A, dim=0)), "MismatchError", "dim"),
    "reduce op differs": ("reduce_scatter", on_rank(2, dict(x=A, op="max"), dict(x=A, op="sum")), "MismatchError", "op"),
    "reduce_scatter shape differs": ("reduce_scatter", on_rank(1, dict(x=("array", (5, 4))), dict(x=A)), "MismatchError", "dim 0"),
    "placement differs": ("redistribute", on_rank(1, dict(x=A, src=rs.Replicate(), dst=rs.Shard(1)), dict(x=A, src=rs.Replicate(), dst=rs.Shard(0))), "MismatchError", "dst"),
    "global_shape differs": ("redistribute", on_rank(0, dict(x=("array", (2, 6)), src=rs.Shard(0), dst=rs.Shard(1), global_shape=(6, 6)),
                                                   dict(x=("array", (2, 6)), src=rs.Shard(0), dst=rs.Shard(1), global_shape=(5, 6))), "InvalidArgument", "global_shape"),
    # split sizes
    "split_sizes too short": ("all_to_all", a2a(split_sizes=[2, 2]), "InvalidArgument", "one per rank"),
    "split_sizes negative": ("all_to_all", a2a(split_sizes=[3, 2, -1]), "InvalidArgument", "negative"),
    "split_sizes wrong sum": ("all_to_all", a2a(split_sizes=[1, 1, 1]), "InvalidArgument", "sums to 3"),
    "split_sizes not ints": ("all_to_all", a2a(split_sizes=[1.5, 1.5, 1]), "InvalidArgument", "int"),
    "split_sizes not a list": ("all_to_all", a2a(split_sizes=4), "InvalidArgument", "sequence"),
    # dims
    "split_dim out of range on one rank": ("all_to_all", on_rank(2, a2a(s=5), a2a()), "InvalidArgument", "split_dim=5"),
    "concat_dim too negative": ("all_to_all", a2a(c=-3), "InvalidArgument", "concat_dim=-3"),
    "dim is a bool": ("all_to_all", a2a(s=True), "InvalidArgument", "bool"),
    "dim is a float": ("all_gather", dict(x=A, dim=0.0), "InvalidArgument", "int"),
    "dim is a string": ("gather", dict(x=A, dim="0"), "InvalidArgument", "int"),
    # inputs
    "0-d numpy": ("all_to_all", a2a(x=("array", ())), "InvalidArgument", "0-d"),
    "0-d tensor": ("all_gather", dict(x=("tensor", (), "float32")), "InvalidArgument", "0-d"),
    "sparse tensor": ("all_gather", dict(x=("tensor", (4, 4), "float32", "sparse")), "InvalidArgument", "dense"),
    "tensor on the wrong device": ("all_to_all", on_rank(1, a2a(x=("tensor", (6, 4), "float32", "meta")), a2a(x=T)), "InvalidArgument", "meta"),
    "object array": ("all_gather", dict(x=("array", (3,), "object")), "UnsupportedDType", "object"),
    "a list is not an array": ("all_to_all", a2a(x=[[1, 2], [3, 4]]), "InvalidArgument", "numpy.ndarray"),
    # op arguments
    "gather dst too big": ("gather", dict(x=A, dst=N), "InvalidArgument", f"dst={N}"),
    "gather dst negative": ("gather", dict(x=A, dst=-1), "InvalidArgument", "dst=-1"),
    "unknown reduce op": ("reduce_scatter", dict(x=A, op="median"), "InvalidArgument", "median"),
    "sum of bools": ("reduce_scatter", dict(x=("array", (6, 4), "bool")), "UnsupportedDType", "bool"),
    "max of complex": ("all_reduce", dict(x=("array", (6, 4), "complex64"), op="max"), "UnsupportedDType", "complex"),
    "avg of ints": ("reduce_scatter", dict(x=("array", (6, 4), "int32"), op="avg"), "UnsupportedDType", "avg"),
    "unknown placement": ("redistribute", dict(x=A, src="diagonal", dst=rs.Shard(1)), "InvalidArgument", "diagonal"),
    "global_shape vs shards": ("redistribute", dict(x=("array", (2, 6)), src=rs.Shard(0), dst=rs.Shard(1), global_shape=(7, 6)), "InvalidArgument", "global_shape"),
    "shards not balanced": ("redistribute", on_rank(0, dict(x=("array", (4, 6)), src=rs.Shard(0), dst=rs.Shard(1)), dict(x=("array", (1, 6)), src=rs.Shard(0), dst=rs.Shard(1))), "MismatchError", "balanced"),
    "Shard -> Partial(avg)": ("redistribute", dict(x=A, src=rs.Shard(0), dst=rs.Partial("avg")), "InvalidArgument", "avg"),
    "comm is not a Comm": ("all_gather", dict(x=A, comm="world"), "InvalidArgument", "comm"),
    "mesh is not a Mesh": ("redistribute", dict(x=A, src=(rs.Shard(0),), dst=(rs.Shard(1),), mesh=(N,)), "InvalidArgument", "rs.Mesh"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_fails_on_every_rank(name):
    op, kwargs, cls, word = CASES[name]
    results = rs.spawn(call_op, N, args=(op, kwargs), timeout=60)
    for rank, (kind, message) in enumerate(results):
        assert kind == cls, f"rank {rank}: {kind}: {message}"
        assert word in message, f"rank {rank}: {message!r} does not mention {word!r}"


MIXED = {
    "all_gather": dict(x=A, dim=0),
    "all_to_all": a2a(),
    "all_to_all_v": dict(x=A, send_counts=[2, 2, 2]),
    "redistribute": dict(x=A, src=rs.Shard(0), dst=rs.Shard(1)),
    "moe.dispatch": dict(tokens=("array", (4, 3)), expert_ids=("ids", [[0], [1], [2], [3]]), num_experts=6),
}


@pytest.mark.parametrize("engine", ["gloo", pytest.param("mpi", marks=NEEDS_MPI)])
@pytest.mark.parametrize(("one", "others"), [("all_gather", "all_to_all"), ("all_to_all_v", "all_gather"),
                                             ("redistribute", "all_to_all_v"), ("moe.dispatch", "all_to_all")])
def test_different_collectives_on_different_ranks(one, others, engine):
    # ops that replay and ops that cannot, in either role: the same error on every rank, at once
    results = rs.spawn(_mixed, N, engine=engine, args=(one, others), timeout=60)
    for kind, message in results:
        assert kind == "MismatchError" and "different collectives" in message, message
        assert one.split(".")[-1] in message and others in message, message


def _mixed(comm, one, others):
    op = one if comm.rank == 1 else others
    return call_op(comm, op, MIXED[op])


def test_requires_grad_input_is_accepted_and_untouched():
    results = rs.spawn(grad_input_all_to_all, N, timeout=60)
    for rank, (untouched, on_tape, right, grad_right) in enumerate(results):
        assert untouched, f"rank {rank}: the input changed, or lost requires_grad, or got a grad"
        assert on_tape and right, f"rank {rank}: the result is off the tape or wrong"
        assert grad_right, f"rank {rank}: the input's gradient is wrong"
