"""The two-level all_to_all on real ranks of one host (the exchange across hosts is each rank's
message to itself): equal to the flat exchange, gradients included, on every rank."""

from __future__ import annotations

import reshard as rs
from tests.helpers import rank_fns


def test_two_levels_on_one_host_equal_flat_on_real_ranks():
    engine, n = "gloo", 4  # the executor's steps are engine-neutral; the MPI forms run in test_mesh_redistribute
    # one host: the exchange across hosts is each rank's message to itself
    cases = [((5, 7), 0, 1), ((6, 5), 1, 0), ((3, 4, 5), 2, 0), ((2, 3, 7), 0, 2), ((0, 4), 1, 0),
             ((9, 3), 0, 0), ((2, 11, 3), 1, 1), ((0, 2), 0, 0)]  # the last three: all_to_all_single's form
    for rank, (outcomes, errors) in enumerate(rs.spawn(rank_fns.two_level_against_flat, n, engine=engine,
                                                       args=(cases,))):
        for case, (same, ran, grads_equal) in zip(cases, outcomes):
            assert same and grads_equal, (rank, case)
            reorder = ["local"] if case[1] == case[2] else []  # what arrived inside put in host order
            assert ran == ["local", "all_to_all (inside the host)", *reorder, "all_to_all (across hosts)"], ran
        assert errors == [errors[0]] and errors[0].startswith("InvalidArgument"), errors
        assert "algorithm must be one of" in errors[0], errors
