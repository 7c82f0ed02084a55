"""Messages between ranks on one host through shared memory (engines/shm.py): the outbox and
the reads on their own, then real gloo ranks that use it, with one rank opting out."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import reshard as rs
from reshard.engines import shm
from tests.helpers import shm_rank

pytestmark = pytest.mark.skipif(not shm.enabled_here(), reason="no memfd or /proc on this system")


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_outbox_regions_reads_and_growth():
    before = _fds()
    box = shm.Outbox(capacity=4096)
    fd = os.open(f"/proc/{os.getpid()}/fd/{box.fd}", os.O_RDONLY)
    reader = shm.LocalPeers(box, {7: fd})

    first = box.take(1000)
    first.copy_(torch.arange(1000, dtype=torch.int64).to(torch.uint8))
    assert box.offset_of(first) == 192  # after the first three cache lines: the token, the vote board, its closed word
    foreign = torch.arange(3000, dtype=torch.int32).view(torch.uint8)  # 12,000 bytes: the file grows
    at = box.place(foreign)
    assert at >= 1192 and at % 64 == 0 and box.capacity >= at + foreign.numel()
    # the first region was written before the file grew: its mapping still holds it
    assert box.offset_of(first) == 192

    into = torch.empty(foreign.numel(), dtype=torch.uint8)
    assert reader.read(7, at, into) is None
    assert torch.equal(into, foreign)
    head = torch.empty(1000, dtype=torch.uint8)
    assert reader.read(7, 192, head) is None
    assert torch.equal(head, torch.arange(1000, dtype=torch.int64).to(torch.uint8))
    assert reader.read(7, box.capacity - 10, torch.empty(11, dtype=torch.uint8)) is not None  # past the end
    assert reader.read(7, 0, torch.empty(0, dtype=torch.uint8)) is None

    del first, into, head
    reader.close()
    assert _fds() == before  # the memory file and the peer's descriptor are closed


def test_a_foreign_file_is_not_taken_for_an_outbox(tmp_path):
    path = tmp_path / "not-an-outbox"
    path.write_bytes(b"\0" * 64)
    with open(path, "rb") as f:
        token = np.frombuffer(os.urandom(16), dtype=np.int64)
        assert shm.open_peer_file(os.getpid(), f.fileno(), token) is None
    assert shm.open_peer_file(os.getpid(), 10**6, token) is None  # no such descriptor


@pytest.mark.parametrize("n", [2, 3, 4])
def test_same_host_ranks_exchange_through_shared_memory(n):
    sizes = [1, 64, 2048, 5, 0, 700]  # rows per rank: the outbox grows, then serves smaller calls
    for rank, (peers, wrong, replayed) in enumerate(rs.spawn(shm_rank.exchanges_through_shared_memory, n, args=(sizes,))):
        assert peers == [q for q in range(n) if q != rank]
        assert wrong == [], (rank, wrong)
        assert replayed == [True] * len(sizes), rank  # the replays read from the outbox too


def test_a_rank_that_opts_out_keeps_its_pairs_on_gloo():
    env = {1: {"RESHARD_SHM": "0"}}
    for rank, (peers, _, ok) in enumerate(rs.spawn(shm_rank.settings_per_rank, 4, args=(env, (37, 41)))):
        assert ok, rank
        assert peers == (None if rank == 1 else [q for q in (0, 2, 3) if q != rank]), (rank, peers)


def test_a_pair_sends_through_shared_memory_from_the_larger_of_its_two_sizes():
    # rank 0: everything; rank 1: from 4 KiB; rank 2: from 1 MiB; rank 3: this machine's
    # default. The messages (about 100 KiB) take shared memory only where both ends allow it.
    env = {0: {"RESHARD_SHM_MIN_BYTES": "0"}, 1: {"RESHARD_SHM_MIN_BYTES": "4096"}, 2: {"RESHARD_SHM_MIN_BYTES": "1048576"}}
    default = 0 if shm.usable_here() else 1 << 20
    mine = {0: 0, 1: 4096, 2: 1 << 20, 3: default}
    for rank, (peers, smallest, ok) in enumerate(rs.spawn(shm_rank.settings_per_rank, 4, args=(env, (600, 700)))):
        assert ok, rank
        assert smallest == {q: max(mine[rank], mine[q]) for q in peers}, (rank, smallest)


def test_a_huge_size_setting_means_never():
    env = {0: {"RESHARD_SHM_MIN_BYTES": "9" * 30}}
    for rank, (peers, smallest, ok) in enumerate(rs.spawn(shm_rank.settings_per_rank, 2, args=(env, (64, 64)))):
        assert ok and peers == [1 - rank] and smallest == {1 - rank: 1 << 62}, (rank, smallest)


def test_a_bad_size_setting_is_named():
    env = {r: {"RESHARD_SHM_MIN_BYTES": "1.5MB"} for r in range(2)}
    with pytest.raises(rs.RankFailed, match="RESHARD_SHM_MIN_BYTES='1.5MB': must be a whole number of bytes"):
        rs.spawn(shm_rank.settings_per_rank, 2, args=(env, (4, 4)))


def test_the_default_size_is_every_message_where_notes_go_through_memory():
    assert shm.smallest_here(notes_in_memory=True) == 0
    assert shm.smallest_here(notes_in_memory=False) == 1 << 20


@pytest.mark.parametrize("n", [3])
def test_notes_as_gloo_messages_where_memory_cannot_carry_them(n):
    # Ranks that cannot order memory notes (not x86-64) send them as gloo messages: the same
    # exchanges, through the outbox, with a note and an acknowledgement per message on gloo.
    sizes = [1, 64, 2048, 0, 700]
    for rank, (peers, mailbox, wrong) in enumerate(rs.spawn(shm_rank.notes_as_gloo_messages, n, args=(sizes,))):
        assert peers == [q for q in range(n) if q != rank] and mailbox is False, (rank, peers, mailbox)
        assert wrong == [], (rank, wrong)


@pytest.mark.parametrize("n", [3])
def test_messages_of_no_bytes_go_through_shared_memory(n, monkeypatch):
    monkeypatch.setenv("RESHARD_SHM_MIN_BYTES", "0")  # every message, the empty ones too
    for rank, (got, recv_counts, back, ok) in enumerate(rs.spawn(shm_rank.empty_messages, n)):
        assert recv_counts == [2 + (rank if q == rank else 0) for q in range(n)], (rank, recv_counts)
        assert got == (sum(recv_counts), 0) and back == (2 * n + rank, 0) and ok, (rank, got, back)
