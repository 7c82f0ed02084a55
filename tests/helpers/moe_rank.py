"""Rank-side runners for the all_to_all_v, MoE and autograd tests (importable by rank processes)."""

from __future__ import annotations

import traceback

import numpy as np

import reshard as rs

from .oracle import all_to_all_v_expected, moe_expected, pattern


def _rows(case: dict, rank: int) -> np.ndarray:
    """Rank ``rank``'s rows; values encode (rank, row, column) so a misrouted row shows."""
    total = sum(case["counts"][rank])
    shape = (total, *case["trail"])
    return pattern(shape, case["dtype"], salt=rank + 1)


def _as(kind: str, a: np.ndarray):
    if kind == "numpy":
        return a
    import torch

    return torch.from_numpy(np.array(a, order="C"))


def _np(a) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.detach().numpy()


def _same(got, want) -> bool:
    got = np.ascontiguousarray(_np(got))
    return got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def run_a2av(comm: rs.Comm, cases: list[dict]) -> list[str | None]:
    out = []
    for case in cases:
        try:
            r, n = comm.rank, comm.size
            rows = [_rows(case, i) for i in range(n)]
            x = _as(case["kind"], rows[r])
            hosts, algorithm = hosts_of(case, n), case.get("algorithm", "auto")
            if hosts is not None and hosts != comm.hosts:  # as a launcher would group the ranks; one machine here
                comm.hosts, comm.hosts_mesh = hosts, None
            got, recv_counts = rs.all_to_all_v(x, case["counts"][r], algorithm=algorithm)
            two_level = "all_to_all_v (across hosts)" in [st.collective for st in rs.last_exchange().steps]
            want = all_to_all_v_expected(rows, case["counts"], r)
            problem = None
            if not _same(got, want):
                problem = f"received {_np(got).shape} differs from the oracle {want.shape}"
            elif recv_counts != [case["counts"][i][r] for i in range(n)]:
                problem = f"recv_counts {recv_counts}"
            elif type(got) is not type(x):
                problem = "type changed"
            elif two_level != (algorithm == "hierarchical"):
                problem = f"{algorithm} ran {[st.collective for st in rs.last_exchange().steps]}"
            else:  # the reverse exchange, without a count exchange, brings the rows home
                back, _ = rs.all_to_all_v(got, recv_counts, recv_counts=case["counts"][r], check=False,
                                          algorithm=algorithm)
                if not _same(back, rows[r]):
                    problem = "the reverse exchange did not bring the rows back"
            out.append(problem)
        except Exception as exc:
            out.append(f"rank {comm.rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    return out


def moe_inputs(case: dict, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens (small integers, exact in any float dtype), expert ids and dyadic weights summing to one."""
    rng = np.random.default_rng(case["seed"] * 101 + rank)
    t, k = case["tokens"][rank], case["k"]
    tokens = (pattern((t, case["hidden"]), "int32", salt=rank + 1) % 1000).astype(case["dtype"])
    ids = rng.integers(0, case["experts"], size=(t, k))
    if case.get("flat_ids") and k == 1:
        ids = ids[:, 0]
    raw = rng.integers(1, 4, size=(t, k)).astype(np.float64)
    weights = raw / raw.sum(axis=1, keepdims=True) if k else raw
    weights = np.round(weights * 64) / 64  # dyadic ...
    weights[:, -1] = 1.0 - weights[:, :-1].sum(axis=1)  # ... and summing to exactly one
    return tokens, ids, weights.astype(case["dtype"])


def run_moe(comm: rs.Comm, cases: list[dict]) -> list[str | None]:
    out = []
    for case in cases:
        try:
            out.append(_moe_case(comm, case))
        except Exception as exc:
            out.append(f"rank {comm.rank}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    return out


def hosts_of(case: dict, n: int) -> list[int] | None:
    """The case's grouping of ranks into hosts (``hosts`` of them, consecutive ranks), or None."""
    hosts = case.get("hosts")
    return None if hosts is None else [r * hosts // n for r in range(n)]


def _moe_case(comm: rs.Comm, case: dict) -> str | None:
    r, n = comm.rank, comm.size
    inputs = [moe_inputs(case, i) for i in range(n)]
    tokens, ids, weights = (_as(case["kind"], a[::-1].copy()[::-1] if case.get("reversed") else a) for a in inputs[r])
    before = _np(tokens).copy()
    hosts, algorithm = hosts_of(case, n), case.get("algorithm", "auto")
    if hosts is not None and hosts != comm.hosts:  # as a launcher would group them (torchrun's GROUP_RANK)
        comm.hosts, comm.hosts_mesh = hosts, None
    expert_in, handle = rs.moe.dispatch(tokens, ids, num_experts=case["experts"], capacity=case.get("capacity"),
                                        algorithm=algorithm)
    if algorithm == "hierarchical" and handle.algorithm != "hierarchical":
        return f"dispatch took the {handle.algorithm} path"
    all_ids = [a[1][:, None] if a[1].ndim == 1 else a[1] for a in inputs]
    want, per_expert, dropped, kept = moe_expected([a[0] for a in inputs], all_ids, case["experts"], case.get("capacity"), r)
    if not _same(expert_in, want):
        return f"expert_inputs {_np(expert_in).shape} differ from the oracle {want.shape}"
    if handle.tokens_per_expert != per_expert:
        return f"tokens_per_expert {handle.tokens_per_expert} != {per_expert}"
    if sorted(map(tuple, handle.dropped.tolist())) != dropped[r]:
        return f"dropped {handle.dropped.tolist()} != {dropped[r]}"
    # Experts: expert e multiplies by (e + 1); combine must give sum_j kept * w * (e + 1) * token.
    local = case["experts"] // n
    scale = np.concatenate([np.full(c, r * local + le + 1) for le, c in enumerate(per_expert)] or [np.zeros(0)])
    outputs = _np(expert_in) * scale.reshape(-1, 1).astype(_np(expert_in).dtype)
    combined = rs.moe.combine(_as(case["kind"], outputs), handle, weights)
    tok, idr, w = inputs[r][0], all_ids[r], inputs[r][2]
    acc = np.zeros(tok.shape, dtype=np.float64)
    for t in range(tok.shape[0]):
        for j in range(idr.shape[1]):
            if kept[(r, t, j)]:
                acc[t] += float(w[t, j]) * (idr[t, j] + 1) * tok[t].astype(np.float64)
    if not _same(combined, acc.astype(tok.dtype)):
        return "combine differs from the oracle"
    if case.get("capacity") is None and np.allclose(case["k"], 1):
        back = rs.moe.combine(expert_in, handle)  # identity experts, top-1: the input exactly
        if not _same(back, tok):
            return "top-1 round trip is not exact"
    if case.get("capacity") is None:
        back = rs.moe.combine(expert_in, handle, weights)  # weights sum to exactly one
        if not _same(back, tok):
            return "weighted round trip is not exact"
        # softmax weights in the tokens' dtype sum to one only up to rounding: still exact on the
        # flat path; the two-level path sums each host's slots apart, so within rounding there
        logits = np.random.default_rng(case["seed"] + r).standard_normal(weights.shape)
        soft = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        back = rs.moe.combine(expert_in, handle, _as(case["kind"], soft.astype(tok.dtype)))
        if handle.algorithm == "flat" and not _same(back, tok):
            return "round trip with softmax weights is not exact"
        eps = np.finfo(tok.dtype).eps * 8 * case["k"]
        if not np.allclose(_np(back), tok, rtol=eps, atol=0):
            return f"round trip with softmax weights is off by {np.abs(_np(back) - tok).max()}"
    if not np.array_equal(before, _np(tokens)):
        return "dispatch modified its input"
    return None


def capacity_winners(comm: rs.Comm):
    tokens = np.ones((4, 2), dtype=np.float32)
    ids = np.zeros(4, dtype=np.int64)  # every token of every rank wants expert 0
    _, handle = rs.moe.dispatch(tokens, ids, num_experts=4, capacity=2)
    return handle.tokens_per_expert, handle.dropped.tolist()


def gradients(comm: rs.Comm) -> dict[str, bool]:
    """Gradients through every differentiable op, against what one process computes for the
    same loss. Values are small integers in float64, so the expected gradients are exact."""
    import torch

    r, n = comm.rank, comm.size
    checks: dict[str, bool] = {}
    A = torch.arange(7 * 5, dtype=torch.float64).reshape(7, 5)
    G = (torch.arange(7 * 5, dtype=torch.float64).reshape(7, 5) * 3 + 1) % 11
    pairs = [(rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Shard(0)), (rs.Shard(0), rs.Replicate()),
             (rs.Replicate(), rs.Shard(1)), (rs.Partial(), rs.Shard(0)), (rs.Partial(), rs.Replicate()),
             (rs.Shard(1), rs.Partial()), (rs.Shard(0), rs.Shard(0))]
    for src, dst in pairs:
        x = (A if not isinstance(src, rs.Shard) else rs.local_shard(A, src, r, n)).clone().requires_grad_()
        out = rs.redistribute(x, src, dst)
        g_out = G if not isinstance(dst, rs.Shard) else rs.local_shard(G, dst, r, n)
        (out * g_out).sum().backward()
        # one process: loss = <redistributed, G> summed over ranks; its gradient wrt each
        # rank's input is G's part under the input's placement (all of G for Replicate/Partial)
        want = G if not isinstance(src, rs.Shard) else rs.local_shard(G, src, r, n)
        checks[f"redistribute {src}->{dst}"] = torch.equal(x.grad, want)
    # permutations: with loss = sum(out * (2 out + 1)), d loss / d x = 2 x + 1 wherever x went
    for s, c, split in [(1, 0, None), (0, 1, None), (0, 0, None), (1, 1, None), (1, 0, [4] + [0] * (n - 1)), (2, 0, None)]:
        x = (torch.arange(6 * 4 * 3, dtype=torch.float64).reshape(6, 4, 3) + 100 * r).requires_grad_()
        if split is not None:
            split = [x.shape[s]] + [0] * (n - 1)
        out = rs.all_to_all(x, s, c, split_sizes=split)
        (out * (2 * out + 1).detach()).sum().backward()
        checks[f"all_to_all s={s} c={c} split={split}"] = torch.equal(x.grad, 2 * x.detach() + 1)
    x = (torch.arange(9 * 2, dtype=torch.float64).reshape(9, 2) + 100 * r).requires_grad_()
    counts = [(r + 2 * j) % 4 for j in range(n)]
    counts[-1] += 9 - sum(counts) if sum(counts) <= 9 else 0
    counts = counts if sum(counts) == 9 else [9] + [0] * (n - 1)
    out, _ = rs.all_to_all_v(x, counts)
    (out * (2 * out + 1).detach()).sum().backward()
    checks["all_to_all_v"] = torch.equal(x.grad, 2 * x.detach() + 1)
    # dispatch -> experts (expert e scales by e + 1) -> combine with weights; on one host, and
    # on one host a rank (the two-level path, on the autograd tape)
    case = dict(seed=7, tokens=[5 + i for i in range(n)], hidden=3, experts=2 * n, k=2, capacity=4, dtype="float64")
    checks.update(moe_gradients(comm, case, [("flat", comm.hosts), ("hierarchical", list(range(n)))]))
    return checks


def moe_gradients(comm: rs.Comm, case: dict, ways: list) -> dict[str, bool]:
    """d/dtokens and d/dweights through dispatch -> experts (expert e scales by e + 1) ->
    combine, for each (algorithm, grouping of the ranks into hosts) of ``ways``, against the
    closed form (exact: small integers in float64)."""
    import torch

    r, n = comm.rank, comm.size
    checks: dict[str, bool] = {}
    tok_np, ids_np, w_np = moe_inputs(case, r)
    for algorithm, hosts in ways:
        comm.hosts, comm.hosts_mesh = hosts, None
        tokens = torch.from_numpy(tok_np).requires_grad_()
        weights = torch.from_numpy(w_np).requires_grad_()
        expert_in, handle = rs.moe.dispatch(tokens, torch.from_numpy(ids_np), num_experts=case["experts"],
                                            capacity=case["capacity"], algorithm=algorithm)
        local = case["experts"] // n
        scale = torch.cat([torch.full((c, 1), float(r * local + le + 1), dtype=torch.float64)
                           for le, c in enumerate(handle.tokens_per_expert)])
        out = rs.moe.combine(expert_in * scale, handle, weights)
        C = (torch.arange(out.numel(), dtype=torch.float64).reshape(out.shape) % 5) - 2
        (out * C).sum().backward()
        kept = torch.from_numpy(handle.kept).to(torch.float64)
        factor = kept * torch.from_numpy(ids_np + 1).to(torch.float64)  # [T, k]: kept * (e + 1)
        want_x = (factor * weights.detach()).sum(1, keepdim=True) * C
        want_w = factor * (tokens.detach() * C).sum(1, keepdim=True)
        name = f"{handle.algorithm} on hosts {hosts}"
        checks[f"dispatch/combine ({name}) d/dtokens"] = torch.allclose(tokens.grad, want_x, rtol=1e-12, atol=0)
        checks[f"dispatch/combine ({name}) d/dweights"] = torch.allclose(weights.grad, want_w, rtol=1e-12, atol=0)
    return checks


def gradients_with_idle_ranks(comm: rs.Comm, cases: list[dict]) -> dict[str, bool]:
    """``moe_gradients`` on the two-level path for ``cases`` whose ranks hold no tokens, or
    forward none to some host, grouped into one host, two and one per rank."""
    n = comm.size
    checks: dict[str, bool] = {}
    for i, case in enumerate(cases):
        ways = [("hierarchical", [q * hosts // n for q in range(n)]) for hosts in (1, 2, n)]
        checks.update({f"case {i}: {k}": v for k, v in moe_gradients(comm, case, ways).items()})
    return checks


def _experts(n: int, case: dict, rank: int) -> list:
    """This rank's experts: each treats rows independently (elementwise), so any batching of
    the rows gives the same outputs bit for bit."""
    return [lambda rows, s=rank * (case["experts"] // n) + le: rows * (s + 2) - s for le in range(case["experts"] // n)]


def run_pipeline(comm: rs.Comm, cases: list[dict]) -> list[str | None]:
    """Per case: rs.moe.pipeline with ``case["chunks"]`` parts against dispatch, the experts and
    combine in one part (blocking), both with ``case["algorithm"]`` (default "auto") on the
    ranks' own hosts, bit for bit; on torch the tokens' and weights' gradients too."""
    out = []
    for case in cases:
        try:
            tokens, ids, weights = moe_inputs(case, comm.rank)
            experts = _experts(comm.size, case, comm.rank)
            results = []
            for parts in (None, case["chunks"]):
                x, w = _as(case["kind"], tokens), _as(case["kind"], weights)
                if case["kind"] == "torch":
                    x.requires_grad_(True)
                    w.requires_grad_(True)
                algorithm = case.get("algorithm", "auto")
                if parts is None:
                    inputs, handle = rs.moe.dispatch(x, ids, case["experts"], capacity=case["capacity"],
                                                     algorithm=algorithm)
                    y = rs.moe.combine(rs.moe._run_experts(experts, inputs, handle.tokens_per_expert), handle, w)
                else:
                    y = rs.moe.pipeline(x, ids, experts, w, chunks=parts, capacity=case["capacity"], algorithm=algorithm)
                grads = ()
                if case["kind"] == "torch":
                    import torch

                    (y * torch.arange(1.0, y.numel() + 1, dtype=y.dtype).reshape(y.shape)).sum().backward()
                    grads = (_np(x.grad), _np(w.grad))
                results.append((_np(y), grads))
            (want, want_grads), (got, got_grads) = results
            problems = [what for what, a, b in [("result", got, want), *zip(("tokens' gradient", "weights' gradient"),
                                                                            got_grads, want_grads)]
                        if not _same(a, b)]
            out.append(f"{', '.join(problems)} differ" if problems else None)
        except Exception:
            out.append(traceback.format_exc())
    return out


def across_left_behind(comm: rs.Comm, op: str = "dispatch") -> tuple[str, list[str]]:
    """Hosts [0, 0, 1, 1], a short timeout; ``op``: "dispatch" or "combine" (after a dispatch
    that succeeds). Host 1's ranks fail before their rows start across the hosts; host 0's fail
    in the exchange inside their host that runs while theirs travel on a thread of its own (it
    waits for host 1 until the timeout). Returns the error this rank saw and the names of the
    exchange threads still running once ``op`` had raised."""
    import threading

    from reshard.moe import two_level as moe_two_level

    comm.hosts, comm.hosts_mesh = [0, 0, 1, 1], None
    kept_timeout = comm.timeout
    comm.timeout = comm.primitives.timeout = 3.0  # the host communicators are made with it
    case = dict(seed=8, tokens=[6, 6, 6, 6], hidden=2, experts=4, k=2, dtype="float32")
    tokens, ids, _ = moe_inputs(case, comm.rank)
    expert_in, handle = (rs.moe.dispatch(tokens, ids, num_experts=4, algorithm="hierarchical") if op == "combine"
                         else (None, None))

    def refused(*args, **kwargs):
        raise rs.ReshardError(f"rank {comm.rank}: refused here")

    exchanged, start_rows = moe_two_level._exchanged, moe_two_level.start_rows
    overlapped = "own host's tokens"  # the exchange inside the host that runs while the rows cross

    def inside_refused(parts, name, *args):
        if overlapped in name:
            refused()
        return exchanged(parts, name, *args)

    def across_refused(comm, x, send, recv, what, overlap):
        if what == f"moe.{op} (across hosts)":
            refused()
        return start_rows(comm, x, send, recv, what, overlap)

    if comm.hosts[comm.rank] == 1:
        moe_two_level.start_rows = across_refused
    else:
        moe_two_level._exchanged = inside_refused
    try:
        if op == "combine":
            rs.moe.combine(expert_in, handle)
        else:
            rs.moe.dispatch(tokens, ids, num_experts=4, algorithm="hierarchical")
        seen = "no error"
    except rs.ReshardError as exc:
        seen = str(exc)
    finally:
        moe_two_level._exchanged, moe_two_level.start_rows = exchanged, start_rows
    running = [t.name for t in threading.enumerate() if t.name.startswith(f"reshard moe.{op}")]
    comm.timeout = comm.primitives.timeout = kept_timeout
    comm.barrier()  # host 1's ranks stay until host 0's have looked
    return seen, running


def moe_reports(comm: rs.Comm, check: bool) -> dict:
    """``last_exchange()`` after dispatch and combine on each path: op, the small exchanges,
    the bytes sent, dispatch's pack copies, and (flat) the bytes this rank's rows for other
    ranks' experts weigh."""
    rng = np.random.default_rng(comm.rank)
    experts, hidden = 2 * comm.size, 3
    tokens = rng.standard_normal((10, hidden)).astype(np.float32)
    ids = rng.integers(0, experts, (10, 2))
    seen = {}
    for algorithm in ("flat", "hierarchical"):
        inputs, handle = rs.moe.dispatch(tokens, ids, experts, algorithm=algorithm, check=check)
        d = rs.last_exchange()
        rs.moe.combine(inputs, handle, check=check)
        c = rs.last_exchange()
        seen[algorithm] = [(st.op, st.metadata_exchanges, st.bytes_sent, len(st.steps)) for st in (d, c)]
        seen[f"{algorithm} packs"] = d.pack_copies
        seen[f"{algorithm} combine unpacks"] = c.unpack_copies
    owner = ids // (experts // comm.size)
    seen["flat rows out"] = int((owner != comm.rank).sum()) * hidden * 4
    return seen


def two_level_packs(comm: rs.Comm) -> tuple[int, int]:
    """Dispatch and combine on two hosts of two ranks, each token sent to one expert on each
    host (every rank's rows cross, stay and arrive, and its experts hold rows of both hosts'
    tokens): the pack copies each reports."""
    comm.hosts, comm.hosts_mesh = [0, 0, 1, 1], None
    experts = 2 * comm.size
    tokens = pattern((8, 4), "float32") + comm.rank
    ids = np.array([[t % (experts // 2), experts // 2 + (t + comm.rank) % (experts // 2)] for t in range(8)])
    inputs, handle = rs.moe.dispatch(tokens, ids, experts, algorithm="hierarchical")
    dispatched = rs.last_exchange().pack_copies
    rs.moe.combine(inputs, handle)
    return dispatched, rs.last_exchange().pack_copies


def two_level_steps(comm: rs.Comm, arrays: str) -> dict:
    """MoE dispatch and combine on two hosts of ``comm.size // 2`` ranks (consecutive ranks, as a
    launcher groups them), hierarchical and flat, on the inputs of ``two_level_inputs``: what each
    returned and the steps ``rs.last_exchange()`` reports (collective, bytes out, bytes in)."""
    n, r = comm.size, comm.rank
    comm.hosts, comm.hosts_mesh = [q * 2 // n for q in range(n)], None
    tokens, ids = two_level_inputs(n, r)
    if arrays == "torch":
        import torch

        tokens = torch.from_numpy(tokens)
    out = {}
    for algorithm in ("hierarchical", "flat"):
        inputs, handle = rs.moe.dispatch(tokens, ids, 2 * n, algorithm=algorithm)
        dispatched = [(s.collective, s.bytes_sent, s.bytes_received) for s in rs.last_exchange().steps]
        back = rs.moe.combine(inputs, handle)
        combined = [(s.collective, s.bytes_sent, s.bytes_received) for s in rs.last_exchange().steps]
        out[algorithm] = (handle.algorithm, _np(inputs).tolist(), _np(back).tolist(), dispatched, combined)
    return out


def two_level_inputs(n: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s tokens ``[6, 4]`` float32 and its top-2 expert ids among ``2 * n`` experts."""
    ids = np.array([[(t + rank) % (2 * n), (t * 3 + 1 + rank) % (2 * n)] for t in range(6)], dtype=np.int64)
    return pattern((6, 4), "float32") + rank, ids


def pipeline_lanes(comm: rs.Comm, kind: str, hosts: int | None) -> dict:
    """``rs.moe.pipeline`` with 1, 3 and 4 parts on row-wise experts (``kind`` "numpy", "torch" or
    "torch-grad"; ``hosts`` groups the ranks as a launcher would, for the two-level path): each
    result, and the started calls it made, as (op, whether on a lane of its own)."""
    from reshard.execution import handles

    if hosts is not None:
        comm.hosts, comm.hosts_mesh = [r * hosts // comm.size for r in range(comm.size)], None
    case = dict(seed=11, tokens=[13, 9, 16, 7][: comm.size], hidden=3, experts=2 * comm.size, k=2, capacity=None,
                dtype="float32")
    tokens, ids, weights = moe_inputs(case, comm.rank)
    experts = _experts(comm.size, case, comm.rank)
    submitted, submit = [], handles.submit

    def recorded(op, rank, run, c, lane=None):
        submitted.append((op, lane is not None))
        return submit(op, rank, run, c, lane)

    handles.submit = recorded
    out = {}
    try:
        for chunks in (1, 3, 4):
            del submitted[:]
            x, w = _as(kind.removesuffix("-grad"), tokens), _as(kind.removesuffix("-grad"), weights)
            if kind.endswith("-grad"):
                x.requires_grad_(True)
            y = rs.moe.pipeline(x, ids, experts, w, chunks=chunks,
                                algorithm="auto" if hosts is None else "hierarchical")
            grad = None
            if kind.endswith("-grad"):
                y.sum().backward()
                grad = _np(x.grad).tolist()
            out[chunks] = (_np(y).tolist(), grad, list(submitted))
    finally:
        handles.submit = submit
    return out, bool(comm.primitives.concurrent_groups)


def pipeline_rank_dies(comm: rs.Comm, victim: int) -> None:
    """A 4-part pipeline whose rank ``victim`` is killed by its experts of the third part: by then
    the second part's combine travels on the lane while the fourth part's dispatch may too."""
    import os
    import signal

    case = dict(seed=12, tokens=[16] * comm.size, hidden=4, experts=2 * comm.size, k=2, capacity=None, dtype="float32")
    tokens, ids, weights = moe_inputs(case, comm.rank)
    calls = [0]

    def expert(rows):
        calls[0] += 1
        if comm.rank == victim and calls[0] == 5:  # two experts a part: the third part's first
            os.kill(os.getpid(), signal.SIGKILL)
        return rows * 2

    rs.moe.pipeline(tokens, ids, [expert, expert], weights, chunks=4)


def phase_spans(comm: rs.Comm) -> tuple[list, list, float, float]:
    """Dispatch and combine on two hosts of two ranks (consecutive ranks, as a launcher groups
    them) while listening to the phases, then once more without: (spans, the spans the second
    call left, start, end)."""
    import time

    from reshard.execution import phases

    comm.hosts, comm.hosts_mesh = [0, 0, 1, 1], None
    tokens, ids = two_level_inputs(comm.size, comm.rank)
    with phases.listening() as spans:
        start = time.perf_counter()
        inputs, handle = rs.moe.dispatch(tokens, ids, 2 * comm.size, algorithm="hierarchical")
        rs.moe.combine(inputs, handle)
        end = time.perf_counter()
    with phases.listening() as later:
        pass
    rs.moe.combine(*rs.moe.dispatch(tokens, ids, 2 * comm.size, algorithm="hierarchical"))
    return spans, later, start, end
