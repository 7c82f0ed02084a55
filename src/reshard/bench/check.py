"""How a bench method's result is checked: elements that differ from the oracle."""

from __future__ import annotations

from typing import Any

import numpy as np


def numpy_of(a: Any) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.detach().cpu().numpy()


def count_wrong(got: Any, want: np.ndarray) -> int:
    got = numpy_of(got)
    if got.shape != want.shape:
        return int(want.size) or 1
    return int(np.count_nonzero(got != want))
