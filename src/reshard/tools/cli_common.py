"""What the CLI's commands share: reading shapes and placements from the command line, and the
terminal they print to."""

from __future__ import annotations

import argparse
import math
from typing import Any

from ..errors import InvalidArgument
from ..planning.layout import check_spec_dims, parse_placement, parse_placements


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(part) for part in text.lower().replace("*", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read shape {text!r}: write it like 6x6 or 7x5") from None
    if not dims or any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"shape {text!r} needs non-negative sizes")
    return dims


def parse_mesh_shape(text: str) -> tuple[int, ...]:
    """A process mesh's shape, ``2x2``: every dim at least 1."""
    dims = parse_shape(text)
    if any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(f"mesh {text!r} needs sizes of at least 1")
    return dims


def parse_shapes(text: str) -> tuple[tuple[int, ...], ...]:
    """One or more shapes, comma-separated: ``8x8`` or ``8x8,16x4,32``."""
    return tuple(parse_shape(part) for part in text.split(",") if part.strip())


def placement(text: str, option: str, ndim: int | None = None):
    """``--src``/``--dst``'s text as a placement; ``InvalidArgument`` naming the option (read
    after parsing, since the same options take one placement per mesh dim with ``--mesh``);
    ``ndim``: the tensor's dims, which a Spec may not pass."""
    if ndim is not None:
        check_spec_dims(text, ndim, option)
    try:
        return parse_placement(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{option}: {exc}") from None


def mesh_placements(text: str, option: str, mesh_ndim: int | None = None, ndim: int | None = None) -> tuple:
    """``--src``/``--dst``'s text on a mesh (one placement per mesh dim, or a Spec) as a
    placements tuple; ``InvalidArgument`` naming the option; ``ndim`` as ``placement``'s."""
    if ndim is not None:
        check_spec_dims(text, ndim, option)
    try:
        placements = parse_placements(text, mesh_ndim)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{option}: {exc}") from None
    if mesh_ndim is not None and len(placements) != mesh_ndim:
        count = len(placements)
        raise InvalidArgument(f"{option} has {count} placement{'' if count == 1 else 's'} for a {mesh_ndim}-d mesh")
    return placements


def layout_text(text: str) -> str:
    """An argparse type for ``--src`` / ``--dst``: any text but a blank one (which would
    otherwise read as the option left out, its default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("needs a placement (row, col, replicate, partial, Shard(d), or a Spec), "
                                         "got an empty string")
    return text


def positive(text: str) -> int:
    return at_least(1)(text)


def at_least(least: int):
    """An argparse type: an integer of at least ``least``."""
    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"needs at least {least}, got {value}")
        return value
    return read


def number(text: str, zero: bool) -> float:
    """A finite float, above zero (or at least zero with ``zero``), for argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(f"needs a finite number {'of at least 0' if zero else 'above 0'}, got {text}")
    return value


def positive_number(text: str) -> float:
    """A finite float above zero: seconds, bandwidths."""
    return number(text, zero=False)


def non_negative_number(text: str) -> float:
    """A finite float of at least zero: the cost model's seconds per message or per byte."""
    return number(text, zero=True)


PIPED_WIDTH = 100  # columns of output to a pipe or a file when COLUMNS does not say


def make_console(no_color: bool = False, stderr: bool = False):
    """The console the commands print to: a terminal's own width (``COLUMNS`` where set);
    piped, ``COLUMNS`` or ``PIPED_WIDTH``, so that logs read as they would in a terminal."""
    import os

    from rich.cells import cell_len
    from rich.console import Console

    from ..viz.text import fit_line

    class FittingConsole(Console):
        """A console whose plain lines that do not fit break after a clause, indented, rather
        than wherever the width runs out (a number apart from its unit)."""

        def print(self, *objects: Any, **kwargs: Any) -> None:
            if len(objects) == 1 and isinstance(objects[0], str) and "[/" not in objects[0]:
                objects = ("\n".join(fit_line(line, self.width, cell_len) for line in objects[0].split("\n")),)
            super().print(*objects, **kwargs)

    console = FittingConsole(highlight=False, soft_wrap=False, no_color=no_color or None, stderr=stderr)
    if not console.is_terminal:
        columns = os.environ.get("COLUMNS", "")
        console.width = int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH
    return console


SMALL_PLAN_RANKS = 256  # above this a 1-D plan is summed up without listing its transfers
