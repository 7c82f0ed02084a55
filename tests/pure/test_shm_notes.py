"""The notes between same-host ranks through shared memory (engines/shm_notes.py), on their
own: two or three mailboxes over plain arrays in one process, as ranks see each other's."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import reshard as rs
from reshard.engines import shm, shm_notes
from reshard.engines.arena_link import ArenaLink
from reshard.engines.shm import BOARD_WORDS, VoteBoard
from reshard.engines.shm_notes import LINE_WORDS, Mailbox, Poll, cores_here, spins_for


def mailboxes(size: int, timeout: float = 5.0, pids: dict | None = None) -> list[Mailbox]:
    heads = [np.zeros(Mailbox.nbytes(size) // 8, dtype=np.int64) for _ in range(size)]
    return [Mailbox(r, size, heads[r], {q: heads[q] for q in range(size) if q != r}, pids or {}, timeout)
            for r in range(size)]


def outbox_reader(outboxes: dict[int, torch.Tensor]):
    def read(peer, offset, into):
        into.copy_(outboxes[peer][offset : offset + into.numel()])
        return None

    return read


def test_messages_are_read_where_the_notes_say_and_acknowledged_round_after_round():
    a, b, c = mailboxes(3)
    for round_ in range(4):  # the numbers count per pair: a line is written again each round
        outboxes = {q: torch.arange(q * 50 + round_, q * 50 + round_ + 200, dtype=torch.int64).to(torch.uint8) for q in range(3)}
        a.post(1, 10, 7)
        a.post(2, 20, 3)
        c.post(1, 5, 11)
        into_b = {0: torch.empty(7, dtype=torch.uint8), 2: torch.empty(11, dtype=torch.uint8)}
        assert b.settle(list(into_b.items()), [], outbox_reader(outboxes), "test") is None
        into_c = torch.empty(3, dtype=torch.uint8)
        assert c.settle([(0, into_c)], [1], outbox_reader(outboxes), "test") is None
        assert a.settle([], [1, 2], outbox_reader(outboxes), "test") is None
        assert torch.equal(into_b[0], outboxes[0][10:17]) and torch.equal(into_b[2], outboxes[2][5:16])
        assert torch.equal(into_c, outboxes[0][20:23])
    assert a.sent == [0, 4, 4] and b.got == [4, 0, 4] and c.got == [4, 0, 0]


def test_a_length_the_receiver_did_not_expect_is_named_on_both_sides():
    a, b = mailboxes(2)
    a.post(1, 0, 9)
    why = b.settle([(0, torch.empty(8, dtype=torch.uint8))], [], outbox_reader({0: torch.zeros(64, dtype=torch.uint8)}), "test")
    assert why == "rank 0 sent 9 bytes where 8 were expected"
    assert a.settle([], [1], outbox_reader({}), "test") == "rank 1 could not read this rank's message"
    assert b.mine[(2 + 0) * LINE_WORDS + 1] == 1  # the acknowledgement carries the failure


def test_a_peer_that_never_posts_times_out_naming_it():
    a, _ = mailboxes(2, timeout=0.05)
    with pytest.raises(rs.CommTimeout, match=r"rank 0: an exchange: waited more than 0.05 s for rank 1"):
        a.settle([(1, torch.empty(4, dtype=torch.uint8))], [], outbox_reader({}), "an exchange")


def test_a_peer_whose_process_ended_is_named():
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    a, _ = mailboxes(2, timeout=30.0, pids={1: ended.pid})
    a.post(1, 0, 4)
    with pytest.raises(rs.RankFailed, match=r"rank 0: an exchange: rank 1 gone"):
        a.settle([], [1], outbox_reader({}), "an exchange")


def test_a_wait_spins_only_where_every_rank_has_a_core_of_its_own():
    """Where ranks share cores, the rank waited for may need this one: no spinning first."""
    cores = cores_here()
    assert spins_for(cores) > 0
    assert spins_for(cores + 1) == 0
    assert mailboxes(cores + 1)[0].spins == 0


class _PeerActsDuringPause(Poll):
    """A wait's pauses, the first of which stands for the moment a peer writes what this rank
    waits for and then ends or closes: ``act()`` runs there, and the wait looks for gone peers."""

    def __init__(self, act, timeout: float = 30.0) -> None:
        super().__init__(timeout, 0)
        self.act = act

    def pause(self) -> bool:
        if self.act is not None:
            act, self.act = self.act, None
            act()
            return True
        return super().pause()


def _ended_pid() -> int:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    return ended.pid


def test_a_peer_that_acknowledged_and_then_ended_is_not_blamed(monkeypatch):
    a, b = mailboxes(2, timeout=30.0, pids={1: _ended_pid()})
    a.post(1, 0, 4)
    into = torch.empty(4, dtype=torch.uint8)
    reader = outbox_reader({0: torch.arange(8, dtype=torch.uint8)})
    monkeypatch.setattr(shm_notes, "Poll", lambda timeout, spins: _PeerActsDuringPause(
        lambda: b.settle([(0, into)], [], reader, "an exchange"), timeout))
    assert a.settle([], [1], reader, "an exchange") is None
    assert torch.equal(into, torch.arange(4, dtype=torch.uint8))


def test_a_peer_that_voted_and_then_closed_is_not_blamed(monkeypatch):
    boards = [np.zeros(BOARD_WORDS, dtype=np.int64) for _ in range(2)]
    mine = VoteBoard(boards[0], {1: boards[1]}, {1: os.getpid()}, 0, 30.0)
    peer = VoteBoard(boards[1], {0: boards[0]}, {0: os.getpid()}, 1, 30.0)

    def peer_votes_and_returns():
        peer.start(np.array([7, -2]))
        peer.close()  # its job returned: it will never vote again

    acts = [lambda: None, peer_votes_and_returns]  # the first wait's pause, then the second's
    monkeypatch.setattr(shm, "Poll", lambda timeout, spins: _PeerActsDuringPause(acts.pop(), timeout))
    finish = mine.start(np.array([3, -5]))
    assert finish().tolist() == [7, -2]
    # a peer that closed without this vote is still named at once
    finish = mine.start(np.array([3, -5]))
    with pytest.raises(rs.RankFailed, match=r"rank 1 closed the communicator"):
        finish()


def test_a_peer_that_wrote_its_note_and_then_ended_is_not_blamed_by_a_reader():
    link = ArenaLink(0, 2, np.zeros(64, dtype=np.int64), {1: np.zeros(64, dtype=np.int64)}, {}, {1: _ended_pid()}, [], 30.0)
    written = []
    link._wait(_PeerActsDuringPause(lambda: written.append(1)), {1}, "an exchange", lambda q: bool(written))
    with pytest.raises(rs.RankFailed, match=r"rank 1 gone"):
        link._wait(_PeerActsDuringPause(lambda: None), {1}, "an exchange", lambda q: False)
