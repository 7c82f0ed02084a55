"""The tracebacks of the errors reshard's calls raise, without reshard's own frames.

A ``ReshardError`` says in its message what was wrong and on which rank; the frames inside
reshard that led to it tell a caller nothing more, and under mpirun or torchrun every rank
prints them. The calls marked ``@public_call`` cut them out of a ``ReshardError``'s traceback,
as JAX's API boundary does, with those of the standard library reshard ran them through (a
started call's future); the caller's frames stay, and those of code reshard called (a user's
expert function, say). ``RESHARD_TRACEBACK=1`` keeps every frame.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import types
from collections.abc import Callable
from typing import Any, TypeVar

from .. import settings
from ..errors import ReshardError

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the reshard package


def _dirs(*keys: str) -> tuple[str, ...]:
    return tuple({os.path.abspath(p) + os.sep for p in (sysconfig.get_paths().get(k) for k in keys) if p})


STDLIB_DIRS, PACKAGES_DIRS = _dirs("stdlib", "platstdlib"), _dirs("purelib", "platlib")  # the latter may lie inside
_RERAISE_KEEPS_TRACEBACK = sys.version_info >= (3, 11)  # a bare raise re-raises the exception's own __traceback__

F = TypeVar("F", bound=Callable[..., Any])


def is_reshard_frame(filename: str) -> bool:
    return os.path.abspath(filename).startswith(PACKAGE_DIR)


def without_reshard_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` (from a call into reshard down) with the entries of frames inside reshard and the
    standard library left out, the others in order."""
    kept = []
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        stdlib = filename.startswith(STDLIB_DIRS) and not filename.startswith(PACKAGES_DIRS)
        if not filename.startswith(PACKAGE_DIR) and not stdlib:
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def public_call(fn: F) -> F:
    """``fn`` raising its ``ReshardError``s with a traceback that ends at the caller's frames."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ReshardError as exc:
            if exc.__traceback__ is None or settings.read("RESHARD_TRACEBACK"):
                raise
            trimmed = without_reshard_frames(exc.__traceback__)
            if not _RERAISE_KEEPS_TRACEBACK:  # Python 3.10: this frame's line stays in the traceback
                raise exc.with_traceback(trimmed)  # noqa: B904 (the same exception again, its cause kept)
            exc.__traceback__ = trimmed
            raise

    return call  # type: ignore[return-value]
