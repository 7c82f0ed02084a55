"""MoE dispatch and combine in two levels (``reshard.moe.host_routes`` says what goes where): the
exchanges, and the local work that overlaps the link between hosts.

A source's rows to its own host never cross, so each forwarder's rows come in two parts: its
own host's (there at once) and the other hosts' (behind the link). Dispatch starts the rows
across, forwards its own host's part inside the host while they travel, then the rest.
Combine does the reverse: it sums the other hosts' part first and starts it back across, then
sums its own host's part while that travels. Each part's exchanges run in the same order on
every rank; where the engine allows two groups at once (gloo; MPI with ``THREAD_MULTIPLE``)
and nothing is on the autograd tape, the exchange across runs on a thread of its own, else
first. The results are the same either way, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..comm import Comm
from ..execution import execute, phases
from ..execution.arrays import is_torch
from ..mesh import Mesh
from . import host_routes, sums
from .rows import may_overlap, start_rows, take_rows

Array = Any


def _exchanged(parts: list, name: str, comm: Comm, x: Array, send: list[int], recv: list[int], what: str) -> Array:
    """``all_to_all_v`` of ``x``'s rows on ``comm``, its stats kept in ``parts`` under ``name``."""
    out, stats = start_rows(comm, x, send, recv, what, overlap=False)()
    parts.append((name, stats))
    return out


def dispatch(comm: Comm, tokens: Array, ids: np.ndarray, kept: np.ndarray, kept_counts: np.ndarray,
             rows_to_host: np.ndarray, mesh_shape: tuple[int, int], per_rank: int
             ) -> tuple[Array, host_routes.HostRoutes]:
    """(``expert_inputs`` as the flat dispatch gives them, the routes for combine)."""
    if comm.hosts_mesh is None:  # made once: its sub-communicators are kept with it
        comm.hosts_mesh = Mesh.from_hosts(comm)
    mesh = comm.hosts_mesh
    across, inside = mesh.sub(0), mesh.sub(1)
    host, top_k = mesh.coord[0], ids.shape[1]
    row_token, routing, across_send, across_recv = host_routes.routes(ids, kept, kept_counts, rows_to_host, comm.rank,
                                                                    mesh_shape, per_rank)
    parts: list = []
    # the routing first: a few bytes a row, across a link that is still idle (behind the tokens
    # it would wait for their queue to drain)
    routed = _exchanged(parts, "all_to_all_v (routing across hosts)", across, routing, across_send, across_recv,
                        "moe.dispatch (routing)")
    own = host_routes.own_block(across_recv, host)
    other = np.r_[0:own.start, own.stop:routed.shape[0]]
    blocks, inside_recv = host_routes.expert_blocks(kept_counts, comm.rank, mesh_shape, per_rank)
    # the pack: each token once per other host, on its way while the own host's part is forwarded
    crossing = row_token[host_routes.crossing(across_send, host)]
    with start_rows(across, take_rows(tokens, crossing),
                    host_routes.remote(across_send, host), host_routes.remote(across_recv, host),
                    "moe.dispatch (across hosts)", may_overlap(across, tokens)) as finish:
        own_pairs, own_send = host_routes.forward_pairs(routed[own], mesh_shape[1], per_rank)
        own_tokens = row_token[host_routes.own_block(across_send, host)]
        own_rows = own_tokens[own_pairs // top_k]
        received_own = _exchanged(parts, "all_to_all_v (inside the host, own host's tokens)", inside,
                                  take_rows(tokens, own_rows), own_send, inside_recv[0],
                                  "moe.dispatch (inside the host)")
        with phases.phase("wait for the rows across"):
            arrived, stats = finish()
    parts.append(("all_to_all_v (across hosts)", stats))
    other_pairs, other_send = host_routes.forward_pairs(routed[other], mesh_shape[1], per_rank)
    received = _exchanged(parts, "all_to_all_v (inside the host, other hosts' tokens)", inside,
                          take_rows(arrived, other_pairs // top_k), other_send, inside_recv[1],
                          "moe.dispatch (inside the host)")
    routes = host_routes.HostRoutes(mesh, row_token, across_send, across_recv, (own_pairs, other_pairs),
                                  (own_send, other_send), blocks, inside_recv)
    received_by_part = (received_own, received)
    # each part's first zero rows too: both exchanges stay on the autograd tape with no block from one
    expert_inputs = _joined([part[0:0] for part in received_by_part]
                            + [received_by_part[p][a : a + n] for p, a, _, n in blocks.tolist()], received)
    # each gather of rows that moved some is a pack (the flat dispatch counts its one alike)
    execute.merged("moe.dispatch", parts, packs=sum(1 for rows in (crossing, own_rows, other_pairs) if len(rows)))
    return expert_inputs, routes


def combine(expert_outputs: Array, routes: host_routes.HostRoutes, num_tokens: int, top_k: int,
            weights: Array | None) -> Array:
    """The way back: each token's slots on a host summed by its forwarder there, one row per
    (token, host) back across, the hosts' rows added at home in host order."""
    across, inside = routes.mesh.sub(0), routes.mesh.sub(1)
    host = routes.mesh.coord[0]
    parts: list = []
    w_own = w_other = None
    if weights is not None:  # each row's gate weights travel to its forwarder (k numbers a row)
        w = weights.reshape(num_tokens, top_k)
        w_other = _exchanged(parts, "all_to_all_v (weights across hosts)", across,
                             take_rows(w, routes.row_token[host_routes.crossing(routes.across_send, host)]),
                             host_routes.remote(routes.across_send, host), host_routes.remote(routes.across_recv, host),
                             "moe.combine (weights)")
        w_own = take_rows(w, routes.row_token[routes.own_rows()])
    # the other hosts' part first, so that it starts back across as early as it can
    back = _exchanged(parts, "all_to_all_v (inside the host, other hosts' tokens)", inside,
                      _in_arrival(expert_outputs, routes.blocks, 1), routes.inside_recv[1], routes.inside_send[1],
                      "moe.combine (inside the host)")
    partial = sums.host_sums(back, routes.pair_at[1], top_k, routes.held[1], w_other)
    with start_rows(across, partial, host_routes.remote(routes.across_recv, host),
                    host_routes.remote(routes.across_send, host), "moe.combine (across hosts)",
                    may_overlap(across, partial)) as finish:
        back_own = _exchanged(parts, "all_to_all_v (inside the host, own host's tokens)", inside,
                              _in_arrival(expert_outputs, routes.blocks, 0), routes.inside_recv[0],
                              routes.inside_send[0], "moe.combine (inside the host)")
        partial_own = sums.host_sums(back_own, routes.pair_at[0], top_k, routes.held[0], w_own)
        with phases.phase("wait for the rows across"):
            home, stats = finish()
    parts.append(("all_to_all_v (across hosts)", stats))
    blocks, at = [], 0
    for h, tokens in enumerate(routes.tokens_by_host()):
        if h == host:
            blocks.append((partial_own, tokens))
        else:
            blocks.append((home[at : at + tokens.size], tokens))
            at += tokens.size
    out = sums.sum_over_hosts(blocks, num_tokens)
    # each part's rows joined in arrival order before its exchange (``_in_arrival``): a pack
    # where it has any (the blocks are the non-empty ones, by part)
    execute.merged("moe.combine", parts, packs=len(np.unique(routes.blocks[:, 0])))
    return out


def _in_arrival(expert_outputs: Array, blocks: np.ndarray, part: int) -> Array:
    """The rows of ``expert_outputs`` that arrived in ``part``, in their order of arrival."""
    mine = blocks[blocks[:, 0] == part]
    mine = mine[np.argsort(mine[:, 1], kind="stable")]
    return _joined([expert_outputs[e : e + n] for _, _, e, n in mine.tolist()], expert_outputs)


@phases.timed("join")
def _joined(runs: list[Array], like: Array) -> Array:
    """The runs (row ranges of arrays like ``like``) one after another, in one pass (on the
    autograd tape where they are); no runs: no rows."""
    if not runs:
        return like[0:0].clone() if is_torch(like) else like[0:0].copy()
    if is_torch(like):
        import torch

        return torch.cat(runs)
    return np.concatenate(runs)
