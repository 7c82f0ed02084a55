"""Never hang, never lie: dead ranks, ranks that never join, Ctrl-C, and what crosses the wire."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import reshard as rs
from reshard.engines.available import missing_for
from tests.helpers import rank_fns

SRC = pathlib.Path(rs.__file__).parent


@pytest.mark.parametrize(("how", "path"), [("sigkill", "gloo"), ("exit", "gloo"), ("exception", "gloo"),
                                           ("sigkill", "shared memory"), ("exit", "shared memory")])
def test_survivors_raise_when_a_rank_dies(how, path, tmp_path, monkeypatch):
    check = True
    if path == "gloo":  # gloo's own messages, as between hosts
        monkeypatch.setenv("RESHARD_SHM", "0")
    else:  # every message through shared memory, and no check round before them
        monkeypatch.setenv("RESHARD_SHM_MIN_BYTES", "0")
        check = False
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.die_mid_exchange, 3, args=(1, how, str(tmp_path), check), timeout=30)
    assert time.monotonic() - start < 30 + 10
    assert 1 in info.value.failures
    seen = {p.name: p.read_text().split() for p in tmp_path.iterdir()}
    assert sorted(seen) == ["rank0", "rank2"], seen
    # every survivor that got to report saw a ReshardError, not a hang and not data
    for rank, (outcome, seconds) in seen.items():
        assert outcome in ("RankFailed", "CommTimeout"), (rank, outcome)
        assert float(seconds) < 30 + 5


def test_rank_that_never_joins_fails_init(tmp_path):
    code = "import reshard as rs\ntry:\n    rs.init(timeout=3)\nexcept rs.ReshardError as e:\n    print(type(e).__name__, e)\n"
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert time.monotonic() - start < 60
    assert run.stdout.startswith(("CommTimeout", "RankFailed")), run.stdout + run.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ctrl_c_leaves_nothing_behind(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(
        f"""
        import signal, sys
        # As from a terminal: Ctrl-C raises here, whatever the test process holds or ignores
        # (a child inherits both, and the suite's own process may have either by now).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
        sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parents[2])!r})
        import reshard as rs
        from tests.helpers import rank_fns
        if __name__ == "__main__":
            print("starting", flush=True)
            rs.spawn(rank_fns.hang, 3, args=(600,), timeout=600)
        """
    ))
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    ranks: list[psutil.Process] = []
    while time.monotonic() < deadline:  # wait until the three ranks exist
        ranks = rank_fns.rank_processes(parent)
        if len(ranks) == 3:
            break
        time.sleep(0.1)
    assert len(ranks) == 3
    everyone = parent.children(recursive=True)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:  # fail, but leave no process behind for the tests after this one
        for p in [parent, *everyone]:
            with contextlib.suppress(psutil.Error):
                p.kill()
        raise
    gone, alive = psutil.wait_procs(everyone, timeout=30)
    assert alive == [], alive
    assert not list(tmp_path.glob("reshard-spawn-*"))


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_sigterm_stops_every_rank_and_removes_the_job_files(engine, tmp_path):
    """A job's process ended by SIGTERM (``timeout``, a scheduler, ``kill``) ends its ranks and
    removes its private directory on the way out, then still ends by SIGTERM."""
    if engine == "mpi" and missing_for("mpi") is not None:
        pytest.skip(f"MPI is not usable here: {missing_for('mpi')}")
    pids, temp = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    temp.mkdir()
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(
        f"""
        import signal, sys
        # SIGTERM at its default, as in a fresh process (a child inherits what the suite set)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
        sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parents[2])!r})
        import reshard as rs
        from tests.helpers import rank_fns
        if __name__ == "__main__":
            rs.spawn(rank_fns.pid_then_hang, 3, engine={engine!r}, args=({str(pids)!r}, 600), timeout=600)
        """
    ))
    proc = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ, TMPDIR=str(temp)))
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(pids.glob("rank?"))) < 3:  # until every rank runs
        time.sleep(0.1)
    ranks = [psutil.Process(int(p.read_text())) for p in sorted(pids.glob("rank?"))]
    everyone = [*parent.children(recursive=True), *ranks]
    assert len(ranks) == 3
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:  # fail, but leave no process behind for the tests after this one
        for p in [parent, *everyone]:
            with contextlib.suppress(psutil.Error):
                p.kill()
        raise
    gone, alive = psutil.wait_procs(everyone, timeout=30)
    for p in alive:  # fail, but leave nothing running
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert alive == [], alive
    assert proc.returncode == -signal.SIGTERM
    assert not list(temp.glob("reshard-*"))


# The only unpickling: results and payloads between rs.spawn and the rank processes it started
# itself, over a local pipe or files in its private 0700 directory. Nothing from the network.
LOCAL_PICKLE = {"local.py", "torch_rank.py", "mpi.py", "mpi_rank.py"}


def test_no_unpickling_of_network_data():
    """Our code paths never turn bytes from the wire into objects with pickle."""
    risky = re.compile(r"pickle\.loads?|torch\.load|_object_list|all_gather_object|recv_object|broadcast_object|gather_object")
    offenders = [f"{p.name}:{i + 1}" for p in SRC.rglob("*.py") for i, line in enumerate(p.read_text().splitlines())
                 if risky.search(line) and p.name not in LOCAL_PICKLE]
    assert offenders == []
    # mpi4py's lower-case calls pickle whatever they carry; the MPI engine uses only the
    # upper-case buffer calls.
    lower = re.compile(r"\.(send|recv|isend|irecv|bcast|gather|allgather|alltoall|scatter|sendrecv|reduce|allreduce)\(")
    engine = (SRC / "engines" / "mpi_engine.py").read_text()
    assert not lower.search(engine), lower.search(engine)
    for name in LOCAL_PICKLE:  # those files read only what this machine's own processes wrote
        path = next(SRC.rglob(name))
        assert "socket" not in path.read_text()


@pytest.mark.soak
def test_soak_mixed_collectives():
    results = rs.spawn(rank_fns.soak, 4, args=(10_000,), timeout=3600)
    for wrong, fd_growth, rss_growth_mb in results:
        assert wrong == 0
        assert fd_growth <= 2
        assert rss_growth_mb < 64
