"""Bad input ends in the same clear ReshardError subclass on every rank, never a hang."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import reshard as rs
from tests.helpers import rank_fns
from tests.helpers.rank_fns import call_op

A = ("array", (6, 4))


def run(op, kwargs, n=3):
    return rs.spawn(call_op, n, args=(op, kwargs), timeout=60)


def _all(results, cls, *words):
    for rank, (kind, message) in enumerate(results):
        assert kind == cls, (rank, kind, message)
        for w in words:
            assert w in message, (rank, message)


def test_shape_mismatch_names_ranks():
    kwargs = [dict(x=("array", (6, 4)), split_dim=1, concat_dim=0)] * 2 + [dict(x=("array", (6, 5)), split_dim=1, concat_dim=0)]
    _all(run("all_to_all", kwargs), "MismatchError", "dim 1", "rank 2")


def test_dtype_mismatch():
    kwargs = [dict(x=("array", (3, 3), "float32"), split_dim=1, concat_dim=0)] * 2 + [dict(x=("array", (3, 3), "float64"), split_dim=1, concat_dim=0)]
    _all(run("all_to_all", kwargs), "MismatchError", "dtype", "float64")


def test_dim_out_of_range_on_one_rank_raises_everywhere():
    kwargs = [dict(x=A, split_dim=1, concat_dim=0)] * 2 + [dict(x=A, split_dim=5, concat_dim=0)]
    _all(run("all_to_all", kwargs), "InvalidArgument", "rank 2", "split_dim=5")


@pytest.mark.parametrize("split", [[1, 1], [2, 2, -0.5], [3, 2, -1], [1, 1, 1]])
def test_bad_split_sizes(split):
    _all(run("all_to_all", dict(x=A, split_dim=1, concat_dim=0, split_sizes=split)), "InvalidArgument", "split_sizes")


def test_split_sizes_disagree():
    kwargs = [dict(x=A, split_dim=1, concat_dim=0, split_sizes=[2, 1, 1])] * 2 + [dict(x=A, split_dim=1, concat_dim=0, split_sizes=[1, 2, 1])]
    _all(run("all_to_all", kwargs), "MismatchError", "split_sizes")


def test_bool_dim_rejected():
    _all(run("all_to_all", dict(x=A, split_dim=True, concat_dim=0)), "InvalidArgument", "bool")


def test_zero_d_rejected():
    _all(run("all_gather", dict(x=("array", ()), dim=0)), "InvalidArgument", "0-d")


def test_gather_dst_out_of_range():
    _all(run("gather", dict(x=A, dim=0, dst=3)), "InvalidArgument", "dst=3")


def test_unknown_reduce_op_and_bad_dtype():
    _all(run("reduce_scatter", dict(x=A, dim=0, op="median")), "InvalidArgument", "median")
    _all(run("reduce_scatter", dict(x=("array", (6, 4), "bool"), dim=0, op="sum")), "UnsupportedDType", "bool")


def test_different_collectives():
    kwargs = [dict(x=A, split_dim=1, concat_dim=0)] * 3
    results = rs.spawn(_mixed, 3, args=(kwargs,), timeout=60)
    for kind, message in results:
        assert kind == "MismatchError" and "all_gather" in message and "all_to_all" in message


def _mixed(comm, kwargs):
    if comm.rank == 1:
        return call_op(comm, "all_gather", dict(x=A, dim=0))
    return call_op(comm, "all_to_all", kwargs)


def test_global_shape_disagrees_with_shards():
    kwargs = dict(x=("array", (2, 6)), src=rs.Shard(0), dst=rs.Shard(1), global_shape=(7, 6))
    _all(run("redistribute", kwargs), "InvalidArgument", "global_shape")


def test_unbalanced_shards_rejected_by_redistribute():
    kwargs = [dict(x=("array", (3, 4)), src=rs.Shard(0), dst=rs.Shard(1))] + [dict(x=("array", (1, 4)), src=rs.Shard(0), dst=rs.Shard(1))] * 2
    _all(run("redistribute", kwargs), "MismatchError", "balanced")


def test_not_an_array():
    _all(run("all_to_all", dict(x=[1, 2, 3], split_dim=0, concat_dim=0)), "InvalidArgument", "numpy.ndarray")


@pytest.mark.parametrize("op", ["all_to_all", "all_to_all_v", "all_reduce", "redistribute", "moe.dispatch",
                                "async all_to_all"])
@pytest.mark.parametrize("replay_first", [False, True])
def test_a_rank_passing_no_communicator_raises_on_every_rank(op, replay_first):
    """Rank 2 passes a string as comm: it runs the check on its process's communicator holding
    the error (and never replays a plan made there), so the others raise too, naming it."""
    results = rs.spawn(rank_fns.bad_comm_on_one_rank, 3, args=(op, replay_first), timeout=60)
    for rank, seen in enumerate(results):
        assert seen is not None and seen[0] == "InvalidArgument", (rank, seen)
        assert "comm must be a reshard Comm" in seen[1] and "rank 2" in seen[1], (rank, seen)


@pytest.mark.parametrize("call", [
    lambda: rs.all_to_all(np.ones((4, 4)), 0, 1),
    lambda: rs.redistribute(np.ones((4, 4)), rs.Shard(0), rs.Shard(1)),
    lambda: rs.redistribute([np.ones((4, 4))], rs.Shard(0), rs.Shard(1)),
    lambda: rs.Mesh((2, 2)),
], ids=["all_to_all", "redistribute", "a list", "Mesh"])
def test_a_call_with_no_communicator_is_told_how_to_get_one(call):
    with pytest.raises(rs.InvalidArgument, match=r"no communicator: call rs.init\(\) .* or run inside rs.spawn"):
        call()


HAVE_MPI = importlib.util.find_spec("mpi4py") is not None


def _calls_after_close(comm):
    """What each call on a closed communicator (and on a mesh dim of it) raises, and whether
    a result made before the close still holds its values."""
    mesh = rs.Mesh((2, comm.size // 2), comm=comm)
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    before = rs.redistribute(x, (rs.Shard(0), rs.Replicate()), (rs.Replicate(), rs.Shard(1)), mesh=mesh)
    rs.all_to_all(x, 0, 1, mesh.sub(0))  # the mesh dim's plan kept, as a loop would
    comm.close()
    comm.close()  # a second close does nothing
    said = {}
    for name, call in (("all_to_all", lambda: rs.all_to_all(x, 0, 1, comm)),
                       ("redistribute", lambda: rs.redistribute(x, (rs.Shard(0), rs.Replicate()),
                                                                (rs.Replicate(), rs.Shard(1)), mesh=mesh)),
                       ("all_to_all", lambda: rs.all_to_all(x, 0, 1, mesh.sub(0))),
                       ("barrier", comm.barrier), ("rs.Mesh", lambda: rs.Mesh((comm.size,), comm=comm))):
        try:
            call()
            said[name] = "no error"
        except rs.InvalidArgument as exc:
            said[name] = str(exc)
    try:  # MPI's world outlives the communicator; a gloo job's group does not
        again = rs.init()
        joined = (again.size, rs.all_to_all(x, 0, 1, again).shape)
    except rs.InvalidArgument as exc:
        joined = str(exc)
    return said, before.tolist(), joined


@pytest.mark.parametrize("engine", ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(not HAVE_MPI,
                                                                                          reason="mpi4py is not installed"))])
def test_a_call_on_a_closed_communicator_is_refused_by_name(engine):
    for rank, (said, before, joined) in enumerate(rs.spawn(_calls_after_close, 4, engine, timeout=120)):
        if engine == "mpi":
            assert joined == (4, (1, 16)), joined
        else:
            assert f"rank {rank}: rs.init() after this rs.spawn rank's communicator was closed: the job's 4 ranks " \
                   "cannot be joined again" in joined, joined
        for name, text in said.items():
            assert f"{name} on a closed communicator (comm.close() ran)" in text, (rank, name, text)
        x = np.arange(16, dtype=np.float32).reshape(4, 4)  # each mesh row's block: the global tensor is 8 x 4
        assert before == np.concatenate([x, x])[:, [[0, 1], [2, 3]][rank % 2]].tolist()


def _calls_in_a_forked_child(comm):
    """What a child forked from this rank is told when it calls on the rank's communicator (by
    default, given, a replay of a kept plan, barrier, then close), and whether the rank's own
    next call is still right."""
    import json
    import os

    x = np.arange(8, dtype=np.float32).reshape(4, 2) + 10 * comm.rank
    rs.all_to_all(x, 0, 1)
    rs.all_to_all(x, 0, 1)  # kept as a hot replay: the child must not run it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        said = []
        for call in (lambda: rs.all_to_all(x, 0, 1), lambda: rs.all_to_all(x, 0, 1, comm), comm.barrier):
            try:
                call()
                said.append("no error")
            except rs.InvalidArgument as exc:
                said.append(str(exc))
        comm.close()  # the parent's engine, left alone
        os.write(write, json.dumps(said).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        said = json.loads(f.read())
    os.waitpid(pid, 0)
    y = rs.all_to_all(x, 0, 1)
    return said, y.tolist()


@pytest.mark.parametrize("engine", ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(not HAVE_MPI,
                                                                                          reason="mpi4py is not installed"))])
def test_a_process_forked_from_a_rank_cannot_call_on_its_communicator(engine):
    per_rank = rs.spawn(_calls_in_a_forked_child, 2, engine, timeout=120)
    full = np.concatenate([np.arange(8, dtype=np.float32).reshape(4, 2) + 10 * r for r in range(2)], axis=1)
    for rank, (said, y) in enumerate(per_rank):
        assert len(said) == 3
        for text, name in zip(said, ("all_to_all", "all_to_all", "barrier")):
            assert f"rank {rank}: {name} in a process forked from the rank" in text, text
        assert y == full[2 * rank : 2 * rank + 2].tolist()  # the rank's own call after the child's


def _nccl_built() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_nccl_available()


@pytest.mark.skipif(_nccl_built(), reason="this torch is built with NCCL")
def test_nccl_on_a_torch_without_it_is_refused_before_any_rank_starts():
    import torch

    for start in (lambda: rs.spawn(rank_fns.identity, 2, engine="nccl"), lambda: rs.init(engine="nccl")):
        with pytest.raises(rs.MissingDependency) as info:
            start()
        said = str(info.value)
        assert "NCCL" in said and torch.__version__ in said and "engine='gloo'" in said, said
        assert "peer rank died" not in said, said


def test_spawn_args_that_are_not_a_sequence_are_refused_by_name():
    for args in (5, None, "ab"):
        with pytest.raises(rs.InvalidArgument, match=r"^args must be a tuple or list of fn's arguments after comm"):
            rs.spawn(rank_fns.identity, 2, args=args)


def _reshard_files(files):
    package = os.path.dirname(os.path.abspath(rs.__file__)) + os.sep
    return [f for f in files if os.path.abspath(f).startswith(package)]


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_an_error_from_a_call_ends_its_traceback_at_the_callers_line(engine):
    if engine == "mpi" and not HAVE_MPI:
        pytest.skip("mpi4py is not installed")
    for rank, seen in enumerate(rs.spawn(rank_fns.traceback_files, 3, engine=engine, timeout=120)):
        for (call, full), files in seen.items():
            assert files, (rank, call, full, "nothing raised")
            if full == "0":
                assert not _reshard_files(files), (rank, call, files)
                assert files[-1] == rank_fns.__file__, (rank, call, files)  # the line that called reshard
            else:
                assert _reshard_files(files), (rank, call, files)


def test_an_error_raised_before_any_rank_exists_ends_at_the_callers_line(monkeypatch):
    import traceback

    for full in ("0", "1"):
        monkeypatch.setenv("RESHARD_TRACEBACK", full)
        with pytest.raises(rs.InvalidArgument) as info:
            rs.redistribute(np.ones((4, 4)), rs.Shard(0), rs.Shard(1))
        files = [frame.filename for frame in traceback.extract_tb(info.value.__traceback__)]
        assert bool(_reshard_files(files)) == (full == "1"), (full, files)
        assert files[0] == __file__, files
