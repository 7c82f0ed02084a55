"""``reshard bench``: reshard's collectives timed beside the baselines, in the same run.

For every size, every method runs on the same ranks, interleaved (method A, B, C, then A, B,
C again...), so a slow moment of the machine hits all of them alike. Each iteration starts
after a barrier; its time is the slowest rank's; the figure is the median over iterations.
Before timing, each method runs once and its result is checked element by element against
the values the layout says it must hold (the ``#wrong`` column), outside the timed region.

Methods (``--op all_to_all`` / ``redistribute``: Shard(0) -> Shard(1) of a float matrix):

* ``reshard``: the public op with its default cross-rank check; ``reshard-nocheck``: check=False.
* ``raw``: the engine's own all-to-all on data that is already packed (``all_to_all_single``,
  MPI ``Alltoall``), into a preallocated buffer: the engine alone.
* ``dtensor``: PyTorch DTensor's ``redistribute`` doing the same layout change (torch engines).
* ``memcpy``: every rank copying its whole buffer once, all at the same time: the floor.
* ``raw+round`` (only when asked for): ``raw`` after an all-gather of 1 KiB, the round a
  checked call adds to the exchange. It shows what one more round of a collective costs on
  these cores, apart from anything reshard does.
* ``raw+local`` (``--op moe``, only when asked for): ``raw`` plus the local passes no MoE
  layer can skip, written by hand with preallocated buffers. Before the exchanges, the routed
  rows are gathered in expert order; after them, each token's k results are gathered back and
  summed with its weights. It is what dispatch + combine would cost if reshard added nothing.

``busbw`` uses nccl-tests' factor for all-to-all, all-gather and reduce-scatter: (N-1)/N.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

OPS = ("all_to_all", "redistribute", "all_gather", "reduce_scatter", "moe")
ROUND_BYTES = 1024  # about the size of the check's record
MOE_HIDDEN, MOE_EXPERTS, MOE_TOP_K = 1024, 8, 2


@dataclass
class Row:
    size: int  # bytes per rank (the local shard; for moe, the tokens)
    count: int  # elements per rank
    dtype: str
    method: str
    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int
    extra_bytes: int = -1  # memory an op allocated beyond its result (max over ranks); -1 unknown
    samples: list[float] = field(default_factory=list)


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    value = int(float(number) * scale)
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def parse_sizes(text: str, factor: int = 4) -> list[int]:
    """'64K..64M' (every ``factor``-fold step), or a list '1M,16M'."""
    if ".." in text:
        lo, hi = (parse_size(t) for t in text.split("..", 1))
        if hi < lo:
            raise ValueError(f"{text!r}: the end is below the start")
        sizes = [lo]
        while sizes[-1] * factor <= hi:
            sizes.append(sizes[-1] * factor)
        return sizes
    return [parse_size(t) for t in text.split(",") if t.strip()]


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- rank side ---------------------------------------------------------------------------------


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

    def __init__(self, comm: Any, op: str, nbytes: int, dtype: str, kit: str):
        self.comm, self.op, self.dtype = comm, op, dtype
        self.n, self.r = comm.size, comm.rank
        self.np_dtype = np.dtype(dtype)
        self.kit = kit
        self.extra = -1

    def to_kit(self, a: np.ndarray) -> Any:
        if self.kit == "numpy":
            return a
        import torch

        return torch.from_numpy(a)


def _np(a: Any) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.detach().cpu().numpy()


def _wrong(got: Any, want: np.ndarray) -> int:
    got = _np(got)
    if got.shape != want.shape:
        return int(want.size) or 1
    return int(np.count_nonzero(got != want))


def _layout_methods(case: _Case, nbytes: int, wanted: list[str]) -> dict[str, tuple[Any, Any]]:
    """Shard(0) -> Shard(1): method -> (run, verify) with verify(result) -> #wrong."""
    import reshard as rs

    comm, n, r = case.comm, case.n, case.r
    rows, cols = _shape(nbytes, case.np_dtype.itemsize, n)
    grow = np.arange(r * rows, (r + 1) * rows)
    x_np = _values(grow, np.arange(cols), case.np_dtype)
    x = case.to_kit(x_np)
    cr = cols // n
    want = _values(np.arange(n * rows), np.arange(r * cr, (r + 1) * cr), case.np_dtype)
    gshape = (n * rows, cols)
    methods: dict[str, tuple[Any, Any]] = {}
    call = (lambda c: rs.all_to_all(x, 1, 0, check=c)) if case.op == "all_to_all" else (
        lambda c: rs.redistribute(x, rs.Shard(0), rs.Shard(1), global_shape=gshape, check=c))
    methods["reshard"] = (lambda: call(None), lambda out: _wrong(out, want))
    methods["reshard-nocheck"] = (lambda: call(False), lambda out: _wrong(out, want))
    packed = np.ascontiguousarray(x_np.reshape(rows, n, cr).transpose(1, 0, 2))
    raw_out = np.empty_like(packed)
    round_out_data = np.empty_like(packed)  # its own output, so its check sees its own result
    check_raw = lambda _: _wrong(raw_out.reshape(n * rows, cr), want)  # noqa: E731
    check_round = lambda _: _wrong(round_out_data.reshape(n * rows, cr), want)  # noqa: E731
    round_in, round_out = np.zeros(ROUND_BYTES, np.uint8), np.empty(n * ROUND_BYTES, np.uint8)
    if comm.engine == "mpi":
        mpi = comm.mpi_comm
        methods["raw"] = (lambda: mpi.Alltoall(packed, raw_out), check_raw)
        methods["raw+round"] = (lambda: (mpi.Allgather(round_in, round_out), mpi.Alltoall(packed, round_out_data)),
                                check_round)
    else:
        import torch
        import torch.distributed as dist

        tp, to = torch.from_numpy(packed), torch.from_numpy(raw_out)
        ri, ro, rd = torch.from_numpy(round_in), torch.from_numpy(round_out), torch.from_numpy(round_out_data)
        methods["raw"] = (lambda: dist.all_to_all_single(to, tp, group=comm.group), check_raw)
        methods["raw+round"] = (lambda: (dist.all_gather_into_tensor(ro, ri, group=comm.group),
                                         dist.all_to_all_single(rd, tp, group=comm.group)), check_round)
        if "dtensor" in wanted and n > 1:
            methods["dtensor"] = _dtensor_method(comm, torch.from_numpy(x_np), gshape, want)
    floor_src, floor_dst = case.to_kit(packed.reshape(-1)), case.to_kit(np.empty_like(packed).reshape(-1))
    methods["memcpy"] = (lambda: _copy(floor_dst, floor_src), lambda _: _wrong(_np(floor_dst), packed.reshape(-1)))
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

    return run, lambda out: _wrong(out, want)


def _gather_methods(case: _Case, nbytes: int, wanted: list[str]) -> dict[str, tuple[Any, Any]]:
    import reshard as rs

    comm, n, r = case.comm, case.n, case.r
    rows, cols = _shape(nbytes, case.np_dtype.itemsize, n)
    if case.op == "all_gather":
        x_np = _values(np.arange(r * rows, (r + 1) * rows), np.arange(cols), case.np_dtype)
        want = _values(np.arange(n * rows), np.arange(cols), case.np_dtype)
        x = case.to_kit(x_np)
        methods = {"reshard": (lambda: rs.all_gather(x), lambda o: _wrong(o, want)),
                   "reshard-nocheck": (lambda: rs.all_gather(x, check=False), lambda o: _wrong(o, want))}
        raw_out = np.empty((n * rows, cols), dtype=case.np_dtype)
    else:  # reduce_scatter: every rank holds the full [n*rows, cols] partial; values sum exactly
        x_np = _values(np.arange(n * rows), np.arange(cols), case.np_dtype) % 16
        want = (x_np[r * rows : (r + 1) * rows].astype(np.float64) * n).astype(case.np_dtype)
        x = case.to_kit(x_np)
        methods = {"reshard": (lambda: rs.reduce_scatter(x), lambda o: _wrong(o, want)),
                   "reshard-nocheck": (lambda: rs.reduce_scatter(x, check=False), lambda o: _wrong(o, want))}
        raw_out = np.empty((rows, cols), dtype=case.np_dtype)
    if comm.engine == "mpi":
        from mpi4py import MPI

        mpi = comm.mpi_comm
        if case.op == "all_gather":
            methods["raw"] = (lambda: mpi.Allgather(x_np, raw_out), lambda _: _wrong(raw_out, want))
        else:
            methods["raw"] = (lambda: mpi.Reduce_scatter_block(x_np, raw_out, op=MPI.SUM), lambda _: _wrong(raw_out, want))
    else:
        import torch
        import torch.distributed as dist

        xt, ot = torch.from_numpy(x_np), torch.from_numpy(raw_out)
        if case.op == "all_gather":
            methods["raw"] = (lambda: dist.all_gather_single(ot, xt, group=comm.group), lambda _: _wrong(raw_out, want))
        else:
            methods["raw"] = (lambda: dist.reduce_scatter_tensor(ot, xt, group=comm.group), lambda _: _wrong(raw_out, want))
    src = case.to_kit(np.ascontiguousarray(x_np).reshape(-1))
    dst = case.to_kit(np.empty(x_np.size, dtype=case.np_dtype))
    methods["memcpy"] = (lambda: _copy(dst, src), lambda _: _wrong(_np(dst), x_np.reshape(-1)))
    return {m: v for m, v in methods.items() if m in wanted}


def _moe_methods(case: _Case, nbytes: int, wanted: list[str]) -> dict[str, tuple[Any, Any]]:
    """dispatch + combine (identity experts) against the two bare variable all-to-alls that
    move the same rows: the engine's own call with the counts already known."""
    import reshard as rs

    comm, r = case.comm, case.r
    tokens = max(1, nbytes // (case.np_dtype.itemsize * MOE_HIDDEN))
    rng = np.random.default_rng(r)
    x_np = _values(np.arange(r * tokens, (r + 1) * tokens), np.arange(MOE_HIDDEN), case.np_dtype)
    # distinct experts per token (top-2 of random scores), as a gate would pick them
    ids = np.argsort(rng.random((tokens, MOE_EXPERTS)), axis=1)[:, :MOE_TOP_K]
    weights = np.full((tokens, MOE_TOP_K), 1.0 / MOE_TOP_K, dtype=case.np_dtype)
    x, ids_k, w = case.to_kit(x_np), case.to_kit(ids), case.to_kit(weights)
    _, handle = rs.moe.dispatch(x, ids_k, num_experts=MOE_EXPERTS)

    def round_trip(check: Any) -> Any:
        expert_in, h = rs.moe.dispatch(x, ids_k, num_experts=MOE_EXPERTS, check=check)
        return rs.moe.combine(expert_in, h, w, check=check)

    methods = {"reshard": (lambda: round_trip(None), lambda o: _wrong(o, x_np)),
               "reshard-nocheck": (lambda: round_trip(False), lambda o: _wrong(o, x_np))}
    rows_out, rows_in = sum(handle.send_counts), sum(handle.recv_counts)
    send = np.ascontiguousarray(np.resize(x_np, (rows_out, MOE_HIDDEN)))
    mid = np.empty((rows_in, MOE_HIDDEN), dtype=case.np_dtype)
    back = np.empty_like(send)
    row_bytes = MOE_HIDDEN * case.np_dtype.itemsize
    sc = [c * row_bytes for c in handle.send_counts]
    rc = [c * row_bytes for c in handle.recv_counts]
    impl = comm._impl

    def bare() -> None:
        impl.alltoallv(_engine_bytes(comm, mid), _engine_bytes(comm, send), rc, sc, "bench")
        impl.alltoallv(_engine_bytes(comm, back), _engine_bytes(comm, mid), sc, rc, "bench")

    methods["raw"] = (bare, lambda _: _wrong(back, send))
    if "raw+local" in wanted:
        methods["raw+local"] = _moe_by_hand(case, x_np, ids, weights, rc, sc, rows_in)
    src = case.to_kit(np.ascontiguousarray(send).reshape(-1))
    dst = case.to_kit(np.empty(send.size, dtype=case.np_dtype))
    methods["memcpy"] = (lambda: _copy(dst, src), lambda _: _wrong(_np(dst), send.reshape(-1)))
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

    if case.kit == "numpy":
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

    impl = comm._impl
    send_buf, mid_buf, back_buf = (_engine_bytes(comm, a) for a in (send, mid, back))

    def run() -> None:
        gather()
        impl.alltoallv(mid_buf, send_buf, recv_bytes, send_bytes, "bench")
        impl.alltoallv(back_buf, mid_buf, send_bytes, recv_bytes, "bench")
        weighted_sum()

    return run, lambda _: _wrong(out, x_np)


def _engine_bytes(comm: Any, a: np.ndarray) -> Any:
    """``a``'s memory as the 1-D byte buffer the engine's ``alltoallv`` takes (no copy)."""
    flat = a.reshape(-1).view(np.uint8)
    return flat if comm.engine == "mpi" else _torch_bytes(flat)


def _torch_bytes(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(a)


def bench_rank(comm: Any, config: dict) -> dict:
    """Runs on every rank: for each size, verify then time every method, interleaved."""
    import reshard as rs
    from reshard import ops

    op, dtype, methods = config["op"], config["dtype"], list(config["methods"])
    kit = "numpy" if comm.engine == "mpi" and config.get("numpy") else "torch"
    if comm.engine == "mpi" and kit == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            kit = "numpy"
    out: dict[str, Any] = {"sizes": []}
    for size in config["sizes"]:
        case = _Case(comm, op, size, dtype, kit)
        if op in ("all_to_all", "redistribute"):
            table = _layout_methods(case, size, methods)
        elif op == "moe":
            table = _moe_methods(case, size, methods)
        else:
            table = _gather_methods(case, size, methods)
        wrong, extra = {}, {}
        for name, (run, verify) in table.items():
            comm.barrier()
            result = run()
            wrong[name] = verify(result)
            stats = rs.last_exchange() if name.startswith("reshard") else None
            if stats is not None and result is not None and hasattr(result, "shape"):
                result_bytes = int(np.prod(result.shape)) * np.dtype(dtype).itemsize
                extra[name] = max(0, stats.allocated_bytes - result_bytes)
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
        out["sizes"].append({"size": size, "times": times, "wrong": wrong, "extra": extra,
                             "count": _count(case, size), "moe_rows": getattr(case, "moe_rows", 0)})
        if comm.rank == 0 and config.get("progress"):
            with open(config["progress"], "a") as f:
                f.write(f"{size}\n")
        ops.release_buffers()
    return out


def _count(case: _Case, size: int) -> int:
    if case.op == "moe":
        return max(1, size // (case.np_dtype.itemsize * MOE_HIDDEN)) * MOE_HIDDEN
    rows, cols = _shape(size, case.np_dtype.itemsize, case.n)
    return rows * cols


# -- parent side -------------------------------------------------------------------------------


def run_bench(engine: str, ranks: int, op: str, sizes: list[int], dtype: str, methods: list[str],
              iters: int = 0, warmup: int = 2, timeout: float = 1800.0, show_progress: bool = True,
              numpy_kit: bool = False) -> list[Row]:
    import reshard as rs

    if op == "moe" and MOE_EXPERTS % ranks:
        raise ValueError(f"--op moe uses {MOE_EXPERTS} experts, so --ranks must divide {MOE_EXPERTS}")
    if engine == "mpi":
        methods = [m for m in methods if m != "dtensor"]
    if op == "moe":
        methods = [m for m in methods if m != "dtensor"]
    tmp = tempfile.mkdtemp(prefix="reshard-bench-")
    progress_path = os.path.join(tmp, "progress")
    open(progress_path, "w").close()
    config = dict(op=op, sizes=sizes, dtype=dtype, methods=methods, iters=iters, warmup=warmup,
                  progress=progress_path, numpy=numpy_kit)
    box: dict[str, Any] = {}

    def job() -> None:
        try:
            box["per_rank"] = rs.spawn(bench_rank, ranks, engine=engine, args=(config,), timeout=timeout)
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    worker = threading.Thread(target=job, daemon=True)
    worker.start()
    try:
        _follow(worker, progress_path, len(sizes), show_progress, f"{op} on {ranks} ranks ({engine})")
    finally:
        worker.join()
        try:
            os.remove(progress_path)
            os.rmdir(tmp)
        except OSError:
            pass
    if "error" in box:
        raise box["error"]
    return _rows(box["per_rank"], ranks, op, dtype)


def _follow(worker: threading.Thread, path: str, total: int, show: bool, label: str) -> None:
    if not show:
        while worker.is_alive():
            worker.join(0.2)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} sizes"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task(label, total=total)
        while worker.is_alive():
            worker.join(0.2)
            with open(path) as f:
                bar.update(task, completed=sum(1 for _ in f))


def _rows(per_rank: list[dict], n: int, op: str, dtype: str) -> list[Row]:
    rows: list[Row] = []
    itemsize = np.dtype(dtype).itemsize
    for k, entry in enumerate(per_rank[0]["sizes"]):
        size = entry["size"]
        for method in entry["times"]:
            per_iter = np.max([r["sizes"][k]["times"][method] for r in per_rank], axis=0)
            t = float(statistics.median(per_iter))
            moved = size
            if op == "moe":  # dispatch + combine move the routed rows there and back
                moved = 2 * max(r["sizes"][k]["moe_rows"] for r in per_rank) * MOE_HIDDEN * itemsize
            algbw = moved / t / 1e9
            factor = 1.0 if method == "memcpy" else (n - 1) / n
            extras = [r["sizes"][k]["extra"].get(method, -1) for r in per_rank]
            rows.append(Row(size=size, count=entry["count"], dtype=dtype, method=method, time_us=t * 1e6,
                            algbw=algbw, busbw=algbw * factor,
                            wrong=sum(r["sizes"][k]["wrong"].get(method, 0) for r in per_rank),
                            extra_bytes=max(extras), samples=[float(v) for v in per_iter]))
    return rows


def ratios(rows: list[Row]) -> list[dict[str, Any]]:
    """Per size: reshard against each baseline (time ratios; < 1 means reshard is faster)."""
    out = []
    for size in sorted({r.size for r in rows}):
        t = {r.method: r.time_us for r in rows if r.size == size}
        entry: dict[str, Any] = {"size": size}
        for ours in ("reshard", "reshard-nocheck"):
            if ours not in t:
                continue
            for base in ("raw", "raw+round", "raw+local", "dtensor", "memcpy"):
                if base in t:
                    entry[f"{ours} / {base}"] = t[ours] / t[base]
        if "dtensor" in t and "reshard" in t:
            entry["dtensor speedup"] = t["dtensor"] / t["reshard"]
        out.append(entry)
    return out


def render(console: Any, rows: list[Row], engine: str, ranks: int, op: str) -> None:
    from rich.table import Table

    title = f"reshard bench: {op} on {ranks} ranks ({engine}); median of interleaved runs, time = slowest rank"
    table = Table(title=title, title_justify="left")
    for col in ("size", "count", "type", "method", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong", "extra mem"):
        table.add_column(col, justify="right" if col not in ("type", "method") else "left")
    last = None
    for r in rows:
        if last is not None and r.size != last:
            table.add_section()
        last = r.size
        extra = "-" if r.extra_bytes < 0 else human(r.extra_bytes)
        table.add_row(human(r.size), str(r.count), r.dtype, r.method, f"{r.time_us:,.1f}", f"{r.algbw:.2f}",
                      f"{r.busbw:.2f}", str(r.wrong), extra)
    console.print(table)
    summary = Table(title="ratios (time / time; below 1 = reshard faster)", title_justify="left")
    entries = ratios(rows)
    keys = sorted({k for e in entries for k in e if k != "size"})
    summary.add_column("size", justify="right")
    for k in keys:
        summary.add_column(k, justify="right")
    for e in entries:
        summary.add_row(human(e["size"]), *[f"{e[k]:.2f}x" if k in e else "-" for k in keys])
    console.print(summary)
    if any(r.wrong for r in rows):
        console.print("[bold red]Some results were wrong: see #wrong.[/]")


def write_json(path: str, rows: list[Row], meta: dict) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": [asdict(r) for r in rows], "ratios": ratios(rows)}, f, indent=1)


def plot(path: str, rows: list[Row], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for method in dict.fromkeys(r.method for r in rows):
        pts = [(r.size, r.busbw) for r in rows if r.method == method]
        style = "--" if method == "memcpy" else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # the memcpy floor sits an order of magnitude above the exchanges
    sizes = sorted({r.size for r in rows})
    ax.set_xticks(sizes, [human(v).replace(" ", "").replace("iB", "") for v in sizes])
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("busbw (GB/s, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
