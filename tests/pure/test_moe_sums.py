"""Combine's sums (``reshard.moe.sums``): the flat path's sum of each token's slots, a block of
tokens at a time, against a loop over the tokens; the two-level path's in-place form (torch's
row ops, on tensors and on numpy rows) against the plain numpy form and against a loop over the
pairs in slot order; bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.moe.sums import CHUNK_BYTES, host_sums, sum_over_hosts, sum_slots


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


def _token_loop(slots: np.ndarray, weights: np.ndarray, kept: np.ndarray, torch_ops: bool = False) -> np.ndarray:
    """The oracle of ``sum_slots``: token by token, ``s * y_0 + sum_{j>0} w_j * (y_j - y_0)``
    with ``w_j`` the weight of a kept slot (0 for a dropped one) and ``s`` their sum (in float32
    at least), taken as exactly one within ``4 k`` ulps of one in the weights' precision. ``torch_ops``: each product and sum by torch's own
    operations on one token's row (``addcmul`` rounds once where the CPU fuses it, and torch
    multiplies complex numbers its own way), as tensors are summed."""
    top_k = slots.shape[1]
    out = np.empty((slots.shape[0], *slots.shape[2:]), dtype=slots.dtype)
    acc = np.result_type(slots.real.dtype, weights.dtype, np.float32)  # the weights added in float32 at least
    eps = np.finfo(weights.dtype).eps  # one within 4 k ulps of the weights' own precision
    for t in range(slots.shape[0]):
        w = (weights[t] * kept[t]).astype(acc)
        total = w.sum()
        if torch_ops:  # torch adds the weights in its own order too
            tw = torch.from_numpy(weights[t]).to(torch.from_numpy(np.zeros(0, acc)).dtype)
            tw = tw * torch.from_numpy(kept[t]).to(tw.dtype)
            w, total = tw.numpy(), tw.sum().numpy()
        total = acc.type(1) if abs(total - 1) <= 4 * top_k * eps else total
        w, total = w.astype(slots.dtype), slots.dtype.type(total)
        if torch_ops:
            first = torch.from_numpy(slots[t, 0])
            row = torch.mul(first, torch.from_numpy(np.array(total)))
            for j in range(1, top_k):
                row = row.addcmul(torch.sub(torch.from_numpy(slots[t, j]), first), torch.from_numpy(np.array(w[j])))
            out[t] = row.numpy()
            continue
        row = slots[t, 0] * total
        for j in range(1, top_k):
            row = row + (slots[t, j] - slots[t, 0]) * w[j]
        out[t] = row
    return out


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 300), st.integers(2, 4), st.sampled_from([(1024,), (1500,), (7, 300)]),
       st.sampled_from(["float32", "float64", "complex64"]))
def test_the_slots_summed_a_block_of_tokens_at_a_time_equal_a_loop_over_the_tokens(seed, tokens, top_k, trail,
                                                                                    dtype):
    rng = np.random.default_rng(seed)
    slots = rng.standard_normal((tokens, top_k, *trail)).astype(dtype)
    weights = rng.random((tokens, top_k)).astype(np.float32)
    weights[: tokens // 3] /= weights[: tokens // 3].sum(axis=1, keepdims=True)  # some sum to one (within ulps)
    kept = rng.random((tokens, top_k)) < 0.9
    row_bytes = slots.itemsize * int(np.prod(trail))
    assert CHUNK_BYTES // row_bytes < 300  # the larger cases span several blocks, the last one partial
    for got, want in ((sum_slots(slots, weights, kept), _token_loop(slots, weights, kept)),
                      (sum_slots(torch.from_numpy(slots), torch.from_numpy(weights), kept).numpy(),
                       _token_loop(slots, weights, kept, torch_ops=True))):
        assert got.dtype == slots.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_bfloat16_rows_keep_the_float32_weights_precision():
    # identity experts: each slot holds the token's row, so the sum is the row times the weights'
    # sum; with bfloat16 rows that product within two roundings of bfloat16 (the sum's and the
    # product's), not the weights rounded to bfloat16 and a sum within 6% of one taken as one
    gen = torch.Generator().manual_seed(3)
    row = torch.randn(512, 64, generator=gen).to(torch.bfloat16)
    weights = 0.47 + 0.06 * torch.rand(512, 2, generator=gen)  # sums in 0.94-1.06
    got = sum_slots(torch.stack([row, row], dim=1), weights, np.ones((512, 2), bool)).float()
    want = row.double() * weights.double().sum(dim=1, keepdim=True)
    ulp = 2.0 ** (torch.floor(torch.log2(want.abs().clamp_min(1e-30))) - 7)  # bfloat16's spacing at each value
    assert bool(((got.double() - want).abs() <= 2 * ulp).all())
