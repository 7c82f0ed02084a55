"""How MoE combine adds a token's slots: all ``k`` at once (the flat path), a host's share on its
forwarder and the hosts' rows at home (the two-level path, ``reshard.moe.host_routes``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..execution import phases
from ..execution.arrays import array_backend, is_torch, loaded_torch, without_negative_strides

Array = Any


def torch_view(a: Array) -> Any:
    """A numpy array as a tensor over the same memory, where torch is loaded already and takes
    it (writeable, a dtype torch has), for its single-pass row gathers and scatters; else None."""
    torch = loaded_torch()
    if torch is None or not isinstance(a, np.ndarray) or not a.flags.writeable or a.ndim == 0:
        return None
    try:
        return torch.from_numpy(a)
    except (TypeError, ValueError):  # a dtype torch lacks, a negative stride
        return None


def _fast_torch(back: Array, weights: Array | None) -> bool:
    """Whether the rows can be summed in place (no autograd tape to keep)."""
    import torch

    if not torch.is_grad_enabled():
        return True
    return not back.requires_grad and not (is_torch(weights) and weights.requires_grad)


def sum_slots(slots: Array, weights: Array | None, kept: np.ndarray) -> Array:
    """``sum_j weights[:, j] * slots[:, j]`` over kept slots, written as
    ``s * y_0 + sum_{j>0} w_j * (y_j - y_0)`` with ``s = sum_j w_j``: the same sum, but when
    every slot holds the same row (identity experts) and the weights sum to one it returns that
    row bit for bit. A sum within ``4 k`` ulps of one, in the weights' own precision, counts as
    one (float32 softmax weights miss one by an ulp about one time in eight); its gradient still
    flows. The weights are added in float32 at least (bfloat16 rows with float32 weights keep
    the weights' precision), then cast to the rows' dtype."""
    num_tokens, top_k = slots.shape[0], slots.shape[1]
    if weights is None and top_k == 1:
        return slots[:, 0]
    ones = (1,) * (slots.ndim - 2)
    torch_in = is_torch(slots)
    floating = (slots.dtype.is_floating_point or slots.dtype.is_complex) if torch_in else slots.dtype.kind in "fc"
    if not floating:
        return sum_slots_int(slots, weights)
    if torch_in:
        import torch

        real = slots.real.dtype if slots.dtype.is_complex else slots.dtype
        given = weights.dtype if weights is not None and weights.dtype.is_floating_point else real
        acc = torch.promote_types(torch.promote_types(real, given), torch.float32)
        w = torch.ones((num_tokens, top_k), dtype=acc, device=slots.device) if weights is None \
            else weights.reshape(num_tokens, top_k).to(acc)
        w = w * torch.from_numpy(kept).to(device=slots.device, dtype=acc)
        total = w.sum(dim=1)
        snap = (total - 1).abs() <= 4 * top_k * torch.finfo(given).eps
        total = torch.where(snap, total + (1 - total).detach(), total).to(slots.dtype)
        w = w.to(slots.dtype)
        base = slots[:, 0]
        wants_grad = torch.is_grad_enabled() and weights is not None and weights.requires_grad
        if top_k == 2 and bool(snap.all()) and not wants_grad:
            # s == 1: y0 + w1 (y1 - y0) is one fused lerp (its gradient in w0 would be lost,
            # hence only without a weight gradient)
            weight = w[:, 1].reshape(num_tokens, *ones)
            if torch.is_grad_enabled() and slots.requires_grad:
                return torch.lerp(base, slots[:, 1], weight)
            return torch.lerp(base, slots[:, 1], weight, out=array_backend("torch").empty(base.shape, like=base))
        scale = total.reshape(num_tokens, *ones)
        if torch.is_grad_enabled() and (slots.requires_grad or w.requires_grad):
            out = base * scale
            for j in range(1, top_k):
                out = torch.addcmul(out, slots[:, j] - base, w[:, j].reshape(num_tokens, *ones))
            return out
        # the backend's buffer: memory the heap freed, where a fresh product page-faults each call
        out = array_backend("torch").empty(base.shape, like=base)
        rows = _chunk_rows(base) if base.device.type == "cpu" else max(1, num_tokens)  # a GPU takes all at once
        diff = array_backend("torch").empty((min(rows, num_tokens), *base.shape[1:]), like=base)
        weight = w.reshape(num_tokens, top_k, *ones)
        for a in range(0, num_tokens, rows):  # in place, a cache-sized block of tokens at a time
            b = min(num_tokens, a + rows)
            part, first, d = out[a:b], base[a:b], diff[: b - a]
            torch.mul(first, scale[a:b], out=part)
            for j in range(1, top_k):
                part.addcmul_(torch.sub(slots[a:b, j], first, out=d), weight[a:b, j])
        return out
    real = slots.real.dtype if slots.dtype.kind == "c" else slots.dtype
    w = np.ones((num_tokens, top_k), dtype=real) if weights is None else np.asarray(weights).reshape(num_tokens, top_k)
    given = w.dtype if w.dtype.kind == "f" else real
    w = (w * kept).astype(np.result_type(real, given, np.float32))
    total = w.sum(axis=1)
    total = np.where(np.abs(total - 1) <= 4 * top_k * np.finfo(given).eps, np.ones_like(total), total)
    w, total = w.astype(slots.dtype), total.astype(slots.dtype)
    base = slots[:, 0]
    scale, weight = total.reshape(num_tokens, *ones), w.reshape(num_tokens, top_k, *ones)
    out = np.empty(base.shape, dtype=np.result_type(base, scale))
    rows = _chunk_rows(base)
    diff = np.empty((min(rows, num_tokens), *base.shape[1:]), dtype=out.dtype) if top_k > 1 else None
    for a in range(0, num_tokens, rows):  # a cache-sized block of tokens at a time: each pass reads it from cache
        b = min(num_tokens, a + rows)
        part, first = out[a:b], base[a:b]
        np.multiply(first, scale[a:b], out=part)
        for j in range(1, top_k):  # in place: the same operations as (y_j - y_0) * w_j, no fresh buffers
            d = diff[: b - a]
            np.subtract(slots[a:b, j], first, out=d)
            d *= weight[a:b, j]
            part += d
    return out


CHUNK_BYTES = 256 << 10  # a block of tokens whose rows, and the passes over them, stay in the core's cache


def _chunk_rows(rows: Array) -> int:
    """How many tokens' rows of ``rows`` (``[tokens, ...]``) make one cache-sized block (at least one)."""
    per = (rows.element_size() if is_torch(rows) else rows.itemsize) * math.prod(rows.shape[1:])
    return max(1, CHUNK_BYTES // max(per, 1))


def sum_slots_int(slots: Array, weights: Array | None) -> Array:
    """Integer and bool rows: the sum in int64 (weights, if any, applied in float64), rounded once."""
    num_tokens, top_k = slots.shape[0], slots.shape[1]
    ones = (1,) * (slots.ndim - 2)
    if is_torch(slots):
        import torch

        wide = torch.float64 if weights is not None else torch.int64
        acc = slots[:, 0].to(wide) * (1 if weights is None else weights.reshape(num_tokens, top_k)[:, 0].to(wide).reshape(num_tokens, *ones))
        for j in range(1, top_k):
            term = slots[:, j].to(wide)
            if weights is not None:
                term = term * weights.reshape(num_tokens, top_k)[:, j].to(wide).reshape(num_tokens, *ones)
            acc = acc + term
        return acc.to(slots.dtype)
    wide = np.float64 if weights is not None else np.int64
    acc = np.zeros((num_tokens, *slots.shape[2:]), dtype=wide)
    for j in range(top_k):
        term = slots[:, j].astype(wide)
        if weights is not None:
            term = term * np.asarray(weights, dtype=np.float64).reshape(num_tokens, top_k)[:, j].reshape(num_tokens, *ones)
        acc += term
    return acc.astype(slots.dtype)


@phases.timed("sums")
def host_sums(back: Array, pair_at: np.ndarray, top_k: int, held: int, weights: Array | None) -> Array:
    """The forwarder's part of combine: ``[R, *F]``, for each row it forwarded, the sum over
    its slots on this host of ``weights[row, j] * out(row, j)`` in slot order (``back``: the
    pairs' outputs in ``pair_at`` order). Integer rows add in int64 (float64 with weights) and
    are rounded here: a weighted integer row spread over hosts is rounded once per host, where
    the flat path rounds once."""
    rows, slot = np.divmod(pair_at, top_k)
    trail = tuple(back.shape[1:])
    ones = (1,) * len(trail)
    written = np.zeros(held, dtype=bool)
    as_tensor = None if is_torch(back) else torch_view(back)
    if as_tensor is not None or is_torch(back) and _fast_torch(back, weights):
        return _host_sums_in_place(back, as_tensor, rows, slot, top_k, held, weights)
    if is_torch(back):
        import torch

        floating = back.dtype.is_floating_point or back.dtype.is_complex
        wide = back.dtype if floating else (torch.float64 if weights is not None else torch.int64)
        out = torch.zeros((held, *trail), dtype=wide, device=back.device)
        for j in range(top_k):  # every slot, none held too: ``back`` and the weights stay on the tape
            sel = np.flatnonzero(slot == j)
            part = torch.index_select(back, 0, torch.from_numpy(sel).to(back.device)).to(wide)
            index = torch.from_numpy(rows[sel]).to(back.device)
            if weights is not None:
                part = part * weights[:, j].index_select(0, index).to(wide).reshape(-1, *ones)
            first = torch.from_numpy(~written[rows[sel]])  # a row's first slot is copied, not added to 0
            out = out.index_copy(0, index[first], part[first]).index_add(0, index[~first], part[~first])
            written[rows[sel]] = True
        return out if floating else out.to(back.dtype)
    floating = back.dtype.kind in "fc"
    wide = back.dtype if floating else (np.float64 if weights is not None else np.int64)
    out = np.zeros((held, *trail), dtype=wide)
    for j in range(top_k):
        sel = np.flatnonzero(slot == j)
        if sel.size:
            part = back[sel].astype(wide, copy=False)
            if weights is not None:
                part = part * np.asarray(weights)[rows[sel], j].astype(wide).reshape(-1, *ones)
            first = ~written[rows[sel]]  # a row's first slot is copied, not added to 0 (-0.0 stays)
            out[rows[sel][first]] = part[first]
            out[rows[sel][~first]] += part[~first]  # one pair per row and slot: no index repeats
            written[rows[sel]] = True
    return out if floating else out.astype(back.dtype)


def _host_sums_in_place(back: Array, as_tensor: Any, rows: np.ndarray, slot: np.ndarray, top_k: int, held: int,
                        weights: Array | None) -> Array:
    """``host_sums`` off the autograd tape, with torch's in-place row ops (one pass each): a
    row's first slot on this host copied (weighted), the later ones added, in slot order.
    ``as_tensor``: ``back`` as a tensor where it is a numpy array (the result is numpy then)."""
    import torch

    src = back if as_tensor is None else as_tensor
    floating = src.dtype.is_floating_point or src.dtype.is_complex
    wide = src.dtype if floating else (torch.float64 if weights is not None else torch.int64)
    trail = tuple(src.shape[1:])
    ones = (1,) * len(trail)
    if as_tensor is not None and floating:
        out_np = np.zeros((held, *trail), dtype=back.dtype)
        out = torch.from_numpy(out_np)
    else:
        out_np, out = None, torch.zeros((held, *trail), dtype=wide, device=src.device)
    w = None
    if weights is not None:
        w = weights if is_torch(weights) else torch.from_numpy(without_negative_strides(weights, contiguous=True))
    written = np.zeros(held, dtype=bool)
    for j in range(top_k):
        sel = np.flatnonzero(slot == j)
        if not sel.size:
            continue
        first = ~written[rows[sel]]
        for pick, add in ((sel[first], False), (sel[~first], True)):
            if not pick.size:
                continue
            index = torch.from_numpy(rows[pick]).to(src.device)
            part = torch.index_select(src, 0, torch.from_numpy(pick).to(src.device))
            if part.dtype != wide:
                part = part.to(wide)
            if w is not None:
                part.mul_(w[:, j].index_select(0, index.to(w.device)).to(wide).reshape(-1, *ones))
            if add:
                out.index_add_(0, index, part)
            else:
                out.index_copy_(0, index, part)
        written[rows[sel]] = True
    if out_np is not None:
        return out_np
    result = out if floating else out.to(src.dtype)
    return result.numpy() if as_tensor is not None else result


@phases.timed("sums")
def sum_over_hosts(blocks: Sequence[tuple[Array, np.ndarray]], num_tokens: int) -> Array:
    """``[T, *F]``: each token's rows added in host order. ``blocks``: one (rows ``[R_h, *F]``,
    their tokens ``[R_h]``, distinct) per host, in host order. A token's first row is copied, the
    later ones added (floating rows add onto -0.0, which leaves any first row as it is, -0.0
    included); a token with none gives zeros."""
    first = blocks[0][0]
    trail = tuple(first.shape[1:])
    if not is_torch(first):  # torch keeps empty blocks: each host's rows stay on the autograd tape
        blocks = [(rows, tokens) for rows, tokens in blocks if len(tokens)]
    none = np.ones(num_tokens, dtype=bool)
    for _, tokens in blocks:
        none[tokens] = False
    if is_torch(first):
        import torch

        floating = first.dtype.is_floating_point or first.dtype.is_complex
        out = torch.full((num_tokens, *trail), -0.0 if floating else 0, dtype=first.dtype if floating else torch.int64,
                         device=first.device)
        for rows, tokens in blocks:
            index = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)).to(first.device)
            out = out.index_add(0, index, rows if floating else rows.to(torch.int64))
        if floating and none.any():
            out = out.index_fill(0, torch.from_numpy(np.flatnonzero(none)).to(first.device), 0)
        return out if floating else out.to(first.dtype)
    floating = first.dtype.kind in "fc"
    out = np.full((num_tokens, *trail), -0.0 if floating else 0, dtype=first.dtype if floating else np.int64)
    target = torch_view(out) if floating else None  # integers widen to int64: numpy adds across dtypes
    for rows, tokens in blocks:
        rows_view = None if target is None else torch_view(rows)
        if rows_view is not None:  # in place, one pass a host
            import torch

            target.index_add_(0, torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)), rows_view)
        else:
            out[tokens] += rows  # distinct tokens: no index repeats
    if floating:
        out[none] = 0
    return out if floating else out.astype(first.dtype)
