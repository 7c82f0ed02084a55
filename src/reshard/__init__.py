"""reshard: move sharded tensors between layouts with AllToAll and its neighbour collectives.

The pure layers (placements, plans) import nothing heavy; the collectives import their engine
on first use, so ``import reshard`` stays fast and never pulls in torch by itself.
"""

from __future__ import annotations

import sys
from typing import Any

from .errors import (
    CommTimeout,
    InvalidArgument,
    MismatchError,
    MissingDependency,
    RankFailed,
    ReshardError,
    UnsupportedDType,
)
from .planning import layout, plan
from .planning.layout import (
    Partial,
    Replicate,
    Shard,
    Spec,
    local_shard,
    parse_placement,
    parse_placements,
    shard_sizes,
)
from .version import VERSION

__version__ = VERSION

# The planning modules' former paths, which the docs and users' code name: the same modules
sys.modules.setdefault(f"{__name__}.layout", layout)
sys.modules.setdefault(f"{__name__}.plan", plan)

_LAZY = {
    "all_to_all": "ops", "all_to_all_v": "ops", "all_gather": "ops", "gather": "ops", "reduce_scatter": "ops",
    "all_reduce": "ops", "redistribute": "ops", "last_exchange": "ops",
    "init": "comm", "Comm": "comm", "Mesh": "mesh",
    "spawn": "launch", "Handle": "execution.handles",
    "moe": "moe",
    "fft": "fft",
    "empty": "memory", "empty_like": "memory",
    "mesh_plan": "planning.mesh_plan",
}

__all__ = [
    "Shard", "Replicate", "Partial", "Spec", "shard_sizes", "local_shard", "parse_placement", "parse_placements",
    "ReshardError", "InvalidArgument", "UnsupportedDType", "MismatchError", "RankFailed", "CommTimeout",
    "MissingDependency", "plan",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        value = module if name in ("moe", "fft") else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'reshard' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the calls loaded on first use (what completion offers)."""
    return sorted({*globals(), *__all__})
