"""Which engines can run here, found without importing their libraries."""

from __future__ import annotations

ENGINES = ("gloo", "nccl", "mpi")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here, found without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# The library each engine needs, and the extra that installs it.
ENGINE_NEEDS = {"gloo": ("torch", "torch"), "nccl": ("torch", "torch"), "mpi": ("mpi4py", "mpi")}


def missing_for(engine: str) -> str | None:
    """One line naming what to install when ``engine``'s library is missing; None when present."""
    module, extra = ENGINE_NEEDS[engine]
    if installed(module):
        return None
    how = ("install torch from the channel that matches your hardware (reshard's [torch] extra)" if module == "torch"
           else f"pip install {module} (reshard's [{extra}] extra)")
    return f"engine {engine!r} needs {module}, which is not installed: {how}"


def unusable(engine: str) -> str | None:
    """Why ``engine`` cannot start here, or None: its library is not installed, or (NCCL) the
    installed torch is a build without it (which imports torch)."""
    return missing_for(engine) or (_nccl_missing() if engine == "nccl" else None)


def _nccl_missing() -> str | None:
    """Why NCCL cannot run here though torch is installed (a torch build without it), or None."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_nccl_available():
        return None
    return (f"engine 'nccl' needs a torch build with NCCL (a CUDA build), and torch {torch.__version__} has none: "
            "use engine='gloo' for CPU tensors, or install torch for your CUDA version")


def default_engine() -> tuple[str, str | None]:
    """(engine, note): gloo where torch is installed; else MPI, with a note saying why."""
    if installed("torch") or not installed("mpi4py"):
        return "gloo", None
    return "mpi", "torch is not installed, so the ranks run on MPI (mpi4py)"
