"""Rank-side conformance runner: executes case dicts on a real communicator and checks each
result bit for bit against the numpy oracle. Importable by rank processes (module level only).

A case's result is None when it passed, a text when it failed, or ("value", array) when the
check needs every rank's output (Partial destinations are checked by summing in the parent).
"""

from __future__ import annotations

import traceback
from typing import Any

import numpy as np

import reshard as rs

from .oracle import (
    all_to_all_expected,
    balanced,
    pattern,
    placement_slice,
    reduce_in_order,
    small_ints,
    starts,
    take,
)


def layout_view(a: np.ndarray, layout: str) -> np.ndarray:
    """The same values as ``a`` in a different memory layout (non-contiguous for most)."""
    if layout == "contig":
        return np.ascontiguousarray(a)
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout == "strided":  # every other element of a bigger buffer along the last dim
        if a.ndim == 0:
            return a
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1] + 1,), dtype=a.dtype)
        big[..., 1::2] = a
        return big[..., 1::2]
    if layout == "negstride":  # a negative stride along dim 0, even where it has one element
        return a[::-1].copy()[::-1] if a.ndim else a
    raise ValueError(layout)


def to_input(a: np.ndarray, dtype: str, kind: str, layout: str = "contig") -> Any:
    a = layout_view(a, layout)
    if kind == "numpy":
        return a
    import torch

    if layout == "negstride":  # torch has no negative strides; use a transposed view instead
        a = np.array(a, order="F")
    t = torch.from_numpy(a)
    if dtype == "bfloat16":
        t = t.view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16)
    return t


def to_numpy(out: Any, dtype: str) -> np.ndarray:
    if isinstance(out, np.ndarray):
        return np.ascontiguousarray(out)
    import torch

    if out.dtype == torch.bfloat16:
        out = out.view(torch.uint16) if hasattr(torch, "uint16") else out.view(torch.int16)
    return np.ascontiguousarray(out.detach().cpu().numpy())


def bf16_bits(a: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def same_bits(got: np.ndarray, want: np.ndarray) -> str | None:
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    g = np.ascontiguousarray(got).view(np.uint8).reshape(-1)
    w = np.ascontiguousarray(want).view(np.uint8).reshape(-1)
    if g.size != w.size:
        return f"itemsize differs: {got.dtype} vs {want.dtype}"
    if not np.array_equal(g, w):
        bad = int(np.argmax(g != w)) // max(1, want.itemsize)
        return f"values differ (first at flat element {bad}): got {got.reshape(-1)[bad]!r}, want {want.reshape(-1)[bad]!r}"
    return None


def _type_ok(x: Any, out: Any, kind: str) -> str | None:
    if out is None:
        return None
    if kind == "numpy" and not isinstance(out, np.ndarray):
        return f"numpy in, {type(out).__name__} out"
    if kind == "torch" and isinstance(out, np.ndarray):
        return "torch in, numpy out"
    if str(getattr(x, "dtype", "")) != str(getattr(out, "dtype", "")):
        return f"dtype changed: {x.dtype} -> {out.dtype}"
    return None


def _compare(x: Any, before: np.ndarray, out: Any, want: np.ndarray | None, case: dict) -> str | None:
    after = to_numpy(x, case["dtype"])
    if not np.array_equal(before.view(np.uint8), after.view(np.uint8)):
        return "the input was modified"
    problem = _type_ok(x, out, case["kind"])
    if problem:
        return problem
    if want is None:
        return None if out is None else f"expected None, got {type(out).__name__}"
    if out is None:
        return "got None, expected an array"
    return same_bits(to_numpy(out, case["dtype"]), want)


def _dim(d: int, ndim: int, neg: bool) -> int:
    return d - ndim if neg else d


def run_all_to_all(comm: rs.Comm, case: dict, salt: int = 0) -> Any:
    n, r = comm.size, comm.rank
    shape, s, c, dtype = tuple(case["shape"]), case["s"], case["c"], case["dtype"]
    full = pattern(shape, dtype, salt)
    lengths = case.get("lengths") or balanced(shape[c], n)
    mine = take(full, c, starts(lengths)[r], starts(lengths)[r] + lengths[r])
    x = to_input(mine, dtype, case["kind"], case.get("layout", "contig"))
    before = to_numpy(x, dtype)
    nd, neg = len(shape), case.get("neg", False)
    out = rs.all_to_all(x, _dim(s, nd, neg), _dim(c, nd, neg), split_sizes=case.get("split"))
    want = all_to_all_expected(full, s, c, n, r, lengths, case.get("split"))
    return _compare(x, before, out, want, case)


def run_gather(comm: rs.Comm, case: dict, salt: int = 0) -> Any:
    n, r = comm.size, comm.rank
    shape, d, dtype = tuple(case["shape"]), case["dim"], case["dtype"]
    full = pattern(shape, dtype, salt)
    lengths = case.get("lengths") or balanced(shape[d], n)
    x = to_input(take(full, d, starts(lengths)[r], starts(lengths)[r] + lengths[r]), dtype, case["kind"], case.get("layout", "contig"))
    before = to_numpy(x, dtype)
    dim = _dim(d, len(shape), case.get("neg", False))
    if case["op"] == "all_gather":
        return _compare(x, before, rs.all_gather(x, dim), full, case)
    dst = case.get("dst", 0)
    return _compare(x, before, rs.gather(x, dim, dst=dst), full if r == dst else None, case)


def _partial_inputs(shape: tuple, dtype: str, n: int, salt: int = 0) -> list[np.ndarray]:
    return [small_ints(shape, dtype, salt=i + 101 * salt) for i in range(n)]


def _expected_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_bits(a) if dtype == "bfloat16" else a


def run_reduce(comm: rs.Comm, case: dict, salt: int = 0) -> Any:
    n, r = comm.size, comm.rank
    shape, dtype, op = tuple(case["shape"]), case["dtype"], case.get("reduce", "sum")
    parts = _partial_inputs(shape, dtype, n, salt)
    x = to_input(parts[r], dtype, case["kind"], case.get("layout", "contig"))
    before = to_numpy(x, dtype)
    total = reduce_in_order(parts, op)
    if case["op"] == "all_reduce":
        return _compare(x, before, rs.all_reduce(x, op=op), _expected_dtype(total, dtype), case)
    d = case["dim"]
    sizes = balanced(shape[d], n)
    want = take(total, d, starts(sizes)[r], starts(sizes)[r] + sizes[r])
    out = rs.reduce_scatter(x, _dim(d, len(shape), case.get("neg", False)), op=op)
    return _compare(x, before, out, _expected_dtype(want, dtype), case)


def placement(spec: tuple) -> Any:
    if spec[0] == "shard":
        return rs.Shard(spec[1])
    if spec[0] == "replicate":
        return rs.Replicate()
    return rs.Partial(spec[1] if len(spec) > 1 else "sum")


def run_redistribute(comm: rs.Comm, case: dict, salt: int = 0) -> Any:
    n, r = comm.size, comm.rank
    shape, dtype, src, dst = tuple(case["shape"]), case["dtype"], tuple(case["src"]), tuple(case["dst"])
    if src[0] == "partial":
        parts = _partial_inputs(shape, dtype, n, salt)
        full = _expected_dtype(reduce_in_order(parts, src[1] if len(src) > 1 else "sum"), dtype)
        mine = parts[r]
    else:
        full = pattern(shape, dtype, salt)
        mine = placement_slice(full, src, r, n)
    x = to_input(mine, dtype, case["kind"], case.get("layout", "contig"))
    before = to_numpy(x, dtype)
    gshape = shape if case.get("global") else None
    out = rs.redistribute(x, placement(src), placement(dst), global_shape=gshape)
    if dst[0] == "partial":
        problem = _compare(x, before, out, None, case) if out is None else _type_ok(x, out, case["kind"])
        return problem or ("value", to_numpy(out, dtype), full)
    want = placement_slice(full, dst, r, n)
    return _compare(x, before, out, want, case)


RUNNERS = {
    "all_to_all": run_all_to_all,
    "all_gather": run_gather,
    "gather": run_gather,
    "reduce_scatter": run_reduce,
    "all_reduce": run_reduce,
    "redistribute": run_redistribute,
}


def run_cases(comm: rs.Comm, cases: list[dict], passes: int = 2) -> list[Any]:
    """Each case ``passes`` times in a row with different values: the first call of a
    signature takes the full path, the next ones replay its plan (ops.py), and both must match
    the oracle. A case's result is its first failure, else its last pass's result."""
    results = []
    for case in cases:
        result = None
        for salt in range(passes):
            try:
                result = RUNNERS[case["op"]](comm, case, salt)
            except Exception as exc:  # reported per case; peers raise too (the check), so no hang
                result = f"rank {comm.rank} raised {type(exc).__name__} (pass {salt + 1}): {exc}\n{traceback.format_exc()}"
            if isinstance(result, str):
                if salt:
                    result = f"pass {salt + 1} (a replay): {result}"
                break
        results.append(result)
    return results


def run_cases_one_call(comm: rs.Comm, cases: list[dict]) -> list[Any]:
    """run_cases on gloo with the exchange as one all_to_all_single per op, the path NCCL
    takes, instead of gloo's own point-to-point messages (engines.gloo_pairwise)."""
    comm.primitives.pairwise = False
    return run_cases(comm, cases)


def run_cases_on_gloo_messages(comm: rs.Comm, cases: list[dict]) -> list[Any]:
    """run_cases on gloo in ranks started with RESHARD_SHM=0: every message between them goes
    as gloo's own, as between hosts (engines.gloo_pairwise without engines.shm)."""
    assert comm.primitives.local is None, sorted(comm.primitives.local.peers)
    return run_cases(comm, cases)


def run_cases_started_async(comm: rs.Comm, cases: list[dict]) -> list[Any]:
    """run_cases with every collective started (``async_op=True``) and its handle waited for:
    the worker thread's result must be the blocking call's, bit for bit, errors included."""
    from reshard import ops

    def started(fn: Any) -> Any:
        return lambda *args, **kwargs: fn(*args, async_op=True, **kwargs).wait()

    for name in ("all_to_all", "all_gather", "gather", "reduce_scatter", "all_reduce", "redistribute"):
        setattr(rs, name, started(getattr(ops, name)))
    return run_cases(comm, cases, passes=1)  # the replay's path is the blocking one's, checked there


def run_cases_without_torch(comm: rs.Comm, cases: list[dict]) -> list[Any]:
    """run_cases in a rank where torch cannot be imported; fails loudly if it was."""
    import sys

    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("torch imported in a rank that was meant to run without it")
    results = run_cases(comm, cases, passes=1)  # replays are the mpi engine's, checked there
    if "torch" in sys.modules and getattr(sys.modules["torch"], "Tensor", None) is not None:
        raise AssertionError("reshard imported torch during the numpy-only run")
    return results
