"""Every call of an op reaches the engine by one route: the first call, checked and unchecked
replays (hot ones included) and started calls run the same frames from the executor's entry
(its program) to the engine, on gloo and MPI."""

from __future__ import annotations

import pytest

import reshard as rs
from tests.helpers import route_rank


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_every_call_of_an_op_reaches_the_engine_by_the_same_frames(engine):
    for rank, per_op in enumerate(rs.spawn(route_rank.routes, 2, engine=engine, args=(engine == "gloo",), timeout=180)):
        for op, per_call in per_op.items():
            first = per_call["checked, call 1"]
            assert first, (rank, op, "no frames under the executor")
            differ = {call: chains for call, chains in per_call.items() if chains != first}
            assert not differ, (rank, op, first, differ)
