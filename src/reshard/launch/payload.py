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
import linecache
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import cloudpickle

from ..errors import InvalidArgument


def pack(fn: Any, args: tuple) -> bytes:
    """``fn`` and ``args`` for the ranks, with where the caller's main module's code lives:
    cloudpickle names code it sends by value ``<dynamic-code>``, and a rank's traceback should
    show the job's own file, line and source."""
    files = _main_code_files(fn)
    sources = {name: linecache.getlines(name) for name in set(files.values())}
    try:
        return cloudpickle.dumps((fn, args, files, sources))
    except Exception as exc:
        raise InvalidArgument(f"fn and args must be picklable to reach the ranks, but {fn!r}: {exc}") from None


def unpack(packed: tuple) -> tuple[Any, tuple]:
    """In a rank: ``(fn, args)`` from ``pack``'s tuple, the job's code named by its own files."""
    fn, args, files, sources = packed
    for name, lines in sources.items():
        if lines:
            linecache.cache[name] = (sum(map(len, lines)), None, lines, name)  # None: never reread
    if files:
        seen: set[int] = set()
        _rename(fn, files, seen)
        for value in list(getattr(fn, "__globals__", {}).values()):
            _rename(value, files, seen)
    return fn, args


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _main_code_files(fn: Any) -> dict[tuple[str, int], str]:
    """(name, first line) -> file of every code object of the main module's functions and of ``fn``."""
    main = sys.modules.get("__main__")
    values = [fn, *(vars(main).values() if main is not None else ())]
    files: dict[tuple[str, int], str] = {}
    for value in values:
        for func in _functions(value):
            if func.__module__ == "__main__":
                for code in _codes(func.__code__):
                    files[(code.co_name, code.co_firstlineno)] = code.co_filename
    return files


def _functions(value: Any) -> list[types.FunctionType]:
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type) and value.__module__ == "__main__":
        return [v for v in vars(value).values() if isinstance(v, types.FunctionType)]
    return []


def _rename(value: Any, files: dict[tuple[str, int], str], seen: set[int]) -> None:
    for func in _functions(value):
        if id(func) not in seen and func.__code__.co_filename == "<dynamic-code>":
            seen.add(id(func))
            func.__code__ = _renamed(func.__code__, files)


def _renamed(code: types.CodeType, files: dict[tuple[str, int], str]) -> types.CodeType:
    consts = tuple(_renamed(c, files) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    name = files.get((code.co_name, code.co_firstlineno), code.co_filename)
    return code.replace(co_filename=name, co_consts=consts)


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
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read())
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
