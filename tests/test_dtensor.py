"""PyTorch interop: a DTensor in gives a DTensor out, laid out exactly as DTensor's own
redistribute lays it out (its split rule, uneven shapes included); the full tensor agrees."""

from __future__ import annotations

import itertools

import pytest

import rank_fns
import reshard as rs

pytest.importorskip("torch.distributed.tensor")
LAYOUTS = [",".join(p) for p in itertools.product(["S(0)", "S(1)", "R"], repeat=2)]


@pytest.mark.parametrize("shape", [(8, 8), (5, 7)])
def test_dtensor_in_dtensor_out_on_a_2x2_mesh(shape):
    pairs = [(a, b) for a in LAYOUTS for b in LAYOUTS if a != b]
    per_rank = rs.spawn(rank_fns.dtensor_pairs, 4, args=((2, 2), shape, pairs), timeout=300)
    for rank, results in enumerate(per_rank):  # every rank's local shard, not only rank 0's
        assert len(results) == len(pairs)
        for src, dst, same_local, same_full, same_placements in results:
            assert same_local and same_full and same_placements, (rank, shape, src, dst)
