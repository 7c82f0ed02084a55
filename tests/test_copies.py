"""The copy budget on gloo: the own piece is copied straight from x into the result and never
goes through the engine. Shard(0)->Shard(1) packs the other pieces once; above
ONE_CALL_MAX_BYTES per rank they land straight in the result (two engine calls); below it one
call writes them into the result too, and the pieces from higher ranks are moved up past the
own piece once (the call's latency costs more than that copy).
Shard(1)->Shard(0) unpacks once and, above that size, sends without packing."""

from __future__ import annotations

import pytest

import reshard as rs
from rank_fns import copies

BIG = (4096 + 1, 1024)  # float32: more than 4 MiB per rank on up to 3 ranks, uneven rows
SMALL = (7, 5)


@pytest.mark.parametrize("n", [2, 3])
def test_rows_to_cols_large_receives_into_the_result(n):
    from reshard.ops import ONE_CALL_MAX_BYTES

    assert 4096 * 1024 * 4 // n > ONE_CALL_MAX_BYTES  # the shape really is in the two-call regime
    for stats, out_ptr, correct in rs.spawn(copies, n, args=(BIG, "Shard(0)", "Shard(1)")):
        assert correct
        assert (stats.pack_copies, stats.unpack_copies) == (1, 0)
        assert out_ptr == stats.recv_buffer_ptr  # the result IS the receive buffer


@pytest.mark.parametrize("n", [2, 3])
def test_rows_to_cols_small_is_one_call_into_the_result(n):
    """One engine call writes the lower and higher pieces into the result itself; the higher
    ones are then moved up past the own piece (the only unpack), so no side buffer exists."""
    for rank, (stats, out_ptr, correct) in enumerate(rs.spawn(copies, n, args=(SMALL, "Shard(0)", "Shard(1)"))):
        assert correct
        assert (stats.pack_copies, stats.unpack_copies) == (1, 0 if rank == n - 1 else 1)
        assert out_ptr == stats.recv_buffer_ptr


@pytest.mark.parametrize("shape", [BIG, SMALL])
def test_cols_to_rows_sends_without_packing_when_large(shape):
    """Large: the pieces are runs of x on either side of the own piece, sent as they are. Small
    (one call): a middle rank joins its two runs into one send buffer first."""
    for rank, (stats, out_ptr, correct) in enumerate(rs.spawn(copies, 3, args=(shape, "Shard(1)", "Shard(0)"))):
        assert correct
        pack = 1 if shape == SMALL and rank == 1 else 0
        assert (stats.pack_copies, stats.unpack_copies) == (pack, 1)
        assert out_ptr != stats.recv_buffer_ptr


def test_bytes_sent_exclude_own_piece():
    results = rs.spawn(copies, 3, args=((6, 6), "Shard(0)", "Shard(1)"))
    for stats, _, _ in results:
        assert stats.bytes_sent == 2 * (2 * 2 * 4)  # two 2x2 float32 blocks leave each rank
        assert stats.bytes_received == 2 * (2 * 2 * 4)
