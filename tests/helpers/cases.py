"""Deterministic case lists for the conformance suite (shared by every engine)."""

from __future__ import annotations

import itertools

from .oracle import DTYPES, balanced

A2A_SHAPES = [(6, 6), (7, 5), (5, 7), (0, 3), (3, 0), (1, 1), (2, 9), (4, 3, 5), (3, 2, 5, 2), (9,)]
REDUCE_DTYPES = {
    "sum": ["float64", "float32", "float16", "bfloat16", "int8", "int32", "int64", "uint16", "uint64", "complex64"],
    "avg": ["float64", "float32", "float16", "bfloat16", "complex64"],
    "max": ["float32", "bfloat16", "int8", "int64", "uint32", "bool"],
    "min": ["float64", "float16", "int32", "uint16", "bool"],
}


def _kinds(dtype: str, kinds: tuple[str, ...]) -> list[str]:
    return [k for k in kinds if not (k == "numpy" and dtype == "bfloat16")]


def uneven_lengths(n: int, seed: int) -> list[int]:
    """Per-rank lengths with zeros and imbalance, different for each seed."""
    return [((seed + 3 * i) % 4) for i in range(n)]


def all_cases(n: int, kinds: tuple[str, ...] = ("torch", "numpy")) -> list[dict]:
    cases: list[dict] = []
    k_cycle = itertools.cycle(kinds)
    # every pair of dims on many shapes, balanced
    for shape in A2A_SHAPES:
        for s, c in itertools.product(range(len(shape)), repeat=2):
            cases.append(dict(op="all_to_all", shape=shape, s=s, c=c, dtype="float32", kind=next(k_cycle)))
    # uneven per-rank lengths along the concat dim (zeros included)
    for seed, (s, c) in itertools.product(range(3), [(1, 0), (0, 0), (0, 1), (2, 1)]):
        lengths = uneven_lengths(n, seed)
        shape = [3, 4, 2]
        shape[c] = sum(lengths)
        cases.append(dict(op="all_to_all", shape=tuple(shape), s=s, c=c, lengths=lengths, dtype="int64", kind=next(k_cycle)))
    # explicit split sizes, including all-to-one and zeros
    for shape, s, c in [((4, 7), 1, 0), ((7, 4), 0, 1), ((5, 3), 0, 0)]:
        length = shape[s] if s != c else balanced(shape[c], n)[0]
        if s == c and len(set(balanced(shape[c], n))) > 1:
            continue  # split_sizes must fit every rank's own length
        for split in ([length] + [0] * (n - 1), [0] * (n - 1) + [length], balanced(length, n)[::-1]):
            cases.append(dict(op="all_to_all", shape=shape, s=s, c=c, split=split, dtype="float64", kind=next(k_cycle)))
    # every dtype, torch and numpy
    for dtype in DTYPES:
        for kind in _kinds(dtype, kinds):
            for shape, s, c in [((7, 5), 1, 0), ((7, 5), 0, 1), ((3, 4, 5), 2, 0), ((6, 2), 0, 0)]:
                cases.append(dict(op="all_to_all", shape=shape, s=s, c=c, dtype=dtype, kind=kind))
    # non-contiguous inputs and negative dims
    for layout in ("fortran", "strided", "negstride"):
        for kind in kinds:
            for shape, s, c in [((6, 6), 1, 0), ((7, 5), 0, 1), ((3, 4, 5), 1, 2), ((5, 4), 1, 1)]:
                cases.append(dict(op="all_to_all", shape=shape, s=s, c=c, dtype="int32", kind=kind, layout=layout))
    # one element a rank, every piece one element of a strided view (contiguous by torch's rule)
    for layout in ("strided", "negstride"):
        for kind in kinds:
            cases.append(dict(op="all_to_all", shape=(n,), s=0, c=0, lengths=[1] * n, dtype="float32", kind=kind,
                              layout=layout))
    for shape, s, c in [((6, 6), 1, 0), ((3, 4, 5), 2, 1)]:
        cases.append(dict(op="all_to_all", shape=shape, s=s, c=c, dtype="float32", kind=kinds[0], neg=True))
    # gather family
    for op in ("all_gather", "gather"):
        for shape, d in [((6, 4), 0), ((6, 4), 1), ((3, 5, 2), 1), ((0, 3), 0), ((7,), 0)]:
            for kind in kinds:
                cases.append(dict(op=op, shape=shape, dim=d, dtype="float32", kind=kind, dst=n - 1))
        for seed in range(2):
            lengths = uneven_lengths(n, seed)
            cases.append(dict(op=op, shape=(sum(lengths), 3), dim=0, lengths=lengths, dtype="int64", kind=next(k_cycle)))
            cases.append(dict(op=op, shape=(2, sum(lengths)), dim=1, lengths=lengths, dtype="int8", kind=next(k_cycle)))
        for dtype in DTYPES:
            for kind in _kinds(dtype, kinds):
                cases.append(dict(op=op, shape=(5, 3), dim=1, dtype=dtype, kind=kind, dst=0, layout="fortran"))
        cases.append(dict(op=op, shape=(4, 6), dim=1, dtype="float32", kind=kinds[0], neg=True))
    # reductions
    for op_name, dtypes in REDUCE_DTYPES.items():
        for dtype in dtypes:
            for kind in _kinds(dtype, kinds):
                for shape, d in [((7, 3), 0), ((4, 5), 1), ((2, 0), 0)]:
                    cases.append(dict(op="reduce_scatter", shape=shape, dim=d, reduce=op_name, dtype=dtype, kind=kind))
                cases.append(dict(op="all_reduce", shape=(3, 5), reduce=op_name, dtype=dtype, kind=kind))
    cases.append(dict(op="reduce_scatter", shape=(3, 6, 2), dim=1, dtype="float32", kind=kinds[0], layout="strided"))
    # redistribute: every pair of placements
    placements = [("shard", 0), ("shard", 1), ("shard", -1), ("replicate",), ("partial", "sum"), ("partial", "max")]
    for shape in [(7, 5), (4, 3, 2)]:
        for src, dst in itertools.product(placements, repeat=2):
            dtype = "float32" if "max" not in (src + dst) else "int32"
            for give in (False, True):
                cases.append(dict(op="redistribute", shape=shape, src=src, dst=dst, dtype=dtype, kind=next(k_cycle), **{"global": give}))
    for dtype in DTYPES:
        for kind in _kinds(dtype, kinds):
            cases.append(dict(op="redistribute", shape=(5, 7), src=("shard", 0), dst=("shard", 1), dtype=dtype, kind=kind))
            cases.append(dict(op="redistribute", shape=(5, 7), src=("shard", 1), dst=("shard", 0), dtype=dtype, kind=kind))
    return cases


def case_id(case: dict) -> str:
    skip = {"op", "kind"}
    parts = [case["op"], case["kind"]] + [f"{k}={v}" for k, v in case.items() if k not in skip]
    return ",".join(str(p) for p in parts).replace(" ", "")
