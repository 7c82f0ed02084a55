"""Backward passes: every exchange's gradient is the reverse exchange.

Imported only when a torch tensor that requires grad reaches an op, so torch is already loaded.
Each op runs its forward as usual on the detached input and then attaches the result to the
tape (``attach``) with a backward that moves the gradient back the way the data came: the plan
back (``RankPlan.reverse``, or ``planner.backward_placements`` for a layout change). The
forward's plan is kept, so a backward needs no metadata round and runs without the check (the
forward was checked).

* all_to_all(split s, concat c): the gradient of rank r's result is cut along ``c`` the way the
  pieces arrived, each piece goes back to the rank it came from, and the pieces are
  concatenated along ``s``.
* all_to_all_v(send_counts -> recv_counts): all_to_all_v(grad, recv_counts, recv_counts=send_counts).
* redistribute(src -> dst): redistribute(grad, dst -> src), where a Partial placement on either
  side reads as Replicate for the gradient (the gradient of a sum with respect to each addend is
  the whole gradient), as in PyTorch DTensor.
* all_gather, reduce_scatter and all_reduce (sum, avg): JAX's transposes, each rank's result
  feeding its own loss (``ops._summed_piece_back``, ``ops._gathered_back``); max, min and gather
  leave their results off the tape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
