"""Array backends: the few array operations the exchange needs, for torch tensors and numpy arrays.

The step forms pack and unpack through a backend, so one implementation serves both array
libraries (the torch engine works on tensors, the MPI engine on numpy buffers). torch is only
imported when a torch tensor is actually seen.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument, UnsupportedDType


def loaded_torch() -> Any:
    """The torch module where it is imported whole, else None: while some thread is still
    importing it, ``sys.modules`` holds a half-made module (no ``Tensor`` yet), and no tensor exists."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return None
    return torch


def is_torch(x: Any) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(x, torch.Tensor)


def resolved(x: Any) -> Any:
    """A torch tensor's values as memory holds them: a lazy conjugate or negation (``x.conj()``
    of a complex tensor, ``.imag`` of one) applied in a copy, since the bytes that move are the
    memory's, not the view's. Anything else as it is."""
    if type(x) is np.ndarray or not is_torch(x):
        return x
    if x.is_conj() or x.is_neg():
        return x.resolve_conj().resolve_neg()
    return x


def data_ptr(a: Any) -> int:
    """The address of an array's or tensor's first element."""
    return a.data_ptr() if is_torch(a) else a.__array_interface__["data"][0]


def is_numpy(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def dtype_name(x: Any) -> str:
    """A short engine-neutral dtype name: float32, bfloat16, bool, complex64..."""
    return str(x.dtype).removeprefix("torch.")


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def numpy_view(a: Any) -> np.ndarray:
    """``a``'s memory as a numpy array of its shape (a dtype of the same item size where numpy
    has no twin of a torch dtype); no copy. CPU arrays only."""
    if not is_torch(a):
        return a
    t = a.detach()
    try:
        return t.numpy()
    except TypeError:
        torch = sys.modules["torch"]
        size = t.element_size()
        as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(size)
        if as_int is None:  # 16-byte items: two int64 each
            return t.view(torch.int64).numpy().view(np.dtype((np.void, size))).reshape(tuple(t.shape))
        return t.view(as_int).numpy()


# Runs along the last dim up to this many bytes are copied as whole items (``copy_box``); past
# it numpy's own loop is as fast. torch's copy is as fast as whole items from 32-byte runs up.
RUN_ITEM_MAX_BYTES = 256
TORCH_RUN_ITEM_MAX_BYTES = 16
RUN_ITEM_MIN_BYTES = 16 << 10  # smaller copies: two more views cost more than they save


def short_runs(dst: Any, src: Any, most: int) -> bool:
    """Whether ``dst[...] = src`` (one shape and dtype) moves runs of at most ``most`` bytes
    along a last dim that both hold contiguously (with the dims before it that both hold end
    to end), and enough of them to pay for two views.
    The cheap tests first: most copies are small or of long runs."""
    if dst.nbytes < RUN_ITEM_MIN_BYTES or type(src) is not type(dst):
        return False
    shape = dst.shape
    if not shape:
        return False
    if torch_in := is_torch(dst):
        size = dst.element_size()
        if shape[-1] * size > most or shape[-1] < 2 or dst.stride()[-1] != 1 or src.stride()[-1] != 1:
            return False
        dst_strides, src_strides, unit = dst.stride(), src.stride(), 1
    else:
        size = dst.itemsize
        if shape[-1] * size > most or shape[-1] < 2 or dst.strides[-1] != size or src.strides[-1] != size:
            return False
        dst_strides, src_strides, unit = dst.strides, src.strides, size
    # dims both hold end to end make one longer run (numpy's copy joins them itself)
    run = shape[-1] * unit
    for d in range(len(shape) - 2, -1, -1):
        if dst_strides[d] != run or src_strides[d] != run:
            break
        run *= shape[d]
        if run // unit * size > most:
            return False
    return tuple(shape) == tuple(src.shape) and dst.dtype == src.dtype and (torch_in or not dst.dtype.hasobject)


def copy_box(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for numpy arrays of one shape and dtype, bit for bit. Where both hold
    short runs along a contiguous last dim, each run is copied as one item of its bytes: numpy's
    loop over a short run's few elements costs more than its bytes (a 32-byte run 1.8x, an
    8-byte one 11x a whole-run copy here)."""
    if short_runs(dst, src, RUN_ITEM_MAX_BYTES):
        run = np.dtype((np.void, dst.shape[-1] * dst.itemsize))
        np.copyto(dst.view(run), src.view(run))
    else:
        dst[...] = src


# CPU results of 256 KiB and up come from numpy (plain malloc), handed to torch without a
# copy: torch's posix_memalign kept growing the heap into fresh pages, which page-faulted on
# every call (docs/performance.md, "Memory"). Such a tensor's storage cannot be resized.
_NUMPY_ALLOC_MIN_BYTES = 256 << 10


class TorchArrays:
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        # numpy's twin of each torch dtype that has one (bfloat16 and friends have none): a
        # result allocated in it needs no view or reshape afterwards, which a 1 MiB call feels
        self._numpy_dtype: dict[Any, Any] = {}

    def _twin(self, dtype: Any) -> Any:
        twin = self._numpy_dtype.get(dtype, False)
        if twin is False:
            try:
                twin = self.torch.empty(0, dtype=dtype).numpy().dtype
            except (TypeError, RuntimeError):
                twin = None
            self._numpy_dtype[dtype] = twin
        return twin

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        nbytes = numel(shape) * like.element_size()
        if nbytes >= _NUMPY_ALLOC_MIN_BYTES and like.device.type == "cpu":
            twin = self._twin(like.dtype)
            if twin is not None:
                return self.torch.from_numpy(np.empty(tuple(shape), dtype=twin))
            raw = self.torch.from_numpy(np.empty(nbytes, dtype=np.uint8))
            return raw.view(like.dtype).reshape(tuple(shape))
        return self.torch.empty(tuple(shape), dtype=like.dtype, device=like.device)

    def zeros(self, shape: Sequence[int], like: Any) -> Any:
        return self.torch.zeros(tuple(shape), dtype=like.dtype, device=like.device)

    def full_like(self, x: Any, value: Any) -> Any:
        return self.torch.full_like(x, value)

    def is_contiguous(self, x: Any) -> bool:
        return x.is_contiguous()

    def bytes_of(self, flat: Any) -> Any:
        """1-D uint8 view of a contiguous tensor (no copy)."""
        if flat.numel() == 0:  # an empty tensor may carry stride 0, which view() refuses
            return self.torch.empty(0, dtype=self.torch.uint8, device=flat.device)
        # A contiguous tensor may still carry odd strides on size-1 dims; its memory is one run.
        return flat.as_strided((flat.numel(),), (1,)).view(self.torch.uint8)

    def copy(self, dst: Any, src: Any) -> None:
        # torch's copy loops over each short run's elements too (an 8-byte run 4x a whole-run copy)
        if (short_runs(dst, src, TORCH_RUN_ITEM_MAX_BYTES) and dst.device.type == "cpu" and src.device.type == "cpu"
                and not (dst.requires_grad or src.is_conj() or src.is_neg() or dst.is_conj() or dst.is_neg())):
            copy_box(numpy_view(dst), numpy_view(src))
        else:
            dst.copy_(src)

    def itemsize(self, x: Any) -> int:
        return x.element_size()

    def stack_reduce(self, pieces: Any, op: str) -> Any:
        """Reduce ``pieces`` [N, ...] over dim 0, strictly in rank order (bitwise reproducible)."""
        t = self.torch
        if pieces.device.type == "cpu" and pieces.dtype in _numpy_reduced(t):  # torch has no kernels for them
            return t.from_numpy(stack_reduce_numpy(numpy_view(pieces), op))
        acc = pieces[0].clone()
        for i in range(1, pieces.shape[0]):
            if op in ("sum", "avg"):
                acc.add_(pieces[i])
            elif op == "max":
                t.maximum(acc, pieces[i], out=acc)
            else:
                t.minimum(acc, pieces[i], out=acc)
        if op == "avg":
            acc.div_(pieces.shape[0])
        return acc

    def dtype_info(self, x: Any) -> tuple[bool, bool, bool]:
        """(is_floating, is_complex, is_bool)."""
        return x.dtype.is_floating_point, x.dtype.is_complex, x.dtype == self.torch.bool

    def identity(self, x: Any, op: str) -> Any:
        """The value that leaves ``op`` unchanged for ``x``'s dtype (0 for sum and avg)."""
        t = self.torch
        if op in ("sum", "avg"):
            return 0
        if x.dtype == t.bool:
            return op == "min"
        if x.dtype.is_floating_point:
            return float("inf") if op == "min" else -float("inf")
        info = t.iinfo(x.dtype)  # complex has no order: refused before this is asked
        return info.max if op == "min" else info.min


@functools.cache  # asked on every reduction
def _numpy_reduced(torch: Any) -> frozenset:
    """The torch dtypes whose sums, maxima and minima numpy computes: unsigned ints wider than a
    byte, which torch stores and copies but cannot add or compare on the CPU."""
    return frozenset(d for d in (getattr(torch, n, None) for n in ("uint16", "uint32", "uint64")) if d is not None)


def stack_reduce_numpy(pieces: np.ndarray, op: str) -> np.ndarray:
    """Reduce ``pieces`` [N, ...] over dim 0, strictly in rank order (bitwise reproducible)."""
    acc = pieces[0].copy()
    for i in range(1, pieces.shape[0]):
        if op in ("sum", "avg"):
            np.add(acc, pieces[i], out=acc)
        elif op == "max":
            np.maximum(acc, pieces[i], out=acc)
        else:
            np.minimum(acc, pieces[i], out=acc)
    if op == "avg":
        np.divide(acc, pieces.shape[0], out=acc)
    return acc


class NumpyArrays:
    name = "numpy"

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        return np.empty(tuple(shape), dtype=like.dtype)

    def zeros(self, shape: Sequence[int], like: Any) -> Any:
        return np.zeros(tuple(shape), dtype=like.dtype)

    def full_like(self, x: Any, value: Any) -> Any:
        return np.full_like(x, value)

    def is_contiguous(self, x: Any) -> bool:
        return bool(x.flags.c_contiguous)

    def bytes_of(self, flat: Any) -> Any:
        return flat.reshape(-1).view(np.uint8)

    def copy(self, dst: Any, src: Any) -> None:
        copy_box(dst, src)

    def itemsize(self, x: Any) -> int:
        return x.dtype.itemsize

    def stack_reduce(self, pieces: Any, op: str) -> Any:
        return stack_reduce_numpy(pieces, op)

    def dtype_info(self, x: Any) -> tuple[bool, bool, bool]:
        k = x.dtype.kind
        return k == "f", k == "c", k == "b"

    def identity(self, x: Any, op: str) -> Any:
        """The value that leaves ``op`` unchanged for ``x``'s dtype (0 for sum and avg)."""
        k = x.dtype.kind
        if op in ("sum", "avg"):
            return 0
        if k == "b":
            return op == "min"
        if k == "f":
            return np.inf if op == "min" else -np.inf
        info = np.iinfo(x.dtype)  # complex has no order: refused before this is asked
        return info.max if op == "min" else info.min


_BACKENDS: dict[str, Any] = {}


def array_backend(name: str) -> Any:
    if name not in _BACKENDS:
        _BACKENDS[name] = TorchArrays() if name == "torch" else NumpyArrays()
    return _BACKENDS[name]


MOVABLE_KINDS = "biufc"  # numpy dtype kinds reshard moves: bool, ints, floats, complex


def _is_masked(x: Any) -> bool:
    # numpy.ma is imported only where it is used (its import takes 0.1-0.2 s); an array made
    # before that import cannot be a masked one
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(x, ma.MaskedArray)


def check_array(x: Any, what: str = "x", need_dims: bool = True) -> None:
    """Reject what no op can take: non-arrays, 0-d inputs where a dim is named, sparse tensors."""
    if is_torch(x):
        if x.layout != sys.modules["torch"].strided:
            raise InvalidArgument(f"{what} must be a dense (strided) tensor, got layout {x.layout}")
    elif not is_numpy(x):
        raise InvalidArgument(
            f"{what} must be a torch.Tensor or numpy.ndarray, got {type(x).__module__}.{type(x).__name__}"
        )
    elif x.dtype.kind not in MOVABLE_KINDS:
        raise UnsupportedDType(f"{what} has dtype {x.dtype}, which reshard cannot move (numbers and bool only)")
    elif type(x) is not np.ndarray and _is_masked(x):  # its mask would not move: the result would unmask
        raise InvalidArgument(f"{what} is a masked array, whose mask reshard does not move; pass {what}.filled(value) "
                              f"or {what}.data, and move the mask (np.ma.getmaskarray) as an array of its own")
    if need_dims and x.ndim == 0:
        raise InvalidArgument(f"{what} is 0-d; this op names a dim, so it needs at least one dim")


def without_negative_strides(x: np.ndarray, contiguous: bool = False) -> np.ndarray:
    """``x``, or a C-ordered copy where a stride is negative (``contiguous``: or where it is not
    C-contiguous). ``torch.from_numpy`` refuses any negative stride, even along a dim of size 1,
    where numpy still calls the array contiguous and ``np.ascontiguousarray`` returns it as is."""
    if any(s < 0 for s in x.strides) or (contiguous and not x.flags.c_contiguous):
        return np.array(x, order="C")
    return x


def to_torch(x: Any) -> Any:
    """A torch view of a numpy array (no copy unless its strides are negative)."""
    import warnings

    import torch

    # torch.from_numpy warns on read-only arrays; we never write into the input, so a view is
    # safe where torch allows one.
    if not x.dtype.isnative:
        raise UnsupportedDType(f"x has dtype {x.dtype.str} (byte order not this machine's), which torch cannot view, "
                               "and gloo moves numpy arrays as torch tensors: pass "
                               "x.astype(x.dtype.newbyteorder('=')), or use the mpi engine")
    x = without_negative_strides(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            return torch.from_numpy(x)
        except TypeError:  # a numpy dtype torch has no twin of (longdouble, clongdouble)
            raise UnsupportedDType(f"x has dtype {x.dtype}, which torch has no dtype for, and gloo moves numpy arrays as "
                                   "torch tensors: convert it (float64, complex128) or use the mpi engine") from None
