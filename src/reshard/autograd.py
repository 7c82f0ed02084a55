"""Backward passes: every exchange's gradient is the reverse exchange.

Imported only when a torch tensor that requires grad reaches an op, so torch is already loaded.
Each op runs its forward as usual on the detached input and then attaches the result to the
tape (``attach``) with a backward that moves the gradient back the way the data came; the ops
build those reverse exchanges, this module gives their geometry. The forward's communication plan (every rank's shape and split) is kept, so a
backward needs no metadata round and runs without the check (the forward was checked).

* all_to_all(split s, concat c): the gradient of rank r's result is cut along ``c`` the way the
  pieces arrived, each piece goes back to the rank it came from, and the pieces are
  concatenated along ``s``.
* all_to_all_v(send_counts -> recv_counts): all_to_all_v(grad, recv_counts, recv_counts=send_counts).
* redistribute(src -> dst): redistribute(grad, dst -> src), where a Partial placement on either
  side reads as Replicate for the gradient (the gradient of a sum with respect to each addend is
  the whole gradient), as in PyTorch DTensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .layout import Partial, Placement, Replicate


class _Attach(torch.autograd.Function):
    """Identity on the forward's result; backward calls ``reverse(grad)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, held: list, reverse: Any) -> torch.Tensor:
        ctx.reverse = reverse
        return held.pop()  # the result was computed already; handed over outside the tensor args

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return ctx.reverse(grad), None, None


def attach(x: torch.Tensor, out: torch.Tensor, reverse: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``out`` on the tape as a function of ``x``, with ``reverse(grad)`` as its backward."""
    return _Attach.apply(x, [out.detach()], reverse)


def all_to_all_backward_geometry(
    s: int, c: int, splits: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(split table, input shapes) of the reverse all-to-all (split along ``c``, concatenate
    along ``s``): what rank i sends back to rank j is what j sent to i."""
    n = len(shapes)
    back_splits = [tuple(splits[j][i] if s == c else shapes[j][c] for j in range(n)) for i in range(n)]
    out_shapes = []
    for i in range(n):
        pieces = [list(shapes[j]) for j in range(n)]
        for j in range(n):
            pieces[j][s] = splits[j][i]
        total = list(pieces[0])
        total[c] = sum(p[c] for p in pieces)
        out_shapes.append(tuple(total))
    return back_splits, out_shapes


def backward_placements(src: Placement, dst: Placement) -> tuple[Placement, Placement]:
    """The gradient's layout change for ``src -> dst``: ``dst -> src`` with Partial read as
    Replicate (the gradient of a sum with respect to each addend is the whole gradient)."""
    back_src = Replicate() if isinstance(dst, Partial) else dst
    back_dst = Replicate() if isinstance(src, Partial) else src
    return back_src, back_dst
