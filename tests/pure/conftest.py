"""Tests here start no ranks: a test that tries (``rs.spawn``, ``mpirun``, ``torchrun``, a command
that starts its own) fails with ``StartedRanks``, so the folder keeps its promise of a fast run
with no process of reshard's own."""

from __future__ import annotations

import multiprocessing.context
import subprocess

import pytest


class StartedRanks(BaseException):
    """Raised where a test in tests/pure would start a rank (BaseException: no handler of the
    code under test may turn it into an ordinary error)."""


_LAUNCHERS = ("mpirun", "mpiexec", "torchrun")


@pytest.fixture(autouse=True)
def no_ranks(monkeypatch):
    def refuse_process(process_obj):
        raise StartedRanks("a test in tests/pure started a rank process; it belongs in tests/ranks")

    real_init = subprocess.Popen.__init__

    def checked_init(self, args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        if any(str(a).rsplit("/", 1)[-1] in _LAUNCHERS for a in argv):
            raise StartedRanks(f"a test in tests/pure ran {argv[0]}; it belongs in tests/ranks")
        real_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(multiprocessing.context.ForkServerProcess, "_Popen", staticmethod(refuse_process))
    monkeypatch.setattr(multiprocessing.context.ForkProcess, "_Popen", staticmethod(refuse_process))
    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "_Popen", staticmethod(refuse_process))
    monkeypatch.setattr(subprocess.Popen, "__init__", checked_init)
