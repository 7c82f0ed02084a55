"""The cross-rank agreement check: one small fixed-size exchange, no pickle.

Every rank encodes what it was asked to do (op, dtype, device, shape, op arguments, split
sizes, global shape, and its own validation error if any) into a fixed-size byte record. One
all-gather of those records lets every rank see every other rank's call, so every rank reaches
the same verdict and raises the same error, naming the ranks that differ. The same records
carry the shapes the exchange needs, so a checked op costs no extra metadata round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ERROR_CODES, WORLD, InvalidArgument, MismatchError, RankNames, ReshardError, error_code

MAGIC = 0x5245534841524431  # "RESHARD1": a record from something else is caught, not misread
MAX_DIMS = 16
MAX_ARGS = 8
_TEXT_FIELDS = (("op", 32), ("dtype", 16), ("device", 16), ("message", 400))


@dataclass
class Record:
    """What one rank passed to a collective."""

    op: str
    dtype: str = ""
    device: str = ""
    shape: tuple[int, ...] | None = None
    args: tuple[int, ...] = ()
    split_sizes: tuple[int, ...] | None = None
    global_shape: tuple[int, ...] | None = None
    error_code: int = 0
    message: str = ""
    tensors: int = -1  # a call on a list: how many tensors it was given (-1: one tensor)
    arg_names: tuple[str, ...] = field(default=(), compare=False)

    def fail(self, exc: ReshardError) -> None:
        self.error_code = error_code(exc)
        self.message = str(exc)


_HEAD = 7  # magic, ndim, error code, split sizes given, global shape given, their count, tensors


def _int_len(size: int) -> int:
    return _HEAD + MAX_DIMS + MAX_ARGS + MAX_DIMS + size


def _put_seq(ints: np.ndarray, at: int, values: Sequence[int] | None, width: int) -> None:
    if values is not None:
        ints[at : at + len(values)] = values[:width]


def encode(rec: Record, size: int) -> np.ndarray:
    ints = np.full(_int_len(size), -1, dtype=np.int64)
    shape = rec.shape
    too_many = shape is not None and len(shape) > MAX_DIMS
    if too_many and not rec.error_code:
        rec.fail(InvalidArgument(f"reshard handles at most {MAX_DIMS} dims, got {len(shape)}"))
    ints[0] = MAGIC
    ints[1] = -1 if shape is None else len(shape)
    ints[2] = rec.error_code
    ints[3] = rec.split_sizes is not None
    ints[4] = rec.global_shape is not None
    ints[5] = -1 if rec.split_sizes is None else len(rec.split_sizes)
    ints[6] = rec.tensors
    at = _HEAD
    _put_seq(ints, at, None if too_many else shape, MAX_DIMS)
    at += MAX_DIMS
    _put_seq(ints, at, rec.args, MAX_ARGS)
    at += MAX_ARGS
    gs = rec.global_shape
    _put_seq(ints, at, gs if gs is not None and len(gs) <= MAX_DIMS else None, MAX_DIMS)
    at += MAX_DIMS
    _put_seq(ints, at, rec.split_sizes, size)
    parts = [ints.view(np.uint8)]
    for name, width in _TEXT_FIELDS:
        raw = str(getattr(rec, name)).encode("utf-8")[:width]
        buf = np.zeros(width, dtype=np.uint8)
        buf[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        parts.append(buf)
    return np.concatenate(parts)


def decode(raw: np.ndarray, size: int, arg_names: tuple[str, ...]) -> Record:
    n_int = _int_len(size)
    ints = raw[: 8 * n_int].view(np.int64).tolist()  # plain ints: one conversion, not one per field
    if ints[0] != MAGIC:
        raise ReshardError("a peer sent something that is not a reshard check record (is every rank running reshard?)")
    ndim = ints[1]
    at = _HEAD
    shape = None if ndim < 0 or ndim > MAX_DIMS else tuple(ints[at : at + ndim])
    at += MAX_DIMS
    args = tuple(ints[at : at + len(arg_names)])
    at += MAX_ARGS
    gs = tuple(ints[at : at + ndim]) if ints[4] and shape is not None else None
    at += MAX_DIMS
    split = tuple(ints[at : at + ints[5]]) if ints[3] else None
    text = raw[8 * n_int :].tobytes()
    texts = {}
    pos = 0
    for name, width in _TEXT_FIELDS:
        texts[name] = text[pos : pos + width].rstrip(b"\0").decode("utf-8", "replace")
        pos += width
    return Record(
        op=texts["op"], dtype=texts["dtype"], device=texts["device"], shape=shape, args=args,
        split_sizes=split, global_shape=gs, error_code=ints[2], message=texts["message"], tensors=ints[6],
        arg_names=arg_names,
    )


def describe_disagreement(what: str, values: Sequence[Any], fmt: Callable[[Any], str] = str,
                           names: RankNames = WORLD) -> str:
    """'dtype differs across ranks: ranks 0, 1: float32; rank 2: float64'."""
    return f"{what} {'differ' if what in _PLURAL else 'differs'} across ranks: " + by_rank(values, fmt, names)


def by_rank(values: Sequence[Any], fmt: Callable[[Any], str] = str, names: RankNames = WORLD) -> str:
    """'ranks 0, 1: float32; rank 2: float64': each distinct value once, after the ranks that hold
    it (``values[q]``: rank q's), the ranks named as ``names`` names them."""
    groups: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(fmt(value), []).append(rank)
    return "; ".join(f"{names.many(ranks)}: {value}" for value, ranks in groups.items())


def _input_text(tensors: int) -> str:
    if tensors <= 0:
        return "one tensor" if tensors < 0 else "an empty list"
    return f"a list of {tensors} tensor{'' if tensors == 1 else 's'}"


_PLURAL = {"tensors", "layouts", "split_sizes", "dtype and dims"}  # the arguments named in the plural


def raise_errors(records: Sequence[Record], own_rank: int, own_error: BaseException | None,
                 names: RankNames = WORLD) -> None:
    """If any rank reported an invalid input, raise on every rank (the offender keeps its own)."""
    bad = [r for r, rec in enumerate(records) if rec.error_code]
    if not bad:
        return
    if own_error is not None:
        raise own_error
    first = records[bad[0]]
    cls = ERROR_CODES.get(first.error_code, ReshardError)
    op = records[own_rank].op
    said = [_own_words(records[r].message, r, op, names) for r in bad]
    text = said[0] if len(bad) == 1 else " | ".join(f"{names.one(r)}: {m}" for r, m in zip(bad, said))
    raise cls(f"{op}: invalid input on {names.many(bad)}: {text}")


def _own_words(message: str, rank: int, op: str, names: RankNames = WORLD) -> str:
    """``message`` without the ``rank R: op: `` its rank put in front (the verdict names both)."""
    for prefix in (f"{names.one(rank)}: ", f"{op}: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    return message


def _coded() -> dict[str, Callable[[int], str]]:
    """How to show the arguments every op records as a code: a reduction's ``op`` and an
    ``algorithm``, by the names the user wrote (read only when ranks disagree)."""
    from ..planning.host_costs import ALGORITHMS
    from ..planning.placements import REDUCE_OPS

    def named(names: tuple[str, ...]) -> Callable[[int], str]:
        return lambda i: repr(names[i]) if 0 <= i < len(names) else str(i)

    return {"op": named(REDUCE_OPS), "algorithm": named(ALGORITHMS)}


def compare_dims(op: str, shapes: Sequence[Sequence[int]], free_dims: Sequence[int] = (),
                 names: RankNames = WORLD) -> None:
    """Raise MismatchError if every rank's shape (``shapes``, the same number of dims) is not
    the same in each dim outside ``free_dims``, naming the dim, each rank's length and shape."""
    for d in range(len(shapes[0])):
        if d in free_dims:
            continue
        values = [s[d] for s in shapes]
        if len(set(values)) > 1:
            raise MismatchError(
                f"{op}: " + describe_disagreement(f"dim {d}", values, names=names)
                + f" (full shapes: {', '.join(f'{names.one(r)} {list(s)}' for r, s in enumerate(shapes))})"
            )


def compare(records: Sequence[Record], free_dims: Sequence[int] = (), per_rank_splits: bool = False,
            arg_text: dict[str, Callable[[int], str]] | None = None, names: RankNames = WORLD) -> None:
    """Raise MismatchError if the calls disagree on anything but the dims in ``free_dims``
    (and the split sizes, when ``per_rank_splits``: all_to_all_v's send counts). ``arg_text``:
    how to show an argument whose record holds a code (an algorithm's index) by its name."""
    op = records[0].op
    if len({r.op for r in records}) > 1:
        raise MismatchError("ranks called different collectives: " + by_rank([r.op for r in records], names=names))
    counts = [r.tensors for r in records]
    if len(set(counts)) > 1:  # a list on some ranks, one tensor or a list of another length on others
        exc = MismatchError(f"{op}: " + describe_disagreement("input", counts, _input_text, names))
        exc.argument = "input"  # type: ignore[attr-defined]  # a caller with the lists says where they part
        raise exc
    for attr in ("dtype", "device"):
        values = [getattr(r, attr) for r in records]
        if len(set(values)) > 1:
            raise MismatchError(f"{op}: " + describe_disagreement(attr, values, names=names))
    for i, name in enumerate(records[0].arg_names):
        values = [r.args[i] for r in records]
        if len(set(values)) > 1:
            shown = (arg_text or {}).get(name) or _coded().get(name, str)
            exc = MismatchError(f"{op}: " + describe_disagreement(name, values, shown, names))
            exc.argument = name  # type: ignore[attr-defined]  # which argument, for a caller that says more
            raise exc
    ndims = [len(r.shape) if r.shape is not None else -1 for r in records]
    if len(set(ndims)) > 1:
        raise MismatchError(f"{op}: " + describe_disagreement("number of dims", ndims, names=names))
    compare_dims(op, [r.shape for r in records], free_dims, names)
    splits = [r.split_sizes for r in records]
    if not per_rank_splits and len(set(splits)) > 1:
        raise MismatchError(f"{op}: " + describe_disagreement("split_sizes", splits, names=names))
    globals_ = [r.global_shape for r in records]
    if len(set(globals_)) > 1:
        raise MismatchError(f"{op}: " + describe_disagreement("global_shape", globals_, names=names))
