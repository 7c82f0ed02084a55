"""What a replayed redistribute costs beyond the engine's own all-to-all, on MPI.

    python benchmarks/replay_overhead.py [--ranks 2] [--bytes 65536] [--repeats 40]

S(0) -> S(1) of a float32 matrix with ``--bytes`` per rank, check off, replayed; beside it
mpi4py's bare ``Alltoall`` on the same bytes already packed into a buffer, and mpi4py alone
moving the same strided pieces into a new result (one resized subarray type through
``Alltoall``, as reshard does for equal pieces; a subarray type per peer through ``Alltoallw``). Each sample is 20
calls back to back between barriers, the slowest rank's time; the figure is the median of
``--repeats`` samples, per call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import reshard as rs

CALLS = 20


def timed(comm, fn) -> float:
    """Seconds per call of ``fn`` over CALLS calls, the slowest rank's. MPI's own barrier (it
    spins): reshard's polling one backs off to sleeps, so ranks would leave it far apart."""
    comm.mpi_comm.Barrier()
    started = time.perf_counter()
    for _ in range(CALLS):
        fn()
    mine = np.array([time.perf_counter() - started])
    slowest = np.empty(1)
    from mpi4py import MPI

    comm.mpi_comm.Allreduce(mine, slowest, op=MPI.MAX)
    return float(slowest[0]) / CALLS


def job(comm, nbytes: int, repeats: int, form: str) -> dict:
    from reshard.engines import mpi_forms

    if form != "auto":  # pin the form reshard would choose by size, to compare the two
        mpi_forms.TYPED_MIN_BYTES, mpi_forms.TYPED_MAX_BYTES = (0, 1 << 62) if form == "typed" else (1 << 62, 0)
    n = comm.size
    cols = 64 * n
    rows = max(1, nbytes // 4 // cols)
    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + comm.rank
    packed = np.ascontiguousarray(x.reshape(rows, n, cols // n).transpose(1, 0, 2)).reshape(-1)
    recv = np.empty_like(packed)

    gshape = (rows * n, cols)
    rows_split, cols_split = rs.Shard(0), rs.Shard(1)  # made once, as a training loop's constants are

    def ours():
        rs.redistribute(x, rows_split, cols_split, global_shape=gshape, check=False)

    def ours_inline():  # as users write it: new placement objects in every call
        rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=gshape, check=False)

    def ours_learning_shapes():  # no global_shape: each call learns the peers' lengths (one small round)
        rs.redistribute(x, rows_split, cols_split, check=False)

    def bare():
        comm.mpi_comm.Alltoall(packed, recv)

    # mpi4py alone moving the same strided pieces, as reshard's two datatype forms do: where the
    # time goes between the engine's own cost of strided pieces and reshard's Python.
    from mpi4py import MPI

    piece = MPI.FLOAT.Create_subarray([rows, cols], [rows, cols // n], [0, 0])
    send_one = piece.Create_resized(0, cols // n * 4).Commit()
    send_each = [MPI.FLOAT.Create_subarray([rows, cols], [rows, cols // n], [0, j * cols // n]).Commit() for j in range(n)]
    piece.Free()
    out_shape, ones, zeros = (rows * n, cols // n), [1] * n, [0] * n
    recv_counts, recv_displs = [rows * cols // n] * n, [i * rows * cols // n * 4 for i in range(n)]

    def strided_alltoall():
        out = np.empty(out_shape, np.float32)
        comm.mpi_comm.Alltoall([x, 1, send_one], [out, rows * cols // n, MPI.FLOAT])

    def strided_alltoallw():
        out = np.empty(out_shape, np.float32)
        comm.mpi_comm.Alltoallw([x, (ones, zeros), send_each], [out, (recv_counts, recv_displs), [MPI.FLOAT] * n])

    methods = {"reshard": ours, "reshard, inline placements": ours_inline, "reshard, shapes learned": ours_learning_shapes, "bare": bare,
               "strided Alltoall": strided_alltoall, "strided Alltoallw": strided_alltoallw}
    for fn in methods.values():  # warm: the plan is made and kept, buffers are touched
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(repeats):  # interleaved, so drift hits every method alike
        for name, fn in methods.items():
            samples[name].append(timed(comm, fn))
    for t in (send_one, *send_each):
        t.Free()
    return {k: statistics.median(v) for k, v in samples.items()} | {"bytes": x.nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=64 << 10)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--form", choices=("auto", "typed", "bytes"), default="auto",
                        help="MPI's datatype form, its byte form, or the one chosen by size (default)")
    args = parser.parse_args()
    result = rs.spawn(job, args.ranks, engine="mpi", args=(args.bytes, args.repeats, args.form), timeout=600)[0]
    bare = result["bare"] * 1e6
    print(f"{args.ranks} MPI ranks, {result['bytes']:,} B per rank, check off, {args.form} form, per call (median of {args.repeats}):")
    print(f"  {'bare Alltoall, packed':<40} {bare:8.1f} us")
    for name, what in (("strided Alltoall", "mpi4py Alltoall, one strided type"),
                       ("strided Alltoallw", "mpi4py Alltoallw, a type per peer"),
                       ("reshard", "reshard replay, global_shape given"),
                       ("reshard, inline placements", "the same, placements made in the call"),
                       ("reshard, shapes learned", "reshard replay, shapes learned")):
        ours = result[name] * 1e6
        print(f"  {what:<40} {ours:8.1f} us   {ours - bare:+8.1f} us")


if __name__ == "__main__":
    main()
