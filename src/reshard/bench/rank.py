"""``reshard bench``, the rank side: build each method's inputs, check its result, time it."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .check import count_wrong, numpy_of

OPS = ("all_to_all", "redistribute", "all_gather", "reduce_scatter", "moe")
ROUND_INTS = 2  # the replay vote: two int64 per rank, all-reduced (max)
MOE_HIDDEN, MOE_EXPERTS, MOE_TOP_K = 1024, 8, 2

def _shape(nbytes: int, itemsize: int, n: int) -> tuple[int, int]:
    """A local [rows, cols] shard of about ``nbytes``; cols divisible by the world size."""
    cols = 256 * n
    rows = max(1, nbytes // (itemsize * cols))
    return rows, cols


def _values(rows: np.ndarray, cols: np.ndarray, dtype: Any) -> np.ndarray:
    """The global matrix's values at (rows, cols): distinct and exact in the dtype."""
    v = (rows[:, None] * 7919 + cols[None, :] * 31) % 2039
    return v.astype(dtype)


class _Case:
    """One op at one size on one rank: its input, the oracle, and a callable per method."""

    def __init__(self, comm: Any, op: str, nbytes: int, dtype: str, arrays: str):
        self.comm, self.op, self.dtype = comm, op, dtype
        self.n, self.r = comm.size, comm.rank
        self.np_dtype = np.dtype(dtype)
        self.arrays = arrays
        self.extra = -1

    def to_array(self, a: np.ndarray) -> Any:
        if self.arrays == "numpy":
            return a
        import torch

        return torch.from_numpy(a)


def _layout_methods(case: _Case, nbytes: int, wanted: list[str]) -> dict[str, tuple[Any, Any]]:
    """Shard(0) -> Shard(1): method -> (run, verify) with verify(result) -> #wrong."""
    from .. import ops
    from ..planning.layout import Shard

    comm, n, r = case.comm, case.n, case.r
    rows, cols = _shape(nbytes, case.np_dtype.itemsize, n)
    grow = np.arange(r * rows, (r + 1) * rows)
    x_np = _values(grow, np.arange(cols), case.np_dtype)
    x = case.to_array(x_np)
    cr = cols // n
    want = _values(np.arange(n * rows), np.arange(r * cr, (r + 1) * cr), case.np_dtype)
    gshape = (n * rows, cols)
    methods: dict[str, tuple[Any, Any]] = {}
    call = (lambda c: ops.all_to_all(x, 1, 0, check=c)) if case.op == "all_to_all" else (
        lambda c: ops.redistribute(x, Shard(0), Shard(1), global_shape=gshape, check=c))
    methods["reshard"] = (lambda: call(None), lambda out: count_wrong(out, want))
    methods["reshard-nocheck"] = (lambda: call(False), lambda out: count_wrong(out, want))
    packed = np.ascontiguousarray(x_np.reshape(rows, n, cr).transpose(1, 0, 2))
    raw_out = np.empty_like(packed)
    round_out_data = np.empty_like(packed)  # its own output, so its check sees its own result
    check_raw = lambda _: count_wrong(raw_out.reshape(n * rows, cr), want)  # noqa: E731
    check_round = lambda _: count_wrong(round_out_data.reshape(n * rows, cr), want)  # noqa: E731
    round_in, round_out = np.zeros(ROUND_INTS, np.int64), np.empty(ROUND_INTS, np.int64)
    pieces = x_np.reshape(rows, n, cr).transpose(1, 0, 2)  # [peer, row, col]: what the pack copies
    if comm.engine == "mpi":
        mpi = comm.mpi_comm
        methods["raw"] = (lambda: mpi.Alltoall(packed, raw_out), check_raw)

        def mpi_by_hand() -> np.ndarray:
            np.copyto(pack_buf, pieces)
            out = np.empty((n * rows, cr), dtype=x_np.dtype)
            mpi.Alltoall(pack_buf, out)
            return out

        pack_buf = np.empty_like(packed)
        methods["raw+pack"] = (mpi_by_hand, lambda out: count_wrong(out, want))
        from mpi4py import MPI

        methods["raw+round"] = (lambda: (mpi.Allreduce(round_in, round_out, op=MPI.MAX), mpi.Alltoall(packed, round_out_data)),
                                check_round)
    else:
        import torch
        import torch.distributed as dist

        tp, to = torch.from_numpy(packed), torch.from_numpy(raw_out)
        ri, rd = torch.from_numpy(round_in), torch.from_numpy(round_out_data)
        methods["raw"] = (lambda: dist.all_to_all_single(to, tp, group=comm.group), check_raw)
        pack_t, pieces_t = torch.empty_like(tp), torch.from_numpy(x_np).view(rows, n, cr).transpose(0, 1)

        def torch_by_hand() -> Any:
            pack_t.copy_(pieces_t)
            out = torch.from_numpy(np.empty((n * rows, cr), dtype=x_np.dtype))
            dist.all_to_all_single(out, pack_t, group=comm.group)
            return out

        methods["raw+pack"] = (torch_by_hand, lambda out: count_wrong(out, want))
        methods["raw+round"] = (lambda: (dist.all_reduce(ri, op=dist.ReduceOp.MAX, group=comm.group),
                                         dist.all_to_all_single(rd, tp, group=comm.group)), check_round)
        if "dtensor" in wanted and n > 1:
            methods["dtensor"] = _dtensor_method(comm, torch.from_numpy(x_np), gshape, want)
    floor_src, floor_dst = case.to_array(packed.reshape(-1)), case.to_array(np.empty_like(packed).reshape(-1))
    methods["memcpy"] = (lambda: _copy(floor_dst, floor_src), lambda _: count_wrong(numpy_of(floor_dst), packed.reshape(-1)))
    return {m: v for m, v in methods.items() if m in wanted}


def _copy(dst: Any, src: Any) -> None:
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src)
    else:
        dst.copy_(src)


def _dtensor_method(comm: Any, x: Any, gshape: tuple[int, int], want: np.ndarray) -> tuple[Any, Any]:
    import logging

    # DTensor warns on every call that gloo has no alltoall and it falls back to all-gather +
    # chunk: that fallback is what this baseline measures, so say it once in the docs instead.
    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)
    logging.getLogger("torch._logging").setLevel(logging.ERROR)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (comm.size,))
    stride = (gshape[1], 1)
    dt = DTensor.from_local(x, mesh, [Shard(0)], run_check=False, shape=gshape, stride=stride)

    def run() -> Any:
        return dt.redistribute(mesh, [Shard(1)]).to_local()

    return run, lambda out: count_wrong(out, want)


def _gather_methods(case: _Case, nbytes: int, wanted: list[str]) -> dict[str, tuple[Any, Any]]:
    from .. import ops

    comm, n, r = case.comm, case.n, case.r
    rows, cols = _shape(nbytes, case.np_dtype.itemsize, n)
    if case.op == "all_gather":
        x_np = _values(np.arange(r * rows, (r + 1) * rows), np.arange(cols), case.np_dtype)
        want = _values(np.arange(n * rows), np.arange(cols), case.np_dtype)
        x = case.to_array(x_np)
        methods = {"reshard": (lambda: ops.all_gather(x), lambda o: count_wrong(o, want)),
                   "reshard-nocheck": (lambda: ops.all_gather(x, check=False), lambda o: count_wrong(o, want))}
        raw_out = np.empty((n * rows, cols), dtype=case.np_dtype)
    else:  # reduce_scatter: every rank holds the full [n*rows, cols] partial; values sum exactly
        x_np = _values(np.arange(n * rows), np.arange(cols), case.np_dtype) % 16
        want = (x_np[r * rows : (r + 1) * rows].astype(np.float64) * n).astype(case.np_dtype)
        x = case.to_array(x_np)
        methods = {"reshard": (lambda: ops.reduce_scatter(x), lambda o: count_wrong(o, want)),
                   "reshard-nocheck": (lambda: ops.reduce_scatter(x, check=False), lambda o: count_wrong(o, want))}
        raw_out = np.empty((rows, cols), dtype=case.np_dtype)
    if comm.engine == "mpi":
        from mpi4py import MPI

        mpi = comm.mpi_comm
        if case.op == "all_gather":
            methods["raw"] = (lambda: mpi.Allgather(x_np, raw_out), lambda _: count_wrong(raw_out, want))
        else:
            methods["raw"] = (lambda: mpi.Reduce_scatter_block(x_np, raw_out, op=MPI.SUM), lambda _: count_wrong(raw_out, want))
    else:
        import torch

        from ..engines.torch_engine import ALL_GATHER_SINGLE, REDUCE_SCATTER_SINGLE

        xt, ot = torch.from_numpy(x_np), torch.from_numpy(raw_out)
        if case.op == "all_gather":
            methods["raw"] = (lambda: ALL_GATHER_SINGLE(ot, xt, group=comm.group), lambda _: count_wrong(raw_out, want))
        else:
            methods["raw"] = (lambda: REDUCE_SCATTER_SINGLE(ot, xt, group=comm.group), lambda _: count_wrong(raw_out, want))
    src = case.to_array(np.ascontiguousarray(x_np).reshape(-1))
    dst = case.to_array(np.empty(x_np.size, dtype=case.np_dtype))
    methods["memcpy"] = (lambda: _copy(dst, src), lambda _: count_wrong(numpy_of(dst), x_np.reshape(-1)))
    return {m: v for m, v in methods.items() if m in wanted}


def _moe_methods(case: _Case, nbytes: int, wanted: list[str]) -> dict[str, tuple[Any, Any]]:
    """dispatch + combine (identity experts) against the two bare variable all-to-alls that
    move the same rows: the engine's own call with the counts already known."""
    from .. import moe

    comm, r = case.comm, case.r
    tokens = max(1, nbytes // (case.np_dtype.itemsize * MOE_HIDDEN))
    rng = np.random.default_rng(r)
    x_np = _values(np.arange(r * tokens, (r + 1) * tokens), np.arange(MOE_HIDDEN), case.np_dtype)
    # distinct experts per token (top-2 of random scores), as a gate would pick them
    ids = np.argsort(rng.random((tokens, MOE_EXPERTS)), axis=1)[:, :MOE_TOP_K]
    weights = np.full((tokens, MOE_TOP_K), 1.0 / MOE_TOP_K, dtype=case.np_dtype)
    x, ids_k, w = case.to_array(x_np), case.to_array(ids), case.to_array(weights)
    _, handle = moe.dispatch(x, ids_k, num_experts=MOE_EXPERTS)

    def round_trip(check: Any) -> Any:
        expert_in, h = moe.dispatch(x, ids_k, num_experts=MOE_EXPERTS, check=check)
        return moe.combine(expert_in, h, w, check=check)

    methods = {"reshard": (lambda: round_trip(None), lambda o: count_wrong(o, x_np)),
               "reshard-nocheck": (lambda: round_trip(False), lambda o: count_wrong(o, x_np))}
    rows_out, rows_in = sum(handle.send_counts), sum(handle.recv_counts)
    send = np.ascontiguousarray(np.resize(x_np, (rows_out, MOE_HIDDEN)))
    mid = np.empty((rows_in, MOE_HIDDEN), dtype=case.np_dtype)
    back = np.empty_like(send)
    row_bytes = MOE_HIDDEN * case.np_dtype.itemsize
    sc = [c * row_bytes for c in handle.send_counts]
    rc = [c * row_bytes for c in handle.recv_counts]
    primitives = comm.primitives

    def bare() -> None:
        primitives.alltoallv(_engine_bytes(comm, mid), _engine_bytes(comm, send), rc, sc, "bench")
        primitives.alltoallv(_engine_bytes(comm, back), _engine_bytes(comm, mid), sc, rc, "bench")

    methods["raw"] = (bare, lambda _: count_wrong(back, send))
    if "raw+local" in wanted:
        methods["raw+local"] = _moe_by_hand(case, x_np, ids, weights, rc, sc, rows_in)
    src = case.to_array(np.ascontiguousarray(send).reshape(-1))
    dst = case.to_array(np.empty(send.size, dtype=case.np_dtype))
    methods["memcpy"] = (lambda: _copy(dst, src), lambda _: count_wrong(numpy_of(dst), send.reshape(-1)))
    case.moe_rows = rows_out
    return {m: v for m, v in methods.items() if m in wanted}


def _moe_by_hand(case: _Case, x_np: np.ndarray, ids: np.ndarray, weights: np.ndarray, recv_bytes: list[int],
                 send_bytes: list[int], rows_in: int) -> tuple[Any, Any]:
    """``raw+local``: the bare exchanges of an MoE layer with identity experts, plus the
    gather of the routed rows before them and the weighted sum of each token's k results after
    them, all into buffers allocated once. Experts are contiguous blocks of ranks, so rows in
    expert order are rows in destination-rank order, as the exchange wants them."""
    comm, (tokens, k), hidden = case.comm, ids.shape, x_np.shape[1]
    order = np.argsort(ids.reshape(-1), kind="stable")  # the routed slot (token * k + j) of each sent row
    rows, slots = order // k, np.argsort(order)  # token of each sent row; each slot's row among those back
    send = np.empty((order.size, hidden), dtype=x_np.dtype)
    mid = np.empty((rows_in, hidden), dtype=x_np.dtype)
    back, picked, out = np.empty_like(send), np.empty_like(send), np.empty_like(x_np)
    w = weights[:, None, :]  # [tokens, 1, k]: one row of weights per token, for a batched product

    if case.arrays == "numpy":
        def gather() -> None:
            np.take(x_np, rows, axis=0, out=send)

        def weighted_sum() -> None:
            np.take(back, slots, axis=0, out=picked)
            np.matmul(w, picked.reshape(tokens, k, hidden), out=out.reshape(tokens, 1, hidden))
    else:
        import torch

        x_t, rows_t, slots_t, w_t = (torch.from_numpy(a) for a in (x_np, rows, slots, w))
        send_t, back_t, picked_t, out_t = (torch.from_numpy(a) for a in (send, back, picked, out))

        def gather() -> None:
            torch.index_select(x_t, 0, rows_t, out=send_t)

        def weighted_sum() -> None:
            torch.index_select(back_t, 0, slots_t, out=picked_t)
            torch.bmm(w_t, picked_t.view(tokens, k, hidden), out=out_t.view(tokens, 1, hidden))

    primitives = comm.primitives
    send_buf, mid_buf, back_buf = (_engine_bytes(comm, a) for a in (send, mid, back))

    def run() -> None:
        gather()
        primitives.alltoallv(mid_buf, send_buf, recv_bytes, send_bytes, "bench")
        primitives.alltoallv(back_buf, mid_buf, send_bytes, recv_bytes, "bench")
        weighted_sum()

    return run, lambda _: count_wrong(out, x_np)


def _engine_bytes(comm: Any, a: np.ndarray) -> Any:
    """``a``'s memory as the 1-D byte buffer the engine's ``alltoallv`` takes (no copy)."""
    flat = a.reshape(-1).view(np.uint8)
    return flat if comm.engine == "mpi" else _torch_bytes(flat)


def _torch_bytes(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(a)


def bench_rank(comm: Any, config: dict) -> dict:
    """Runs on every rank: for each size, verify then time every method, interleaved."""
    from reshard.execution.buffers import release_buffers

    from .. import ops

    op, dtype, methods = config["op"], config["dtype"], list(config["methods"])
    arrays = "numpy" if comm.engine == "mpi" and config.get("numpy") else "torch"
    if comm.engine == "mpi" and arrays == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            arrays = "numpy"
    out: dict[str, Any] = {"sizes": []}
    for size in config["sizes"]:
        case = _Case(comm, op, size, dtype, arrays)
        sent: dict[str, int] = {}
        if config.get("mesh"):
            from ..planning.layout import parse_placements
            from .mesh import mesh_methods

            mesh_shape = tuple(config["mesh"])  # a Spec resolves on it, not on the fewest mesh dims it names
            table, sent = mesh_methods(case, size, methods, mesh_shape, parse_placements(config["src"], len(mesh_shape)),
                                       parse_placements(config["dst"], len(mesh_shape)))
        elif op in ("all_to_all", "redistribute"):
            table = _layout_methods(case, size, methods)
        elif op == "moe":
            table = _moe_methods(case, size, methods)
        else:
            table = _gather_methods(case, size, methods)
        wrong, extra = {}, {}
        for name, (run, verify) in table.items():
            _count_kept_buffers_again(comm)
            comm.barrier()
            result = run()
            wrong[name] = verify(result)
            stats = ops.last_exchange() if name.startswith("reshard") else None
            if stats is not None and result is not None and hasattr(result, "shape"):
                result_bytes = int(np.prod(result.shape)) * np.dtype(dtype).itemsize
                extra[name] = max(0, stats.allocated_bytes - result_bytes)
                if config.get("mesh"):  # bytes sent per rank, from reshard's own counters
                    sent[name] = stats.bytes_sent
            del result
        # Warm-up (also grows the kept pack buffer once), then interleaved timed iterations.
        iters = config["iters"] or max(5, min(50, int(0.25 / max(size / 2e9, 1e-5))))
        times: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(config["warmup"]):
            for run, _ in table.values():
                run()
        for _ in range(iters):
            for name, (run, _) in table.items():
                comm.barrier()
                t0 = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t0)
        out["sizes"].append({"size": size, "times": times, "wrong": wrong, "extra": extra, "sent": sent,
                             "count": _count(case, size), "moe_rows": getattr(case, "moe_rows", 0)})
        if comm.rank == 0 and config.get("progress"):
            with open(config["progress"], "a") as f:
                f.write(f"{size}\n")
        release_buffers()
    return out


def _count_kept_buffers_again(comm: Any) -> None:
    """The next call counts every buffer it uses as allocated, kept from an earlier call or
    not: each method's memory is measured alike, whichever method ran first."""
    from reshard.execution.buffers import release_buffers

    release_buffers()
    for c in (comm, *comm.children):  # a mesh's dims have outboxes of their own
        local = getattr(c.primitives, "local", None)
        if local is not None:
            local.outbox.count_again()


def _count(case: _Case, size: int) -> int:
    if case.op == "moe":
        return max(1, size // (case.np_dtype.itemsize * MOE_HIDDEN)) * MOE_HIDDEN
    rows, cols = _shape(size, case.np_dtype.itemsize, case.n)
    return rows * cols


