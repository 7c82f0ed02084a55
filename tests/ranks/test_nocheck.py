"""check=False never returns wrong data: the first call of each signature agrees across ranks
(check on or off), so ranks that disagree raise MismatchError on every rank; a repeated call
that skips the agreement runs only while every rank's signature is unchanged, and a rank that
changes alone cannot match the others' exchange, so the job fails rather than move data."""

from __future__ import annotations

import pytest

import reshard as rs
from tests.helpers import rank_fns

ENGINES = ["gloo", "mpi"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", ["all_to_all", "reduce_scatter", "redistribute", "all_to_all_v"])
def test_disagreeing_ranks_raise_on_every_rank(engine, case):
    with pytest.raises(rs.MismatchError) as info:
        rs.spawn(rank_fns.nocheck_disagreement, 3, engine=engine, args=(case,), timeout=60)
    assert info.value.ranks == [0, 1, 2]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_that_changes_alone_after_a_replay_fails_the_job(engine):
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.nocheck_change_after_replay, 3, engine=engine, args=(0,), timeout=5)
    text = str(info.value)
    assert "redistribute" in text  # the reports say which collective the ranks were stuck in


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("change", ["alone", "all"])
def test_a_replay_that_needs_the_peers_shapes_votes_and_a_lone_change_raises_everywhere(engine, change):
    for rank, got in enumerate(rs.spawn(rank_fns.nocheck_shapes_needed, 3, engine=engine, args=(change,), timeout=60)):
        assert got[:2] == [((6, 2), True), ((6, 2), True)], (rank, got)
        if change == "all":  # a new signature on every rank: the full path, the right parts
            assert got[2] == ((9, 2), True), (rank, got)
        else:  # rank 1's replay misses; the others' vote fails, and the records name the dim
            kind, text = got[2]
            assert kind == "MismatchError" and "dim 1 differs across ranks" in text, (rank, got)
