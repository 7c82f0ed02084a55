"""Started collectives (``async_op=True``): a handle's wait() returns exactly what the blocking
call returns; several in flight, waited in any order; bad input, a dead rank and a short wait
raise on every rank; handles never waited are finished at close; no thread is left behind."""

from __future__ import annotations

import importlib.util
import time

import pytest

import reshard as rs
from tests.helpers import async_rank

HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
ENGINES = ["gloo", pytest.param("mpi", marks=pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_many_started_calls_waited_in_reverse_equal_the_blocking_ones(engine):
    for same, middle_same, threads_before, threads_after, pending in rs.spawn(async_rank.many_in_flight, 3, engine=engine):
        assert same == dict.fromkeys(same, True) and len(same) == 7, same
        assert middle_same
        assert threads_after == threads_before and pending == 0, (threads_before, threads_after, pending)


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_input_in_a_started_call_raises_at_wait_on_every_rank(engine):
    for kind, message in rs.spawn(async_rank.bad_input_started, 3, engine=engine, args=(1,)):
        assert kind == "MismatchError", (kind, message)
        assert "rank 1" in message, message


@pytest.mark.parametrize("engine", ENGINES)
def test_ranks_that_start_calls_in_different_orders_raise_on_every_rank(engine):
    for outcomes in rs.spawn(async_rank.different_order, 2, engine=engine):
        assert outcomes[0].startswith("MismatchError") and "different collectives" in outcomes[0], outcomes


@pytest.mark.parametrize("engine", ENGINES)
def test_a_wait_that_runs_out_raises_comm_timeout_and_the_call_goes_on(engine, tmp_path):
    results = rs.spawn(async_rank.timed_out_wait, 2, engine=engine, args=(str(tmp_path / "go"),))
    first, done_then, gathered = results[0]
    assert first.startswith("rank 0: all_gather: wait(timeout=0.3) ran out"), first
    assert done_then is False
    assert gathered == [[0.0] * 3] * 2 + [[1.0] * 3] * 2
    assert results[1][2] == gathered


@pytest.mark.parametrize("engine", ENGINES)
def test_handles_never_waited_are_finished_when_the_communicator_closes(engine):
    for messages, done1, done2, value, threads, _, _ in rs.spawn(async_rank.never_waited, 2, engine=engine):
        assert len(messages) == 1 and "2 started calls never waited" in messages[0], messages
        assert "all_reduce" in messages[0] and "all_gather" in messages[0]
        assert done1 and done2 and value == 3.0
        assert threads[0] == threads[1], threads


@pytest.mark.parametrize("finished_first", [False, True])
def test_the_never_waited_warning_points_at_the_job_line_on_every_rank(finished_first):
    results = rs.spawn(async_rank.never_waited, 3, engine="gloo", args=(finished_first,))
    for rank, (messages, *_, sites, start) in enumerate(results):
        assert len(messages) == 1 and messages[0].startswith("the communicator closes with 2 started calls"), messages
        filename, line, category = sites[0]
        assert category == "RuntimeWarning"
        assert (filename, line) == start, (rank, sites, start)  # the job's line, not reshard's


def test_a_rank_that_dies_with_a_call_pending_fails_the_others_wait_on_gloo(tmp_path):
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(async_rank.started_then_dies, 3, engine="gloo", args=(1, str(tmp_path)), timeout=30)
    assert time.monotonic() - start < 40
    assert 1 in info.value.failures
    seen = {p.name: p.read_text().split() for p in tmp_path.iterdir()}
    assert sorted(seen) == ["rank0", "rank2"], seen
    for rank, (outcome, seconds) in seen.items():
        assert outcome in ("RankFailed", "CommTimeout"), (rank, outcome)
        assert float(seconds) < 30, (rank, seconds)


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed")
def test_a_rank_that_dies_with_a_call_pending_fails_the_mpi_job_naming_it(tmp_path):
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(async_rank.started_then_dies, 3, engine="mpi", args=(1, str(tmp_path)), timeout=60)
    assert 1 in info.value.failures, info.value


@pytest.mark.parametrize("engine", ENGINES)
def test_gradient_through_a_started_call(engine):
    for equal, nonzero in rs.spawn(async_rank.gradient_through_a_started_call, 2, engine=engine):
        assert equal and nonzero


def test_last_exchange_describes_the_last_finished_call():
    for gathered, reduced in rs.spawn(async_rank.last_exchange_is_the_last_finished, 2, engine="gloo"):
        assert (gathered, reduced) == ("all_gather", "all_reduce")


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True])
def test_a_bad_wait_timeout_is_refused(timeout):
    handle = rs.Handle("all_gather", 0, __import__("concurrent.futures").futures.Future())
    with pytest.raises(rs.InvalidArgument, match="wait\\(timeout=\\) takes seconds >= 0 or None"):
        handle.wait(timeout=timeout)


def test_wait_returns_after_the_worker_thread_has_freed_what_it_kept():
    # a torch tensor freed as a thread ends lets go of the GIL; a process that exited meanwhile aborted
    import threading

    from reshard.execution import handles

    freed = []

    class FreedSlowly:
        def __del__(self):
            time.sleep(0.2)  # long enough that a wait() returning before the thread's end is caught
            freed.append(True)

    kept = threading.local()

    def run():
        kept.probe = FreedSlowly()  # the worker thread's own data, freed as it ends
        return 7

    assert handles.submit("probe", 0, run, None).wait() == 7
    assert freed == [True]


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed")
def test_a_job_that_waited_for_a_started_list_of_torch_and_numpy_ends_cleanly_on_mpi(capfd):
    for _ in range(3):  # each rank's exit raced its worker's end: most jobs of three aborted a rank
        assert rs.spawn(async_rank.started_mixed_list, 4, engine="mpi") == [True] * 4
    out, err = capfd.readouterr()
    assert "terminate called" not in out + err and "Aborted" not in out + err, (out + err)[-2000:]


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed")
def test_a_call_made_while_torch_is_half_imported_moves_numpy_arrays():
    # a started call's worker runs while the caller may be importing torch: a half-made module has
    # no Tensor yet, and asking it for one raises AttributeError (MPI ranks start without torch)
    for absent, half_made, got, want in rs.spawn(async_rank.calls_while_torch_is_imported, 2, engine="mpi"):
        assert absent and half_made, "the rank had torch loaded already, or the hook never saw it half-made"
        assert got == want, got
