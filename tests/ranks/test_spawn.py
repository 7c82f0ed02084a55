"""rs.spawn: results in rank order, failures named with tracebacks, nothing left behind."""

from __future__ import annotations

import glob
import os
import tempfile
import threading
import time

import pytest

import reshard as rs
from tests.helpers import rank_fns


def _rank_children() -> list:
    return rank_fns.rank_processes()


def _spawn_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "reshard-spawn-*")))


def test_results_in_rank_order():
    assert rs.spawn(rank_fns.identity, 4, args=("x",)) == [(r, 4, "gloo", "x") for r in range(4)]


def test_world_size_one():
    assert rs.spawn(rank_fns.identity, 1) == [(0, 1, "gloo", None)]


def test_exception_names_rank_and_traceback():
    dirs = _spawn_dirs()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.raise_on, 3, args=(1,), timeout=60)
    err = info.value
    assert 1 in err.failures and "boom from rank 1" in err.failures[1]
    assert "Traceback" in err.failures[1] and "rank 1" in str(err)
    assert _rank_children() == []
    assert _spawn_dirs() == dirs


def test_dead_rank_fails_job_quickly():
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.exit_on, 3, args=(2,), timeout=60)
    assert time.monotonic() - start < 30
    assert "exit code 3" in info.value.failures[2]
    assert _rank_children() == []


def test_hang_past_timeout_is_stopped():
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.hang, 2, args=(600,), timeout=3)
    assert time.monotonic() - start < 20
    assert set(info.value.failures) == {0, 1} and "timeout" in str(info.value)
    assert _rank_children() == []


def test_unpicklable_fn_is_a_clear_error():
    lock = threading.Lock()  # cloudpickle cannot carry a lock to another process
    with pytest.raises(rs.InvalidArgument, match="picklable"):
        rs.spawn(lambda comm: lock, 2)


def test_a_lambda_travels_by_value():
    assert rs.spawn(lambda comm, k: comm.rank * k, 2, args=(10,)) == [0, 10]


def test_unpicklable_result_is_reported():
    with pytest.raises(rs.RankFailed, match="could not send its return value"):
        rs.spawn(rank_fns.unpicklable_result, 2)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_bad_world_size(bad):
    with pytest.raises(rs.InvalidArgument):
        rs.spawn(rank_fns.identity, bad)


def test_ranks_listen_on_loopback_only():
    for addresses in rs.spawn(rank_fns.listening, 3):
        assert addresses, "gloo should listen somewhere"
        assert all(a.startswith("127.") or a == "::1" for a in addresses), addresses


def test_a_job_starts_with_the_collectives_imported():
    """The fork server imports them once, so a job's first call does not (85-170 ms here)."""
    assert rs.spawn(rank_fns.collectives_loaded, 2) == [True, True]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "soon", True])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_before_any_rank_starts(bad):
    with pytest.raises(rs.InvalidArgument, match="timeout"):
        rs.spawn(rank_fns.identity, 2, timeout=bad)
    with pytest.raises(rs.InvalidArgument, match="timeout"):
        rs.init(timeout=bad)


def test_a_setting_that_cannot_be_read_fails_the_job_before_any_rank_starts(monkeypatch):
    """RESHARD_ARENA is read only by calls big enough for the arena: a small job would have run."""
    monkeypatch.setenv("RESHARD_ARENA", "x")
    with pytest.raises(rs.InvalidArgument, match="RESHARD_ARENA='x'"):
        rs.spawn(rank_fns.identity, 2)


@pytest.mark.parametrize("setting,given,want", [("0", True, False), ("1", True, True), ("1", False, False)])
def test_reshard_check_sets_the_default_check_of_the_ranks_spawn_starts(monkeypatch, setting, given, want):
    monkeypatch.setenv("RESHARD_CHECK", setting)
    assert rs.spawn(rank_fns.default_check, 2, check=given) == [want, want]


def test_a_gloo_rank_that_starts_a_gloo_job_is_told_why_it_cannot_and_an_mpi_one_runs():
    # a gloo rank is a daemon process, which multiprocessing forbids to have children
    (name, message), = rs.spawn(rank_fns.spawns_a_job, 1, "gloo", args=("gloo",), timeout=120)
    assert name == "InvalidArgument" and "daemon process" in message and "engine='mpi'" in message, message
    assert rs.spawn(rank_fns.spawns_a_job, 1, "gloo", args=("mpi",), timeout=120) == [[0, 1]]
