"""What a picture shows, worked out once for the PNG and the HTML page: for one collective (or
one layout change) on the N x N block grid of a matrix, the cells each rank's box holds before
and after, and every copy of a block that travels between boxes.

A cell keeps the colour of the rank its values came from, inside its new holder's box, so the
last frame still says that A10 came from rank 1. ``style`` is ``solid`` (a block moved
unchanged), ``partial`` (a full-size partial sum, as gradients are) or ``sum`` (the sum of the
ranks' partial sums; ``sources`` lists whose).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..messages import placement_words, say
from ..planning.layout import (
    Partial,
    Placement,
    Replicate,
    Shard,
    map_placements,
    mesh_region,
    shard_sizes,
)
from ..planning.spec import layout_text
from .blocks import block_name, blocks, holders

FIVE = ("gather", "all_gather", "reduce_scatter", "all_to_all", "all_reduce")


@dataclass(frozen=True)
class Cell:
    i: int
    j: int
    colour_rank: int  # the rank whose values these are (for a sum: the first source)
    style: str = "solid"  # solid | partial | sum
    sources: tuple[int, ...] = ()
    name: str = ""  # its own label where (i, j) is a place in a box, not a block of the matrix


@dataclass(frozen=True)
class Move:
    i: int
    j: int
    src: int
    dst: int
    style: str = "solid"  # how the travelling copy looks (a partial sum travels as partial)
    to: tuple[int, int] | None = None  # where it lands in dst's box, where that is not (i, j)
    name: str = ""  # its own label (as Cell.name)


@dataclass(frozen=True)
class Scene:
    name: str
    title: str
    caption: str
    n: int
    names: dict[tuple[int, int], str]
    before: dict[int, list[Cell]]
    after: dict[int, list[Cell]]  # a rank missing here holds nothing afterwards (Gather's others)
    moves: list[Move]
    grid: tuple[int, int] | None = None  # blocks per box (rows, cols); default n x n
    labels: tuple[str, ...] | None = None  # each rank's box label; default "rank r"
    boxes: tuple[int, int] | None = None  # how the ranks' boxes are laid out (rows, cols): a mesh's grid
    sizes: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # elements in each block row and column
    lang: str = "en"  # the language of its words (title, caption, legend)

    @property
    def shape(self) -> tuple[int, int]:
        return self.grid or (self.n, self.n)

    def box_at(self, rank: int) -> tuple[int, int]:
        """(row, column) of rank's box: one row of boxes, or the mesh's grid in rank order."""
        return divmod(rank, (self.boxes or (1, self.n))[1])

    def edges(self) -> tuple[list[float], list[float]]:
        """Where each block row and column starts in its box, in block units (last: the end):
        each as long as its share of the matrix's elements, so uneven blocks look uneven."""
        rows, cols = self.shape
        if self.sizes is None:
            return [float(i) for i in range(rows + 1)], [float(j) for j in range(cols + 1)]
        return _edges(self.sizes[0], rows), _edges(self.sizes[1], cols)

    def label(self, rank: int) -> str:
        return self.labels[rank] if self.labels else f"rank {rank}"

    def cell_name(self, c: Cell | Move) -> str:
        return c.name or self.names[(c.i, c.j)]

    def legend(self) -> list[tuple[str, str]]:
        """(style, words) for the styles this scene uses, in order."""
        used = {c.style for cells in (*self.before.values(), *self.after.values()) for c in cells}
        return [(s, say(f"scene.legend.{s}", self.lang)) for s in ("solid", "partial", "sum") if s in used]


def _edges(sizes: tuple[int, ...], units: int) -> list[float]:
    total = sum(sizes) or 1
    out, at = [0.0], 0
    for size in sizes:
        at += size
        out.append(at * units / total)
    return out


def mesh_boxes(mesh_shape: tuple[int, ...]) -> tuple[int, int]:
    """The boxes of a mesh's ranks as a grid: its last dim across, the others down (rank order)."""
    across = mesh_shape[-1] if mesh_shape else 1
    return max(1, int(prod(mesh_shape)) // max(across, 1)), across


def collective_scene(name: str, shape: tuple[int, int], n: int, lang: str = "en") -> Scene:
    """One of the five collectives on the matrix: the movement collectives start row-sharded,
    the reduce collectives from full-size partial sums."""
    grid = blocks(shape, n)
    names = {(i, j): block_name(i, j, n) for i, j in grid}
    everyone = tuple(range(n))
    if name in ("reduce_scatter", "all_reduce"):
        before = {r: [Cell(i, j, r, "partial") for i, j in grid] for r in range(n)}
        targets = (lambda i, j: [j]) if name == "reduce_scatter" else (lambda i, j: list(everyone))
        after: dict[int, list[Cell]] = {r: [] for r in range(n)}
        moves = []
        for i, j in grid:
            for d in targets(i, j):
                after[d].append(Cell(i, j, 0, "sum", everyone))
                moves += [Move(i, j, r, d, "partial") for r in everyone if r != d]
    else:
        before = {r: [Cell(i, j, i) for i, j in grid if i == r] for r in range(n)}
        dests = {"gather": lambda i, j: [0], "all_gather": lambda i, j: list(everyone),
                 "all_to_all": lambda i, j: [j]}[name]
        after = {r: [] for r in range(n)} if name != "gather" else {0: []}
        moves = []
        for i, j in grid:
            for d in dests(i, j):
                after[d].append(Cell(i, j, i))
                if d != i:
                    moves.append(Move(i, j, i, d))
    sizes = (tuple(shard_sizes(shape[0], n)), tuple(shard_sizes(shape[1], n)))
    return Scene(name, say(f"scene.title.{name}", lang), say(f"scene.caption.{name}", lang), n, names, before, after,
                 moves, sizes=sizes, lang=lang)


def change_scene(shape: tuple[int, int], n: int, src: Placement, dst: Placement, title: str,
                 lang: str = "en") -> Scene:
    """Any layout change of the matrix (``reshard demo``): src's cells, dst's cells coloured by
    where their values came from, and the copies that travel."""
    grid = blocks(shape, n)
    names = {(i, j): block_name(i, j, n) for i, j in grid}
    src_style = "partial" if isinstance(src, Partial) else "solid"
    before: dict[int, list[Cell]] = {r: [] for r in range(n)}
    after: dict[int, list[Cell]] = {r: [] for r in range(n)}
    moves = []
    for i, j in grid:
        had = holders(src, i, j, n)
        for r in had:
            before[r].append(Cell(i, j, r, src_style))
        if isinstance(dst, Partial):  # nothing moves: each rank keeps its values as a partial sum
            for r in had:
                after[r].append(Cell(i, j, r, "partial"))
            continue
        for d in holders(dst, i, j, n):
            if isinstance(src, Partial):
                after[d].append(Cell(i, j, 0, "sum", tuple(had)))
                moves += [Move(i, j, r, d, "partial") for r in had if r != d]
                continue
            s = d if d in had else had[0]
            after[d].append(Cell(i, j, s))
            if s != d:
                moves.append(Move(i, j, s, d))
    caption = say("picture.change", lang, src=_words(src, lang), dst=_words(dst, lang))
    sizes = (tuple(shard_sizes(shape[0], n)), tuple(shard_sizes(shape[1], n)))
    return Scene("change", title, caption, n, names, before, after, moves, sizes=sizes, lang=lang)


def _words(p: Placement, lang: str) -> str:
    """A placement of the matrix in words: row- or column-sharded, replicated, partial sums."""
    if isinstance(p, Shard):
        return placement_words(Shard(p.dim % 2), lang)
    return placement_words(Partial() if isinstance(p, Partial) else Replicate(), lang)


def mesh_scene(shape: tuple[int, int], mesh_shape: tuple[int, ...], src: tuple, dst: tuple, title: str,
               lang: str = "en") -> Scene:
    """A layout change of the matrix on a process mesh (``reshard demo --mesh``): the matrix cut at
    every boundary of both layouts, so each block is wholly held or not; each block after the
    change coloured by the rank that sent it (or kept it), as ``MeshPlan`` decides."""
    from ..planning.mesh_plan import MeshPlan, box_intersect

    plan = MeshPlan(shape, src, dst, mesh_shape)
    size = plan.size
    cuts = [sorted({0, n} | {e for r in range(size) for box in (plan.exchange.held(r), plan.target(r))
                             for e in box[d]}) for d, n in enumerate(shape)]
    rows = [(a, b) for a, b in zip(cuts[0], cuts[0][1:]) if b > a]
    cols = [(a, b) for a, b in zip(cuts[1], cuts[1][1:]) if b > a]
    names = {(i, j): (f"A{i}{j}" if max(len(rows), len(cols)) <= 10 else f"A[{i},{j}]")
             for i in range(len(rows)) for j in range(len(cols))}

    def inside(box: tuple, i: int, j: int) -> bool:
        return box_intersect(box, (rows[i], cols[j])) == (rows[i], cols[j])

    src_partial = [m for m, p in enumerate(src) if isinstance(p, Partial)]
    before: dict[int, list[Cell]] = {r: [] for r in range(size)}
    after: dict[int, list[Cell]] = {r: [] for r in range(size)}
    moves = []
    for r in range(size):
        held = mesh_region(shape, map_placements(src, lambda p: Replicate() if isinstance(p, Partial) else p),
                           plan.exchange.coord(r), mesh_shape)
        for i, j in names:
            if inside(held, i, j):
                before[r].append(Cell(i, j, r, "partial" if src_partial else "solid"))
    summed = bool(plan.reductions)
    for q in range(size):
        recvs = plan.recvs(q)
        kept = plan.kept(q)
        partial_after = any(isinstance(p, Partial) for p in dst)
        for i, j in names:
            if not inside(plan.target(q), i, j):
                continue
            source = next((p for p, box in recvs if inside(box, i, j)), None)
            if source is not None:
                moves.append(Move(i, j, source, q, "partial" if summed else "solid"))
            elif not any(inside(box, i, j) for box in kept):
                continue  # a Partial destination: another rank of the group holds this block
            origin = q if source is None else source
            if summed:
                group = tuple(sorted({origin} | {k for k in range(size) if all(
                    plan.exchange.coord(k)[m] == plan.exchange.coord(origin)[m] for m in range(len(mesh_shape))
                    if m not in src_partial)}))
                after[q].append(Cell(i, j, group[0], "sum", group))
            else:
                after[q].append(Cell(i, j, origin, "partial" if partial_after else "solid"))
    labels = tuple(f"rank {r} {tuple(plan.exchange.coord(r))}" for r in range(size))
    caption = say("picture.change_mesh", lang, src=layout_text(src), dst=layout_text(dst),
                  mesh="x".join(map(str, mesh_shape)))
    sizes = (tuple(b - a for a, b in rows), tuple(b - a for a, b in cols))
    return Scene("change", title, caption, size, names, before, after, moves, (len(rows), len(cols)), labels,
                 mesh_boxes(mesh_shape), sizes, lang)
