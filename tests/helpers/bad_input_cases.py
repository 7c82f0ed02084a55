"""Bad input, case by case, for every rank: (op, each rank's arguments, the error class, a phrase
the message must hold). Used by test_bad_input (gloo) and test_mpi (MPI)."""

from __future__ import annotations

import reshard as rs

N = 3
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
    # a reduction and an algorithm are named as the user wrote them
    "reduce op differs": ("reduce_scatter", on_rank(2, dict(x=A, op="max"), dict(x=A, op="sum")), "MismatchError",
                          "op differs across ranks: ranks 0, 1: 'sum'; rank 2: 'max'"),
    "all_reduce op differs": ("all_reduce", on_rank(0, dict(x=A, op="avg"), dict(x=A, op="min")), "MismatchError",
                              "op differs across ranks: rank 0: 'avg'; ranks 1, 2: 'min'"),
    "algorithm differs": ("all_to_all", on_rank(1, a2a(algorithm="hierarchical"), a2a(algorithm="flat")), "MismatchError",
                          "algorithm differs across ranks: ranks 0, 2: 'flat'; rank 1: 'hierarchical'"),
    "reduce_scatter shape differs": ("reduce_scatter", on_rank(1, dict(x=("array", (5, 4))), dict(x=A)), "MismatchError", "dim 0"),
    "placement differs": ("redistribute", on_rank(1, dict(x=A, src=rs.Replicate(), dst=rs.Shard(1)), dict(x=A, src=rs.Replicate(), dst=rs.Shard(0))), "MismatchError", "dst"),
    "global_shape differs": ("redistribute", on_rank(0, dict(x=("array", (2, 6)), src=rs.Shard(0), dst=rs.Shard(1), global_shape=(6, 6)),
                                                   dict(x=("array", (2, 6)), src=rs.Shard(0), dst=rs.Shard(1), global_shape=(5, 6))), "InvalidArgument", "global_shape"),
    # split sizes
    "split_sizes too short": ("all_to_all", a2a(split_sizes=[2, 2]), "InvalidArgument", "one per rank"),
    "split_sizes negative": ("all_to_all", a2a(split_sizes=[3, 2, -1]), "InvalidArgument", "negative"),
    "split_sizes wrong sum": ("all_to_all", a2a(split_sizes=[1, 1, 1]), "InvalidArgument",
                              "sums to 3, but split_dim 1 has length 4"),
    "send_counts wrong sum": ("all_to_all_v", dict(x=A, send_counts=[2, 2, 1]), "InvalidArgument",
                              "sums to 5, but x's dim 0 (its rows) has length 6"),
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
    "masked array": ("all_gather", dict(x=("array", (6, 4), "float32", "masked")), "InvalidArgument", "masked array"),
    "masked array to redistribute": ("redistribute", dict(x=("array", (2, 6), "int32", "masked"), src=rs.Shard(0),
                                                          dst=rs.Shard(1)), "InvalidArgument", "whose mask reshard does not move"),
    "a list is not an array": ("all_to_all", a2a(x=[[1, 2], [3, 4]]), "InvalidArgument", "numpy.ndarray"),
    # op arguments
    "gather dst too big": ("gather", dict(x=A, dst=N), "InvalidArgument", f"dst={N}"),
    "gather dst negative": ("gather", dict(x=A, dst=-1), "InvalidArgument", "dst=-1"),
    "unknown reduce op": ("reduce_scatter", dict(x=A, op="median"), "InvalidArgument", "median"),
    "sum of bools": ("reduce_scatter", dict(x=("array", (6, 4), "bool")), "UnsupportedDType", "bool"),
    "max of complex": ("all_reduce", dict(x=("array", (6, 4), "complex64"), op="max"), "UnsupportedDType", "complex"),
    "avg of ints": ("reduce_scatter", dict(x=("array", (6, 4), "int32"), op="avg"), "UnsupportedDType", "avg"),
    "Spec past the tensor's dims": ("redistribute", dict(x=A, src=rs.Spec(None, None, 0), dst=rs.Shard(1)), "InvalidArgument",
                                    "src Spec(None, None, 0) splits tensor dim 2, but the tensor is 2-d"),
    "Spec past the dims on one rank": ("redistribute", on_rank(1, dict(x=A, src=rs.Shard(0), dst="Spec(None, None, 0)"),
                                                               dict(x=A, src=rs.Shard(0), dst=rs.Shard(1))), "InvalidArgument",
                                       "dst Spec(None, None, 0) splits tensor dim 2, but the tensor is 2-d"),
    "unknown placement": ("redistribute", dict(x=A, src="diagonal", dst=rs.Shard(1)), "InvalidArgument", "diagonal"),
    "global_shape vs shards": ("redistribute", dict(x=("array", (2, 6)), src=rs.Shard(0), dst=rs.Shard(1), global_shape=(7, 6)), "InvalidArgument", "global_shape"),
    "shards not balanced": ("redistribute", on_rank(0, dict(x=("array", (4, 6)), src=rs.Shard(0), dst=rs.Shard(1)), dict(x=("array", (1, 6)), src=rs.Shard(0), dst=rs.Shard(1))), "MismatchError", "balanced"),
    "Shard -> Partial(avg)": ("redistribute", dict(x=A, src=rs.Shard(0), dst=rs.Partial("avg")), "InvalidArgument", "avg"),
    "comm is not a Comm": ("all_gather", dict(x=A, comm="world"), "InvalidArgument", "comm"),
    "mesh is not a Mesh": ("redistribute", dict(x=A, src=(rs.Shard(0),), dst=(rs.Shard(1),), mesh=(N,)), "InvalidArgument", "rs.Mesh"),
}
