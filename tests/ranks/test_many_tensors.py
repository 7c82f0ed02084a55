"""Many tensors in one ``redistribute`` call: different shapes, dtypes and layouts (Partial
included) give, bit for bit, what the separate calls give and what numpy slices of the full
arrays say; the exchanges of boxes travel as one step; replays, started calls, gradients,
DTensors and bad input behave as for one tensor."""

from __future__ import annotations

import os

import numpy as np
import pytest

import reshard as rs
from reshard.planning import planner
from tests.helpers import many_rank
from tests.helpers.oracle import pattern

S, R, P = rs.Shard, rs.Replicate, rs.Partial

WORLD_CASES = [  # (shape, dtype, src, dst), one placement each side on a world
    ((8, 6), "float32", (S(0),), (S(1),)),
    ((7, 5), "float64", (S(0),), (S(1),)),
    ((5, 3, 4), "int64", (S(1),), (S(2),)),
    ((0, 3), "float32", (S(0),), (S(1),)),
    ((9,), "int32", (S(0),), (R(),)),
    ((6, 4), "complex64", (R(),), (S(1),)),
    ((4, 4), "float32", (S(0),), (S(0),)),  # unchanged: the input itself
    ((8, 6), "float32", (S(0),), (S(1),)),  # the first again
    ((6, 5), "float64", (P(),), (S(0),)),  # reduced: its own plan, in the same call
]
MESH_CASES = [  # on a 2x2 mesh
    ((8, 6), "float32", (S(0), S(1)), (S(1), S(0))),
    ((7, 5), "float64", (S(0), S(0)), rs.Spec((1, 0), None).resolve(2)),
    ((5, 3, 4), "int64", (R(), S(2)), (S(0), R())),
    ((3, 2), "float32", (S(0), R()), (S(0), R())),
    ((6, 4), "float64", (P(), S(1)), (S(0), S(1))),
    ((0, 5), "float32", (S(0), S(1)), (S(1), S(0))),
]


def _oracle(shape, dtype, dst, coord, mesh_shape):
    return np.asarray(rs.local_shard(pattern(shape, dtype), dst, coord, mesh_shape))


@pytest.mark.parametrize("engine,as_torch", [("gloo", False), ("gloo", True), ("gloo", "mixed"), ("mpi", False),
                                             ("mpi", True), ("mpi", "mixed")])
@pytest.mark.parametrize("where", ["world", "mesh"])
def test_one_call_equals_the_separate_calls_and_numpy(engine, as_torch, where):
    cases, mesh_shape = (WORLD_CASES, (3,)) if where == "world" else (MESH_CASES, (2, 2))
    size = int(np.prod(mesh_shape))
    results = rs.spawn(many_rank.many_and_separate, size, engine=engine, args=(mesh_shape, cases, as_torch),
                       timeout=300)
    for r, (runs, replayed, separate, steps, per_tensor) in enumerate(results):
        coord = np.unravel_index(r, mesh_shape)
        assert replayed == [False, True], replayed
        for run in runs:
            for k, (shape, dtype, src, dst) in enumerate(cases):
                got = run[k]
                assert got.dtype == separate[k].dtype and np.array_equal(got, separate[k]), (r, k)
                if not any(isinstance(p, P) for p in src):  # a Partial source's input is not the full tensor
                    assert np.array_equal(got, _oracle(shape, dtype, dst, coord, mesh_shape)), (r, k)
        # every exchange of boxes in one step (MPI: one Alltoallw per group of like tensors,
        # moved by datatypes); the reduced tensor's own steps after it
        reduced = [k for k, c in enumerate(cases) if any(isinstance(p, P) for p in c[2])]
        moving = {(shape, dtype, src, dst) for shape, dtype, src, dst in cases if src != dst and
                  not any(isinstance(p, P) for p in (*src, *dst)) and
                  planner.exchange_boxes(shape, src, dst, mesh_shape, 0).moves}
        exchanges = [name for name in steps if name in ("all_to_all", "all_gather")]
        assert steps[:len(exchanges)] == exchanges and len(exchanges) == (len(moving) if engine == "mpi" else 1), steps
        names = {planner.exchange_boxes(shape, src, dst, mesh_shape, 0).collective for shape, _, src, dst in moving}
        assert set(exchanges) == (names if engine == "mpi" else {"all_gather"} if names == {"all_gather"} else {"all_to_all"})
        assert len(per_tensor) == len(cases) and all(per_tensor[k] for k in reduced), per_tensor


def test_the_partial_tensor_sums_like_a_separate_call():
    # rank 0 holds the full tensor, the others zeros (local_shard's Partial): they sum to it
    cases = [((6, 5), "float64", (P(),), (S(0),)), ((4, 3), "float32", (S(0),), (S(1),))]
    results = rs.spawn(many_rank.many_and_separate, 3, args=((3,), cases, False, 1), timeout=120)
    full = pattern((6, 5), "float64")
    for r, (runs, _, separate, _, _) in enumerate(results):
        assert np.array_equal(runs[0][0], separate[0])
        assert np.array_equal(runs[0][0], rs.local_shard(full, S(0), r, 3))


def test_gradients_and_started_calls_as_for_one_tensor():
    shapes = [(6, 4), (5, 7), (3, 3)]
    for grads, same in rs.spawn(many_rank.many_grads_and_started, 2, args=(shapes,), timeout=120):
        together, separate = grads
        assert all(np.array_equal(a, b) for a, b in zip(together, separate))
        assert same


@pytest.mark.parametrize("case,kind,words", [
    ("dtype on rank 1", "MismatchError", "tensor 2: dtype and dims differ across ranks: ranks 0, 2: float32 2-d; "
                                         "rank 1: float64 2-d"),
    ("layout on rank 1", "MismatchError", "tensor 1: layout differs across ranks: ranks 0, 2: Shard(0) -> Shard(1); "
                                          "rank 1: Shard(1) -> Shard(1)"),
    ("global_shape differs on one rank", "MismatchError", "tensor 1: global_shape differs across ranks: ranks 0, 1: [12, 6]; "
                                                "rank 2: [13, 6]"),
    ("bad dim on rank 0", "InvalidArgument", "tensor 1"),
    ("Spec past the dims on rank 2", "InvalidArgument",
     "tensor 2: dst Spec(None, None, 0) splits tensor dim 2, but the tensor is 2-d (dims 0..1)"),
    ("count on rank 1", "MismatchError", "input differs across ranks: ranks 0, 2: a list of 3 tensors; rank 1: a list of 2 "
                                         "tensors; the lists part at tensor 2: ranks 0, 2: float32 2-d [4, 6]; rank 1: none "
                                         "(its list ends at 2 tensors)"),
    ("middle tensor missing on rank 1", "MismatchError", "the lists part at tensor 1: ranks 0, 2: float32 2-d [4, 6]; "
                                                         "rank 1: float32 2-d [8, 3]"),
    ("middle tensor missing on rank 1, check off", "MismatchError", "the lists part at tensor 1: ranks 0, 2: "
                                                                    "float32 2-d [4, 6]; rank 1: float32 2-d [8, 3]"),
    ("one tensor on rank 1", "MismatchError", "input differs across ranks: ranks 0, 2: a list of 3 tensors; rank 1: one tensor"),
    ("empty list on rank 1", "MismatchError", "ranks 0, 2: a list of 3 tensors; rank 1: an empty list"),
    ("empty list on rank 1, check off", "MismatchError", "ranks 0, 2: a list of 3 tensors; rank 1: an empty list"),
    ("not an array on rank 0", "InvalidArgument", "tensor 1 must be a torch.Tensor or numpy.ndarray, got builtins.NoneType"),
    ("src list length", "InvalidArgument", "one per tensor"),
    ("placements tuple on a world", "InvalidArgument",
     "tensor 0: src and dst are one placement per mesh dim: pass the mesh (mesh=rs.Mesh(...))"),
    ("unsplit dim on rank 2", "MismatchError", "redistribute: tensor 1: dim 1 differs across ranks"),
    ("replicated shape on rank 2", "MismatchError", "redistribute: tensor 1: dim 1 differs across ranks"),
])
def test_bad_input_among_many_names_the_tensor_on_every_rank(case, kind, words):
    for rank, (got, text) in enumerate(rs.spawn(many_rank.many_bad, 3, args=(case,), timeout=120)):
        assert got == kind and words in text, (rank, got, text)
        if case in ("bad dim on rank 0", "not an array on rank 0"):
            assert "rank 0" in text and "tensor 1: tensor 1" not in text, text
        if "on rank 2" in case and kind == "MismatchError":
            assert "ranks 0, 1: 6; rank 2: 7" in text, text


def test_dtensors_in_one_call_as_dtensor_moves_each():
    pytest.importorskip("torch.distributed.tensor")
    for out, refused in rs.spawn(many_rank.many_dtensors, 4, timeout=300):
        assert all(all(flags) for flags in out), out
        assert refused.startswith("InvalidArgument") and "another device mesh" in refused, refused


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_inputs_in_fortran_order_give_the_right_parts_on_every_engine(engine):
    # every other input F-ordered (the same values): a group of one such tensor was sent as if C-ordered on MPI
    from tests.helpers import arena_rank

    cases = [((8, 6), "float32", S(0), S(1)), ((7, 5), "float64", S(0), S(1)), ((6, 9), "int32", S(1), S(0)),
             ((6, 9), "int32", S(1), S(0)), ((5, 3, 4), "int64", S(1), S(2))]
    for calls, _ in rs.spawn(arena_rank.many, 3, engine, args=(engine, (3,), cases, 2, False, None, "views"),
                             timeout=120):
        for got, want, _ in calls:
            assert got == want


def test_one_layout_for_all_may_be_a_list_of_placements_one_per_mesh_dim():
    pytest.importorskip("torch.distributed.tensor")
    for out, refused in rs.spawn(many_rank.one_placement_list_for_all, 4, timeout=300):
        assert len(out) == 10 and all(all(flags) for flags in out), out
        assert refused.startswith("InvalidArgument") and "list of 3 layouts for 2 tensors" in refused, refused


def test_tensors_of_one_shape_and_layout_are_planned_once():
    # a model's parameters repeat a few shapes: the list's first call plans each distinct
    # (global shape, src, dst) once, whatever the dtype, however many tensors have it
    cases = [((8, 6), "float32", S(0), S(1)), ((8, 6), "float64", S(0), S(1)), ((6, 4), "int32", S(0), S(1)),
             ((9,), "float32", S(0), R()), ((6, 5), "float64", P(), S(0)), ((4, 4), "float32", S(1), S(1))]
    results = rs.spawn(many_rank.planned_once, 2, args=(cases, 25), timeout=300)
    for r, (calls, same) in enumerate(results):
        assert len(same) == 150 and all(same), (r, [k for k, ok in enumerate(same) if not ok])
        # (8, 6), (6, 4), (9,) and the Partial's (which the exchange cannot take); the unchanged none
        assert calls == {"exchange_boxes": 4, "redistribute": 1}, (r, calls)


def test_a_list_of_numpy_arrays_needs_no_torch(monkeypatch):
    # an install without torch runs on MPI: a list's first call, replay, started call and mesh
    # change must not import it (a Partial's own steps included)
    blocked = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "no_torch")
    monkeypatch.setenv("PYTHONPATH", blocked + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = rs.spawn(many_rank.lists_without_torch, 2, engine="mpi", timeout=300)
    for r, (same, torch_loaded) in enumerate(results):
        assert len(same) == 11 and all(same), (r, same)
        assert not torch_loaded, r
