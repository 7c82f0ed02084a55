"""The two-level combine's sums (``reshard.moe.sums``): the in-place form (torch's row ops, on
tensors and on numpy rows) against the plain numpy form and against a loop over the pairs in
slot order, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.moe.sums import host_sums, sum_over_hosts


def _pairs(rng: np.random.Generator, held: int, top_k: int) -> np.ndarray:
    """row * k + slot of each (row, slot) pair on this host, every row with at least one, in a
    shuffled order (as pairs arrive sorted by destination, not by row)."""
    pairs = [r * top_k + j for r in range(held) for j in sorted(rng.choice(top_k, rng.integers(1, top_k + 1),
                                                                          replace=False))]
    return np.array(rng.permutation(pairs), dtype=np.int64)


def _loop(back: np.ndarray, pair_at: np.ndarray, top_k: int, held: int, weights) -> np.ndarray:
    """The oracle: each row's slots in slot order, the first copied, the rest added."""
    out = np.zeros((held, *back.shape[1:]), dtype=back.dtype)
    for r in range(held):
        first = True
        for j in range(top_k):
            hit = np.flatnonzero(pair_at == r * top_k + j)
            if hit.size:
                term = back[hit[0]] if weights is None else back[hit[0]] * back.dtype.type(weights[r, j])
                out[r] = term if first else out[r] + term
                first = False
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 12), st.integers(1, 4), st.booleans(),
       st.sampled_from(["float32", "float64", "complex64"]))
def test_host_sums_in_place_equal_the_plain_sums_and_the_slot_order_loop(seed, held, top_k, weighted, dtype):
    rng = np.random.default_rng(seed)
    pair_at = _pairs(rng, held, top_k)
    back = rng.standard_normal((pair_at.size, 3)).astype(dtype)
    back[rng.random(back.shape) < 0.2] = -0.0  # a lone -0.0 must stay -0.0 (copied, not added to 0)
    weights = rng.random((held, top_k)).astype(np.float32) if weighted else None
    plain = back.copy()
    plain.flags.writeable = False  # read-only: the plain numpy form
    want = _loop(back, pair_at, top_k, held, weights)
    for got in (host_sums(back, pair_at, top_k, held, weights),
                host_sums(plain, pair_at, top_k, held, weights),
                host_sums(torch.from_numpy(back.copy()), pair_at, top_k, held,
                          None if weights is None else torch.from_numpy(weights)).numpy()):
        assert got.dtype == back.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_host_sums_of_integer_rows_add_in_int64_in_every_form(dtype):
    rng = np.random.default_rng(7)
    pair_at = _pairs(rng, 9, 3)
    back = rng.integers(0, 3, (pair_at.size, 4)).astype(dtype)
    plain = back.copy()
    plain.flags.writeable = False
    want = _loop(back.astype(np.int64), pair_at, 3, 9, None).astype(dtype)
    for got in (host_sums(back, pair_at, 3, 9, None), host_sums(plain, pair_at, 3, 9, None)):
        assert got.dtype == back.dtype and np.array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 9), st.integers(1, 4), st.sampled_from(["float32", "int32"]))
def test_sum_over_hosts_adds_each_tokens_rows_in_host_order(seed, tokens, hosts, dtype):
    rng = np.random.default_rng(seed)
    runs = [np.sort(rng.choice(tokens, rng.integers(0, tokens + 1), replace=False)) for _ in range(hosts)]
    row_token = np.concatenate(runs).astype(np.int64)
    back = (rng.standard_normal((row_token.size, 2)) * 100).astype(dtype)
    if dtype == "float32":
        back[rng.random(back.shape) < 0.1] = -0.0  # a row copied, not added to 0, keeps its sign
    want = np.zeros((tokens, 2), dtype=dtype)
    seen = np.zeros(tokens, dtype=bool)
    for t, row in zip(row_token, back):  # host-major rows: host order per token
        want[t] = row if not seen[t] else want[t] + row
        seen[t] = True
    plain = back.copy()
    plain.flags.writeable = False
    ends = np.cumsum([r.size for r in runs])

    def blocks(rows):
        return [(rows[e - r.size : e], r) for r, e in zip(runs, ends)]

    for got in (sum_over_hosts(blocks(back), tokens), sum_over_hosts(blocks(plain), tokens),
                sum_over_hosts(blocks(torch.from_numpy(back.copy())), tokens).numpy()):
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
