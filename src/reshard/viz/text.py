"""Numbers and lines as people read them."""

from __future__ import annotations

import re
from collections.abc import Callable

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")


def human_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``, ``1048576 -> '1 MiB'``, ``32 -> '32 B'`` (binary units, up to YiB)."""
    for unit in _BYTE_UNITS:
        if n < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# a number and the unit after it stay on one line
_NUMBER_UNIT = re.compile(rf"(\d) ({'|'.join(_BYTE_UNITS)}|MB|GB|TB|GB/s|ms|us|µs|s|x|ranks?|rows?|cols?|hosts?)\b")
_KEEP = "\ue000"  # an unbreakable space while lines are measured (one cell wide, as the space)


def fit_line(line: str, width: int, cells: Callable[[str], int] = len) -> str:
    """``line`` broken into lines of at most ``width`` cells (``cells`` measures a piece): after
    ``; `` or ``, `` where it can, else between words, never between a number and its unit nor
    inside a short bracketed group (``(Shard(1), Shard(0))``); continuation lines indented four
    more than the first. A line that fits comes back as it is."""
    if cells(line) <= width:
        return line
    lead = len(line) - len(line.lstrip(" "))
    indent = " " * min(lead + 4, max(0, width // 3))
    kept = _short_groups_whole(_NUMBER_UNIT.sub(lambda m: m.group(1) + _KEEP + m.group(2), line[lead:]))
    phrases = re.split(r"(?<=[;,]) ", kept)  # clauses first, then words where a clause is too long
    out, current = [], " " * lead
    for phrase in phrases:
        for word in phrase.split(" ") if cells(indent + phrase) > width else [phrase]:
            sep = "" if current.strip() == "" else " "
            if current.strip() and cells(current + sep + word) > width:
                out.append(current.rstrip())
                current, sep = indent, ""
            current += sep + word
    out.append(current.rstrip())
    return "\n".join(out).replace(_KEEP, " ")


SHORT_GROUP = 40  # a bracketed group up to this long stays on one line


def _short_groups_whole(text: str) -> str:
    """``text`` with the spaces of each outermost (...) or [...] group of at most ``SHORT_GROUP``
    characters made unbreakable."""
    out, depth, start = list(text), 0, -1
    for i, ch in enumerate(text):
        if ch in "([":
            if depth == 0:
                start = i
            depth += 1
        elif ch in ")]" and depth:
            depth -= 1
            if depth == 0 and i - start < SHORT_GROUP:
                out[start:i] = [_KEEP if c == " " else c for c in out[start:i]]
    return "".join(out)
