"""``reshard explain --moe``: a small MoE dispatch and combine run for real on local ranks
grouped into hosts, on the flat path and on the two-level one, and what crossed between hosts.

Each rank has a few tokens, each routed to ``top_k`` distinct experts (one expert per rank,
expert e on rank e); a token's value is its name's number (source rank * 100 + index), so
where each row landed is read from the data itself. The ranks are grouped into hosts as a
launcher would group them (consecutive ranks, ``comm.hosts``); on one machine the hosts are a
grouping, not separate machines, and the bytes across hosts are what ``last_exchange()``
counts for the ranks of other hosts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOKENS = 3  # per rank: small enough to read every row
HIDDEN = 32


def moe_rank(comm: Any, hosts: int, top_k: int, seed: int) -> dict[str, Any]:
    from .. import moe
    from ..execution.stats import last_exchange

    comm.hosts, comm.hosts_mesh = [r * hosts // comm.size for r in range(comm.size)], None
    experts = comm.size
    rng = np.random.default_rng(seed * 1000 + comm.rank)
    ids = np.argsort(rng.random((TOKENS, experts)), axis=1)[:, :top_k]  # distinct experts per token
    # 32 float64 a row (256 bytes, small beside a real model's but larger than its routing)
    x = np.repeat((comm.rank * 100 + np.arange(TOKENS, dtype=np.float64))[:, None], HIDDEN, axis=1)
    out: dict[str, Any] = {"ids": ids.tolist()}
    for algorithm in ("flat", "hierarchical"):
        rows, handle = moe.dispatch(x, ids, experts, algorithm=algorithm)
        sent = last_exchange()
        back = moe.combine(rows, handle)  # identity experts: each token comes back summed k times
        returned = last_exchange()
        out[algorithm] = {
            "rows": [divmod(int(v), 100) for v in rows[:, 0]],
            "dispatch_cross_host_bytes": sent.cross_host_bytes_sent,
            "combine_cross_host_bytes": returned.cross_host_bytes_sent,
            "combine_ok": bool(np.array_equal(back, x * top_k)),
        }
    return out


def run_explain_moe(ranks: int, hosts: int, top_k: int, engine: str | None, timeout: float = 60.0,
                    seed: int = 0) -> dict[str, Any]:
    """Every rank's routing and rows on both paths, with the rows that crossed between hosts."""
    from ..launch import spawn

    per_rank = spawn(moe_rank, ranks, engine=engine or "gloo", args=(hosts, top_k, seed), timeout=timeout)
    per_host = ranks // hosts
    host = [r // per_host for r in range(ranks)]
    ids = [p["ids"] for p in per_rank]
    pairs_across = sum(host[e] != host[s] for s in range(ranks) for experts in ids[s] for e in experts)
    tokens_across = sum(len({host[e] for e in experts} - {host[s]}) for s in range(ranks) for experts in ids[s])
    same = all(p["flat"]["rows"] == p["hierarchical"]["rows"] for p in per_rank)
    return {
        "ranks": ranks, "hosts": hosts, "tokens_per_rank": TOKENS, "row_bytes": HIDDEN * 8, "top_k": top_k, "experts": ranks,
        "engine": engine or "gloo", "ids": ids, "expert_rows": [p["flat"]["rows"] for p in per_rank],
        "rows_across": {"flat": pairs_across, "hierarchical": tokens_across},
        "bytes_across": {a: {"dispatch": sum(p[a]["dispatch_cross_host_bytes"] for p in per_rank),
                             "combine": sum(p[a]["combine_cross_host_bytes"] for p in per_rank)}
                         for a in ("flat", "hierarchical")},
        "same_expert_inputs": same, "combine_ok": all(p[a]["combine_ok"] for p in per_rank for a in ("flat", "hierarchical")),
    }
