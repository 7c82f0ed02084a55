"""MoE dispatch and combine across hosts: a token crosses to a remote host once.

The ranks form the hosts mesh ``(H, L)`` (``rs.Mesh.from_hosts``): rank ``(h, l)`` is local
rank ``l`` of host ``h``; with ``P`` experts per rank, host ``h`` holds experts
``h*L*P .. (h+1)*L*P - 1``. Dispatch runs in two exchanges (DeepEP's normal path, on the
engines here):

1. **Across hosts**, among the ranks with the same local index (the hosts mesh's "host" dim):
   a source sends each token ONCE to every host holding at least one of its kept experts, with
   the token's routing on that host (``k`` host-local expert ids, -1 where a slot goes
   elsewhere). Its peer there, rank ``(h', l)``, is the token's forwarder on that host.
2. **Inside each host** (the "local" dim): the forwarder copies each token to the ranks holding
   its experts there, one row per (token, slot).

A source's rows to its own host never cross: each forwarder's rows come in two parts (its own
host's, the other hosts'), and ``reshard.moe.two_level`` forwards the first while the second is
on the link. The expert ranks then put their rows in ``dispatch``'s order (by local expert, then source rank,
then token), so what a caller sees equals the flat path's ``expert_inputs`` bit for bit.

Combine runs the way back and sums early: each forwarder adds ``weights[t, j] * out(t, j)`` over
the token's slots on its host, in slot order; one row per (token, host) crosses back, and the
source adds its hosts' rows in host order. The flat path writes the same sum as
``s * y_0 + sum_j w_j (y_j - y_0)`` (exact for identity experts with weights summing to one),
so the two agree within the dtype's rounding of a different order; top-1 without weights is
bit for bit (each token's one row comes home as it is).

Routing indices are worked out on every rank with numpy from the counts everyone has; the only
integers that travel with the tokens are each row's host-local expert ids (``k`` int64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..execution.arrays import is_torch
from ..planning import host_costs

Array = Any


@dataclass
class HostRoutes:
    """What the exchanges of a dispatch moved, kept for combine (this rank's three roles:
    source, forwarder, expert rank). A forwarder's rows are in two parts: those from its own
    host (a source's rows to its own host never cross) and those from the others."""

    mesh: Any  # rs.Mesh (hosts, ranks per host)
    # source: token of each row sent across (host-major, token order), rows to / from each host
    row_token: np.ndarray
    across_send: list[int]
    across_recv: list[int]
    # forwarder, per part (own host, other hosts): each pair sent inside (row of the part * k +
    # slot, in send order), pairs to each local rank
    pair_at: tuple[np.ndarray, np.ndarray]
    inside_send: tuple[list[int], list[int]]
    # expert rank: its blocks (``expert_blocks``), pairs from each local rank per part
    blocks: np.ndarray
    inside_recv: tuple[list[int], list[int]]

    @property
    def held(self) -> tuple[int, int]:
        """The forwarder's rows in each part (from its own host, from the others)."""
        own = self.across_recv[self.mesh.coord[0]]
        return own, sum(self.across_recv) - own

    def own_rows(self) -> slice:
        """The source's rows to its own host, within its rows across (``row_token``)."""
        return own_block(self.across_send, self.mesh.coord[0])

    def tokens_by_host(self) -> list[np.ndarray]:
        """The source's tokens of its rows to each host, in host order."""
        return np.split(self.row_token, np.cumsum(self.across_send)[:-1])


def own_block(counts: list[int], host: int) -> slice:
    """Host ``host``'s run among host-major rows of ``counts`` (rows per host)."""
    at = sum(counts[:host])
    return slice(at, at + counts[host])


def remote(counts: list[int], host: int) -> list[int]:
    """``counts`` (one per host) with ``host``'s set to 0: what crosses."""
    return [0 if h == host else c for h, c in enumerate(counts)]


def crossing(counts: list[int], host: int) -> np.ndarray:
    """bool, one per host-major row of ``counts``: whether the row goes to another host."""
    return np.repeat(np.arange(len(counts)) != host, counts)


def host_rows(ids: np.ndarray, kept: np.ndarray, experts_per_host: int, hosts: int) -> np.ndarray:
    """bool ``[T, H]``: whether token t has a kept slot on host h (its rows across, one per host)."""
    on = np.zeros((ids.shape[0], hosts), dtype=bool)
    t, j = np.nonzero(kept)
    on[t, ids[t, j] // experts_per_host] = True
    return on


def routes(ids: np.ndarray, kept: np.ndarray, kept_counts: np.ndarray, rows_to_host: np.ndarray, rank: int,
           mesh_shape: tuple[int, int], per_rank: int) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    """The source side: (token of each row across, each row's host-local routing ``[R, k]``,
    rows to each host, rows from each host). ``rows_to_host``: ``[N, H]``, every rank's."""
    hosts, local = mesh_shape
    per_host = local * per_rank
    on = host_rows(ids, kept, per_host, hosts)
    host_of, token_of = np.nonzero(on.T)  # host-major, then token order
    routing = np.where(kept[token_of] & (ids[token_of] // per_host == host_of[:, None]), ids[token_of] % per_host, -1)
    h, le = divmod(rank, local)
    across_send = [int(v) for v in rows_to_host[rank]]
    across_recv = [int(rows_to_host[hs * local + le, h]) for hs in range(hosts)]
    return token_of, routing.astype(np.int64), across_send, across_recv


def forward_pairs(routing: np.ndarray, local: int, per_rank: int) -> tuple[np.ndarray, list[int]]:
    """The forwarder: (row * k + slot of each pair, ordered by destination local rank, local
    expert, then row and slot; pairs to each local rank)."""
    flat = routing.reshape(-1)
    at = np.flatnonzero(flat >= 0)
    at = at[np.argsort(flat[at], kind="stable")]  # the id is local rank * P + expert: one key
    return at, [int(v) for v in np.bincount(flat[at] // per_rank, minlength=local)]


def expert_blocks(kept_counts: np.ndarray, rank: int, mesh_shape: tuple[int, int], per_rank: int
                  ) -> tuple[np.ndarray, tuple[list[int], list[int]]]:
    """The expert rank: (its non-empty blocks, int64 ``[B, 4]`` rows of (part, start in that
    part's arrival, start in ``expert_inputs``, rows), in ``expert_inputs`` order; pairs from
    each local rank, per part). A block is the pairs of one source rank for one local expert.
    Two exchanges arrive: part 0 the own host's sources, part 1 the other hosts'. From local
    rank ``ls`` come, in each, its blocks by (expert, source host) (``forward_pairs``' order);
    ``dispatch`` orders rows by (expert, source rank = source host * L + ls)."""
    hosts, local = mesh_shape
    host = rank // local
    mine = kept_counts[:, rank * per_rank : (rank + 1) * per_rank].reshape(hosts, local, per_rank)  # [hs, ls, le]
    hs, ls, le = (g.ravel() for g in np.meshgrid(np.arange(hosts), np.arange(local), np.arange(per_rank),
                                                  indexing="ij"))
    size = mine.ravel().astype(np.int64)
    part = (hs != host).astype(np.int64)
    arrival = np.lexsort((hs, le, ls, part))  # part, then source local rank, expert, source host
    arrival_start = np.empty_like(size)
    arrival_start[arrival] = np.cumsum(size[arrival]) - size[arrival]
    arrival_start[part == 1] -= size[part == 0].sum()  # each part counts from its own start
    expert = np.lexsort((ls, hs, le))
    expert_start = np.empty_like(size)
    expert_start[expert] = np.cumsum(size[expert]) - size[expert]
    table = np.stack([part, arrival_start, expert_start, size], axis=1)[expert]
    own = [int(v) for v in mine[host].sum(axis=1)]
    other = [int(v) for v in mine.sum(axis=(0, 2)) - np.asarray(own, dtype=np.int64)]
    return table[table[:, 3] > 0], (own, other)


def row_bytes(tokens: Array) -> int:
    per_row = int(np.prod(tokens.shape[1:], dtype=np.int64))
    return per_row * (tokens.element_size() if is_torch(tokens) else tokens.dtype.itemsize)


def cheaper(kept_counts: np.ndarray, rows_to_host: np.ndarray, mesh_shape: tuple[int, int], per_rank: int,
                   row_bytes: int) -> bool:
    """Whether the two-level path is estimated faster, from what every rank knows alike: the
    bytes each path puts on the busiest host link (both ways) and the forwarding inside."""
    hosts, local = mesh_shape
    host_of_rank = np.arange(hosts * local) // local
    host_of_expert = np.arange(kept_counts.shape[1]) // (local * per_rank)
    crossing = host_of_rank[:, None] != host_of_expert[None, :]
    flat = np.zeros(hosts, dtype=np.int64)  # rows leaving each host
    np.add.at(flat, host_of_rank, (kept_counts * crossing).sum(axis=1))
    two = np.zeros(hosts, dtype=np.int64)
    np.add.at(two, host_of_rank, (rows_to_host * (host_of_rank[:, None] != np.arange(hosts)[None, :])).sum(axis=1))
    inside = int(kept_counts.sum()) * row_bytes // (hosts * local)  # the mean rank's forwarded bytes
    return host_costs.moe_cheaper(int(flat.max()) * row_bytes, int(two.max()) * row_bytes, inside, hosts, local)
