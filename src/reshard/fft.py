"""The distributed FFT: an N-D transform of an array laid out on a process mesh.

A rank transforms locally along the axes it holds whole, then a layout change makes other
axes whole (the shard moves from an axis still to transform to one already done), and so on:
a slab decomposition (a mesh with one dim of size > 1) needs one exchange for a 3-D array, a
pencil (two dims > 1) two. Each exchange is a ``redistribute`` on the mesh; the transforms are
numpy's (or scipy's) along whole axes, so the result equals ``numpy.fft.fftn`` of the full
array up to the rounding of a different order of the same sums.

``fftn(x, mesh, src)`` returns the rank's piece of the transform laid out as ``dst``, or with
``dst=None`` as the last local transform leaves it (no extra exchange), which
``output_layout`` tells without communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .comm import current_or_none
from .errors import InvalidArgument, UnsupportedDType
from .execution.tracebacks import public_call
from .mesh import Mesh
from .planning.layout import (
    Partial,
    Placement,
    Shard,
    check_int,
    check_spec_dims,
    global_shape_of,
    mesh_region,
    normalize_dim,
    normalize_placements,
    orders_of,
    parse_placements,
    split_by,
    unravel,
    with_order,
)
from .planning.spec import layout_text

__all__ = ["fftn", "ifftn", "rfftn", "irfftn", "output_layout"]

Array = Any
NORMS = ("backward", "ortho", "forward")
# What every rank must pass alike besides the op, dtype and dims: each sent as a digest in the
# call's record (the common agreement, which carries the pieces' shapes too).
ARGS = ("src", "axes", "s", "dst", "norm", "backend")


@dataclass(frozen=True)
class Transform:
    """One local transform: ``kind`` ("fft", "ifft", "rfft" or "irfft") along ``axes``."""

    kind: str
    axes: tuple[int, ...]


@dataclass(frozen=True)
class Move:
    """One layout change to ``layout`` (one placement per mesh dim)."""

    layout: tuple[Placement, ...]


def _cuts(layout: Sequence[Placement], mesh_shape: Sequence[int], axis: int) -> bool:
    """Whether some mesh dim of size > 1 splits ``axis``."""
    return any(isinstance(p, Shard) and p.dim == axis and mesh_shape[m] > 1 for m, p in enumerate(layout))


def _whole(layout: Sequence[Placement], mesh_shape: Sequence[int], todo: Sequence[int]) -> list[int]:
    return [a for a in todo if not _cuts(layout, mesh_shape, a)]


def _free(layout: Sequence[Placement], mesh_shape: Sequence[int], axis: int, keep: Sequence[int], ndim: int,
          prefer: Sequence[Placement] | None = None) -> tuple[Placement, ...]:
    """``layout`` with every mesh dim that splits ``axis`` moved to another axis: one not in
    ``keep`` (still to transform) where there is one, preferring the axis ``prefer`` (the
    result's layout) gives that mesh dim, then an axis nobody splits, the outermost first; else
    stacked onto another split axis of ``keep``."""
    out = list(layout)
    for m, p in enumerate(out):
        if not (isinstance(p, Shard) and p.dim == axis and mesh_shape[m] > 1):
            continue
        done = [a for a in range(ndim) if a not in keep and a != axis]
        wanted = prefer[m].dim if prefer is not None and isinstance(prefer[m], Shard) else None
        if wanted in done:
            out[m] = Shard(wanted)
            continue
        spare = [a for a in done if not _cuts(out, mesh_shape, a)] or done
        if not spare:
            spare = [a for a in keep if a != axis]
        if not spare:
            raise InvalidArgument(f"a 1-D array cannot be transformed on a mesh that splits it (mesh {list(mesh_shape)})")
        out[m] = Shard(spare[0])  # the outermost: each piece then moves in the longest runs
    # an order stays where the mesh dims that split its tensor dim stay the same
    kept = [(d, dims) for d, dims in orders_of(layout) if set(split_by(out, d)) == set(dims)]
    return with_order(out, kept)


def schedule(shape: Sequence[int], mesh_shape: Sequence[int], src: Sequence[Placement], axes: Sequence[int],
             kind: str, prefer: Sequence[Placement] | None = None) -> list[Transform | Move]:
    """The transforms and layout changes of one N-D transform, in order (pure). ``kind``:
    fft, ifft, rfft (the last of ``axes`` first, real to complex) or irfft (it last). Each
    change moves shards toward ``prefer`` where it can (an inverse back to where the forward
    began needs no extra exchange)."""
    ndim = len(shape)
    layout = src
    steps: list[Transform | Move] = []
    complex_kind = "ifft" if kind in ("ifft", "irfft") else "fft"
    todo = list(axes)

    def make_whole(axis: int, keep: Sequence[int]) -> None:
        nonlocal layout
        if _cuts(layout, mesh_shape, axis):
            layout = _free(layout, mesh_shape, axis, keep, ndim, prefer)
            steps.append(Move(layout))

    if kind == "rfft":  # the real axis first, alone
        real = todo.pop()
        make_whole(real, [real, *todo])
        steps.append(Transform("rfft", (real,)))
    last = todo.pop() if kind == "irfft" else None
    keep = list(todo) + ([last] if last is not None else [])
    while todo:
        now = _whole(layout, mesh_shape, todo)
        if not now:
            make_whole(_next_axis(layout, mesh_shape, todo, keep, ndim, prefer), keep)
            now = _whole(layout, mesh_shape, todo)
        steps.append(Transform(complex_kind, tuple(now)))
        todo = [a for a in todo if a not in now]
        keep = [a for a in keep if a not in now]
    if last is not None:
        make_whole(last, [last])
        steps.append(Transform("irfft", (last,)))
    return steps


def _next_axis(layout: Sequence[Placement], mesh_shape: Sequence[int], todo: Sequence[int], keep: Sequence[int],
               ndim: int, prefer: Sequence[Placement] | None) -> int:
    """The axis to make whole next: one whose shards can all move where ``prefer`` puts them,
    where there is one; else the last still to transform."""
    if prefer is not None:
        for a in reversed(todo):
            moved = _free(layout, mesh_shape, a, keep, ndim, prefer)
            if all(moved[m] == layout[m] or moved[m] == prefer[m] for m in range(len(layout))):
                return a
    return todo[-1]


def _canonical(shape: Sequence[int], mesh_shape: Sequence[int], src: Any, axes: Any, s: Any = None,
               names: Sequence[str] | None = None) -> tuple[tuple[Placement, ...], tuple[int, ...]]:
    ndim = len(shape)
    if ndim not in (1, 2, 3):
        raise InvalidArgument(f"the distributed FFT takes 1-D, 2-D or 3-D arrays; got {ndim} dims")
    layout = _layout_of(src, ndim, mesh_shape, "src", names)
    if axes is None:
        axes = tuple(range(ndim)) if s is None else tuple(range(ndim - len(s), ndim))
    axes = tuple(normalize_dim(a, ndim, "axes") for a in _sequence(axes, "axes"))
    if not axes or len(set(axes)) != len(axes):
        raise InvalidArgument(f"axes {list(axes)} must name at least one axis, each once")
    return layout, axes


def _sequence(value: Any, name: str) -> tuple:
    """``value`` (``axes`` or ``s``, a sequence as numpy's) as a tuple, or an InvalidArgument."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidArgument(f"{name} must be a sequence of ints (as numpy's), got {value!r}")
    return tuple(value)


def _layout_of(placements: Any, ndim: int, mesh_shape: Sequence[int], name: str,
               names: Sequence[str] | None = None) -> tuple[Placement, ...]:
    """``placements`` (``src`` or ``dst``; a ``Spec`` by mesh dim number, or by ``names``) as
    one Shard (dim counted from the front) or Replicate per mesh dim, split orders kept."""
    check_spec_dims(placements, ndim, name)
    layout = parse_placements(placements, len(mesh_shape), names)
    if len(layout) != len(mesh_shape):
        raise InvalidArgument(f"{name} {list(layout)} needs one placement per mesh dim ({len(mesh_shape)})")
    if any(isinstance(p, Partial) for p in layout):
        raise InvalidArgument(f"{name} {list(layout)}: the FFT's arrays are Shard or Replicate, not Partial"
                              + ("; reduce it first" if name == "src" else ""))
    return normalize_placements(layout, ndim, f"{name} Shard dim")


def output_layout(shape: Sequence[int], mesh_shape: Any, src: Any, axes: Sequence[int] | None = None,
                  real: bool = False, *, inverse: bool = False) -> tuple[Placement, ...]:
    """The layout ``fftn`` (``real=True``: ``rfftn``; ``inverse=True``: ``ifftn``, ``irfftn``)
    leaves its result in with ``dst=None``, for an array of ``shape`` laid out as ``src`` on a
    mesh of ``mesh_shape`` (or a ``Mesh``)."""
    mesh_shape = tuple(mesh_shape.shape if isinstance(mesh_shape, Mesh) else mesh_shape)
    layout, axes = _canonical(shape, mesh_shape, src, axes)
    kind = ("irfft" if real else "ifft") if inverse else ("rfft" if real else "fft")
    moves = [st.layout for st in schedule(shape, mesh_shape, layout, axes, kind) if isinstance(st, Move)]
    return moves[-1] if moves else layout


def _local(kind: str, a: Any, axes: tuple[int, ...], norm: str, backend: Any, n: int | None = None) -> Any:
    out = _arena_out(kind, a, axes, backend, n)
    kw = {} if out is None else {"out": out}
    if kind == "fft":
        return backend.fftn(a, axes=axes, norm=norm, **kw)
    if kind == "ifft":
        return backend.ifftn(a, axes=axes, norm=norm, **kw)
    if kind == "rfft":
        return backend.rfft(a, axis=axes[0], norm=norm, **kw)
    return backend.irfft(a, n=n, axis=axes[0], norm=norm, **kw)


_OUT_DTYPES: dict[tuple[str, Any], Any] = {}


def _arena_out(kind: str, a: Any, axes: tuple[int, ...], backend: Any, n: int | None) -> Any:
    """Where a local transform may write its result in the shared arena, so the transpose after
    it reads that in place: numpy's FFT (``out=``, numpy 2) on an array of
    ``RESHARD_ARENA_MIN_BYTES`` or more; None elsewhere (the transform makes its own)."""
    import numpy as np

    from . import settings
    from .engines import arena as arena_mod

    if backend.__name__ != "numpy.fft" or int(np.__version__.split(".")[0]) < 2 or not arena_mod.enabled():
        return None
    if a.nbytes < settings.read("RESHARD_ARENA_MIN_BYTES"):
        return None
    key = (kind, a.dtype)
    dtype = _OUT_DTYPES.get(key)
    if dtype is None:  # numpy's own choice, from a transform of one point
        tiny = np.zeros(2, dtype=a.dtype)
        dtype = _OUT_DTYPES[key] = {"fft": backend.fft, "ifft": backend.ifft, "rfft": backend.rfft,
                                    "irfft": backend.irfft}[kind](tiny).dtype
    shape = list(a.shape)
    if kind == "rfft":
        shape[axes[0]] = shape[axes[0]] // 2 + 1
    elif kind == "irfft":
        shape[axes[0]] = n
    return arena_mod.numpy_array(shape, dtype)


def _backend(name: str) -> Any:
    if name == "numpy":
        import numpy.fft as backend

        return backend
    if name == "scipy":
        try:
            import scipy.fft as backend
        except ImportError:
            from .errors import MissingDependency

            raise MissingDependency("backend='scipy' needs scipy: pip install scipy") from None
        return backend
    raise InvalidArgument(f"backend must be 'numpy' or 'scipy', got {name!r}")


def _run(x: Array, mesh: Mesh, src: Any, axes: Any, dst: Any, norm: str, backend: str, kind: str,
         s: Sequence[int] | None = None, check: bool | None = None) -> Array:

    from . import ops
    from .execution import execute
    from .execution.call import Call

    torch_in = type(x).__module__.split(".")[0] == "torch"
    if not isinstance(mesh, Mesh) and current_or_none() is None:  # no communicator to tell the others through
        raise InvalidArgument(f"mesh must be an rs.Mesh, got {type(mesh).__name__}")
    # every rank's arguments and piece shape in the common agreement (one exchange of records):
    # every rank raises when any rank's were not valid, or when they differ
    call = Call(f"{kind}n", x, mesh.comm if isinstance(mesh, Mesh) else None, check, ARGS)
    checked = call.validate(lambda _: _arguments(x, mesh, src, axes, s, dst, norm, backend, kind, torch_in, call))
    a, layout, axes, s, want, lib = checked if checked is not None else (x, (), (), s, None, None)
    shapes = call.agree(free_dims=sorted({p.dim for p in layout if isinstance(p, Shard)}), need_shapes=True)
    shape, bad = global_shape_of(shapes, layout, mesh.shape)
    if bad is not None:
        want_piece = tuple(b - a for a, b in mesh_region(shape, layout, unravel(bad, mesh.shape), mesh.shape))
        raise InvalidArgument(f"rank {bad} holds a piece of shape {list(shapes[bad])}, but {list(layout)} of "
                              f"the global shape {list(shape)} gives it {list(want_piece)} (shards follow the "
                              "balanced rule)")
    execute.finish(call, None)
    empty = [ax for ax in axes if shape[ax] == 0]
    if empty:  # every rank: the shape is the global one
        raise InvalidArgument(f"axis {empty[0]} of the global shape {list(shape)} has length 0: a transformed axis "
                              "needs at least one point")
    n_last = None
    if kind == "irfft":
        m = shape[axes[-1]]
        n_last = int(s[-1]) if s is not None else 2 * (m - 1)
        if s is None and n_last < 1:
            raise InvalidArgument(f"the last transformed axis (axis {axes[-1]}) has length 1: the output length it "
                                  "implies, 2 * (1 - 1), is 0; pass s with its real length (1 or 2)")
        if n_last < 1 or n_last // 2 + 1 != m:
            raise InvalidArgument(f"s[-1]={n_last} does not fit the last transformed axis of length {m} (n // 2 + 1)")
        if s is not None and any(n != shape[ax] for n, ax in zip(s[:-1], axes[:-1])):
            raise InvalidArgument(f"s {list(s)}: the axes before the last keep their lengths "
                                  f"{[shape[ax] for ax in axes[:-1]]} (padding or cropping them is not supported)")
    current = layout
    for st in schedule(shape, mesh.shape, layout, axes, kind, want):
        if isinstance(st, Move):
            a = ops.redistribute(a, current, st.layout, mesh=mesh, global_shape=shape, check=check)
            current = st.layout
        else:
            a = _local(st.kind, a, st.axes, norm, lib, n_last)
            if st.kind in ("rfft", "irfft"):
                ax = st.axes[0]
                shape = tuple((shape[d] // 2 + 1 if st.kind == "rfft" else n_last) if d == ax else shape[d]
                              for d in range(len(shape)))
    if want is not None:
        if want != current:
            a = ops.redistribute(a, current, want, mesh=mesh, global_shape=shape, check=check)
    if torch_in:
        import torch

        from .execution.arrays import without_negative_strides

        return torch.from_numpy(without_negative_strides(a, contiguous=True))
    return a


def _arguments(x: Array, mesh: Any, src: Any, axes: Any, s: Any, dst: Any, norm: str, backend: str, kind: str,
               torch_in: bool, call: Any) -> tuple:
    """This rank's arguments checked: (its piece as numpy, layout, axes, s, dst's layout, the
    FFT library); each argument every rank must pass alike goes in ``call``'s record."""
    import hashlib

    import numpy as np

    if not isinstance(mesh, Mesh):
        raise InvalidArgument(f"mesh must be an rs.Mesh, got {type(mesh).__name__}")
    a = x
    if torch_in:
        try:
            a = x.detach().cpu().resolve_conj().resolve_neg().numpy()
        except TypeError as exc:  # a dtype numpy has no kind for (bfloat16)
            raise UnsupportedDType(f"x has dtype {x.dtype}, which numpy's FFT cannot take ({exc})") from None
    if norm not in NORMS:
        raise InvalidArgument(f"norm must be one of {NORMS}, got {norm!r}")
    lib = _backend(backend)
    if not isinstance(a, np.ndarray):
        raise InvalidArgument(f"x must be a numpy array or torch tensor, got {type(x).__name__}")
    if kind == "rfft" and a.dtype.kind == "c":
        raise UnsupportedDType(f"rfftn takes real values, got {a.dtype}")
    if a.dtype.kind not in "fc":
        raise UnsupportedDType(f"x has dtype {a.dtype}: the FFT takes floating or complex values")
    if s is not None:
        s = tuple(check_int("s", n) for n in _sequence(s, "s"))
    layout, axes = _canonical(a.shape, mesh.shape, src, axes, s, mesh.names)
    if s is not None and len(s) != len(axes):
        raise InvalidArgument(f"s {list(s)} needs one length per transformed axis ({len(axes)})")
    want = _layout_of(dst, a.ndim, mesh.shape, "dst", mesh.names) if dst is not None else None
    values = (layout_text(layout), list(axes), s, want and layout_text(want), norm, backend)
    digests = [int.from_bytes(hashlib.blake2b(repr(v).encode(), digest_size=8).digest(), "little", signed=True)
               for v in values]
    call.record.args = tuple(digests)
    for name, value, mine in zip(ARGS, values, digests):  # a differing argument shown by its value here
        call.arg_text[name] = lambda d, v=value, m=mine: repr(v) if d == m else "another value"
    return a, layout, axes, s, want, lib


@public_call
def fftn(x: Array, mesh: Mesh, src: Any, axes: Sequence[int] | None = None, dst: Any = None,
         norm: str = "backward", backend: str = "numpy", *, check: bool | None = None) -> Array:
    """The N-D discrete Fourier transform of the array whose piece on this rank is ``x``.

    Args:
      x: this rank's piece of a 1-D, 2-D or 3-D array laid out as ``src`` on ``mesh`` (one
        placement per mesh dim: Shard or Replicate; shards by the balanced rule; or an
        ``rs.Spec`` that splits an axis over several mesh dims in a chosen order).
      axes: the axes to transform (default all), as numpy's ``axes``.
      dst: the layout of the result; None: the one the last local transform leaves
        (``output_layout``), with no extra exchange.
      norm: ``backward``, ``ortho`` or ``forward``, as numpy's.
      backend: ``numpy`` or ``scipy`` (``scipy.fft``, where installed).
      check: the cross-rank check of each layout change (default: the communicator's); the
        arguments and the pieces' shapes are checked on every rank first, whatever it says.

    Returns:
      This rank's piece of ``numpy.fft.fftn(full, axes=axes, norm=norm)``, complex, laid out as
      ``dst``. numpy in, numpy out; torch in, torch out (CPU).
    """
    return _run(x, mesh, src, axes, dst, norm, backend, "fft", check=check)


@public_call
def ifftn(x: Array, mesh: Mesh, src: Any, axes: Sequence[int] | None = None, dst: Any = None,
          norm: str = "backward", backend: str = "numpy", *, check: bool | None = None) -> Array:
    """The inverse of ``fftn``: this rank's piece of ``numpy.fft.ifftn(full, axes=axes, norm=norm)``."""
    return _run(x, mesh, src, axes, dst, norm, backend, "ifft", check=check)


@public_call
def rfftn(x: Array, mesh: Mesh, src: Any, axes: Sequence[int] | None = None, dst: Any = None,
          norm: str = "backward", backend: str = "numpy", *, check: bool | None = None) -> Array:
    """The transform of real values: this rank's piece of ``numpy.fft.rfftn(full, axes=axes,
    norm=norm)`` (the last of ``axes`` shortened to ``n // 2 + 1``)."""
    return _run(x, mesh, src, axes, dst, norm, backend, "rfft", check=check)


@public_call
def irfftn(x: Array, mesh: Mesh, src: Any, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
           dst: Any = None, norm: str = "backward", backend: str = "numpy", *, check: bool | None = None) -> Array:
    """The inverse of ``rfftn``: this rank's piece of ``numpy.fft.irfftn(full, s=s, axes=axes,
    norm=norm)``; ``s[-1]`` gives the last axis' length (odd lengths need it). The other lengths
    of ``s`` must be those axes' own: numpy pads or crops to them, which is not supported here."""
    return _run(x, mesh, src, axes, dst, norm, backend, "irfft", s, check=check)
