"""``reshard ARGS`` run in the test process: the command line parsed and run by ``cli.main``,
its output captured, its ranks real processes started by the same ``rs.spawn`` (whose fork
server this process keeps warm, so a run does not import torch again). Tests of what only a
separate process shows (a pipe's plain output, a hidden library, ``python -m``) start one."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from unittest import mock

from reshard import cli


def reshard_cli(*args: str, columns: int | None = 200) -> subprocess.CompletedProcess:
    """``reshard *args`` as a finished process: its exit code, stdout and stderr.
    ``columns``: the terminal width the output is laid out for (None: a plain pipe's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse's own exits (a bad option, --help)
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(["reshard", *args], code, out.getvalue(), err.getvalue())
