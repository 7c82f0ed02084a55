"""The shared arena: arrays same-host peers read in place, and exchanges that read them there
(one copy per byte), against numpy on the full array, with the arena on and off."""

from __future__ import annotations

import mmap
import os
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.engines import arena as arena_mod
from tests.helpers import arena_rank

torch = pytest.importorskip("torch")
needs_arena = pytest.mark.skipif(arena_mod.why_not() is not None, reason=f"no shared arena here: {arena_mod.why_not()}")
pytestmark = needs_arena
ENGINES = ["gloo", "mpi"]


@pytest.fixture
def small_exchanges(monkeypatch):
    """Every exchange reads in place, however small (the ranks inherit the setting)."""
    monkeypatch.setenv("RESHARD_ARENA_MIN_BYTES", "0")


def _engine_or_skip(engine):
    from reshard.engines.available import missing_for

    why = missing_for(engine)
    if why is not None:
        pytest.skip(f"{engine} is not installed here: {why}")


# -- the arena itself, in this process ----------------------------------------------------


def test_blocks_are_reused_and_returned_to_the_system(monkeypatch):
    monkeypatch.setattr(arena_mod, "KEEP_WARM_BYTES", 1 << 20)
    arena = arena_mod.Arena(cap=512 << 20)
    mib = 1 << 20
    head = _file_pages(arena.fd) * mmap.PAGESIZE  # the token's page (a huge one where the kernel gives them)

    def block(n, value):
        a = arena.array((n * mib,), np.uint8)
        a[:] = value
        return a, arena.where(a.__array_interface__["data"][0], a.nbytes)

    try:
        a, first = block(32, 1)
        del a
        b, again = block(32, 2)  # the same length: the warm block again, no page fault
        assert again == first
        del b
        c, inside = block(24, 3)  # a shorter one fits in the warm block too
        assert first % arena_mod.HUGE == 0 and inside == first and arena.top == first + 32 * mib
        del c
        # 32 + 32 + 8 alive at once (the most ever); then the 32s freed: 64 MiB warm, in two ranges
        a, _ = block(32, 4)
        c, _ = block(32, 6)
        b, _ = block(8, 5)
        del a, c
        assert arena.warm_bytes == 64 * mib and arena.peak_live == 72 * mib
        d, fresh = block(40, 7)  # fits no warm range: fresh space, after b
        del d
        # warm 104 MiB > the most alive at once (72): the largest range's pages went back
        assert arena.warm_bytes == 64 * mib
        held = _file_pages(arena.fd) * mmap.PAGESIZE
        assert held - head == 72 * mib, (held - head) / mib
        e, reused = block(40, 8)  # the returned range is free for reuse
        assert reused == fresh
        del e, b
    finally:
        arena.map.close()
        os.close(arena.fd)


def test_pages_held_after_a_free_stay_at_the_most_alive_at_once(monkeypatch):
    monkeypatch.setattr(arena_mod, "KEEP_WARM_BYTES", 1 << 20)
    arena = arena_mod.Arena(cap=512 << 20)
    mib = 1 << 20
    head = _file_pages(arena.fd) * mmap.PAGESIZE  # the token's page (a huge one where the kernel gives them)

    def block(n):
        a = arena.array((n * mib,), np.uint8)
        a[:] = 1
        return a

    try:
        a, s, b = block(40), block(8), block(24)  # 72 MiB alive at once: the most ever
        del a, b  # 64 MiB warm around s
        x = block(48)  # fits no warm range: fresh pages; 48 alive + 64 warm + s's 8 are held
        del s  # the warm ranges merge into one of 72 MiB
        held = _file_pages(arena.fd) * mmap.PAGESIZE - head
        # only the excess over the most alive at once went back (a part of the merged range),
        # neither nothing (120 MiB held) nor the whole range (48 MiB held, refaulted on reuse)
        assert held == 72 * mib, held / mib
        assert arena.live + arena.warm_bytes == 72 * mib
        del x
        assert _file_pages(arena.fd) * mmap.PAGESIZE - head == 72 * mib
    finally:
        arena.map.close()
        os.close(arena.fd)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12 << 20)), min_size=1, max_size=40))
def test_blocks_of_a_huge_page_or_more_start_on_one_and_never_overlap(steps):
    """Random takes and frees (True: take a block of that many bytes; False: free the oldest);
    every live block is found where it lies, a freed one no longer."""
    arena = arena_mod.Arena(cap=256 << 20)
    live: dict[int, int] = {}  # offset -> bytes asked for
    try:
        for take, nbytes in steps:
            if not take and live:
                freed = next(iter(live))
                arena.give(freed)
                assert arena.where(arena.base + freed, live.pop(freed)) is None
                for offset, size in live.items():
                    assert arena.where(arena.base + offset, size) == offset
                continue
            offset = arena.take(nbytes)
            if offset is None:  # past the cap
                continue
            assert offset >= arena_mod.HEAD_BYTES and offset + nbytes <= arena.cap
            if nbytes >= arena_mod.HUGE:
                assert offset % arena_mod.HUGE == 0, (offset, nbytes)
            for other, other_bytes in live.items():
                assert offset + nbytes <= other or other + other_bytes <= offset, (offset, nbytes, other)
            live[offset] = nbytes
        assert arena.live >= sum(live.values())
    finally:
        arena.map.close()
        os.close(arena.fd)


def _file_pages(fd):
    """Pages the system holds for a memory file (its blocks, as ``stat`` counts them)."""
    return os.fstat(fd).st_blocks * 512 // mmap.PAGESIZE


def test_past_the_cap_results_come_from_ordinary_memory_with_one_warning(monkeypatch):
    arena = arena_mod.Arena(cap=4 << 20)
    monkeypatch.setitem(arena_mod._state, "arena", arena)
    keep = arena_mod.numpy_array((2 << 20,), np.uint8)
    assert keep is not None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert arena_mod.numpy_array((8 << 20,), np.uint8) is None
        assert arena_mod.numpy_array((8 << 20,), np.uint8) is None
        ordinary = rs.empty((8 << 20,), np.uint8)
    assert [w.category for w in seen] == [ResourceWarning]
    assert "RESHARD_ARENA_BYTES" in str(seen[0].message)
    assert ordinary.shape == (8 << 20,) and arena_mod.locate(ordinary) is None


def test_empty_gives_numpy_and_torch_in_the_arena():
    a = rs.empty((3, 5), np.float64)
    t = rs.empty((4, 6), torch.bfloat16)
    u = rs.empty_like(torch.zeros(2, 3, dtype=torch.int16))
    v = rs.empty_like(np.zeros((7,), np.complex64))
    assert type(a) is np.ndarray and a.shape == (3, 5) and a.dtype == np.float64
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and tuple(t.shape) == (4, 6)
    assert u.dtype == torch.int16 and v.dtype == np.complex64
    assert all(arena_rank.in_arena(z) for z in (a, t, u, v))
    t.fill_(1.5)
    assert float(t.float().sum()) == 36.0


def test_empty_refuses_device_tensors_nccl_and_bad_shapes():
    with pytest.raises(rs.InvalidArgument, match="CPU memory"):
        rs.empty_like(torch.empty(2, device="meta"))
    with pytest.raises(rs.InvalidArgument, match="sizes >= 0"):
        rs.empty((2, -1), np.float32)
    with pytest.raises(rs.InvalidArgument, match="dtype"):
        rs.empty((2,), "not a dtype")
    with pytest.raises(rs.InvalidArgument, match="comm must be"):
        rs.empty((2,), np.float32, comm="world")


def test_empty_takes_any_sequence_of_sizes_and_names_itself_when_one_is_not_an_int():
    assert rs.empty(torch.Size([2, 3]), np.float32).shape == (2, 3)
    assert rs.empty(np.array([4, 1]), np.int8).shape == (4, 1)
    assert rs.empty(range(1, 3), torch.float64).shape == (1, 2)
    with pytest.raises(rs.InvalidArgument, match=r"^empty: shape must be an int, got 2.5 \(float\)"):
        rs.empty((2.5, 3), np.float32)


@pytest.mark.parametrize("dtype", [np.float32, torch.float32])
def test_empty_of_more_bytes_than_any_array_holds_is_refused_by_name(dtype):
    # 2^40 x 2^40 float32 is 4 * 2^80 bytes: numpy and torch would fail deep inside
    for make in (lambda: rs.empty((1 << 40, 1 << 40), dtype),
                 lambda: rs.empty((1 << 21,) * 3, dtype)):  # 2^63 elements: the count alone overflows
        with pytest.raises(rs.InvalidArgument, match=r"^empty: shape .* holds .* bytes, more than an array can \(8 EiB\)"):
            make()
    assert rs.empty((0, 1 << 40), dtype).shape == (0, 1 << 40)  # no elements, no bytes


@pytest.mark.parametrize("dtype", [np.float32, torch.float32])
def test_empty_with_a_zero_dim_beside_dims_past_any_array_is_refused_by_name(dtype):
    # nothing held, but numpy's strides for 2^61 float32 would pass 8 EiB: it fails deep inside
    with pytest.raises(rs.InvalidArgument, match=r"^empty: shape \(0, 2305843009213693952\) holds nothing, but its "
                                                 r"other dims span 9\.22e\+18 bytes, more than an array can \(8 EiB\)"):
        rs.empty((0, 1 << 61), dtype)


@pytest.mark.parametrize("dtype", [object, "U4", [("a", "f4")], "datetime64[s]"])
def test_empty_refuses_what_is_not_a_number_or_bool(dtype):
    with pytest.raises(rs.UnsupportedDType, match="numbers and bool only"):
        rs.empty((2, 2), dtype)
    with pytest.raises(rs.UnsupportedDType, match="numbers and bool only"):
        rs.empty_like(np.zeros((2, 2), dtype))


def test_arena_arrays_cannot_be_resized_and_pickle_as_ordinary_copies():
    a = rs.empty((16,), np.float32)
    a[:] = np.arange(16)
    with pytest.raises(ValueError):
        a.resize((32,))
    t = torch.from_numpy(rs.empty((16,), np.float32))
    with pytest.raises(RuntimeError):
        t.resize_(1 << 20)
    back = pickle.loads(pickle.dumps(a))
    assert np.array_equal(back, a) and arena_mod.locate(back) is None
    shared = torch.from_numpy(a).clone().share_memory_()
    assert not arena_rank.in_arena(shared)


def test_a_forked_child_cannot_change_what_the_parents_peers_read():
    a = rs.empty((1024,), np.int64)
    a[:] = 5
    offset, nbytes = arena_mod.locate(a)
    parent = arena_mod.arena()
    # a peer's view: the file opened through /proc, as a same-host rank opens it
    fd = os.open(f"/proc/{os.getpid()}/fd/{parent.fd}", os.O_RDONLY)
    peer = np.frombuffer(mmap.mmap(fd, parent.cap, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.uint8)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: writes the inherited array, allocates, reports where
        try:
            a[:] = -1
            b = rs.empty((1024,), np.int64)
            b[:] = -2
            mine = arena_mod.arena()
            os.write(write, f"{int(a[0])} {int(mine is not parent and mine.fd != parent.fd or mine is None)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child_saw, own_arena = os.read(read, 100).decode().split()
    os.close(read)
    assert status == 0 and child_saw == "-1"  # the child sees its own write
    assert own_arena == "1"  # and allocates from an arena of its own
    assert np.all(a == 5)  # the parent's array is untouched
    assert np.all(peer[offset : offset + nbytes].view(np.int64) == 5)  # and so is what its peers read
    del peer
    os.close(fd)


# -- exchanges that read in place ----------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_chain_of_changes_moves_each_byte_once_after_the_first(engine):
    _engine_or_skip(engine)
    rows = rs.spawn(arena_rank.chain, 3, engine, args=(engine, 1024, 4), timeout=120)
    for per_call in rows:
        assert all(ok for ok, *_ in per_call)
        assert all(inside for _, inside, *_ in per_call)
        # the first input is the user's ordinary array: the engine's path (gloo packs its pieces,
        # MPI's datatypes do not), its result in the arena; from then on read in place, no pack
        assert [packs for _, _, packs, _ in per_call] == [1 if engine == "gloo" else 0, 0, 0, 0]
        assert all(unpacks == 0 for *_, unpacks in per_call)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_input_from_empty_is_read_in_place(engine):
    _engine_or_skip(engine)
    for ok, x_in, z_in, first, second, third in rs.spawn(arena_rank.from_empty, 4, engine, args=(engine, 1024),
                                                          timeout=120):
        assert ok and x_in and z_in
        # read in place: nothing packed; an ordinary input takes the engine's path (gloo packs)
        assert (first, second, third) == (0, 0, 1 if engine == "gloo" else 0)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_input_changed_after_the_call_never_reaches_a_peers_result(engine, small_exchanges):
    _engine_or_skip(engine)
    assert rs.spawn(arena_rank.input_changed_after, 3, engine, args=(engine, 96), timeout=120) == [(True, True, True)] * 3


@pytest.mark.parametrize("engine", ENGINES)
def test_results_stay_valid_after_the_arena_grows_and_the_comm_closes(engine):
    _engine_or_skip(engine)
    assert rs.spawn(arena_rank.outlives, 2, engine, args=(engine, 1024), timeout=120) == [(True, True, True)] * 2


def test_survivors_raise_rank_failed_when_a_rank_dies_mid_exchange(tmp_path, small_exchanges):
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(arena_rank.dies_while_read, 3, args=(1, str(tmp_path), 96), timeout=60)
    assert 1 in info.value.failures
    seen = {p.name: p.read_text() for p in tmp_path.iterdir()}
    for rank, outcome in seen.items():
        assert outcome.startswith("RankFailed") and "rank 1 gone" in outcome, (rank, outcome)


_PLACEMENTS = [rs.Shard(0), rs.Shard(1), rs.Shard(2), rs.Replicate()]


@st.composite
def _cases(draw, ndim=3):
    out = []
    for _ in range(draw(st.integers(1, 4))):
        shape = tuple(draw(st.integers(0, 9)) for _ in range(ndim))
        src = draw(st.sampled_from([*_PLACEMENTS, rs.Partial("sum"), rs.Partial("max")]))  # reduce_scatter, all_reduce
        dst = draw(st.sampled_from(_PLACEMENTS))
        dtype = draw(st.sampled_from(["float32", "float64", "int16", "uint8", "complex64"]))
        if dtype == "complex64" and src == rs.Partial("max"):  # complex values have no order
            src = rs.Partial("sum")
        out.append((shape, dtype, src, dst, draw(st.integers(0, 1 << 16))))
    return out


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=_cases())
def test_every_world_change_is_the_same_with_the_arena_on_and_off(engine, cases, small_exchanges):
    _engine_or_skip(engine)
    rows = rs.spawn(arena_rank.changes, 3, engine, args=(engine, cases), timeout=120)
    for per_rank in rows:
        for (on, off, want, on_inside, off_inside, steps, holds), case in zip(per_rank, cases):
            assert on == want and off == want, case
            assert not off_inside, case
            if steps in (["all_to_all"], ["all_gather"]) and holds:  # moved data: the result in the arena
                assert on_inside, case


_MESH_LAYOUTS = [(rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Replicate()), (rs.Replicate(), rs.Shard(0)),
                 (rs.Shard(0), rs.Shard(0)), rs.Spec((1, 0), None), rs.Spec(None, 1)]


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_mesh_change_is_the_same_with_the_arena_on_and_off(engine, data, small_exchanges):
    _engine_or_skip(engine)
    cases = []
    for _ in range(data.draw(st.integers(1, 4))):
        shape = (data.draw(st.integers(0, 11)), data.draw(st.integers(0, 11)))
        cases.append((shape, data.draw(st.sampled_from(["float32", "int64"])), data.draw(st.sampled_from(_MESH_LAYOUTS)),
                      data.draw(st.sampled_from(_MESH_LAYOUTS)), data.draw(st.integers(0, 1 << 16))))
    rows = rs.spawn(arena_rank.changes, 4, engine, args=(engine, cases, (2, 2)), timeout=120)
    for per_rank in rows:
        for (on, off, want, on_inside, off_inside, steps, holds), case in zip(per_rank, cases):
            assert on == want and off == want, case
            assert not off_inside, case
            if steps == ["all_to_all"] and holds:
                assert on_inside, case


@pytest.mark.parametrize("engine", ENGINES)
def test_the_fft_gives_the_same_bits_with_the_arena_on_and_off(engine, small_exchanges, monkeypatch):
    _engine_or_skip(engine)
    on = rs.spawn(arena_rank.transforms, 4, engine, args=(engine, (16, 12, 10)), timeout=120)
    monkeypatch.setenv("RESHARD_ARENA", "0")
    off = rs.spawn(arena_rank.transforms, 4, engine, args=(engine, (16, 12, 10)), timeout=120)
    for mine, theirs in zip(on, off):
        assert [bits for bits, _ in mine] == [bits for bits, _ in theirs]
        assert all(inside for _, inside in mine) and not any(inside for _, inside in theirs)


@pytest.mark.parametrize("engine", ENGINES)
def test_rows_and_moe_give_the_same_bits_with_the_arena_on_and_off(engine, small_exchanges, monkeypatch):
    _engine_or_skip(engine)
    args = (engine, 50, 24, 8, 2, 3)
    on = rs.spawn(arena_rank.rows, 4, engine, args=args, timeout=120)
    monkeypatch.setenv("RESHARD_ARENA", "0")
    off = rs.spawn(arena_rank.rows, 4, engine, args=args, timeout=120)
    for (moved, dispatched, combined), (moved_off, dispatched_off, combined_off) in zip(on, off):
        assert moved[0] == moved_off[0] and dispatched[0] == dispatched_off[0] and combined[0] == combined_off[0]
        assert moved[1] and dispatched[1] and not moved_off[1] and not dispatched_off[1]  # read in place with it on
        assert combined[1] and combined_off[1]  # and right: numpy's weighted sums


@st.composite
def _routing_cases(draw, size=4):
    out = []
    for _ in range(draw(st.integers(1, 3))):
        tokens = [draw(st.integers(0, 40)) for _ in range(size)]
        experts = size * draw(st.integers(1, 3))
        top_k = draw(st.integers(1, min(3, experts)))
        capacity = draw(st.one_of(st.none(), st.integers(0, 12)))
        in_arena = draw(st.sets(st.integers(0, size - 1)))
        out.append((tokens, draw(st.integers(1, 24)), experts, top_k, capacity,
                    draw(st.sampled_from(["float32", "float64"])), draw(st.integers(0, 1 << 16)), sorted(in_arena)))
    return out


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=_routing_cases())
def test_dispatch_takes_routed_rows_straight_from_tokens_in_the_arena(engine, cases, small_exchanges, monkeypatch):
    """Peers copy a rank's routed rows out of its tokens by its index where they lie in the
    arena (nothing gathered: no pack), the rank gathers them first where they do not (one
    pack), ranks of both kinds in one exchange; the rows equal numpy's and the arena's off path."""
    _engine_or_skip(engine)
    on = rs.spawn(arena_rank.taken_tokens, 4, engine, args=(engine, cases), timeout=120)
    with monkeypatch.context() as patched:  # undone before the next example
        patched.setenv("RESHARD_ARENA", "0")
        off = rs.spawn(arena_rank.taken_tokens, 4, engine, args=(engine, cases), timeout=120)
    for rank, (per_case, per_case_off) in enumerate(zip(on, off)):
        for (rows, want, packs, gathered, summed, untouched, sent, unpacks), \
                (rows_off, _, packs_off, _, summed_off, _, _, unpacks_off), case in zip(per_case, per_case_off, cases):
            assert rows == rows_off and (want is None or rows == want), (rank, case)
            assert summed and summed_off and untouched, (rank, case)
            # gathered first only where peers read its rows and its tokens lie outside the arena
            lends = any(c for q, c in enumerate(sent) if q != rank)
            packed = rank not in case[-1] and lends
            assert (packs, gathered) == (int(packed), packed), (rank, case, packs, gathered)
            assert packs_off == int(sum(sent) > 0), (rank, case)  # off: every rank gathers what it sends
            # combine: the rows that come home put in (token, slot) order after the exchange,
            # except where they land in place (every pair kept, read in place)
            (unpacks, all_kept), (unpacks_off, _) = unpacks, unpacks_off
            assert unpacks_off == int(sum(sent) > 0), (rank, case, unpacks_off)
            assert unpacks == (0 if all_kept else int(sum(sent) > 0)), (rank, case, unpacks)


def test_started_calls_and_gradients_read_in_place_too():
    for on_inside, off_inside, right, y_inside, grad_right in rs.spawn(arena_rank.started_and_grads, 3, "gloo",
                                                                        args=(1024,), timeout=120):
        assert on_inside and not off_inside and right
        assert y_inside and grad_right


# -- many tensors in one call -------------------------------------------------------------

S, R = rs.Shard, rs.Replicate
_MANY_WORLD = [((8, 6), "float32", S(0), S(1)), ((7, 5), "float64", S(0), S(1)), ((5, 3, 4), "int64", S(1), S(2)),
               ((0, 3), "float32", S(0), S(1)), ((9,), "int32", S(0), R()), ((6, 4), "complex64", R(), S(1)),
               ((4, 4), "float32", S(0), S(0)), ((8, 6), "float32", S(0), S(1)), ((11, 2), "int8", S(0), S(1))]
_MANY_MESH = [((8, 6), "float32", (S(0), S(1)), (S(1), S(0))), ((7, 5), "float64", (S(0), S(0)), rs.Spec((1, 0), None)),
              ((5, 3, 4), "int64", (R(), S(2)), (S(0), R())), ((3, 2), "float32", (S(0), R()), (S(0), R())),
              ((0, 5), "float32", (S(0), S(1)), (S(1), S(0))), ((9, 7), "float64", (S(0), S(1)), (S(1), S(0)))]


def _check_many(per_rank, engine, arena_moves):
    for calls, _ in per_rank:
        for got, want, inside in calls:
            assert got == want
            if arena_moves is not None:  # the reads' results lie in the arena; the engine's do not
                assert any(inside) == arena_moves


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["world", "mesh"])
def test_a_list_is_read_in_place_on_gloo_and_sent_straight_from_each_tensor_on_mpi(engine, where, small_exchanges):
    _engine_or_skip(engine)
    cases, mesh_shape = (_MANY_WORLD, (3,)) if where == "world" else (_MANY_MESH, (2, 2))
    per_rank = rs.spawn(arena_rank.many, int(np.prod(mesh_shape)), engine,
                        args=(engine, mesh_shape, cases, 6, engine == "gloo"), timeout=180)
    _check_many(per_rank, engine, arena_moves=engine == "gloo")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layouts", ["views", "twice"])
def test_a_list_with_strided_inputs_or_one_tensor_twice_is_right(engine, layouts, small_exchanges):
    _engine_or_skip(engine)
    per_rank = rs.spawn(arena_rank.many, 3, engine, args=(engine, (3,), _MANY_WORLD, 3, False, None, layouts),
                        timeout=180)
    _check_many(per_rank, engine, arena_moves=None)


# boxes that cut the last dim into equal short runs: the inputs joined piece by piece
_MANY_BY_PIECE = [((8, 6), "float32", S(0), S(1)), ((4, 6, 9), "float64", S(0), S(2)), ((6, 12), "int8", S(0), S(1)),
                  ((5, 6), "complex64", S(0), S(1)), ((8, 6), "float32", S(0), S(1)), ((7, 5), "float64", S(0), S(1)),
                  ((3, 9), "float16", S(0), S(1))]


@pytest.mark.parametrize("as_torch", [False, True])
@pytest.mark.parametrize("layouts", ["contiguous", "views", "twice"])
def test_a_list_whose_boxes_cut_the_last_dim_into_equal_runs_reads_numpys_parts(as_torch, layouts, small_exchanges):
    per_rank = rs.spawn(arena_rank.many, 3, "gloo", args=("gloo", (3,), _MANY_BY_PIECE, 3, as_torch, None, layouts),
                        timeout=180)
    _check_many(per_rank, "gloo", arena_moves=True)
    mesh_cases = [((8, 8), "float32", (S(0), S(0)), (S(0), S(1))), ((4, 8, 4), "int64", (S(0), S(1)), (S(0), S(2)))]
    per_rank = rs.spawn(arena_rank.many, 4, "gloo", args=("gloo", (2, 2), mesh_cases, 3, as_torch, None, layouts),
                        timeout=180)
    _check_many(per_rank, "gloo", arena_moves=True)


def test_a_list_takes_the_engines_path_on_every_rank_where_one_ranks_arena_is_full(small_exchanges):
    cases = [*_MANY_WORLD, ((96, 48), "float64", S(0), S(1))]  # more than the page its arena holds
    per_rank = rs.spawn(arena_rank.many, 3, "gloo", args=("gloo", (3,), cases, 3, False, 1), timeout=180)
    _check_many(per_rank, "gloo", arena_moves=False)
    assert any("arena is full" in w for w in per_rank[1][1])


@st.composite
def _lists(draw):
    out = []
    for _ in range(draw(st.integers(1, 6))):
        ndim = draw(st.integers(1, 3))
        shape = tuple(draw(st.integers(0, 9)) for _ in range(ndim))
        src = draw(st.sampled_from([S(d) for d in range(ndim)] + [R()]))
        dst = draw(st.sampled_from([S(d) for d in range(ndim)] + [R()]))
        out.append((shape, draw(st.sampled_from(["float32", "float64", "int8", "complex64"])), src, dst))
    return out


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lists=st.lists(st.tuples(_lists(), st.sampled_from(["contiguous", "views", "twice"])), min_size=4, max_size=4))
def test_every_list_gives_numpys_parts_with_the_arena_on(engine, lists, small_exchanges):
    # four drawn lists per job (a job's start is most of an MPI example's time), two jobs
    _engine_or_skip(engine)
    per_rank = rs.spawn(arena_rank.many_lists, 3, engine, args=(engine, (3,), lists, 2, engine == "gloo"), timeout=180)
    for i in range(len(lists)):
        _check_many([mine[i] for mine in per_rank], engine, arena_moves=None)


def test_a_long_list_holds_one_batch_of_joined_inputs_at_a_time(small_exchanges):
    # 48 tensors of 1.5 MiB (global), batches of two (4 MiB at most): 24 batches of 1 MiB per rank
    batch = 2 * (1536 * 256 * 4) // 3
    for extra, results, right in rs.spawn(arena_rank.many_peak, 3, "gloo", args=(48, (1536, 256), 3), timeout=180):
        assert right
        assert extra <= results + 4 * batch  # the new results, the block being read, two kept for late readers
