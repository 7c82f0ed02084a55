"""PyTorch interop: a DTensor in gives a DTensor out, laid out exactly as DTensor's own
redistribute lays it out (its split rule, uneven shapes included); the full tensor agrees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import reshard as rs
from tests.helpers import rank_fns
from tests.helpers.oracle import pattern

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


@pytest.mark.parametrize("given", ["every rank", "one rank"])
def test_a_src_that_contradicts_the_dtensor_raises_naming_both(given):
    srcs = [rs.Replicate()] * 2 if given == "every rank" else [None, "S(1)"]
    for kind, text in rs.spawn(rank_fns.dtensor_given_src, 2, args=(srcs,), timeout=120):
        assert kind == "InvalidArgument", (kind, text)
        said = "Replicate()" if given == "every rank" else "Shard(1)"
        assert f"src=({said},) contradicts the DTensor's own placements (Shard(0),)" in text, text


def test_a_src_equal_to_the_dtensor_placements_is_taken():
    full = pattern((6, 4), "float32")
    for rank, (kind, local) in enumerate(rs.spawn(rank_fns.dtensor_given_src, 2, args=([rs.Shard(0), "S(0)"],))):
        assert kind == "ok" and np.array_equal(local, full[:, 2 * rank : 2 * rank + 2])


def test_a_spec_past_a_dtensors_dims_is_named_as_written_on_every_rank():
    for rank, (one, many) in enumerate(rs.spawn(rank_fns.dtensor_spec_past_dims, 4, timeout=120)):
        assert one == ("InvalidArgument", f"rank {rank}: redistribute: dst Spec(None, None, (0, 1)) splits tensor dim 2, "
                                          "but the tensor is 2-d (dims 0..1)"), one
        assert many == ("InvalidArgument", f"rank {rank}: redistribute: tensor 1: dst Spec(None, None, (1, 0)) splits "
                                           "tensor dim 2, but the tensor is 2-d (dims 0..1)"), many


@pytest.mark.parametrize("shape", [(8, 6), (7, 5)])
def test_a_dtensor_split_in_another_order_comes_in_and_goes_out_as_dtensor_has_it(shape):
    pytest.importorskip("torch.distributed.tensor.placement_types", reason="torch without _StridedShard")
    for rank, results in enumerate(rs.spawn(rank_fns.dtensor_ordered, 4, args=(shape,), timeout=300)):
        assert len(results) == (5 if shape[0] % 4 == 0 else 2)
        for what, same_local, same_full, same_placements in results:
            assert same_local is not False and same_full and same_placements, (rank, shape, what)


@pytest.mark.parametrize("shape", [(8, 6), (7, 5)])
def test_src_and_dst_in_dtensors_own_placements_with_strided_shards_are_taken(shape):
    pytest.importorskip("torch.distributed.tensor.placement_types", reason="torch without _StridedShard")
    for rank, results in enumerate(rs.spawn(rank_fns.dtensor_own_placements, 4, args=(shape,), timeout=300)):
        assert [r[0] for r in results] == ["dst strided", "src its own placements", "list dst strided", "list dst strided"]
        for what, same_local, same_full, same_placements in results:
            assert same_local is not False and same_full and same_placements, (rank, shape, what)
