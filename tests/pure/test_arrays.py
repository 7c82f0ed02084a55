"""The torch array backend's result allocation: results of 256 KiB and up come from numpy (in the
dtype's numpy twin when it has one, else as bytes viewed in the dtype); every dtype must come
back as an ordinary, writable, contiguous tensor of the asked shape and dtype."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reshard.execution import arrays  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool, torch.complex64,
          torch.int8, torch.uint8, torch.int16, torch.int64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1024, 512), (7,), (3, 5, 2)])
def test_empty_gives_a_plain_tensor_of_the_asked_shape_and_dtype(dtype, shape):
    backend = arrays.array_backend("torch")
    like = torch.zeros(2, dtype=dtype)
    out = backend.empty(shape, like=like)
    assert out.dtype == dtype and tuple(out.shape) == shape and out.is_contiguous()
    values = (torch.arange(out.numel()) % 3 == 1).reshape(shape).to(dtype)
    out.copy_(values)  # writable, and holds exactly what was written
    assert torch.equal(out, values)
    other = backend.empty(shape, like=like)  # a second result never shares the first one's memory
    assert other.data_ptr() != out.data_ptr()
