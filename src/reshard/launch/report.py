"""What a job's ranks sent back, turned into the exception ``rs.spawn`` raises: one that names
the ranks and says why each failed, and that is also the ``ReshardError`` subclass every rank
raised when they all raised the same one."""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from .. import activity, errors
from ..errors import RankFailed, ReshardError, on_every_rank


@dataclass(frozen=True)
class RankError:
    """A rank's exception, as it travels back: the traceback, and the reshard error class
    (its name in ``reshard.errors``) and message when it was one."""

    text: str
    reshard_class: str | None = None
    message: str = ""


def rank_error(exc: BaseException, rank: int, what: str = "") -> RankError:
    """``exc`` (being handled on ``rank``) as it goes back to the parent."""
    text = f"{type(exc).__name__} on rank {rank}{what}\n{traceback.format_exc()}"
    name = type(exc).__name__
    if isinstance(exc, ReshardError) and getattr(errors, name, None) is type(exc):
        return RankError(text, name, str(exc))
    return RankError(text)


def encode(status: str, value: object, rank: int) -> tuple[str, bytes]:
    """A rank's report as (status, bytes): a result that cannot be pickled becomes an error."""
    try:
        return status, pickle.dumps((status, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # e.g. a return value that cannot be pickled
        note = RankError(f"rank {rank}: could not send its return value back: {type(exc).__name__}: {exc}")
        return "error", pickle.dumps(("error", note), protocol=pickle.HIGHEST_PROTOCOL)


def job_failed(
    size: int, failures: dict[int, str], stopped: Sequence[int], raised: dict[int, RankError],
    seen: dict[int, activity.Seen | None] | None = None,
) -> RankFailed:
    """The exception for a job whose ranks ``failures`` failed (``stopped``: stopped because
    another failed first); ``raised``: the exceptions ranks reported themselves; ``seen``: where
    each rank was, added to the report of each rank that raised a timeout."""
    for r, err in raised.items():
        where = (seen or {}).get(r)
        if where is not None and err.reshard_class == "CommTimeout":
            failures[r] = f"{failures[r].rstrip()}\n(rank {r}: {where.describe()})"
    classes = {raised[r].reshard_class for r in raised}
    if len(raised) == size and len(classes) == 1 and None not in classes:
        name = classes.pop()
        by_message: dict[str, list[int]] = {}
        for r in sorted(raised):
            by_message.setdefault(raised[r].message, []).append(r)
        head = f"{name} on every rank ({_ranks(range(size))})"
        if len(by_message) == 1:
            text = f"{head}: {next(iter(by_message))}"
        else:
            text = head + ":\n" + "\n".join(f"  {_ranks(rs)}: {m}" for m, rs in by_message.items())
        return on_every_rank(getattr(errors, name))(text, failures)
    causes = {r: t for r, t in failures.items() if r not in stopped}
    head = f"{len(causes)} of {size} ranks failed: " + ", ".join(f"rank {r}" for r in sorted(causes))
    if stopped:
        head += f" (stopped afterwards: {', '.join(f'rank {r}' for r in sorted(stopped))})"
    body = "\n".join(f"--- rank {r} ---\n{causes[r].rstrip()}" for r in sorted(causes))
    body += "".join(f"\n--- rank {r} (stopped) ---\n{failures[r].rstrip()}" for r in sorted(stopped))
    return RankFailed(f"{head}\n{body}", failures)


def _ranks(ranks: Sequence[int] | range) -> str:
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
