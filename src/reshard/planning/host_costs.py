"""An all_to_all across hosts on paper: the flat exchange against the two-level one, in closed
form at any scale (pure: no engine, no array library).

Each of ``N = hosts * per_host`` ranks holds ``B`` bytes and sends ``B / N`` to every rank (a
balanced row -> column change). Flat: every rank sends to every rank, ``N - per_host`` of its
messages across hosts. Two-level (``planner.all_to_all_hierarchical``): first inside the host
(``per_host - 1`` messages of ``B / per_host``), then across, among the ranks with the same
local index (``hosts - 1`` messages of ``B / hosts``). Both put the same bytes on each host's
link: ``per_host * B * (N - per_host) / N`` each way.

The estimate is an alpha-beta model with one pair per level: a message costs ``alpha`` of its
level; inside a host a rank's bytes cost ``beta_local`` each; across, a host's link carries all
its ranks' bytes at ``beta_link`` each (its ranks share it); each exchange step costs ``step`` of
its own (a round of the engine and the check's vote: the two-level form has two). They add up.
"""

from __future__ import annotations

from dataclasses import dataclass

# the all_to_all algorithms a call may name; "auto" lets the cost model below choose
ALGORITHMS = ("flat", "hierarchical", "auto")


@dataclass(frozen=True)
class Levels:
    """The cost model's two levels: seconds per message and per byte inside a host and across."""

    alpha_local: float = 2e-6
    beta_local: float = 1 / 50e9
    alpha_link: float = 10e-6
    beta_link: float = 1 / 25e9  # a host's link: 200 Gbit/s
    step: float = 50e-6  # each exchange step's own round (the engine's call, the check's vote)


def two_level_table(bytes_per_rank: int, hosts: int, per_host: int, levels: Levels = Levels()) -> dict:
    """Flat and two-level side by side: messages per rank (inside, across), bytes per rank inside
    a host, bytes per host link each way, and the estimated seconds."""
    n, b = hosts * per_host, bytes_per_rank
    link = per_host * b * (n - per_host) // n

    def row(inside_msgs: int, inside_bytes: float, across_msgs: int, steps: int) -> dict:
        seconds = (steps * levels.step + inside_msgs * levels.alpha_local + inside_bytes * levels.beta_local
                   + across_msgs * levels.alpha_link + link * levels.beta_link)
        return {"messages_inside_per_rank": inside_msgs, "messages_across_per_rank": across_msgs,
                "bytes_inside_per_rank": int(inside_bytes), "bytes_per_host_link": link, "estimate_s": seconds}

    flat = row(per_host - 1, b * (per_host - 1) / n, n - per_host, 1)
    two = row(per_host - 1, b * (per_host - 1) / per_host, hosts - 1, 2)
    return {"ranks": n, "hosts": hosts, "ranks_per_host": per_host, "bytes_per_rank": b,
            "levels": {"alpha_local_s": levels.alpha_local, "beta_local_s_per_byte": levels.beta_local,
                       "alpha_link_s": levels.alpha_link, "beta_link_s_per_byte": levels.beta_link,
                       "step_s": levels.step},
            "flat": flat, "hierarchical": two}


def cheaper(bytes_per_rank: int, hosts: int, per_host: int, levels: Levels = Levels()) -> str:
    """``"hierarchical"`` where the model's estimate for it is below the flat one's, else ``"flat"``
    (what ``algorithm="auto"`` runs across hosts)."""
    table = two_level_table(bytes_per_rank, hosts, per_host, levels)
    return "hierarchical" if table["hierarchical"]["estimate_s"] < table["flat"]["estimate_s"] else "flat"


def fit_levels(inside: dict[int, float], across: dict[int, float], hosts: int, per_host: int) -> Levels:
    """The model's numbers from a row -> column all_to_all timed on each level alone at two
    sizes (bytes per rank -> seconds): inside each host (``per_host`` ranks) and across hosts
    (``hosts`` ranks with the same local index, every local index at once). A line through each
    level's two points gives its fixed cost (intercept) and its bytes' cost (slope):

    * inside: ``intercept = step + (L - 1) * alpha_local``, slope per byte a rank sends inside;
    * across: ``intercept = step + (H - 1) * alpha_link``, slope per byte on a host link.

    ``step`` is the smaller intercept; each level's ``alpha`` is the rest of its own, per message."""
    def line(times: dict[int, float], share: float) -> tuple[float, float]:
        (small, t_small), (large, t_large) = sorted(times.items())[0], sorted(times.items())[-1]
        if share == 0 or large == small:  # one rank a host (nothing moves inside), or one size
            return t_small, 0.0
        slope = max(0.0, (t_large - t_small) / ((large - small) * share))
        return max(0.0, t_small - small * share * slope), slope

    fixed_in, beta_local = line(inside, (per_host - 1) / per_host)  # what a rank sends inside
    fixed_across, beta_link = line(across, per_host * (hosts - 1) / hosts)  # what a host link carries
    step = min(fixed_in, fixed_across)
    return Levels(alpha_local=(fixed_in - step) / max(1, per_host - 1), beta_local=beta_local,
                  alpha_link=(fixed_across - step) / max(1, hosts - 1), beta_link=beta_link, step=step)


def moe_cheaper(flat_link_bytes: int, two_level_link_bytes: int, pair_bytes_per_rank: int, hosts: int,
                per_host: int, levels: Levels = Levels()) -> bool:
    """Whether a MoE exchange is estimated faster in two levels (``reshard.moe.host_routes``): the
    bytes each form puts on the busiest host link, against the forwarding the two-level form
    adds inside each host (every pair passes its forwarder; the flat form moves inside only
    the pairs for the same host) and its second exchange step."""
    n = hosts * per_host
    flat = levels.step + flat_link_bytes * levels.beta_link + pair_bytes_per_rank * (per_host - 1) / n * levels.beta_local
    two = (2 * levels.step + two_level_link_bytes * levels.beta_link
           + pair_bytes_per_rank * (per_host - 1) / per_host * levels.beta_local)
    return two < flat


def moe_table(tokens: int, hidden: int, top_k: int, experts: int, hosts: int, per_host: int,
              dispatch_bytes: float = 1 + 4 / 128, combine_bytes: float = 2.0,
              link_bytes_per_s: float = 50e9) -> dict:
    """MoE dispatch and combine across ``hosts`` on paper: each of ``hosts * per_host`` ranks
    routes ``tokens`` tokens of ``hidden`` elements to ``top_k`` distinct experts drawn
    uniformly from ``experts`` (spread evenly over the hosts). Expected bytes per rank sent
    across hosts, flat (one row per (token, slot) on a remote host) against deduplicated (one
    row per (token, remote host)); per host link (its ranks' sum, each way); and the time at
    ``link_bytes_per_s`` per rank (a rank's own NIC). ``dispatch_bytes`` per element defaults
    to FP8 with one float32 scale per 128 elements, ``combine_bytes`` to BF16."""
    from math import comb

    if experts % hosts:
        raise ValueError(f"{experts} experts do not spread evenly over {hosts} hosts")
    remote = experts - experts // hosts
    pairs_across = top_k * remote / experts  # (token, slot) pairs per token on other hosts
    miss = comb(experts - experts // hosts, top_k) / comb(experts, top_k)  # no slot on a given host
    hosts_across = (hosts - 1) * (1 - miss)  # remote hosts a token reaches
    rows = {"flat": pairs_across, "deduplicated": hosts_across}
    out: dict = {"tokens": tokens, "hidden": hidden, "top_k": top_k, "experts": experts, "hosts": hosts,
                 "ranks_per_host": per_host, "dispatch_bytes_per_element": dispatch_bytes,
                 "combine_bytes_per_element": combine_bytes, "link_bytes_per_s_per_rank": link_bytes_per_s,
                 "pairs_across_per_token": pairs_across, "remote_hosts_per_token": hosts_across}
    for name, per_token in rows.items():
        d = tokens * per_token * hidden * dispatch_bytes
        c = tokens * per_token * hidden * combine_bytes
        out[name] = {"rows_across_per_rank": tokens * per_token, "dispatch_bytes_per_rank": d,
                     "combine_bytes_per_rank": c, "dispatch_bytes_per_host_link": d * per_host,
                     "combine_bytes_per_host_link": c * per_host, "dispatch_s": d / link_bytes_per_s,
                     "combine_s": c / link_bytes_per_s}
    return out
