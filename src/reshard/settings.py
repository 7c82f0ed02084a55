"""Every ``RESHARD_*`` environment variable, read one way: the table below is what the docs
(``docs/settings.md``) and ``reshard doctor`` list, and a bad value raises ``InvalidArgument``
naming the variable. Pure: imports no engine and no array library.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument

NEVER_BYTES = 1 << 62  # any larger byte count means "never"; it must still fit an int64


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1/0, true/false, yes/no or on/off")


def _seconds(raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError("must be a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive, finite number of seconds")
    return value


def check_seconds(name: str, value: Any) -> float:
    """``value`` as seconds to wait (a positive, finite number), else ``InvalidArgument`` naming ``name``."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{name} must be a number of seconds, got the bool {value!r}")
    try:
        return _seconds(value)
    except ValueError as exc:
        raise InvalidArgument(f"{name} {exc}, got {value!r}") from None


_BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes(raw: str) -> int:
    """``4096``, ``64K``, ``8GiB``, ``1 MB``: a whole number of bytes, units powers of 1024."""
    found = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:I?B)?", raw.strip().upper())
    if found is None:
        raise ValueError("must be a whole number of bytes (0 or more), optionally with K, M, G or T "
                         "(powers of 1024: 64K, 8GiB)")
    return min(int(found[1]) * _BYTE_UNITS[found[2]], NEVER_BYTES)


@dataclass(frozen=True)
class Variable:
    """One variable: its name, what it means, its default and how its text is read."""

    name: str
    meaning: str
    default: Any
    parse: Callable[[str], Any]
    set_by_reshard: bool = False  # written by rs.spawn for its ranks, read by the user's code
    default_text: str | None = None  # a default that depends on the machine (``default`` is None), in words


VARIABLES: tuple[Variable, ...] = (
    Variable("RESHARD_TIMEOUT", "seconds every collective may wait for its peers before raising CommTimeout "
             "(rs.init; rs.spawn passes its own timeout)", 300.0, _seconds),
    Variable("RESHARD_CHECK", "0 turns off the cross-rank agreement check of repeated calls by default "
             "(as rs.init(check=False) or rs.spawn(check=False))", True, _flag),
    Variable("RESHARD_SHM", "0 keeps every pair this rank belongs to on the engine's messages "
             "(no shared memory between same-host gloo ranks)", True, _flag),
    Variable("RESHARD_SHM_MIN_BYTES", "the smallest message that goes through shared memory; a pair takes the "
             f"larger of its two settings; {NEVER_BYTES} or more means never. Unset: every message on x86-64, "
             "where the notes saying where a message lies go through shared memory too; 1048576 elsewhere, "
             "where they go as gloo messages", None, _bytes, default_text="0 on x86-64, 1048576 elsewhere"),
    Variable("RESHARD_ARENA", "0 keeps results out of the shared arena: every exchange moves by the engine's own "
             "path (two copies on one host instead of one); a call's arena=False does the same for that call",
             True, _flag),
    Variable("RESHARD_ARENA_BYTES", "the cap on this process's shared arena; past it, results come from ordinary "
             "memory (warned once)", None, _bytes, default_text="half of this machine's memory"),
    Variable("RESHARD_ARENA_MIN_BYTES", "the smallest exchange (the tensor's bytes over its ranks) that uses the "
             f"shared arena; below it the engine's own path is faster; {NEVER_BYTES} or more means never",
             1 << 20, _bytes),
    Variable("RESHARD_TRACEBACK", "1 keeps reshard's own frames in the tracebacks of the errors its calls raise "
             "and in those rs.spawn reports for its ranks (by default a traceback ends at the line that called "
             "reshard)", False, _flag),
    Variable("RESHARD_RANK_PREFIX", "0 passes the output of the ranks rs.spawn starts on as it is, without the "
             "[rank N] in front of each line", True, _flag),
    Variable("RESHARD_RANK", "this rank's index, set by rs.spawn for the ranks it starts", None, int,
             set_by_reshard=True),
    Variable("RESHARD_WORLD_SIZE", "the number of ranks, set by rs.spawn for the torch ranks it starts", None, int,
             set_by_reshard=True),
)
BY_NAME = {v.name: v for v in VARIABLES}


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of ``name`` (its default when unset or blank); ``InvalidArgument``
    naming the variable when its text cannot be read."""
    var = BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw.strip() == "":
        return var.default
    try:
        return var.parse(raw)
    except ValueError as exc:
        raise InvalidArgument(f"environment variable {name}={raw!r}: {exc}") from None


def check_set(environ: Mapping[str, str] | None = None) -> None:
    """Read every setting that is set, so that a value that cannot be read fails when a job
    starts (``InvalidArgument`` naming each such variable), not at the first call that reads it."""
    env = os.environ if environ is None else environ
    wrong = []
    for var in VARIABLES:
        if var.set_by_reshard or var.name not in env:
            continue
        try:
            read(var.name, env)
        except InvalidArgument as exc:
            wrong.append(str(exc))
    if wrong:
        raise InvalidArgument("; ".join(wrong))


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """``RESHARD_*`` variables that are set but mean nothing to reshard (a typo, or one it dropped)."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("RESHARD_") and k not in BY_NAME)


def current(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Every variable that is set: its text, and its parsed value or what is wrong with it."""
    env = os.environ if environ is None else environ
    out: dict[str, dict[str, Any]] = {}
    for var in VARIABLES:
        if var.name not in env:
            continue
        entry: dict[str, Any] = {"text": env[var.name]}
        try:
            entry["value"] = read(var.name, env)
        except InvalidArgument as exc:
            entry["error"] = str(exc)
        out[var.name] = entry
    for name in unknown(env):
        out[name] = {"text": env[name], "error": f"{name} is not a reshard setting"}
    return out
