"""``rs.empty`` and ``rs.empty_like``: CPU arrays in this process's shared arena, which the
same-host peers of an exchange read in place (``engines.arena``): each byte then moves once.

Where there is no arena (not Linux, ``RESHARD_ARENA=0`` or ``RESHARD_SHM=0``) or it is full
(``RESHARD_ARENA_BYTES``, warned once), the array comes from ordinary memory: the same
results, by the engine's own path.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .comm import Comm
from .engines import arena as arena_mod
from .errors import InvalidArgument, UnsupportedDType
from .execution.arrays import MOVABLE_KINDS, is_torch, loaded_torch
from .execution.buffers import shared_empty
from .execution.tracebacks import public_call
from .planning.placements import MAX_TENSOR_BYTES, check_int

Array = Any


def _torch_dtype(dtype: Any) -> Any:
    torch = loaded_torch()
    return dtype if torch is not None and isinstance(dtype, torch.dtype) else None


def _check_comm(comm: Comm | None, what: str) -> None:
    if comm is None:
        return
    if not isinstance(comm, Comm):
        raise InvalidArgument(f"{what}: comm must be an rs.Comm or None, got {type(comm).__name__}")
    if comm.engine == "nccl":
        raise InvalidArgument(f"{what}: rank {comm.rank}: the arena holds CPU memory; NCCL moves CUDA tensors "
                              "(allocate them with torch.empty(..., device='cuda'))")


@public_call
def empty(shape: Sequence[int] | int, dtype: Any, comm: Comm | None = None) -> Array:
    """An uninitialised C-order CPU array of ``shape`` and ``dtype`` in the shared arena:
    a numpy array, or a CPU torch tensor where ``dtype`` is a torch dtype (numbers or bool,
    what reshard moves; others raise ``UnsupportedDType``). ``comm``, if
    given, is the communicator the array will move on (NCCL is refused: its tensors live on
    the GPU). Like any array, except that it cannot be resized in place; pickling and
    ``share_memory_()`` give ordinary copies.

    >>> a = rs.empty((1024, 1024), np.float32)        # numpy
    >>> t = rs.empty((1024, 1024), torch.bfloat16)    # torch, CPU
    """
    dims = tuple(shape) if hasattr(shape, "__iter__") else (shape,)  # torch.Size and numpy shapes too
    dims = tuple(check_int("empty: shape", d) for d in dims)
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"empty: shape must hold sizes >= 0, got {dims}")
    _check_comm(comm, "empty")
    torch_dtype = _torch_dtype(dtype)
    if torch_dtype is not None:
        like = sys.modules["torch"].empty(0, dtype=torch_dtype)
    else:
        try:
            like = np.empty(0, dtype=np.dtype(dtype))
        except TypeError as exc:
            raise InvalidArgument(f"empty: dtype must be a numpy or torch dtype, got {dtype!r}") from exc
        _check_numbers(like, "empty")
    nbytes = span = like.element_size() if torch_dtype is not None else like.dtype.itemsize
    for d in dims:
        nbytes *= d
        span *= max(d, 1)  # numpy's strides must fit even where a 0 dim leaves nothing held
    if span > MAX_TENSOR_BYTES:
        held = f"holds {nbytes:.3g} bytes" if nbytes else f"holds nothing, but its other dims span {span:.3g} bytes"
        raise InvalidArgument(f"empty: shape {dims} {held}, more than an array can (8 EiB)")
    return _in_arena(dims, like)


def _check_numbers(like: np.ndarray, op: str) -> None:
    """Numbers and bool only, as reshard moves: Python objects in shared memory would be
    pointers into one process, read by its peers."""
    if like.dtype.kind not in MOVABLE_KINDS:
        raise UnsupportedDType(f"{op}: dtype {like.dtype} cannot be placed in the shared arena: it holds numbers "
                               "and bool only, the values reshard moves")


@public_call
def empty_like(x: Array, comm: Comm | None = None) -> Array:
    """``empty(x.shape, x.dtype, comm)``: numpy for a numpy ``x``, a CPU torch tensor for a
    torch one (a CUDA tensor is refused: the arena holds CPU memory)."""
    _check_comm(comm, "empty_like")
    if is_torch(x):
        if x.device.type != "cpu":
            raise InvalidArgument(f"empty_like: x is on {x.device}; the arena holds CPU memory")
        return _in_arena(tuple(x.shape), x)
    if not isinstance(x, np.ndarray):
        raise InvalidArgument(f"empty_like: x must be a numpy array or a torch tensor, got {type(x).__name__}")
    _check_numbers(x, "empty_like")
    return _in_arena(x.shape, x)


def _in_arena(shape: tuple[int, ...], like: Array) -> Array:
    out = shared_empty(shape, like) if arena_mod.enabled() else None
    if out is not None:
        return out
    if is_torch(like):
        return sys.modules["torch"].empty(shape, dtype=like.dtype)
    return np.empty(shape, dtype=like.dtype)
