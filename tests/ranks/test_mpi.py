"""The MPI engine's own concerns: launching (rs.spawn and mpirun), failures, bad input, zero
copies for torch tensors, large counts. Its semantics are checked by test_conformance.py, which
runs the same cases on every engine."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import reshard as rs
from tests.helpers import rank_fns
from tests.helpers.bad_input_cases import CASES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")


def _mpi_leftovers() -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "reshard.launch.mpi_rank" in cmd or "prterun" in cmd:
            out.append(cmd)
    return out


@pytest.fixture(autouse=True)
def no_rank_left_behind():
    yield
    deadline = time.monotonic() + 10
    while _mpi_leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)  # reaped processes vanish asynchronously; poll for the condition
    assert _mpi_leftovers() == []


def test_spawn_returns_results_in_rank_order():
    assert rs.spawn(rank_fns.identity, 3, engine="mpi", args=("v",)) == [(r, 3, "mpi", "v") for r in range(3)]


def test_exception_names_the_rank_and_stops_the_others_quickly():
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.raise_on, 3, engine="mpi", args=(1,), timeout=60)
    assert time.monotonic() - start < 30
    assert "rank 1" in str(info.value) and "boom from rank 1" in info.value.failures[1]


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_dead_rank_is_reported(how, tmp_path):
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.die_mid_exchange, 3, engine="mpi", args=(1, how, str(tmp_path)), timeout=60)
    assert time.monotonic() - start < 40
    assert info.value.failures  # names who died; mpirun ends the job, so nobody waits out a timeout
    for p in tmp_path.iterdir():  # a survivor that got to report saw an error, never data
        assert p.read_text().split()[0] in ("RankFailed", "CommTimeout")


def test_rank_that_never_arrives_times_out_the_others():
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.late_rank, 3, engine="mpi", args=(1, 600), timeout=4)
    assert time.monotonic() - start < 30
    waiting = [info.value.failures[rank] for rank in (0, 2)]
    # The first waiter to time out reports and aborts the job, which may stop the other
    # before it writes its own report: each says one or the other, and one says CommTimeout.
    assert any("CommTimeout" in text for text in waiting), waiting
    assert all("CommTimeout" in text or "stopped after another rank failed" in text for text in waiting), waiting


def test_whole_job_timeout_stops_every_rank():
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.hang, 2, engine="mpi", args=(600,), timeout=3)
    assert time.monotonic() - start < 30
    assert "timeout" in str(info.value)


def test_unpicklable_result_is_reported():
    with pytest.raises(rs.RankFailed, match="could not send its return value"):
        rs.spawn(rank_fns.unpicklable_result, 2, engine="mpi")


def test_spawn_at_import_time_is_refused(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("import reshard as rs\n\ndef fn(comm):\n    return comm.rank\n\nprint(rs.spawn(fn, 2, engine='mpi'))\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "__name__" in run.stderr


@pytest.fixture(scope="module")
def bad_input_outcomes():
    calls_per_rank = [[(op, kw[r] if isinstance(kw, list) else kw) for op, kw, _, _ in CASES.values()] for r in range(3)]
    # call_op takes per-rank kwargs lists; hand each rank its own column
    return rs.spawn(_bad_input_rank, 3, engine="mpi", args=(calls_per_rank,), timeout=120)


def _bad_input_rank(comm, calls_per_rank):
    return rank_fns.call_ops(comm, calls_per_rank[comm.rank])


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_fails_on_every_rank(name, bad_input_outcomes):
    index = list(CASES).index(name)
    _, _, cls, word = CASES[name]
    for rank, outcomes in enumerate(bad_input_outcomes):
        kind, message = outcomes[index]
        assert kind == cls, f"rank {rank}: {kind}: {message}"
        assert word in message, f"rank {rank}: {message!r} does not mention {word!r}"


def test_init_under_mpirun(tmp_path):
    """The same script under mpirun: rs.init() finds MPI; torch CPU tensors move without a copy."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(
        """
        import sys
        import numpy as np
        import torch
        from mpi4py import MPI
        import reshard as rs

        comm = rs.init()
        assert comm.engine == "mpi" and isinstance(comm.mpi_comm, MPI.Intracomm), comm
        A = np.arange(7 * 5, dtype=np.float64).reshape(7, 5)
        for src, dst in [(rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Shard(0))]:
            mine = rs.local_shard(A, src, comm.rank, comm.size)
            out = rs.redistribute(mine, src, dst)
            assert isinstance(out, np.ndarray) and np.array_equal(out, rs.local_shard(A, dst, comm.rank, comm.size))
            t = torch.from_numpy(np.ascontiguousarray(mine))
            out_t = rs.redistribute(t, src, dst)
            stats = rs.last_exchange()
            assert isinstance(out_t, torch.Tensor)
            assert torch.equal(out_t, torch.from_numpy(rs.local_shard(A, dst, comm.rank, comm.size).copy()))
            assert (stats.pack_copies, stats.unpack_copies) == (0, 0), stats
            assert stats.recv_buffer_ptr == out_t.data_ptr()  # MPI wrote straight into the result
        with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as f:
            f.write(f"rank {comm.rank} of {comm.size} ok")
        comm.close()
        """
    ))
    from reshard.launch.mpi import launcher_command

    run = subprocess.run(launcher_command(3) + [sys.executable, str(script), str(tmp_path)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [(tmp_path / f"rank{r}").read_text() for r in range(3)] == [f"rank {r} of 3 ok" for r in range(3)]


@pytest.mark.parametrize("command", ["demo", "explain"])
def test_cli_runs_on_mpi(command):
    run = subprocess.run([sys.executable, "-m", "reshard", command, "--engine", "mpi", "--no-color"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mpi" in run.stdout


@pytest.mark.bigmem
@pytest.mark.parametrize("concat_dim", [0, 1], ids=["bytes", "subarray-types"])
def test_more_than_2_31_elements(concat_dim):
    """Pieces past INT_MAX bytes take the large-count path (about 9 GiB of memory in all)."""
    per_rank = 2**31 + 2**20  # int8: more elements, and bytes, than an int can count
    results = rs.spawn(rank_fns.big_int8_exchange, 2, engine="mpi", args=(per_rank, concat_dim), timeout=1200, check=False)
    assert results[0] == (True, 2 * per_rank)
    assert results[1] == (True, 0)


def test_a_lone_mpi_process_leaves_no_files(tmp_path):
    """rs.init() in a process no launcher started runs MPI as a singleton: it works, and Open
    MPI's session directory (made under TMPDIR) and shared-memory segment (/dev/shm) are gone
    when the process ends."""
    shm = pathlib.Path("/dev/shm")
    segments_before = set(shm.glob("sm_segment*")) if shm.is_dir() else set()
    work = tmp_path / "tmp"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PRTE_"))} | {"TMPDIR": str(work)}
    code = ("import numpy as np, reshard as rs; c = rs.init(engine='mpi'); "
            "print(c.engine, c.size, rs.redistribute(np.ones((2, 3)), rs.Shard(0), rs.Shard(1)).shape)")
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["mpi", "1", "(2,", "3)"]
    assert sorted(p.name for p in work.iterdir()) == [], "files left under TMPDIR"
    if shm.is_dir():
        assert set(shm.glob("sm_segment*")) - segments_before == set(), "a segment left in /dev/shm"


NEVER_VOTES = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import reshard as rs

    comm = rs.init(timeout=3)
    x = np.zeros((comm.size, 6), np.float32)
    if comm.rank == 2:
        time.sleep(8)  # elsewhere, alive, never reaching the collective below
    else:
        try:
            rs.redistribute(x, rs.Shard(0), rs.Shard(1))
            said = "no error"
        except rs.ReshardError as exc:
            said = f"{type(exc).__name__}: {exc}"
        with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as f:
            f.write(said)
    """
)


def test_a_rank_that_never_votes_is_named_under_mpirun(tmp_path):
    from reshard.launch.mpi import launcher_command

    script = tmp_path / "job.py"
    script.write_text(NEVER_VOTES)
    subprocess.run(launcher_command(3) + [sys.executable, str(script), str(tmp_path)], capture_output=True,
                   text=True, timeout=180)
    for r in (0, 1):
        said = (tmp_path / f"rank{r}").read_text()
        assert said.startswith("CommTimeout") and "for rank 2 " in said, said
