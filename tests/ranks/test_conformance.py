"""Every op on real local ranks, on every engine present, checked bit for bit against the
numpy oracle. The case list is the same for every engine (cases.py); only the runner's engine
changes.

One job per (engine, world size) runs every case (a few hundred), so the suite stays fast;
each case is still its own test item, passing or failing on its own.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import numpy as np
import pytest

import reshard as rs
from tests.helpers.cases import all_cases, case_id
from tests.helpers.conformance import (
    run_cases,
    run_cases_on_gloo_messages,
    run_cases_one_call,
    run_cases_started_async,
    run_cases_without_torch,
)
from tests.helpers.oracle import reduce_in_order

WORLD_SIZES = (1, 2, 3, 4)
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None
# "mpi-notorch": the MPI engine in rank processes where `import torch` fails (numpy alone).
# "gloo-one-call": gloo moving each op's pieces in one all_to_all_single, as NCCL does, rather
# than in its own point-to-point messages. "gloo-messages": every message as gloo's own, as
# between hosts (on one host they go through shared memory: engines.shm), torch inputs only
# (numpy inputs become tensors before gloo, as the plain "gloo" runs show). "*-async": every call started with
# async_op=True and its handle waited for (one world size: the worker runs the same code).
# The variants of gloo's path (one call, gloo's messages) run on 4 ranks, MPI on 1, 2 and 4
# (3 ranks on gloo and MPI without torch).
ENGINES = ("gloo", "gloo-one-call", "gloo-messages", "mpi", "mpi-notorch", "gloo-async", "mpi-async")
KINDS = {"gloo": ("torch", "numpy"), "gloo-one-call": ("torch",), "gloo-messages": ("torch",),
         "mpi": ("torch", "numpy"), "mpi-notorch": ("numpy",), "gloo-async": ("torch", "numpy"),
         "mpi-async": ("torch", "numpy")}
SIZES = {"gloo-async": (3,), "mpi-async": (2,), "gloo-one-call": (4,), "gloo-messages": (4,), "mpi": (1, 2, 4)}
NO_TORCH_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "no_torch")


@functools.cache
def results_for(engine: str, n: int) -> tuple[list[dict], list[list]]:
    cases = all_cases(n, KINDS[engine])
    if engine == "mpi-notorch":
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = NO_TORCH_DIR + (os.pathsep + old if old else "")
        try:
            per_rank = rs.spawn(run_cases_without_torch, n, engine="mpi", args=(cases,), timeout=600)
        finally:
            os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
    elif engine.endswith("-async"):
        per_rank = rs.spawn(run_cases_started_async, n, engine=engine.removesuffix("-async"), args=(cases,),
                            timeout=600)
    elif engine == "gloo-one-call":
        per_rank = rs.spawn(run_cases_one_call, n, engine="gloo", args=(cases,), timeout=600)
    elif engine == "gloo-messages":
        os.environ["RESHARD_SHM"] = "0"
        try:
            per_rank = rs.spawn(run_cases_on_gloo_messages, n, engine="gloo", args=(cases,), timeout=600)
        finally:
            del os.environ["RESHARD_SHM"]
    else:
        per_rank = rs.spawn(run_cases, n, engine=engine, args=(cases,), timeout=600)
    return cases, per_rank


def _params():
    for engine in ENGINES:
        marks = [] if engine.startswith("gloo") or HAVE_MPI else [pytest.mark.skip(reason="mpi4py is not installed")]
        for n in SIZES.get(engine, WORLD_SIZES):
            for i, case in enumerate(all_cases(n, KINDS[engine])):
                yield pytest.param(engine, n, i, id=f"{engine}-N{n}-{i}-{case_id(case)}", marks=marks)


@pytest.mark.parametrize("engine,n,index", list(_params()))
def test_case(engine: str, n: int, index: int) -> None:
    cases, per_rank = results_for(engine, n)
    outcomes = [per_rank[r][index] for r in range(n)]
    if any(isinstance(o, tuple) for o in outcomes):  # Partial destination: reduce in the parent
        assert all(isinstance(o, tuple) for o in outcomes), outcomes
        src = cases[index]["dst"]
        op = src[1] if len(src) > 1 else "sum"
        total = reduce_in_order([o[1] for o in outcomes], op)
        want = outcomes[0][2]
        assert total.shape == want.shape and np.array_equal(total.view(np.uint8), want.view(np.uint8))
        return
    failures = {r: o for r, o in enumerate(outcomes) if o is not None}
    assert not failures, "\n".join(f"rank {r}: {o}" for r, o in failures.items())


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py is not installed")
def test_a_one_element_piece_of_a_strided_input_moves_on_gloo() -> None:
    """A tensor of one element counts as contiguous whatever its stride: the rank holding one
    element of a strided input sends it as any other piece (here through shared memory)."""
    cases = [dict(op="all_to_all", shape=(8,), s=0, c=0, lengths=[3, 0, 4, 1], split=None, dtype="float32",
                  kind=kind, layout="strided") for kind in ("torch", "numpy")]
    assert rs.spawn(run_cases, 4, engine="gloo", args=(cases,), timeout=60) == [[None, None]] * 4


def test_torch_really_blocked_in_numpy_only_ranks() -> None:
    """The numpy-only run means something only if torch truly could not load there."""
    _, per_rank = results_for("mpi-notorch", 2)
    import subprocess

    env = dict(os.environ, PYTHONPATH=NO_TORCH_DIR)
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "torch is blocked" in probe.stderr
    assert len(per_rank) == 2
