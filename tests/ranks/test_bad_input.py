"""The bad-input suite: every case runs on 3 real ranks and must end in the named ReshardError
subclass on every rank (the check makes the innocent ranks raise too), never a hang."""

from __future__ import annotations

import importlib.util

import pytest

import reshard as rs
from tests.helpers.bad_input_cases import CASES, A, N, a2a
from tests.helpers.rank_fns import (
    call_op,
    grad_input_all_to_all,
    lazy_conjugates_move_their_values,
    rows_to_columns_in_dtype,
)

NEEDS_MPI = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")


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


@pytest.mark.parametrize("dtype,said", [(">f4", "byte order"), ("longdouble", "torch has no dtype for")])
def test_numpy_arrays_torch_cannot_view_are_refused_on_gloo_and_moved_on_mpi(dtype, said):
    # gloo moves numpy arrays as torch views, which torch.from_numpy cannot make of these: its
    # ValueError or TypeError came out bare from deep inside
    import numpy as np

    for rank, (kind, message) in enumerate(rs.spawn(rows_to_columns_in_dtype, 2, "gloo", args=(dtype, 1))):
        assert kind == "UnsupportedDType" and said in message and "rank 1" in message, (rank, message)
    if importlib.util.find_spec("mpi4py") is not None:  # MPI moves any numpy dtype's bytes as they are
        for got_dtype, equal in rs.spawn(rows_to_columns_in_dtype, 2, "mpi", args=(dtype,)):
            assert got_dtype == np.dtype(dtype).str and equal


@pytest.mark.parametrize("engine", ["gloo", pytest.param("mpi", marks=NEEDS_MPI)])
def test_a_lazy_conjugate_moves_its_values_not_its_memory(engine, monkeypatch):
    # x.conj() and x.conj().imag are views whose memory holds the unconjugated values: MPI's list
    # path sent that memory (silently wrong), the others failed inside torch's numpy()
    monkeypatch.setenv("RESHARD_ARENA_MIN_BYTES", "0")  # the arena's in-place reads too
    for rank, per_op in enumerate(rs.spawn(lazy_conjugates_move_their_values, 3, engine)):
        assert per_op == dict.fromkeys(per_op, [True, True, True]), (rank, per_op)
