"""Errors name ranks as the job numbers them and show the job's own lines: a mesh dim's
communicator names world ranks (its own beside), ranks that called different collectives each
get their line, and ranks left waiting by one that returned say where they waited."""

from __future__ import annotations

import pytest

import reshard as rs
from reshard.errors import RankNames
from tests.helpers import rank_fns

ENGINES = ["gloo", "mpi"]


def test_rank_names_give_the_world_rank_and_the_rank_in_the_mesh_dim_beside():
    tp = RankNames([2, 3], "tp")
    assert tp.one(0) == "rank 2 (tp rank 0)"
    assert tp.many([1, 0]) == "ranks 2, 3 (tp ranks 0, 1)"
    assert RankNames().one(4) == "rank 4" and RankNames([0, 1, 2]).many([0, 2]) == "ranks 0, 2"
    assert RankNames([3, 1]).one(0) == "rank 3 (rank 0 here)"


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case,words", [
    ("dtype on world rank 2", ["dtype differs across ranks: rank 2 (tp rank 0): float64; rank 3 (tp rank 1): float32"] * 2),
    ("bad dim on world rank 3", ["invalid input on rank 3 (tp rank 1): dst Shard dim=5 is out of range",
                                 "rank 3 (tp rank 1): redistribute: dst Shard dim=5 is out of range"]),  # its own
])
def test_an_error_on_a_mesh_dim_names_the_world_rank_with_its_rank_in_the_dim(engine, case, words):
    texts = rs.spawn(rank_fns.on_a_mesh_dim, 4, engine=engine, args=(case,), timeout=120)
    assert texts[0] == texts[1] == "ok", texts  # the other tp group is not involved
    for rank, said in zip((2, 3), words):
        assert said in texts[rank], (rank, texts[rank])
        assert "rank 0:" not in texts[rank] and "rank 1:" not in texts[rank], texts[rank]


def test_ranks_that_called_different_collectives_are_each_shown_their_line():
    with pytest.raises(rs.MismatchError) as info:
        rs.spawn(rank_fns.different_collectives, 3, timeout=120)
    text = str(info.value)
    assert "ranks called different collectives: rank 0: all_to_all; ranks 1, 2: all_gather" in text, text
    lines = text.splitlines()
    at = lines.index("  raised from:")
    assert lines[at + 1].startswith("  rank 0: ") and "rank_fns.py:" in lines[at + 1], text
    assert lines[at + 2].strip() == "return rs.all_to_all(x, 1, 0)", text
    assert lines[at + 3].startswith("  ranks 1, 2: ") and lines[at + 4].strip() == "return rs.all_gather(x)", text


@pytest.mark.parametrize("ranks,waiting", [(2, "rank 0 was waiting"), (3, "ranks 0, 1 were waiting")])
def test_ranks_left_waiting_say_where_they_waited_and_one_rank_is_singular(ranks, waiting, tmp_path):
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.return_early, ranks, args=(ranks - 1, str(tmp_path / "returned")), timeout=60)
    lines = str(info.value).splitlines()
    assert lines[0] == f"rank {ranks - 1} returned after 1 collective call; {waiting} in redistribute (call 2)", lines
    assert lines[1].startswith(f"  {waiting.split(' w')[0]} waited at ") and "rank_fns.py:" in lines[1], lines
    assert lines[2].strip() == "return rs.redistribute(x, rs.Shard(0), rs.Shard(1)).shape", lines
