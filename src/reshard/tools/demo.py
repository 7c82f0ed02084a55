"""``reshard demo``: the row -> column example, run for real on local ranks, drawn and checked."""

from __future__ import annotations

from typing import Any

from ..engines.available import installed
from ..errors import MissingDependency
from ..messages import say
from ..planning.layout import Partial, Placement, Replicate, local_shard
from ..planning.spec import layout_text, map_placements
from ..viz.terminal import render_demo


def global_matrix(shape: tuple[int, int], dtype: str) -> Any:
    """A[i, j] = i * cols + j: every value names its own position. A torch tensor where torch
    is installed, else a numpy array (numpy has no bfloat16)."""
    rows, cols = shape
    if installed("torch"):
        import torch

        return torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols).to(getattr(torch, dtype))
    import numpy as np

    if dtype == "bfloat16":
        raise MissingDependency("--dtype bfloat16 needs torch, which is not installed: install torch (reshard's [torch] extra)")
    return np.arange(rows * cols, dtype=np.float64).reshape(rows, cols).astype(dtype)


def _contiguous(a: Any) -> Any:
    import numpy as np

    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a.contiguous()


def demo_rank(comm: Any, shape: tuple[int, int], src: Placement, dst: Placement, dtype: str) -> tuple:
    """One rank: take my part of A under ``src``, redistribute to ``dst``, report what moved."""
    from .. import ops

    full = global_matrix(shape, dtype)
    mine = _contiguous(local_shard(full, src, comm.rank, comm.size))
    out = ops.redistribute(mine, src, dst)
    stats = ops.last_exchange()
    return mine, out, (stats.bytes_sent, stats.bytes_received) if stats else (0, 0)


def _bits_equal(a: Any, b: Any) -> bool:
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    return bytes_of(_contiguous(a)) == bytes_of(_contiguous(b))


def bytes_of(a: Any) -> bytes:
    """The raw bytes of a contiguous array or tensor."""
    import numpy as np

    if isinstance(a, np.ndarray):
        return a.tobytes()
    import torch

    return a.reshape(-1).view(torch.uint8).numpy().tobytes()


def verify(shape: tuple[int, int], dtype: str, dst: Placement, outs: list[Any]) -> dict[int, str]:
    """Rank -> what is wrong with its result; checked against the full matrix."""

    full = global_matrix(shape, dtype)
    n = len(outs)
    if isinstance(dst, Partial):
        total = outs[0] * 1
        for o in outs[1:]:
            total = total + o
        return {} if _bits_equal(total, full) else {0: "the partial results do not sum to A"}
    problems = {}
    for r, out in enumerate(outs):
        want = local_shard(full, dst, r, n)
        if not _bits_equal(out, want):
            problems[r] = f"got shape {list(out.shape)}, want {list(want.shape)}" if out.shape != want.shape else "values differ"
    return problems


def run_demo(ranks: int, shape: tuple[int, int], src: Placement, dst: Placement, dtype: str,
             engine: str, lang: str, console: Any, timeout: float = 60.0) -> int:
    """Run, draw and check the exchange; the exit status (0 when every rank is right)."""
    from ..errors import ReshardError
    from ..launch import spawn

    try:
        results = spawn(demo_rank, ranks, engine=engine, args=(shape, src, dst, dtype), timeout=timeout)
    except ReshardError as exc:
        console.print(say("demo.failed", lang, error=exc))
        return 1
    ins = [r[0] for r in results]
    outs = [r[1] for r in results]
    render_demo(console, lang, shape, ranks, src, dst, dtype, engine, ins, outs, [r[2] for r in results])
    problems = verify(shape, dtype, dst, outs)
    for rank, detail in sorted(problems.items()):
        console.print(say("demo.bad", lang, rank=rank, detail=detail), style="bold red")
    if problems:
        return 1
    console.print(say("demo.ok", lang, ranks=ranks, placement=repr(dst)), style="bold green")
    return 0


def demo_mesh_rank(comm: Any, mesh_shape: tuple, shape: tuple[int, int], src: tuple, dst: tuple, dtype: str) -> tuple:
    """One rank of a mesh: take my part of A under ``src``, redistribute on the mesh to ``dst``."""
    from .. import ops
    from ..mesh import Mesh

    mesh = Mesh(mesh_shape, comm=comm)
    full = global_matrix(shape, dtype)
    mine = local_shard(full, src, mesh.coord, mesh_shape)
    if any(isinstance(p, Partial) for p in src):  # a partial sum: the first rank of each group holds A
        first = all(mesh.coord[m] == 0 for m, p in enumerate(src) if isinstance(p, Partial))
        mine = mine if first else mine * 0
    mine = _contiguous(mine)
    out = ops.redistribute(mine, src, dst, mesh=mesh)
    stats = ops.last_exchange()
    return mesh.coord, mine, out, (stats.bytes_sent, stats.bytes_received) if stats else (0, 0)


def verify_mesh(shape: tuple[int, int], dtype: str, mesh_shape: tuple, dst: tuple, coords: list, outs: list) -> dict[int, str]:
    """Rank -> what is wrong (empty when every rank holds its part; Partial parts summed)."""
    full = global_matrix(shape, dtype)
    whole = map_placements(dst, lambda p: Replicate() if isinstance(p, Partial) else p)  # the split order kept
    partial = [m for m, p in enumerate(dst) if isinstance(p, Partial)]
    problems = {}
    for r, (coord, out) in enumerate(zip(coords, outs)):
        want = _contiguous(local_shard(full, whole, coord, mesh_shape))
        got = out
        if partial:
            got = sum(o for c, o in zip(coords, outs) if all(c[m] == coord[m] for m in range(len(coord)) if m not in partial))
        if tuple(got.shape) != tuple(want.shape) or not _bits_equal(got, want):
            problems[r] = f"got shape {list(got.shape)}, want {list(want.shape)}" if tuple(got.shape) != tuple(want.shape) else "values differ"
    return problems


def run_demo_mesh(mesh_shape: tuple, shape: tuple[int, int], src: tuple, dst: tuple, dtype: str, engine: str,
                  lang: str, console: Any, timeout: float = 60.0) -> tuple[int, Any]:
    """Run, draw and check a layout change on a mesh; (exit status, the scene for pictures)."""
    from ..errors import ReshardError
    from ..launch import spawn
    from ..viz.scenes import mesh_scene
    from ..viz.terminal import render_mesh_demo

    size = 1
    for s in mesh_shape:
        size *= s
    try:
        results = spawn(demo_mesh_rank, size, engine=engine, args=(mesh_shape, shape, src, dst, dtype), timeout=timeout)
    except ReshardError as exc:
        console.print(say("demo.failed", lang, error=exc))
        return 1, None
    coords, ins, outs = [r[0] for r in results], [r[1] for r in results], [r[2] for r in results]
    render_mesh_demo(console, lang, shape, mesh_shape, src, dst, dtype, engine, coords, ins, outs, [r[3] for r in results])
    problems = verify_mesh(shape, dtype, mesh_shape, dst, coords, outs)
    for rank, detail in sorted(problems.items()):
        console.print(say("demo.bad", lang, rank=rank, detail=detail), style="bold red")
    if problems:
        return 1, None
    console.print(say("demo.ok_mesh", lang, ranks=size, placement=layout_text(dst)), style="bold green")
    return 0, mesh_scene(shape, mesh_shape, src, dst, "redistribute", lang)
