"""A small Mixture-of-Experts layer trained on 4 local ranks with reshard's dispatch/combine,
checked step by step against the same layer in one process.

    python examples/moe_layer.py [--engine gloo|mpi] [--steps 5]

Each rank holds 2 of the 8 experts (small MLPs) and 32 tokens; a replicated gate picks the
top-2 experts per token. Tokens travel to their experts with rs.moe.dispatch and come back with
rs.moe.combine; the backward pass runs the same exchanges in reverse. The gate's gradient is
summed over ranks with rs.all_reduce. Every expert and the gate start from fixed seeds, so the
one-process reference starts from the same weights and sees the same 128 tokens.
"""

from __future__ import annotations

import argparse
import sys

import torch

import reshard as rs

HIDDEN, FFN, EXPERTS, TOP_K = 16, 32, 8, 2
RANKS, TOKENS_PER_RANK, LR = 4, 32, 0.1


def make_expert(e: int) -> torch.nn.Module:
    torch.manual_seed(1000 + e)
    return torch.nn.Sequential(torch.nn.Linear(HIDDEN, FFN), torch.nn.GELU(), torch.nn.Linear(FFN, HIDDEN))


def make_gate() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(HIDDEN, EXPERTS, bias=False)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tokens and targets for ``step`` (the reference concatenates every rank's)."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(TOKENS_PER_RANK, HIDDEN, generator=g, dtype=torch.float32)
    return x, torch.sin(x.flip(1))


def route(gate: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-2 experts per token and their softmax weights over the two chosen logits."""
    logits = gate(x)
    top, ids = logits.topk(TOP_K, dim=1)
    return ids, torch.softmax(top, dim=1)


def distributed_rank(comm: rs.Comm, steps: int) -> list[float]:
    local = EXPERTS // comm.size
    experts = [make_expert(comm.rank * local + i) for i in range(local)]
    gate = make_gate()
    params = list(gate.parameters()) + [p for e in experts for p in e.parameters()]
    losses = []
    for step in range(steps):
        x, target = batch(comm.rank, step)
        ids, weights = route(gate, x)
        expert_in, handle = rs.moe.dispatch(x, ids, num_experts=EXPERTS)
        pieces = expert_in.split(handle.tokens_per_expert)  # rows grouped by local expert
        expert_out = torch.cat([e(p) for e, p in zip(experts, pieces)])
        y = rs.moe.combine(expert_out, handle, weights)
        loss = ((y - target) ** 2).sum() / (TOKENS_PER_RANK * comm.size)  # this rank's share of the mean
        for p in params:
            p.grad = None
        loss.backward()
        # The gate is replicated: its gradient is the sum of every rank's part.
        gate.weight.grad = rs.all_reduce(gate.weight.grad)
        with torch.no_grad():
            for p in params:
                p -= LR * p.grad
        losses.append(float(rs.all_reduce(loss.detach().reshape(1))[0]))
    return losses


def reference(steps: int) -> list[float]:
    experts = [make_expert(e) for e in range(EXPERTS)]
    gate = make_gate()
    params = list(gate.parameters()) + [p for e in experts for p in e.parameters()]
    losses = []
    for step in range(steps):
        parts = [batch(r, step) for r in range(RANKS)]
        x = torch.cat([p[0] for p in parts])
        target = torch.cat([p[1] for p in parts])
        ids, weights = route(gate, x)
        y = torch.zeros_like(x)
        for e, expert in enumerate(experts):
            token, slot = (ids == e).nonzero(as_tuple=True)
            y = y.index_add(0, token, weights[token, slot, None] * expert(x[token]))
        loss = ((y - target) ** 2).sum() / x.shape[0]
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= LR * p.grad
        losses.append(float(loss.detach()))
    return losses


def run(engine: str = "gloo", steps: int = 5) -> tuple[list[float], list[float]]:
    per_rank = rs.spawn(distributed_rank, RANKS, engine=engine, args=(steps,), timeout=300)
    return per_rank[0], reference(steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi"), default="gloo")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    ours, ref = run(args.engine, args.steps)
    print(f"MoE layer: {EXPERTS} experts ({EXPERTS // RANKS} per rank), top-{TOP_K}, {RANKS} ranks x "
          f"{TOKENS_PER_RANK} tokens, hidden {HIDDEN}, engine {args.engine}")
    print(f"{'step':>4}  {'loss (reshard, 4 ranks)':>24}  {'loss (one process)':>20}  {'|difference|':>12}")
    worst = 0.0
    for step, (a, b) in enumerate(zip(ours, ref)):
        worst = max(worst, abs(a - b))
        print(f"{step:>4}  {a:>24.12f}  {b:>20.12f}  {abs(a - b):>12.3e}")
    ok = worst <= 1e-5
    print(("OK" if ok else "MISMATCH") + f": largest difference {worst:.3e} (tolerance 1e-5)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
