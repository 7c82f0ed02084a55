"""Backward passes: every exchange's gradient is the reverse exchange.

Imported only when a torch tensor that requires grad reaches an op, so torch is already loaded.
Each op runs its forward as usual on the detached input and then attaches the result to the
tape through a ``torch.autograd.Function`` whose backward moves the gradient back the way the
data came. The forward's communication plan (every rank's shape and split) is kept, so a
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

from collections.abc import Sequence
from typing import Any

import torch

from . import ops
from .comm import Comm
from .layout import Partial, Replicate


class _Attach(torch.autograd.Function):
    """Identity on the forward's result; backward calls ``reverse(grad)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, held: list, reverse: Any) -> torch.Tensor:
        ctx.reverse = reverse
        return held.pop()  # the result was computed already; handed over outside the tensor args

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return ctx.reverse(grad), None, None


def _attach(x: torch.Tensor, out: torch.Tensor, reverse: Any) -> torch.Tensor:
    return _Attach.apply(x, [out.detach()], reverse)


def attach_all_to_all(
    x: torch.Tensor, out: torch.Tensor, comm: Comm, s: int, c: int,
    splits: Sequence[Sequence[int]], shapes: Sequence[Sequence[int]],
) -> torch.Tensor:
    n = len(shapes)
    # What rank i sends back to rank j is what j sent to i: its length along c.
    back_splits = [tuple(splits[j][i] if s == c else shapes[j][c] for j in range(n)) for i in range(n)]
    out_shapes = []
    for i in range(n):
        pieces = [ops._with_dim(shapes[j], s, splits[j][i]) for j in range(n)]
        out_shapes.append(tuple(ops._with_dim(pieces[0], c, sum(p[c] for p in pieces))))

    def reverse(grad: torch.Tensor) -> torch.Tensor:
        call = ops._Call("all_to_all (backward)", grad, comm, False)
        call.take_input()
        return ops._all_to_all_core(call, call.x, c, s, back_splits, out_shapes)

    return _attach(x, out, reverse)


def attach_all_to_all_v(
    x: torch.Tensor, out: torch.Tensor, comm: Comm, send_counts: list[int], recv_counts: list[int]
) -> torch.Tensor:
    def reverse(grad: torch.Tensor) -> torch.Tensor:
        back, _ = ops.all_to_all_v(grad, recv_counts, comm, recv_counts=send_counts, check=False)
        return back

    return _attach(x, out, reverse)


def attach_reverse(x: torch.Tensor, out: torch.Tensor, reverse: Any) -> torch.Tensor:
    """``out`` on the tape as a function of ``x``, with ``reverse(grad)`` as its backward
    (MoE's per-expert exchanges)."""
    return _attach(x, out, reverse)


def attach_redistribute(
    x: torch.Tensor, out: torch.Tensor, comm: Comm, src: Any, dst: Any, global_shape: Sequence[int] | None
) -> torch.Tensor:
    back_src = Replicate() if isinstance(dst, Partial) else dst
    back_dst = Replicate() if isinstance(src, Partial) else src

    def reverse(grad: torch.Tensor) -> torch.Tensor:
        if back_src == back_dst:
            return grad
        shape = None if global_shape is None else tuple(global_shape)
        return ops.redistribute(grad, back_src, back_dst, comm, global_shape=shape, check=False)

    return _attach(x, out, reverse)
