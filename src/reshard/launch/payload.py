"""Getting ``fn`` and its arguments to the ranks from wherever ``rs.spawn`` was called.

``fn`` travels by value (cloudpickle) when it lives in ``__main__`` (a script, a notebook, the
REPL, ``python -c``, code on stdin) and by name otherwise, so no rank has to import the
caller's main module. A script that calls ``rs.spawn`` at its top level without
``if __name__ == "__main__":`` is refused before any rank starts: the call would run again in
any process that imports the script (a test runner, ``mpirun`` over the script, multiprocessing).
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle

from ..errors import InvalidArgument


def pack(fn: Any, args: tuple) -> bytes:
    try:
        return cloudpickle.dumps((fn, args))
    except Exception as exc:
        raise InvalidArgument(f"fn and args must be picklable to reach the ranks, but {fn!r}: {exc}") from None


def unguarded_call_site() -> str | None:
    """``'script.py:LINE'`` when the running script reaches this call from its top level,
    outside an ``if __name__ == "__main__":`` block; else None."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or not os.path.isfile(path):
        return None  # a notebook, the REPL, -c or stdin: nothing can import it again
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_guard(node.test):
            if any(child.lineno <= line <= (child.end_lineno or child.lineno) for child in node.body):
                return None
    return f"{path}:{line}"


def _is_main_guard(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


@contextlib.contextmanager
def main_not_imported() -> Iterator[None]:
    """While ranks start: multiprocessing would re-run the caller's main module in each rank
    (or fail on one that is not a file, such as ``<stdin>``); ``fn`` travels by value, so the
    ranks need nothing from it."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        for key in saved:
            main.__dict__[key] = None
        yield
    finally:
        for key, value in saved.items():
            main.__dict__[key] = value
