"""`reshard doctor`: what it reports is checked against the libraries themselves, it imports no
torch, and it exits non-zero exactly when something asked for cannot work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mpi4py
import numpy
import pytest
import torch

import reshard

HAS_CUDA = torch.cuda.is_available()


def doctor(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RESHARD_", "OMPI_", "PMI", "TORCHELASTIC"))
               and k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-m", "reshard", "doctor", *args], capture_output=True, text=True,
                          timeout=timeout, env=environ | (env or {}))


def doctor_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    run = doctor("--json", *args, env=env)
    assert run.stdout.strip(), run.stderr
    return run.returncode, json.loads(run.stdout)


def test_versions_are_the_installed_ones():
    code, report = doctor_json()
    assert code == 0, report["problems"]
    libs = report["libraries"]
    assert report["reshard"]["version"] == reshard.__version__
    assert libs["numpy"] == numpy.__version__
    assert libs["torch"] == torch.__version__
    assert libs["torch_cuda"] == torch.version.cuda
    assert libs["mpi4py"] == mpi4py.__version__
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert libs["mpi_library"] and "MPI" in libs["mpi_library"]


def test_engines_as_torch_itself_sees_them():
    _, report = doctor_json()
    engines = report["engines"]
    assert engines["gloo"]["works"] is torch.distributed.is_gloo_available()
    assert engines["mpi"]["works"] is True and engines["mpi"]["launcher"].endswith(("mpirun", "mpiexec"))
    assert engines["nccl"]["works"] is (HAS_CUDA and torch.distributed.is_nccl_available())
    if not HAS_CUDA:
        assert "CUDA" in engines["nccl"]["why"]


def test_doctor_prints_no_trailing_blanks_or_control_characters():
    # Open MPI's version string ends in a NUL; lines padded to the width read badly when pasted
    run = doctor("--no-color", "--ranks", "2", env={"COLUMNS": "100"})
    assert run.returncode == 0, run.stdout + run.stderr
    for line in run.stdout.splitlines():
        assert line == line.rstrip() and line.isprintable(), repr(line)
    assert "1 pair of ranks shares memory" in run.stdout and "1 pairs" not in run.stdout, run.stdout


def test_doctor_does_not_import_torch():
    probe = "import sys; from reshard.tools.doctor import collect; collect(); print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "False", run.stdout + run.stderr


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is visible, so NCCL may work here")
def test_an_engine_asked_for_that_cannot_work_exits_non_zero():
    run = doctor("--engine", "nccl", "--no-color")
    assert run.returncode == 1
    assert "problem: engine 'nccl' was asked for and cannot work here" in run.stdout
    assert "Engines" in run.stdout and "Versions" in run.stdout


def test_settings_are_shown_parsed_and_bad_ones_are_problems():
    code, report = doctor_json(env={"RESHARD_TIMEOUT": "12.5", "RESHARD_SHM": "off"})
    assert code == 0
    assert report["settings"]["RESHARD_TIMEOUT"] == {"text": "12.5", "value": 12.5}
    assert report["settings"]["RESHARD_SHM"] == {"text": "off", "value": False}
    assert report["shared_memory"] == {"available": False, "why": "RESHARD_SHM=0 turns it off"}
    assert report["shared_arena"] == {"available": False, "why": "RESHARD_SHM=0 turns shared memory off"}
    code, report = doctor_json(env={"RESHARD_SHM_MIN_BYTES": "1.5MB", "RESHARD_TIMOUT": "5"})
    assert code == 1
    problems = "\n".join(report["problems"])
    assert "RESHARD_SHM_MIN_BYTES='1.5MB': must be a whole number of bytes" in problems
    assert "RESHARD_TIMOUT is not a reshard setting" in problems


@pytest.mark.parametrize("env,name,rank,size", [
    ({}, "none", None, None),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "mpirun (Open MPI)", 1, 2),
    ({"RANK": "3", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}, "torchrun", 3, 4),
])
def test_the_launcher_is_named(env, name, rank, size):
    _, report = doctor_json(env=env)
    assert report["launcher"].get("name") == name
    assert report["launcher"].get("rank") == rank and report["launcher"].get("size") == size


def test_ranks_run_a_real_exchange_on_each_engine():
    code, report = doctor_json("--ranks", "3", env={"RESHARD_SHM": "1"})
    assert code == 0, report["problems"]
    trials = {t["engine"]: t for t in report["trials"]}
    assert set(trials) == {"gloo", "mpi"} and all(t["works"] and t["ranks"] == 3 for t in trials.values())
    assert trials["gloo"]["shared_memory_peers"] == {"0": [1, 2], "1": [0, 2], "2": [0, 1]}


def test_the_shared_arena_is_tried_and_its_settings_shown():
    code, report = doctor_json(env={"RESHARD_ARENA_BYTES": "1048576", "RESHARD_ARENA_MIN_BYTES": "4096"})
    assert code == 0
    from reshard.engines import arena as arena_mod

    if arena_mod.why_not() is None:
        arena = report["shared_arena"]
        huge = {"huge_pages": arena.pop("huge_pages"), "why": arena.pop("huge_pages_why")}
        assert arena == {"available": True, "why": None, "cap_bytes": 1048576, "min_bytes": 4096}
        # the kernel's own setting, read here: its bracketed choice is named, and "never" means none
        setting = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        if setting.exists() and "[inherit]" in Path(setting.parent, "hugepages-2048kB/shmem_enabled").read_text():
            choice = setting.read_text().split("[")[1].split("]")[0]
            assert huge["why"] == f"shmem_enabled is {choice}"
            assert huge["huge_pages"] == (choice not in ("never", "deny"))
        text = doctor("--no-color", env={"COLUMNS": "200"}).stdout
        assert "huge pages" in text and ("yes, for the arena" in text) == huge["huge_pages"], text
        sized = doctor("--no-color", env={"COLUMNS": "200", "RESHARD_ARENA_BYTES": "1048576",
                                          "RESHARD_ARENA_MIN_BYTES": "4096"}).stdout
        assert "results of 4 KiB per rank and up" in sized and "(cap 1 MiB)" in sized, sized
    code, report = doctor_json(env={"RESHARD_ARENA": "0"})
    assert report["shared_arena"] == {"available": False, "why": "RESHARD_ARENA=0 turns it off"}


def test_a_trial_on_one_rank_says_rank_not_ranks():
    run = doctor("--no-color", "--ranks", "1", "--engine", "mpi")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "A real exchange on 1 mpi rank\n" in run.stdout, run.stdout
