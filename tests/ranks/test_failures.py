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
    # As from a terminal: Ctrl-C raises here, whatever the test process holds or ignores
    # (a child inherits both, and the suite's own process may have either by now).
    script = _job_script(tmp_path, """
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        """, """
        print("starting", flush=True)
        rs.spawn(rank_fns.hang, 3, args=(600,), timeout=600)
        """)
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
    _signal_and_reap(proc, signal.SIGINT, parent.children(recursive=True))
    assert not list(tmp_path.glob("reshard-spawn-*"))


def _job_script(tmp_path: pathlib.Path, signal_setup: str, body: str) -> pathlib.Path:
    """A script that sets its signals as ``signal_setup`` says, then runs ``body`` under
    ``if __name__ == "__main__":`` with ``rs`` and ``rank_fns`` imported."""
    script = tmp_path / "job.py"
    root = str(pathlib.Path(__file__).resolve().parents[2])
    script.write_text(f"import signal, sys\n{textwrap.dedent(signal_setup)}sys.path.insert(0, {root!r})\n"
                      "import reshard as rs\nfrom tests.helpers import rank_fns\n"
                      f"if __name__ == \"__main__\":\n{textwrap.indent(textwrap.dedent(body), '    ')}")
    return script


def _signal_and_reap(proc: subprocess.Popen, sig: int, everyone: list[psutil.Process]) -> None:
    """Send ``sig`` to the job's process and wait for it to end; every process of ``everyone``
    (its children and ranks) must be gone within 30 s. On failure nothing is left running for
    the tests after this one."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for p in [psutil.Process(proc.pid), *everyone]:
            with contextlib.suppress(psutil.Error):
                p.kill()
        raise
    gone, alive = psutil.wait_procs(everyone, timeout=30)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert alive == [], alive


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_sigterm_stops_every_rank_and_removes_the_job_files(engine, tmp_path):
    """A job's process ended by SIGTERM (``timeout``, a scheduler, ``kill``) ends its ranks and
    removes its private directory on the way out, then still ends by SIGTERM."""
    if engine == "mpi" and missing_for("mpi") is not None:
        pytest.skip(f"MPI is not usable here: {missing_for('mpi')}")
    pids, temp = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    temp.mkdir()
    # SIGTERM at its default, as in a fresh process (a child inherits what the suite set)
    script = _job_script(tmp_path, """
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        """, f"rs.spawn(rank_fns.pid_then_hang, 3, engine={engine!r}, args=({str(pids)!r}, 600), timeout=600)\n")
    proc = subprocess.Popen([sys.executable, str(script)], env=dict(os.environ, TMPDIR=str(temp)))
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(pids.glob("rank?"))) < 3:  # until every rank runs
        time.sleep(0.1)
    ranks = [psutil.Process(int(p.read_text())) for p in sorted(pids.glob("rank?"))]
    assert len(ranks) == 3
    _signal_and_reap(proc, signal.SIGTERM, [*parent.children(recursive=True), *ranks])
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
