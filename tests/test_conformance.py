"""Every op on real local ranks (gloo), checked bit for bit against the numpy oracle.

One job per world size runs every case (a few hundred), so the suite stays fast; each case is
still its own test item, passing or failing on its own.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import reshard as rs
from cases import all_cases, case_id
from conformance import run_cases
from oracle import reduce_in_order

WORLD_SIZES = (1, 2, 3, 4)
ENGINE = "gloo"


@functools.cache
def results_for(n: int) -> tuple[list[dict], list[list]]:
    cases = all_cases(n)
    per_rank = rs.spawn(run_cases, n, engine=ENGINE, args=(cases,), timeout=600)
    return cases, per_rank


def _params():
    for n in WORLD_SIZES:
        for i, case in enumerate(all_cases(n)):
            yield pytest.param(n, i, id=f"N{n}-{i}-{case_id(case)}")


@pytest.mark.parametrize("n,index", list(_params()))
def test_case(n: int, index: int) -> None:
    cases, per_rank = results_for(n)
    outcomes = [per_rank[r][index] for r in range(n)]
    if any(isinstance(o, tuple) for o in outcomes):  # Partial destination: reduce in the parent
        assert all(isinstance(o, tuple) for o in outcomes), outcomes
        src = cases[index]["dst"]
        op = src[1] if len(src) > 1 else "sum"
        total = reduce_in_order([o[1] for o in outcomes], op)
        want = outcomes[0][2]
        assert total.shape == want.shape and np.array_equal(total.view(np.uint8), want.view(np.uint8))
        return
    failures = {r: o for r, o in enumerate(outcomes) if o is not None}
    assert not failures, "\n".join(f"rank {r}: {o}" for r, o in failures.items())
