"""Independent oracles: slice the full array with numpy. Nothing here calls reshard.

Test values encode their global index, so a permutation bug cannot hide behind equal values
(for 8- and 16-bit dtypes, where the index does not fit, a hash of the index stands in).
"""

from __future__ import annotations

import numpy as np

DTYPES = ["float64", "float32", "float16", "bfloat16", "int8", "int32", "int64", "bool", "complex64"]
_STORAGE = {"bfloat16": np.uint16}  # numpy has no bfloat16: carry its bits


def balanced(length: int, parts: int) -> list[int]:
    base, extra = divmod(length, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def starts(sizes: list[int]) -> list[int]:
    return [sum(sizes[:i]) for i in range(len(sizes))]


def take(a: np.ndarray, dim: int, start: int, stop: int) -> np.ndarray:
    index = [slice(None)] * a.ndim
    index[dim] = slice(start, stop)
    return a[tuple(index)]


def _hash(i: np.ndarray) -> np.ndarray:
    return ((i.astype(np.uint64) * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & np.uint64(0xFFFFFFFF)) >> np.uint64(7)


def pattern(shape: tuple[int, ...], dtype: str, salt: int = 0) -> np.ndarray:
    """A full array whose values encode each element's global index (numpy storage dtype)."""
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64) + salt * 1_000_003
    if dtype in ("float64", "float32", "int32", "int64"):
        out = i.astype(dtype)
    elif dtype == "complex64":
        out = (i.astype(np.float32) - 1j * (i.astype(np.float32) + 0.5)).astype(np.complex64)
    elif dtype == "int8":
        out = (_hash(i) & np.uint64(0xFF)).astype(np.uint8).view(np.int8)
    elif dtype in ("float16", "bfloat16"):
        bits = (_hash(i) & np.uint64(0xFFFF)).astype(np.uint16)
        out = bits.view(np.float16) if dtype == "float16" else bits
    elif dtype == "bool":
        out = (_hash(i) & np.uint64(1)).astype(bool)
    else:
        raise ValueError(dtype)
    return out.reshape(shape)


def small_ints(shape: tuple[int, ...], dtype: str, salt: int) -> np.ndarray:
    """Values whose sums stay exact in every dtype (for the reducing ops)."""
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    v = ((i * 7 + salt * 13) % 5) - 2
    if dtype == "bool":
        return (v > 0).reshape(shape)
    if dtype == "bfloat16":
        return v.astype(np.float32).reshape(shape)  # converted in the rank
    if dtype == "complex64":
        return (v + 1j * (v % 3)).astype(np.complex64).reshape(shape)
    return v.astype(dtype).reshape(shape)


def reduce_in_order(parts: list[np.ndarray], op: str) -> np.ndarray:
    acc = parts[0].copy()
    for p in parts[1:]:
        if op in ("sum", "avg"):
            acc = (acc + p).astype(acc.dtype)
        elif op == "max":
            acc = np.maximum(acc, p)
        else:
            acc = np.minimum(acc, p)
    if op == "avg":
        acc = (acc / len(parts)).astype(acc.dtype)
    return acc


def all_to_all_expected(
    full: np.ndarray, s: int, c: int, n: int, rank: int, concat_lengths: list[int], split_sizes: list[int] | None
) -> np.ndarray:
    """What ``rank`` holds after all_to_all when rank i held ``full`` cut along ``c`` by ``concat_lengths``."""
    if s != c:
        sizes = split_sizes or balanced(full.shape[s], n)
        return take(full, s, starts(sizes)[rank], starts(sizes)[rank] + sizes[rank])
    pieces = []
    for start, length in zip(starts(concat_lengths), concat_lengths):
        sizes = split_sizes or balanced(length, n)
        lo = start + starts(sizes)[rank]
        pieces.append(take(full, c, lo, lo + sizes[rank]))
    return np.concatenate(pieces, axis=c)


def placement_slice(full: np.ndarray, placement: tuple, rank: int, n: int) -> np.ndarray:
    """('shard', d) or ('replicate',): the numpy slice a rank holds."""
    if placement[0] == "shard":
        d = placement[1] % full.ndim
        sizes = balanced(full.shape[d], n)
        return take(full, d, starts(sizes)[rank], starts(sizes)[rank] + sizes[rank])
    return full


def all_to_all_v_expected(rows: list[np.ndarray], counts: list[list[int]], r: int) -> np.ndarray:
    """What rank r receives: rank i's rows [sum(counts[i][:r]), +counts[i][r]), in rank order."""
    pieces = [rows[i][sum(counts[i][:r]) : sum(counts[i][:r]) + counts[i][r]] for i in range(len(rows))]
    return np.concatenate(pieces) if pieces else rows[0][:0]


def moe_expected(tokens: list[np.ndarray], ids: list[np.ndarray], num_experts: int, capacity: int | None, d: int):
    """Rank d's expert inputs, tokens per local expert, and every rank's dropped (token, slot)
    pairs, by walking (expert, source rank, token, slot) in order with a per-expert budget."""
    n = len(tokens)
    per = num_experts // n
    used = [0] * num_experts
    kept: dict[tuple[int, int, int], bool] = {}
    for i in range(n):  # capacity goes to lower source ranks first, then lower tokens, then slots
        for t in range(ids[i].shape[0]):
            for j in range(ids[i].shape[1]):
                e = int(ids[i][t, j])
                ok = capacity is None or used[e] < capacity
                used[e] += ok
                kept[(i, t, j)] = ok
    rows, per_expert = [], []
    for e in range(d * per, (d + 1) * per):
        count = 0
        for i in range(n):
            for t in range(ids[i].shape[0]):
                for j in range(ids[i].shape[1]):
                    if int(ids[i][t, j]) == e and kept[(i, t, j)]:
                        rows.append(tokens[i][t])
                        count += 1
        per_expert.append(count)
    dropped = [sorted((t, j) for (i2, t, j), ok in kept.items() if i2 == i and not ok) for i in range(n)]
    trail = tokens[0].shape[1:]
    out = np.stack(rows) if rows else np.zeros((0, *trail), dtype=tokens[0].dtype)
    return out, per_expert, dropped, kept
