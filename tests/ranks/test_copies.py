"""The copy budget: Shard(0)->Shard(1) packs once and receives straight into the result;
Shard(1)->Shard(0) sends without packing and unpacks once."""

from __future__ import annotations

import importlib.util

import pytest

import reshard as rs
from tests.helpers.rank_fns import copies, pack_bytes_first_call, page_faults_per_call, user_message_beside_reshard


@pytest.mark.parametrize("n", [2, 3])
def test_rows_to_cols_receives_into_the_result(n):
    for stats, out_ptr, correct in rs.spawn(copies, n, args=((7, 5), "Shard(0)", "Shard(1)")):
        assert correct
        assert (stats.pack_copies, stats.unpack_copies) == (1, 0)
        assert out_ptr == stats.recv_buffer_ptr  # the result IS the receive buffer


@pytest.mark.parametrize("n", [2, 3])
def test_cols_to_rows_sends_without_packing(n):
    for stats, out_ptr, correct in rs.spawn(copies, n, args=((7, 5), "Shard(1)", "Shard(0)")):
        assert correct
        assert (stats.pack_copies, stats.unpack_copies) == (0, 1)
        assert out_ptr != stats.recv_buffer_ptr


def test_bytes_sent_exclude_own_piece():
    results = rs.spawn(copies, 3, args=((6, 6), "Shard(0)", "Shard(1)"))
    for stats, _, _ in results:
        assert stats.bytes_sent == 2 * (2 * 2 * 4)  # two 2x2 float32 blocks leave each rank
        assert stats.bytes_received == 2 * (2 * 2 * 4)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_gloo_packs_only_the_pieces_that_leave(n):
    # gloo moves pieces as one message per peer: the own piece goes straight from x into the
    # result, so the pack buffer holds the (N-1)/N of the shard that leaves the rank. The
    # one-call path (NCCL's) packs the whole shard.
    shape = (4 * n, 30 * n)
    for extra, shard, correct in rs.spawn(pack_bytes_first_call, n, args=(shape, False)):
        assert correct
        assert extra == shard * (n - 1) // n
    for extra, shard, correct in rs.spawn(pack_bytes_first_call, n, args=(shape, True)):
        assert correct
        assert extra == shard


def test_gloo_messages_leave_a_users_own_messages_alone():
    for rank, (correct, mine) in enumerate(rs.spawn(user_message_beside_reshard, 2)):
        assert correct
        if rank == 1:
            assert mine == [float(v) for v in range(64)]


ENGINES = ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_large_results_reuse_freed_memory(engine):
    # A 64 MiB result is 16,384 pages. torch.empty's memory was fresh on every call inside a
    # rank (posix_memalign grew the heap instead of reusing the freed block), so each call paid
    # all of those faults; results allocated through numpy reuse the memory the last one freed.
    for faults in rs.spawn(page_faults_per_call, 2, engine=engine, args=(64 << 20, 5)):
        assert max(faults[2:]) < 1000, faults
