"""Pictures of a small MoE dispatch across hosts (``reshard explain --moe``): each rank's box
holds its tokens (column 0) and, between the two exchanges of the two-level path, the tokens it
forwards for the other host (column 1); after dispatch, its expert's rows (column 0). A token
is named by its source rank's letter and its index (``B2``: rank 1's token 2) and keeps that
rank's colour wherever it goes.

Three scenes from one routing: the flat dispatch (one copy per (token, expert) straight to the
expert's rank), then the two-level one's two exchanges (across hosts, one copy per (token,
remote host) to the rank with the same local index there; inside each host, one copy per
(token, expert) to the expert's rank).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .scenes import Cell, Move, Scene

Say = Callable[..., str]


def token_name(rank: int, t: int) -> str:
    return f"{chr(ord('A') + rank % 26)}{t}"


def moe_scenes(ids: Sequence[Sequence[Sequence[int]]], experts_rows: Sequence[Sequence[tuple[int, int]]],
               hosts: int, say: Say, lang: str = "en") -> list[Scene]:
    """``ids[r][t]``: the experts of rank r's token t (one expert per rank: expert e is on rank
    e); ``experts_rows[d]``: the (source rank, token) of each row rank d's expert received, in
    order (what dispatch returned there)."""
    n = len(ids)
    per_host = n // hosts
    host = [r // per_host for r in range(n)]
    labels = tuple(say("moe.box", rank=r, host=host[r]) for r in range(n))
    tokens = {r: [Cell(t, 0, r, name=token_name(r, t)) for t in range(len(ids[r]))] for r in range(n)}
    row_at = {(d, k): src for d, rows in enumerate(experts_rows) for k, src in enumerate(rows)}
    placed = {d: [Cell(k, 0, s, name=token_name(s, t)) for k, (s, t) in enumerate(rows)]
              for d, rows in enumerate(experts_rows)}
    order: dict[tuple[int, int, int], int] = {}  # (dest, source, token) -> its row at dest, in turn
    for (d, k), (s, t) in sorted(row_at.items()):
        order.setdefault((d, s, t), k)

    def row_of(d: int, s: int, t: int) -> int:
        return order[(d, s, t)]

    # the flat dispatch: each (token, expert) pair straight to the expert's rank
    flat_moves = [Move(t, 0, s, e, to=(row_of(e, s, t), 0), name=token_name(s, t))
                  for s in range(n) for t, experts in enumerate(ids[s]) for e in experts]
    crossing = sum(host[m.src] != host[m.dst] for m in flat_moves)
    rows = max([len(ids[r]) for r in range(n)] + [len(v) for v in experts_rows] + [1])
    # two levels, across: each token once to each remote host with one of its experts, to the
    # rank with the same local index there (its forwarder), into column 1
    forwarded: dict[int, list[tuple[int, int]]] = {r: [] for r in range(n)}
    across_moves = []
    for s in range(n):
        for t, experts in enumerate(ids[s]):
            for h in sorted({host[e] for e in experts} - {host[s]}):
                twin = h * per_host + s % per_host
                across_moves.append(Move(t, 0, s, twin, to=(len(forwarded[twin]), 1), name=token_name(s, t)))
                forwarded[twin].append((s, t))
    rows = max([rows] + [len(v) for v in forwarded.values()])
    between = {r: tokens[r] + [Cell(k, 1, s, name=token_name(s, t)) for k, (s, t) in enumerate(forwarded[r])]
               for r in range(n)}
    # two levels, inside: from the token's holder on the expert's host to the expert's rank
    inside_moves = []
    for s in range(n):
        for t, experts in enumerate(ids[s]):
            for e in experts:
                if host[e] == host[s]:
                    at, holder = (t, 0), s
                else:
                    holder = host[e] * per_host + s % per_host
                    at = (forwarded[holder].index((s, t)), 1)
                inside_moves.append(Move(*at, holder, e, to=(row_of(e, s, t), 0), name=token_name(s, t)))
    grid = (rows, 2)
    return [
        Scene("flat", say("moe.flat.title"), say("moe.flat.caption", crossing=crossing, pairs=len(flat_moves)), n, {},
              tokens, placed, flat_moves, grid, labels, lang=lang),
        Scene("across", say("moe.across.title"), say("moe.across.caption", crossing=len(across_moves)), n, {},
              tokens, between, across_moves, grid, labels, lang=lang),
        Scene("inside", say("moe.inside.title"), say("moe.inside.caption"), n, {}, between, placed, inside_moves,
              grid, labels, lang=lang),
    ]
