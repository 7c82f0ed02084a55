"""What a failed job tells a person: the rank whose own code failed first, with the job's file,
line and source; the ranks that stopped because of it after, one line per group; a rank that
returned while others waited for it named within about a second; every line of the ranks'
output whole and prefixed with its rank."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import reshard as rs
from tests.helpers import rank_fns

ENGINES = ["gloo", "mpi"]

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import reshard as rs


    def job(comm):
        x = np.zeros((2, 6), np.float32)
        if comm.rank == 1:
            raise ValueError("my bug on rank 1")
        return rs.redistribute(x, rs.Shard(0), rs.Shard(1))


    if __name__ == "__main__":
        try:
            rs.spawn(job, world_size=3, engine=sys.argv[1], timeout=60)
        except rs.RankFailed as exc:
            print(json.dumps({"text": str(exc), "culprits": exc.culprits, "stopped": exc.stopped,
                              "ranks": exc.ranks}))
''')


def _run(tmp_path, script, *args, env=None):
    path = tmp_path / "job.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return path, done


@pytest.mark.parametrize("engine", ENGINES)
def test_the_report_leads_with_the_rank_whose_own_code_failed(engine, tmp_path):
    path, done = _run(tmp_path, SCRIPT, engine)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    lines = report["text"].splitlines()
    assert lines[0] == "rank 1 failed: ValueError: my bug on rank 1", report["text"]
    assert lines[1].strip() == f'File "{path}", line 10, in job', report["text"]  # the script's own file
    assert lines[2].strip() == 'raise ValueError("my bug on rank 1")', report["text"]
    assert "ranks 0, 2: stopped: rank 1 ended during redistribute (call 1)" in lines, report["text"]
    assert report["culprits"] == [1] and report["stopped"] == [0, 2] and report["ranks"] == [0, 1, 2]
    assert "/reshard/" not in report["text"] and "<dynamic-code>" not in report["text"], report["text"]
    assert "MPI_ABORT" not in done.stderr  # the launcher's banner says nothing the report does not


def test_reshard_frames_are_shown_when_the_setting_asks(tmp_path):
    _, done = _run(tmp_path, SCRIPT, "gloo", env={"RESHARD_TRACEBACK": "1"})
    text = json.loads(done.stdout.strip().splitlines()[-1])["text"]
    assert "my bug on rank 1" in text.splitlines()[0]
    assert "/reshard/launch/torch_rank.py" in text, text


@pytest.mark.parametrize("engine", ENGINES)
def test_a_rank_that_returns_while_others_wait_is_named_within_about_a_second(engine, tmp_path):
    stamp = tmp_path / "returned"
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.return_early, 3, engine=engine, args=(2, str(stamp)), timeout=60)
    after_return = time.time() - float(stamp.read_text())
    assert after_return < 2.5, after_return  # not the 60 s timeout
    err = info.value
    first = str(err).splitlines()[0]
    assert first == "rank 2 returned after 1 collective call; ranks 0, 1 were waiting in redistribute (call 2)", str(err)
    assert err.culprits == [2] and err.stopped == [0, 1]


OUTPUT = textwrap.dedent('''
    import sys
    import reshard as rs


    def job(comm):
        for i in range(40):
            print(f"stdout from {comm.rank}", end="", flush=True)
            print(f" line {i}", flush=True)
            sys.stderr.write(f"stderr from {comm.rank} ")
            sys.stderr.flush()
            sys.stderr.write(f"line {i}\\n")
        return comm.rank


    if __name__ == "__main__":
        assert rs.spawn(job, world_size=3, engine=sys.argv[1]) == [0, 1, 2]
''')


@pytest.mark.parametrize("engine", ENGINES)
def test_each_line_of_a_rank_arrives_whole_with_its_rank(engine, tmp_path):
    _, done = _run(tmp_path, OUTPUT, engine)
    for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        lines = text.splitlines()
        assert len(lines) == 120, (stream, text)
        for line in lines:
            assert re.fullmatch(rf"\[rank (\d)\] {stream} from \1 line \d+", line), (stream, line)


def test_the_rank_prefix_can_be_turned_off(tmp_path):
    _, done = _run(tmp_path, OUTPUT, "gloo", env={"RESHARD_RANK_PREFIX": "0"})
    assert all(re.fullmatch(r"stdout from \d line \d+", line) for line in done.stdout.splitlines()), done.stdout


@pytest.mark.parametrize("engine", ENGINES)
def test_no_engine_warning_reaches_the_job(engine):
    for said in rs.spawn(rank_fns.warnings_from_read_only_inputs, 3, engine=engine, timeout=120):
        assert said == [], said


@pytest.mark.parametrize("engine", ENGINES)
def test_a_long_message_is_cut_in_the_report_and_whole_in_failures(engine):
    with pytest.raises(rs.RankFailed) as info:
        rs.spawn(rank_fns.raises_a_long_message, 2, engine=engine, args=(1, 500), timeout=60)
    report = str(info.value)
    assert report.startswith("rank 1 failed: ValueError: message line 0\n"), report
    assert "message line 19\n" in report and "message line 20\n" not in report, report
    assert re.search(r"\n\.\.\. \([\d,]+ more characters of the message: it is whole in \.failures\)\n", report), report
    assert len(report) < 3000, len(report)
    assert "message line 499" in info.value.failures[1]
