"""Hypothesis picks shapes, dims, world sizes and uneven splits; real gloo ranks run them."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard as rs
from tests.helpers.rank_fns import run_cases

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
