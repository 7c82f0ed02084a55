"""A world of N ranks and the (N,) mesh are one thing: every placement change gives the same
local tensors (or the same error) on both, bit for bit, and a change to Partial(op) follows
the documented rule, checked against numpy on the full array:

a rank keeps what it holds of the tensor and holds op's identity elsewhere (0 for sum, the
dtype's lowest value for max, its highest for min); for sum only the first rank that holds an
element keeps it, so that the parts add up to the tensor once."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

import reshard as rs

PLACEMENTS = ["S(0)", "S(1)", "S(2)", "R", "P(sum)", "P(max)", "P(min)", "P(avg)"]
SHAPES = [(5, 4, 3), (0, 3, 2), (3, 1, 7)]
DTYPES = ["float32", "complex64", "int32"]


def _full(shape, dtype):
    rng = np.random.default_rng(zlib.crc32(repr((shape, dtype)).encode()))
    if dtype == "complex64":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype == "int32":
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _input(full, src, rank, n):
    if isinstance(src, rs.Partial):  # every rank's own partial values
        return np.ascontiguousarray(full * (rank + 1) if full.dtype.kind != "b" else full)
    return np.ascontiguousarray(rs.local_shard(full, src, rank, n))


def both_forms(comm):
    """Every (shape, dtype, src, dst): this rank's result on the world and on the (N,) mesh."""
    mesh = rs.Mesh((comm.size,), comm=comm)
    out = {}
    for shape, dtype, a, b in itertools.product(SHAPES, DTYPES, PLACEMENTS, PLACEMENTS):
        src, dst = rs.parse_placement(a), rs.parse_placement(b)
        x = _input(_full(shape, dtype), src, comm.rank, comm.size)
        seen = []
        for on_mesh in (False, True):
            kept = x.copy()
            try:
                y = rs.redistribute(x, (src,), (dst,), mesh=mesh) if on_mesh else rs.redistribute(x, src, dst)
                seen.append(("ok", y.shape, str(y.dtype), y.tobytes()))
            except rs.ReshardError as exc:
                seen.append((type(exc).__name__,))
            assert x.tobytes() == kept.tobytes(), "the input was modified"
        out[(shape, dtype, a, b)] = seen
    return out


def _holds(src, rank, n, shape):
    """Boolean mask of the elements ``rank`` holds under ``src`` (Partial: all of them)."""
    mask = np.zeros(shape, dtype=bool)
    if isinstance(src, rs.Shard):
        index = [slice(None)] * len(shape)
        sizes = rs.shard_sizes(shape[src.dim], n)
        index[src.dim] = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
        mask[tuple(index)] = True
    else:
        mask[...] = True
    return mask


def _identity(dtype, op):
    if op in ("sum", "avg"):
        return 0
    if np.dtype(dtype).kind == "f":
        return -np.inf if op == "max" else np.inf
    info = np.iinfo(dtype)
    return info.min if op == "max" else info.max


# Every world size on MPI; gloo (whose small messages are slower here) on 1 and 2 ranks.
@pytest.mark.parametrize(("engine", "n"), [*(("mpi", n) for n in (1, 2, 3, 4)), *(("gloo", n) for n in (1, 2))])
def test_world_and_line_mesh_give_the_same_local_tensors(engine, n):
    results = rs.spawn(both_forms, n, engine=engine, timeout=600)
    for (shape, dtype, a, b), _ in results[0].items():
        per_rank = [results[r][(shape, dtype, a, b)] for r in range(n)]
        for r, (world, mesh) in enumerate(per_rank):
            assert world == mesh, f"rank {r}, {shape} {dtype}: {a} -> {b}: world {world[:2]} but mesh {mesh[:2]}"
        src, dst = rs.parse_placement(a), rs.parse_placement(b)
        refused = {p[0][0] for p in per_rank} - {"ok"}
        if refused:  # the same error on every rank
            assert len({p[0][0] for p in per_rank}) == 1, per_rank
            continue
        if not isinstance(dst, rs.Partial) or src == dst:
            continue
        full = _full(shape, dtype)
        if isinstance(src, rs.Partial):  # reduced first: every rank holds the reduced tensor
            stacked = np.stack([_input(full, src, r, n) for r in range(n)])
            reduce = {"sum": lambda s: s.sum(0), "max": lambda s: s.max(0), "min": lambda s: s.min(0),
                      "avg": lambda s: s.sum(0) / n}[src.op]
            full = reduce(stacked).astype(dtype)
        claimed = np.zeros(shape, dtype=bool)
        for r in range(n):
            got = np.frombuffer(per_rank[r][0][3], dtype=dtype).reshape(per_rank[r][0][1])
            holds = _holds(src, r, n, shape)
            keeps = holds & ~claimed if dst.op == "sum" else holds
            claimed |= holds
            want = np.full(shape, _identity(dtype, dst.op), dtype=dtype)
            want[keeps] = full[keeps]
            assert got.tobytes() == want.tobytes(), f"rank {r}, {shape} {dtype}: {a} -> {b} breaks the Partial rule"


def shard_to_partial_every_dtype(comm):
    """Shard(0) -> Partial(op) and back to Replicate, for every dtype and op, world and mesh."""
    mesh = rs.Mesh((comm.size,), comm=comm)
    out = {}
    for dtype, op in itertools.product(["float64", "float32", "float16", "int8", "int32", "int64", "bool",
                                        "complex64", "complex128"], ["sum", "max", "min", "avg"]):
        full = _full((6, 3), dtype if dtype != "bool" else "int32").astype(dtype)
        x = np.ascontiguousarray(rs.local_shard(full, rs.Shard(0), comm.rank, comm.size))
        for on_mesh in (False, True):
            try:
                if on_mesh:
                    part = rs.redistribute(x, (rs.Shard(0),), (rs.Partial(op),), mesh=mesh)
                    whole = rs.redistribute(part, (rs.Partial(op),), (rs.Replicate(),), mesh=mesh)
                else:
                    part = rs.redistribute(x, rs.Shard(0), rs.Partial(op))
                    whole = rs.redistribute(part, rs.Partial(op), rs.Replicate())
                out[(dtype, op, on_mesh)] = ("ok", whole.tobytes() == full.tobytes())
            except rs.ReshardError as exc:
                out[(dtype, op, on_mesh)] = (type(exc).__name__, str(exc))
    return out


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_shard_to_partial_works_for_every_dtype_whose_reduction_exists(engine):
    results = rs.spawn(shard_to_partial_every_dtype, 3, engine=engine, timeout=600)
    for (dtype, op, on_mesh), seen in results[0].items():
        where = f"{dtype} Shard(0) -> Partial({op!r}) on the {'mesh' if on_mesh else 'world'}"
        assert all(results[r][(dtype, op, on_mesh)][0] == seen[0] for r in range(3)), where
        refused = (op == "avg") or (dtype == "bool" and op == "sum") or (dtype.startswith("complex") and op in ("max", "min"))
        if refused:
            assert seen[0] in ("UnsupportedDType", "InvalidArgument"), f"{where}: {seen}"
            if op != "avg":
                assert seen[0] == "UnsupportedDType", f"{where}: {seen}"
        else:
            assert seen == ("ok", True), f"{where}: {seen}"
