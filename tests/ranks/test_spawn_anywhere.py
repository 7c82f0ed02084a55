"""rs.spawn from wherever Python runs (a notebook through a real Jupyter kernel, `python -c`,
code on stdin, a script), a clear refusal for a script that calls it unguarded, and failures a
user can catch and read: the error class every rank raised, the collective each rank was in
when the job ran out of time, and a dead rank's own last words."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import nbformat
import pytest
from nbclient import NotebookClient

import reshard as rs
from tests.helpers import rank_fns

ENGINES = ["gloo", "mpi"]
JOB = textwrap.dedent('''
    import numpy as np
    import reshard as rs

    def job(comm, scale):
        A = np.arange(36.0).reshape(6, 6) * scale
        rows = rs.local_shard(A, rs.Shard(0), comm.rank, comm.size)
        return rs.all_to_all(rows, split_dim=1, concat_dim=0).tolist()
''')
CHECK = textwrap.dedent('''
    want = [(np.arange(36.0).reshape(6, 6) * 2)[:, 2 * r : 2 * r + 2].tolist() for r in range(3)]
    assert rs.spawn(job, 3, args=(2,)) == want
    assert rs.spawn(job, 3, engine="mpi", args=(2,)) == want
    print("both engines ok")
''')


def _python(args, **kw):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, **kw)


def test_a_function_defined_in_a_notebook_runs_on_local_ranks(tmp_path, monkeypatch):
    # The kernel is stopped without running its exit hooks, so the temporary directory of
    # multiprocessing's fork server goes into tmp_path rather than /tmp.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(JOB), nbformat.v4.new_code_cell(CHECK)]
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    printed = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert "both engines ok" in printed


def test_python_dash_c_and_stdin(tmp_path):
    done = _python(["-c", JOB + CHECK], cwd=tmp_path)
    assert done.returncode == 0 and "both engines ok" in done.stdout, done.stderr[-3000:]
    done = _python(["-"], input=JOB + CHECK, cwd=tmp_path)
    assert done.returncode == 0 and "both engines ok" in done.stdout, done.stderr[-3000:]


def test_a_guarded_script(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB + "\nif __name__ == '__main__':\n" + textwrap.indent(CHECK, "    "))
    done = _python([str(script)], cwd=tmp_path)
    assert done.returncode == 0 and "both engines ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_unguarded_script_is_refused_before_any_rank_starts(engine, tmp_path):
    marker = tmp_path / "a rank ran"
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f'''
        import reshard as rs

        def job(comm):
            open({str(marker)!r}, "w").close()

        def main():
            rs.spawn(job, 2, engine={engine!r})

        main()
    '''))
    done = _python([str(script)], cwd=tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("reshard.errors.InvalidArgument") and 'if __name__ == "__main__":' in last, done.stderr
    assert "job.py:10" in last  # the line of the unguarded call
    assert not marker.exists()
    assert done.stderr.count("Traceback") == 1  # one error, from the caller, not one per rank


@pytest.mark.parametrize("engine", ENGINES)
def test_the_same_error_on_every_rank_is_that_error(engine):
    with pytest.raises(rs.MismatchError) as info:
        rs.spawn(rank_fns.mismatch_on_rank_1, 3, engine=engine, timeout=120)
    err = info.value
    assert isinstance(err, rs.RankFailed) and err.ranks == [0, 1, 2]
    text = str(err)
    assert text.startswith("MismatchError on every rank (ranks 0-2): all_to_all: dim 1 differs")
    assert text.count("dim 1 differs") == 1  # the message once, not once per rank
    # the job's line it was raised from, with its source; none of reshard's own frames
    assert "rank_fns.py:" in text and "return rs.all_to_all(x, split_dim=0, concat_dim=0)" in text, text
    assert "/reshard/" not in text, text
    assert all("Traceback" in err.failures[r] for r in range(3))  # each rank's traceback is kept


@pytest.mark.parametrize("engine", ENGINES)
def test_a_timeout_names_the_collective_and_call_each_rank_was_in(engine):
    start = time.monotonic()
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.skip_second_collective, 3, engine=engine, args=(120,), timeout=6)
    assert time.monotonic() - start < 60
    failures = info.value.failures
    assert "outside reshard's collectives, after 1 call (the last: all_gather)" in failures[1], failures[1]
    for r in (0, 2):  # each waiter was stopped in, or timed out of, its second call
        assert "waiting in all_to_all (its collective call 2)" in failures[r], failures[r]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_dead_rank_reports_its_own_last_words(engine):
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.exit_with_message, 3, engine=engine, args=(1, "the input file was missing"), timeout=60)
    text = info.value.failures[1]
    assert "the input file was missing" in text and "died without reporting" not in text, text
    assert "exit code 3" in text, text
