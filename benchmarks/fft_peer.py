"""reshard's distributed FFT beside mpi4py-fft's, on the same MPI ranks, in one run.

    apt-get install libfftw3-dev          # FFTW's headers, which mpi4py-fft's build needs
    .venv/bin/python -m pip install --no-deps --target benchmarks/.peers mpi4py-fft==2.0.6
    PYTHONPATH=benchmarks/.peers .venv/bin/python benchmarks/fft_peer.py [--n 128] [--repeats 15] [--warm 0]

mpi4py-fft is the peer: it lives in that folder only, never in reshard's dependencies. On 4 MPI
ranks, an n^3 complex128 array, numpy's FFT on both sides: a slab (reshard's 1x4 mesh against
mpi4py-fft's ``slab=True``) and a pencil (2x2 against its default grid), each starting from the
same pieces of the same array. Per case: forward + backward, and each transpose alone (reshard's
``redistribute`` between the layouts its transform takes, mpi4py-fft's ``Transfer.forward`` /
``backward`` between the same axes), medians of ``--repeats`` interleaved repetitions, each the
slowest rank's time; the one-process numpy time beside them (the bound with no communication);
the largest error of each library's forward transform against numpy's on the full array, and
the largest difference between the two libraries' transforms of the same input.

Two things are held equal, as each moved the ratios by more than the targets allow: both
libraries' transposes read the same input arrays (mpi4py-fft's own; its ``Transfer`` reading a
copy made once took 1.26-1.33x its time on its own array), and the jobs run in a new order each
repetition (the same on every rank), so no job always follows the heavy forward + backward ones.
Each transpose is also timed with reshard's input in the shared arena (a copy made once), as
it lies within reshard's FFT, where the local transform writes its result there and the
transpose's peers read it in place. Beside each transpose, its floor: each rank's input copied
once into a touched array of its size, timed as the others (the slowest rank's own time), the
least an exchange that moves each byte once could take. ``--warm N`` runs each job N times
untimed just before each timed call (steady state); by default each timed call follows other
jobs, as a transpose follows the local transforms within an FFT.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np

import reshard as rs
from reshard.fft import Move, schedule


def slowest(comm, seconds: float) -> float:
    from mpi4py import MPI

    out = np.empty(1)
    comm.mpi_comm.Allreduce(np.array([seconds]), out, op=MPI.MAX)
    return float(out[0])


def timed(comm, fn) -> float:
    """The slowest rank's seconds for ``fn``, every rank starting from MPI's own barrier (it
    spins, so ranks leave it together; reshard's polling one backs off to sleeps)."""
    comm.mpi_comm.Barrier()
    started = time.perf_counter()
    fn()
    return slowest(comm, time.perf_counter() - started)


def case(comm, name: str, mesh_shape: tuple, src: str, slab: bool, n: int, repeats: int, warm: int = 0) -> dict:
    from mpi4py_fft import PFFT

    full = np.random.default_rng(0).standard_normal((n, n, n)) + 1j * np.random.default_rng(1).standard_normal((n, n, n))
    reference = np.fft.fftn(full)
    theirs = PFFT(comm.mpi_comm, (n, n, n), dtype=np.complex128, backend="numpy", slab=slab)
    mesh = rs.Mesh(mesh_shape, comm=comm)
    src_pl = rs.parse_placements(src)
    region = rs.layout.mesh_region(full.shape, src_pl, mesh.coord, mesh.shape)
    ours_in = tuple(slice(a, b) for a, b in region)
    if ours_in != tuple(theirs.local_slice(False)):
        raise SystemExit(f"{name}: rank {comm.rank} starts from {ours_in}, mpi4py-fft from {theirs.local_slice(False)}")
    x = np.ascontiguousarray(full[ours_in])
    u = np.ascontiguousarray(full[theirs.local_slice(False)])
    u_hat = np.empty(theirs.forward.output_array.shape, dtype=np.complex128)
    out_layout = rs.fft.output_layout(full.shape, mesh, src_pl)

    def ours_both(check: bool | None = None) -> None:
        y = rs.fft.fftn(x, mesh, src_pl, check=check)
        rs.fft.ifftn(y, mesh, out_layout, dst=src_pl, check=check)

    def theirs_both() -> None:
        theirs.forward(u, u_hat, normalize=False)
        theirs.backward(u_hat, u, normalize=True)

    # the transposes alone: ours between the layouts our forward takes, theirs between its pencils
    moves, layout = [], src_pl
    shape = full.shape
    for st in schedule(shape, mesh.shape, src_pl, (0, 1, 2), "fft"):
        if isinstance(st, Move):
            moves.append((layout, st.layout))
            layout = st.layout
    # mpi4py-fft's transfers that move data (a slab's first is between identical pieces)
    real = [i for i, t in enumerate(theirs.transfer) if tuple(t.subshapeA) != tuple(t.subshapeB)]
    if len(real) != len(moves):
        raise SystemExit(f"{name}: mpi4py-fft moves data {len(real)} times, reshard {len(moves)}")
    transposes, floors = [], []
    for (a, b), i in zip(moves, real):
        t = theirs.transfer[i]
        # Both libraries read the same input array (mpi4py-fft's own), so neither gains from where
        # its input lies in memory or how recently it was written.
        arr_a = theirs.xfftn[i].forward.output_array
        arr_b = theirs.xfftn[i + 1].forward.input_array
        for arr, layout in ((arr_a, a), (arr_b, b)):
            reg = rs.layout.mesh_region(shape, layout, mesh.coord, mesh.shape)
            if arr.shape != tuple(q - p for p, q in reg) or not arr.flags.c_contiguous:
                raise SystemExit(f"{name}: rank {comm.rank} holds {arr.shape} as mpi4py-fft, {reg} as reshard")
        k = len(transposes) // 6 + 1
        # the floor: each rank's input copied once into a touched array of its size, every rank
        # at once (what an exchange that moves each byte once cannot beat)
        landing = np.empty_like(arr_a)
        landing[...] = 0
        floors.append((f"floor {k}", lambda src=arr_a, dst=landing: np.copyto(dst, src)))
        # Within reshard's FFT a transpose's input is the local transform's result, which lies in
        # the shared arena (its peers read it in place): the same values, copied there once
        in_a, in_b = rs.empty_like(arr_a), rs.empty_like(arr_b)
        in_a[...], in_b[...] = arr_a, arr_b
        transposes.append((f"transpose {k} forward, input in the arena",
                           lambda a=a, b=b, x=in_a: rs.redistribute(x, a, b, mesh=mesh, global_shape=shape),
                           lambda t=t, arr_a=arr_a, arr_b=arr_b: t.forward(arr_a, arr_b)))
        transposes.append((f"transpose {k} backward, input in the arena",
                           lambda a=a, b=b, x=in_b: rs.redistribute(x, b, a, mesh=mesh, global_shape=shape),
                           lambda t=t, arr_a=arr_a, arr_b=arr_b: t.backward(arr_b, arr_a)))
        for check in (None, False):
            tag = "" if check is None else ", check off"
            transposes.append((f"transpose {k} forward{tag}",
                               lambda a=a, b=b, arr_a=arr_a, c=check: rs.redistribute(arr_a, a, b, mesh=mesh,
                                                                                      global_shape=shape, check=c),
                               lambda t=t, arr_a=arr_a, arr_b=arr_b: t.forward(arr_a, arr_b)))
            transposes.append((f"transpose {k} backward{tag}",
                               lambda a=a, b=b, arr_b=arr_b, c=check: rs.redistribute(arr_b, b, a, mesh=mesh,
                                                                                      global_shape=shape, check=c),
                               lambda t=t, arr_a=arr_a, arr_b=arr_b: t.backward(arr_b, arr_a)))

    def numpy_alone() -> None:
        if comm.rank == 0:
            np.fft.ifftn(np.fft.fftn(full))

    jobs = [("reshard fwd+bwd", ours_both), ("reshard fwd+bwd, check off", lambda: ours_both(False)),
            ("mpi4py-fft fwd+bwd", theirs_both), ("numpy, one process", numpy_alone)]
    for what, ours, peer in transposes:
        jobs += [(f"reshard {what}", ours),
                 (f"mpi4py-fft {what.removesuffix(', check off').removesuffix(', input in the arena')}", peer)]
    jobs += floors
    samples: dict[str, list[float]] = {key: [] for key, _ in jobs}  # in the table's order
    for fn in dict(jobs).values():  # warm: plans, datatypes and buffers made once
        fn()
    for rep in range(repeats):  # a new order each repetition (the same on every rank): no job always follows another
        order = list(jobs)
        random.Random(rep).shuffle(order)
        for key, fn in order:
            for _ in range(warm):  # steady state: the job's own untimed calls just before
                fn()
            samples[key].append(timed(comm, fn))
    y = rs.fft.fftn(x, mesh, src_pl)
    want = reference[tuple(slice(a, b) for a, b in rs.layout.mesh_region(shape, out_layout, mesh.coord, mesh.shape))]
    scale = float(np.abs(reference).max())
    ours_err = float(np.abs(y - want).max()) / scale
    theirs.forward(u, u_hat, normalize=False)
    theirs_err = float(np.abs(u_hat - reference[theirs.local_slice(True)]).max()) / scale
    errs = np.array([ours_err, theirs_err])
    from mpi4py import MPI

    comm.mpi_comm.Allreduce(MPI.IN_PLACE, errs, op=MPI.MAX)
    # the two transforms side by side: each library's pieces summed into the full array
    # (each element held by one rank of each), then compared with each other directly
    both = np.zeros((2, *reference.shape), dtype=np.complex128)
    both[0][tuple(slice(a, b) for a, b in rs.layout.mesh_region(shape, out_layout, mesh.coord, mesh.shape))] = y
    both[1][theirs.local_slice(True)] = u_hat
    comm.mpi_comm.Allreduce(MPI.IN_PLACE, both, op=MPI.SUM)
    between = float(np.abs(both[0] - both[1]).max()) / scale
    return {"case": name, "ms": {k: statistics.median(v) * 1e3 for k, v in samples.items()},
            "reshard_error": float(errs[0]), "mpi4py_fft_error": float(errs[1]), "between": between,
            "repeats": repeats, "warm": warm}


def job(comm, n: int, repeats: int, warm: int) -> list[dict]:
    return [case(comm, "slab 1x4", (1, 4), "R,S(0)", True, n, repeats, warm),
            case(comm, "pencil 2x2", (2, 2), "S(0),S(1)", False, n, repeats, warm)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warm", type=int, default=0,
                        help="untimed calls of each job just before each timed one (steady state; 0: each timed call "
                             "follows other jobs)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    rows = rs.spawn(job, 4, engine="mpi", args=(args.n, args.repeats, args.warm), timeout=1800)[0]
    print(f"4 MPI ranks, {args.n}^3 complex128, numpy backend, median of {args.repeats} interleaved repetitions"
          f"{f', each after {args.warm} untimed calls of its own' if args.warm else ''} "
          f"(slowest rank):\n")
    print("The floor of a transpose: each rank's input copied once into a touched array of its size (the slowest "
          "rank's own time).\n")
    print("| case | what | mpi4py-fft (ms) | reshard (ms) | reshard / mpi4py-fft | mpi4py-fft / floor | reshard / floor |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        ms = row["ms"]
        print(f"| {row['case']} | numpy in one process, forward + inverse | | {ms['numpy, one process']:.1f} | | | |")
        for what in [k.removeprefix("reshard ") for k in ms if k.startswith("reshard ")]:
            peer = what.removesuffix(", check off").removesuffix(", input in the arena")
            theirs, ours = ms[f"mpi4py-fft {peer}"], ms[f"reshard {what}"]
            floor = ms.get(f"floor {peer.split()[1]}") if peer.startswith("transpose ") else None
            over = f"{theirs / floor:.2f}x | {ours / floor:.2f}x" if floor else " | "
            print(f"| {row['case']} | {what} | {theirs:.1f} | {ours:.1f} | {ours / theirs:.2f}x | {over} |")
        for key in [k for k in ms if k.startswith("floor ")]:
            print(f"| {row['case']} | the floor of transpose {key.split()[1]} | | {ms[key]:.1f} | | | |")
        print(f"| {row['case']} | largest error against numpy, over its largest value | "
              f"{row['mpi4py_fft_error']:.1e} | {row['reshard_error']:.1e} | | | |")
        print(f"| {row['case']} | largest difference between the two transforms, over the largest value | | | "
              f"{row['between']:.1e} | | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
