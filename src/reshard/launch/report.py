"""What a job's ranks sent back, turned into the exception ``rs.spawn`` raises.

The exception leads with the root cause: the ranks whose own code failed (or that ended, or
returned while others waited for them), with their exception and the job's own frames; then
one line for each group of ranks that stopped because of them. When every rank raised the same
``ReshardError`` subclass, the exception is also an instance of that subclass. Each rank's whole
report stays in ``failures``.
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import errors, settings
from ..errors import CommTimeout, RankFailed, ReshardError, on_every_rank, ranks_text
from ..execution import activity
from ..execution.tracebacks import PACKAGES_DIRS, STDLIB_DIRS, is_reshard_frame

_LIBRARIES = STDLIB_DIRS + PACKAGES_DIRS


@dataclass(frozen=True)
class RankError:
    """A rank's exception, as it travels back.

    ``text``: the whole traceback; ``reshard_class`` and ``message``: the reshard error class
    (its name in ``reshard.errors``) and message when it was one; ``summary``: ``Type: message``;
    ``frames``: the traceback without reshard's own frames, ``all_frames`` with them (as
    ``RESHARD_TRACEBACK=1`` shows it); ``site``: the job's innermost frame
    (``file:line in function``) with its source line; ``consequence``: it only reports that a
    peer failed (a ``RankFailed`` or ``CommTimeout`` raised inside the rank); ``blames``: the
    peers it names as gone."""

    text: str
    reshard_class: str | None = None
    message: str = ""
    summary: str = ""
    frames: str = ""
    all_frames: str = ""
    site: str = ""
    consequence: bool = False
    blames: tuple[int, ...] = field(default_factory=tuple)


def _is_library_frame(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_LIBRARIES)


def job_site(frames: Sequence[traceback.FrameSummary]) -> str:
    """The job's innermost frame as ``file:line in function`` and its source line."""
    own = [f for f in frames if not _is_library_frame(f.filename)] or list(frames)
    if not own:
        return ""
    f = own[-1]
    source = f"\n    {f.line.strip()}" if f.line else ""
    return f"{f.filename}:{f.lineno} in {f.name}{source}"


def rank_error(exc: BaseException, rank: int, what: str = "") -> RankError:
    """``exc`` (being handled on ``rank``) as it goes back to the parent."""
    text = f"{type(exc).__name__} on rank {rank}{what}\n{traceback.format_exc()}"
    name = type(exc).__name__
    message = str(exc)
    every = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in every if not is_reshard_frame(f.filename)]
    summary = f"{name}: {message}" if message else name
    consequence = isinstance(exc, (RankFailed, CommTimeout))
    blames = tuple(exc.ranks) if isinstance(exc, RankFailed) else ()
    cls = name if isinstance(exc, ReshardError) and getattr(errors, name, None) is type(exc) else None
    return RankError(text, cls, message if cls else "", summary, "".join(traceback.format_list(frames)),
                     "".join(traceback.format_list(every)), job_site(frames), consequence, blames)


def encode(status: str, value: object, rank: int) -> tuple[str, bytes]:
    """A rank's report as (status, bytes): a result that cannot be pickled becomes an error."""
    try:
        return status, pickle.dumps((status, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # e.g. a return value that cannot be pickled
        text = f"rank {rank}: could not send its return value back: {type(exc).__name__}: {exc}"
        note = RankError(text, summary=text)
        return "error", pickle.dumps(("error", note), protocol=pickle.HIGHEST_PROTOCOL)


def job_failed(
    size: int, failures: dict[int, str], stopped: Sequence[int], raised: dict[int, RankError],
    seen: dict[int, activity.Seen | None] | None = None, returned: Iterable[int] = (),
) -> RankFailed:
    """The exception for a job whose ranks ``failures`` failed.

    ``stopped``: ranks stopped by the launcher because another failed first; ``raised``: the
    exceptions ranks reported themselves; ``seen``: where each rank was; ``returned``: ranks
    that returned their result (named as culprits where a peer failed waiting for them)."""
    seen = seen or {}
    returned = set(returned)
    for r, err in raised.items():
        where = seen.get(r)
        if where is not None and err.reshard_class == "CommTimeout":
            failures[r] = f"{failures[r].rstrip()}\n(rank {r}: {where.describe()})"
    full = settings.read("RESHARD_TRACEBACK")
    classes = {raised[r].reshard_class for r in raised}
    if len(raised) == size and len(classes) == 1 and None not in classes and not all(
        raised[r].consequence for r in raised
    ):
        return _same_everywhere(size, raised, failures, classes.pop(), full)

    # The culprits: ranks that raised of their own accord or ended; then those returned ranks
    # that a stopped peer names; failing both (every rank timed out, say), every failed rank.
    own = {r for r in failures if r not in stopped and not (r in raised and raised[r].consequence)}
    blamed = {q for r in raised if raised[r].consequence for q in raised[r].blames}
    early = sorted(q for q in blamed & returned if q not in own)
    culprits = sorted(own | set(early)) or sorted(failures)
    for q in early:
        failures[q] = f"rank {q} returned after {_calls(seen.get(q))} while its peers waited for it"
    lines = [_returned_head(early, sorted(r for r in failures if r not in culprits), seen, raised)] if early else []
    for text, ranks in _grouped({r: _cause(r, raised, failures, full) for r in culprits if r not in early}):
        lines.append(f"{ranks_text(ranks)} {text}" if text.startswith("failed: ") else _with_ranks(ranks, text))
    followers = {r: _stopped_line(r, culprits, early, raised, failures, seen) for r in sorted(failures) if r not in culprits}
    for text, ranks in _grouped(followers):
        lines.append(_with_ranks(ranks, text))
    if not full and any(err.frames != err.all_frames for err in raised.values()):
        lines.append("(reshard's own frames are left out: RESHARD_TRACEBACK=1 shows them; "
                     "every rank's whole report is in .failures)")
    return RankFailed("\n".join(lines), failures, culprits, sorted(r for r in failures if r not in culprits))


def _same_everywhere(size: int, raised: dict[int, RankError], failures: dict[int, str], name: str,
                     full: bool) -> RankFailed:
    """Every rank raised the same reshard error: its message once per distinct text, and the
    job's line it was raised from."""
    by_message: dict[str, list[int]] = {}
    for r in sorted(raised):
        by_message.setdefault(_without_own_prefix(raised[r].message, r), []).append(r)
    head = f"{name} on every rank ({ranks_text(range(size))})"
    if len(by_message) == 1:
        text = f"{head}: {next(iter(by_message))}"
    else:
        text = head + ":\n" + "\n".join(f"  {_with_ranks(rs, m)}" for m, rs in by_message.items())
    sites = _grouped({r: raised[r].site for r in raised if raised[r].site})
    if full:
        text += "\n" + raised[min(raised)].text.rstrip()
    elif len(sites) == 1:
        text += "\n  raised from " + sites[0][0].replace("\n", "\n  ")
    elif sites:  # the ranks called from different lines (different collectives, say): each group's
        text += "\n  raised from:" + "".join(f"\n  {ranks_text(rs)}: " + site.replace("\n", "\n    ")
                                             for site, rs in sites)
    return on_every_rank(getattr(errors, name))(text, failures, sorted(raised), [])


def _returned_head(early: Sequence[int], waiting: Sequence[int], seen: dict, raised: dict[int, RankError]) -> str:
    """The first line where ranks returned while their peers waited for them, then the job's
    line each group of waiting ranks waited at (from their own tracebacks)."""
    if len(early) > 1:
        head = f"{ranks_text(early)} returned while their peers waited for them"
    else:
        head = f"rank {early[0]} returned after {_calls(seen.get(early[0]))}"
        if waiting:
            verb = "was" if len(waiting) == 1 else "were"
            head += f"; {ranks_text(waiting)} {verb} waiting in {_where(seen.get(waiting[0]))}"
    sites = _grouped({r: raised[r].site for r in waiting if r in raised and raised[r].site})
    for site, ranks in sites:
        head += f"\n  {ranks_text(ranks)} waited at " + site.replace("\n", "\n    ")
    return head


def _cause(r: int, raised: dict[int, RankError], failures: dict[int, str], full: bool) -> str:
    """What went wrong on culprit ``r``, with the job's frames (all frames where ``full``)."""
    err = raised.get(r)
    if err is None:  # it ended, overran or was stopped: the launcher's words
        return _without_own_prefix(failures[r].rstrip(), r)
    head = f"failed: {_fitted(_without_own_prefix(err.summary or err.text.splitlines()[0], r))}"
    frames = err.all_frames if full else err.frames
    body = "".join("\n  " + line for line in frames.rstrip().splitlines())
    return head + body


MESSAGE_LINES, MESSAGE_CHARS = 20, 2000  # of a job's own exception message in the report


def _fitted(message: str) -> str:
    """``message`` cut to ``MESSAGE_LINES`` lines and ``MESSAGE_CHARS`` characters, saying how
    much was left out and where it is, so that one long message cannot bury the report."""
    lines = message.splitlines()
    cut = "\n".join(lines[:MESSAGE_LINES])[:MESSAGE_CHARS]
    if len(lines) <= MESSAGE_LINES and len(message) <= MESSAGE_CHARS:
        return message
    left = len(message) - len(cut)
    return f"{cut}\n... ({left:,} more characters of the message: it is whole in .failures)"


def _stopped_line(r: int, culprits: Sequence[int], early: Sequence[int], raised: dict[int, RankError],
                  failures: dict[int, str], seen: dict) -> str:
    err = raised.get(r)
    blamed = sorted(set(err.blames) & set(culprits)) if err is not None else []
    who = blamed or list(culprits)
    where = seen.get(r)
    if err is None and "did not finish within the timeout" in failures[r]:
        return _without_own_prefix(failures[r], r)
    if where is None or not (where.current or where.last):
        return f"stopped: {ranks_text(who)} ended"
    if who and set(who) <= set(early):
        return f"stopped: {ranks_text(who)} returned while this rank waited in {_where(where)}"
    return f"stopped: {ranks_text(who)} ended during {_where(where)}"


def _where(seen: activity.Seen | None) -> str:
    if seen is None:
        return "a collective"
    return f"{seen.current or seen.last} (call {seen.calls})"


def _calls(seen: activity.Seen | None) -> str:
    n = seen.calls if seen is not None else 0
    return "1 collective call" if n == 1 else f"{n} collective calls"


def _without_own_prefix(text: str, r: int) -> str:
    """``text`` without the ``rank r: `` it may begin with (the report names the ranks itself)."""
    for prefix in (f"rank {r}: ", f"{RankFailed.__name__}: rank {r}: ", f"{CommTimeout.__name__}: rank {r}: "):
        if text.startswith(prefix):
            return text[: len(prefix) - len(f"rank {r}: ")] + text[len(prefix):]
    return text


def _grouped(texts: dict[int, str]) -> list[tuple[str, list[int]]]:
    groups: dict[str, list[int]] = {}
    for r in sorted(texts):
        groups.setdefault(texts[r], []).append(r)
    return [(t, rs) for t, rs in groups.items()]


def _with_ranks(ranks: Sequence[int], text: str) -> str:
    """``ranks: text``, unless the launcher's text names its rank already (``rank 1 ended ...``)."""
    return f"{ranks_text(ranks)}: {text}" if not text.startswith("rank ") else text
