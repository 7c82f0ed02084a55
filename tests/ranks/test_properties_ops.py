"""Hypothesis picks shapes, dims, world sizes and uneven splits; real gloo ranks run them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard as rs
from tests.helpers.rank_fns import gathered_and_summed_gradients, run_cases

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def a2a_case(draw):
    n = draw(st.integers(1, 4))
    ndim = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(0, 6), min_size=ndim, max_size=ndim))
    s = draw(st.integers(0, ndim - 1))
    c = draw(st.integers(0, ndim - 1))
    lengths = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    shape[c] = sum(lengths)
    split = None
    if s != c and draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(0, shape[s]), min_size=n - 1, max_size=n - 1)))
        split = [b - a for a, b in zip([0, *cuts], [*cuts, shape[s]])]
    case = dict(op="all_to_all", shape=tuple(shape), s=s, c=c, lengths=lengths, split=split,
                dtype=draw(st.sampled_from(["float32", "int8", "bfloat16", "complex64", "bool"])),
                kind="torch", layout=draw(st.sampled_from(["contig", "fortran", "strided"])),
                neg=draw(st.booleans()))
    if case["dtype"] != "bfloat16" and draw(st.booleans()):
        case["kind"] = "numpy"
    return n, case


@SETTINGS
@given(a2a_case())
def test_all_to_all_any_shape(example):
    n, case = example
    results = rs.spawn(run_cases, n, args=([case],), timeout=120)
    assert [r[0] for r in results] == [None] * n, results


@st.composite
def redistribute_case(draw):
    n = draw(st.integers(1, 4))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim)))
    kinds = [("shard", d) for d in range(-ndim, ndim)] + [("replicate",), ("partial", "sum")]
    src, dst = draw(st.sampled_from(kinds)), draw(st.sampled_from(kinds))
    return n, dict(op="redistribute", shape=shape, src=src, dst=dst, dtype="int64",
                   kind=draw(st.sampled_from(["torch", "numpy"])), **{"global": draw(st.booleans())})


@SETTINGS
@given(redistribute_case())
def test_redistribute_any_pair(example):
    import numpy as np

    from tests.helpers.oracle import reduce_in_order

    n, case = example
    outcomes = [r[0] for r in rs.spawn(run_cases, n, args=([case],), timeout=120)]
    if case["dst"][0] == "partial":
        assert all(isinstance(o, tuple) for o in outcomes), outcomes
        assert np.array_equal(reduce_in_order([o[1] for o in outcomes], "sum"), outcomes[0][2])
    else:
        assert outcomes == [None] * n, outcomes


@st.composite
def gather_case(draw):
    n = draw(st.integers(1, 4))
    ndim = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim))
    d = draw(st.integers(0, ndim - 1))
    lengths = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    shape[d] = sum(lengths)
    return n, dict(op=draw(st.sampled_from(["all_gather", "gather"])), shape=tuple(shape), dim=d, lengths=lengths,
                   dst=draw(st.integers(0, n - 1)), dtype="int32", kind=draw(st.sampled_from(["torch", "numpy"])))


@SETTINGS
@given(gather_case())
def test_gather_family_uneven(example):
    n, case = example
    assert [r[0] for r in rs.spawn(run_cases, n, args=([case],), timeout=120)] == [None] * n


@st.composite
def gradient_cases(draw):
    n = draw(st.integers(1, 4))
    cases = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce"]))
        ndim = draw(st.integers(1, 3))
        shape = draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim))
        dim = draw(st.integers(-ndim, ndim - 1))
        shapes = [list(shape) for _ in range(n)]
        if op == "all_gather":  # each rank's length along dim its own
            for sh in shapes:
                sh[dim] = draw(st.integers(0, 4))
        reduce_op = draw(st.sampled_from(["sum", "avg", "max"]))
        cases.append((op, [tuple(sh) for sh in shapes], dim, reduce_op, draw(st.integers(0, 999)), draw(st.booleans())))
    return n, cases


def _gradients_in_one_process(n, case):
    """The same losses in one process, torch's own autograd through cat, sum and slicing."""
    import torch

    from tests.helpers.rank_fns import collective_input, loss_weights

    op, shapes, dim, reduce_op, seed, _ = case
    xs = [torch.from_numpy(collective_input(r, shapes[r], seed)).requires_grad_() for r in range(n)]
    if op == "all_gather":
        ys = [torch.cat(xs, dim)] * n
    else:
        total = sum(xs[1:], xs[0]) / (n if reduce_op == "avg" else 1)
        if op == "all_reduce":
            ys = [total] * n
        else:
            sizes = rs.shard_sizes(shapes[0][dim], n)
            ys = [total.narrow(dim, sum(sizes[:r]), sizes[r]) for r in range(n)]
    sum((torch.from_numpy(loss_weights(r, tuple(ys[r].shape))) * ys[r]).sum() for r in range(n)).backward()
    return [x.grad.numpy() for x in xs]


@SETTINGS
@given(gradient_cases(), st.sampled_from(["gloo", "mpi"]))
def test_gathers_and_sums_carry_gradients_as_jax_transposes_them(example, engine):
    # all_gather's gradient is the reduce_scatter of every rank's gradient, reduce_scatter's and
    # all_reduce's the all_gather and all_reduce of theirs (sum, avg); max has no gradient here
    import numpy as np

    n, cases = example
    if engine == "mpi":
        pytest.importorskip("mpi4py", reason="mpi4py is not installed")
    per_rank = rs.spawn(gathered_and_summed_gradients, n, engine, args=(cases,), timeout=120)
    for k, case in enumerate(cases):
        if case[0] != "all_gather" and case[3] == "max":
            assert all(got[k] == [None, None] for got in per_rank), case
            continue
        want = _gradients_in_one_process(n, case)
        for r, got in enumerate(per_rank):
            for grad in got[k]:  # the first call and its replay
                assert grad is not None and grad.shape == want[r].shape and np.array_equal(grad, want[r]), (case, r)
