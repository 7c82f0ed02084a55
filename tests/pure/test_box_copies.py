"""The copies every pack, unpack and read in place makes (``arrays.copy_box`` and the backends'
``copy``): bit for bit what plain assignment gives, on every dtype, shape and box, writing
nothing outside the box, whatever the strides of either side, including the short runs along
the last dim that are copied as whole items."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.execution import arrays
from reshard.execution.arrays import RUN_ITEM_MIN_BYTES, copy_box

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.bool_, np.complex64, np.dtype((np.void, 16))]


@st.composite
def boxes(draw):
    """A box's shape (its first dim long enough, at times, for copies past the whole-run
    threshold), where it starts in a larger source and a larger destination, the destination's
    step along each dim."""
    ndim = draw(st.integers(1, 4))
    shape = [draw(st.sampled_from([0, 1, 5, 600, 2500]))] + [draw(st.integers(0, 6)) for _ in range(ndim - 1)]
    src_starts = [draw(st.integers(0, 3)) for _ in range(ndim)]
    dst_starts = [draw(st.integers(0, 3)) for _ in range(ndim)]
    steps = [draw(st.sampled_from([1, 1, 2])) for _ in range(ndim)]
    pads = [2] * ndim
    if draw(st.booleans()):  # whole along the last dims on both sides: runs that join across dims
        for d in range(draw(st.integers(1, ndim)), ndim):
            src_starts[d] = dst_starts[d] = 0
            steps[d], pads[d] = 1, 0
    return tuple(shape), src_starts, dst_starts, steps, pads


def _random_bytes(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def _places(case):
    shape, src_starts, dst_starts, steps, pads = case
    source_shape = tuple(s + n + p for s, n, p in zip(src_starts, shape, pads))
    box = tuple(slice(a, a + n) for a, n in zip(src_starts, shape))
    target_shape = tuple(a + n * k + p for a, n, k, p in zip(dst_starts, shape, steps, pads))
    boxed = tuple(slice(a, a + n * k, k) for a, n, k in zip(dst_starts, shape, steps))
    return source_shape, box, target_shape, boxed


@settings(max_examples=300, deadline=None)
@given(boxes(), st.sampled_from(DTYPES), st.integers(0, 2**32 - 1))
def test_copy_box_equals_numpy_assignment_bit_for_bit(case, dtype, seed):
    dtype = np.dtype(dtype)
    source_shape, box, target_shape, boxed = _places(case)
    # random bytes read as the dtype: NaN payloads, signed zeros and all
    source = _random_bytes(int(np.prod(source_shape)) * dtype.itemsize, seed).view(dtype).reshape(source_shape)
    target = _random_bytes(int(np.prod(target_shape)) * dtype.itemsize, seed + 1).view(dtype).reshape(target_shape)
    expected = target.copy()
    expected[boxed] = source[box]
    before = source.copy()
    copy_box(target[boxed], source[box])
    assert target.tobytes() == expected.tobytes()  # the box holds the source's bytes; nothing else changed
    assert source.tobytes() == before.tobytes()


@settings(max_examples=200, deadline=None)
@given(boxes(), st.sampled_from(["float32", "bfloat16", "float16", "bool", "complex64", "int64", "uint8"]),
       st.integers(0, 2**32 - 1))
def test_torch_backend_copy_equals_assignment_bit_for_bit(case, dtype_name, seed):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    size = torch.empty(0, dtype=dtype).element_size()
    source_shape, box, target_shape, boxed = _places(case)

    def tensor(shape, seed):
        if not np.prod(shape):  # no bytes to view as the dtype
            return torch.empty(shape, dtype=dtype)
        raw = torch.from_numpy(_random_bytes(int(np.prod(shape)) * size, seed))
        if dtype == torch.bool:  # only 0 and 1 are bools
            raw = raw % 2
        return raw.view(dtype).reshape(shape)

    source, target = tensor(source_shape, seed), tensor(target_shape, seed + 1)
    expected = target.clone()
    expected[boxed] = source[box]
    before = source.clone()
    arrays.array_backend("torch").copy(target[boxed], source[box])
    as_bytes = (lambda t: t.contiguous().view(torch.uint8).numpy().tobytes()) if dtype != torch.bool else (
        lambda t: t.numpy().tobytes())
    assert as_bytes(target) == as_bytes(expected)
    assert as_bytes(source) == as_bytes(before)


def test_copy_box_copies_short_runs_of_a_wide_array():
    """The case whole-run items are for: 8-byte runs out of 128-byte rows, far past the threshold."""
    source = np.random.default_rng(7).standard_normal((4096, 32)).astype(np.float32)
    assert source[:, 6:8].nbytes >= RUN_ITEM_MIN_BYTES
    out = np.zeros((4096 * 4, 2), np.float32)
    copy_box(out[4096:8192], source[:, 6:8])
    assert out[4096:8192].tobytes() == np.ascontiguousarray(source[:, 6:8]).tobytes()
    assert not out[:4096].any() and not out[8192:].any()
