"""A list's inputs joined into the shared arena piece by piece (where its boxes cut the last
dim into equal runs, each run's rows end to end, so readers copy long runs): every box of the
stacked inputs read back through ``piece_of`` holds, bit for bit, what numpy's stack of the
inputs holds there; a box that crosses a piece or a block too small is refused."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.execution.many_reads import _even_last_cut, join_pieces, piece_of
from reshard.planning import planner

DTYPES = ["float32", "int8", "float16", "complex128", "int64"]


@st.composite
def joins(draw):
    """Members (their count, shape, dtype, order), the run width, where the held box starts,
    and one box inside one piece."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    width = draw(st.integers(1, max(1, 256 // dtype.itemsize)).filter(lambda w: w <= 9))
    pieces = draw(st.integers(1, 4))
    lead = [draw(st.integers(1, 5)) for _ in range(draw(st.integers(1, 2)))]
    shape = (*lead, pieces * width)
    starts = [draw(st.integers(0, 7)) for _ in shape]
    q = draw(st.integers(0, pieces - 1))
    box = []
    for d, (n, a) in enumerate(zip(shape, starts)):
        lo, hi = (q * width, (q + 1) * width) if d == len(shape) - 1 else (0, n)
        first = draw(st.integers(lo, hi))
        box.append((a + first, a + draw(st.integers(first, hi))))
    return (draw(st.integers(1, 5)), shape, dtype, width, starts, tuple(box),
            draw(st.sampled_from(["C", "F", "torch"])), draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=300, deadline=None)
@given(joins())
def test_every_box_of_inputs_joined_by_piece_reads_back_bit_for_bit(case):
    count, shape, dtype, width, starts, box, order, seed = case
    rng = np.random.default_rng(seed)
    members = [rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)
               for _ in range(count)]
    expected = np.stack(members)
    if order == "F":
        members = [np.asfortranarray(m) for m in members]
    elif order == "torch":
        torch = pytest.importorskip("torch")
        members = [torch.from_numpy(m) for m in members]
    before = [bytes(np.asarray(m).tobytes()) for m in members]
    nbytes = expected.nbytes
    block = np.zeros(64 + nbytes + 64, np.uint8)
    chunk = SimpleNamespace(members=list(range(count)), itemsize=dtype.itemsize)
    joined = join_pieces(chunk, members, block[64 : 64 + nbytes], expected.shape, width)
    assert tuple(joined.shape) == (shape[-1] // width, count, *shape[:-1], width)
    origin = tuple((a, a + n) for a, n in zip(starts, shape))
    theirs, where = piece_of(block, 64, width, count, origin, box, dtype)
    want = expected[(slice(None), *(slice(a - o, b - o) for (a, b), o in zip(box, starts)))]
    assert theirs is not None and theirs[where].tobytes() == want.tobytes()
    assert block[:64].tobytes() == bytes(64) and block[64 + nbytes :].tobytes() == bytes(64)  # nothing outside
    assert [bytes(np.asarray(m).tobytes()) for m in members] == before  # the inputs unchanged
    whole, where = piece_of(block, 64, 0, count, origin, box, dtype)  # joined whole: the same bytes read as such
    assert whole is not None and whole.shape == expected.shape


def test_a_box_across_two_pieces_or_past_the_block_is_refused():
    origin = ((0, 2), (0, 8))
    block = np.zeros(64 + 2 * 2 * 8 * 4, np.uint8)
    assert piece_of(block, 64, 4, 2, origin, ((0, 2), (2, 6)), np.dtype(np.float32))[0] is None  # crosses pieces
    assert piece_of(block, 64, 4, 2, origin, ((0, 2), (4, 8)), np.dtype(np.float32))[0] is not None
    assert piece_of(block, 128, 4, 2, origin, ((0, 2), (4, 8)), np.dtype(np.float32))[0] is None  # past the end
    assert piece_of(block, 64, 3, 2, origin, ((0, 2), (0, 3)), np.dtype(np.float32))[0] is None  # 8 is not 3s


@pytest.mark.parametrize("shape,src,dst,mesh_shape,itemsize,width", [
    ((8, 6), (rs.Shard(0),), (rs.Shard(1),), (3,), 4, 2),  # three equal runs of two
    ((8, 5), (rs.Shard(0),), (rs.Shard(1),), (3,), 4, 0),  # runs of 2, 2 and 1: joined whole
    ((4, 6, 9), (rs.Shard(0),), (rs.Shard(2),), (3,), 8, 3),
    ((8, 6), (rs.Shard(1),), (rs.Shard(0),), (3,), 4, 0),  # rows cut, not the last dim
    ((8, 256), (rs.Shard(0),), (rs.Shard(1),), (2,), 4, 0),  # runs of 512 bytes: long already
    ((8, 8), (rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Shard(0)), (2, 2), 4, 0),  # two dims cut
    ((8, 8), (rs.Shard(0), rs.Shard(0)), (rs.Shard(0), rs.Shard(1)), (2, 2), 4, 4),
])
def test_a_list_is_joined_by_piece_only_where_its_boxes_cut_the_last_dim_into_equal_short_runs(
        shape, src, dst, mesh_shape, itemsize, width):
    for rank in range(int(np.prod(mesh_shape))):
        step = planner.exchange_boxes(shape, src, dst, mesh_shape, rank)
        assert _even_last_cut(step, itemsize) == width, rank
