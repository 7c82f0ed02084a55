"""A rank plans its own part from its coordinate alone: the peers and boxes it gets are exactly
what listing every rank's boxes gives (small meshes, hypothesis), both ends of a message compute
the same box, the totals match, and single ranks of a 65,536-rank world and of a 256x256 mesh
are planned against closed-form answers. The timing itself lives in the benchmark."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from reshard.planning import planner
from reshard.planning.box_geometry import ExchangeGeometry
from reshard.planning.layout import Replicate, Shard, local_region, mesh_region, parse_placement, shard_sizes
from reshard.planning.mesh_plan import BoxExchange
from reshard.planning.steps import AllToAll
from reshard.tools.rank_report import rank_report


def _elements(pairs):
    """(peer, box) pairs as {peer: set of element indices}."""
    out: dict[int, set] = {}
    for peer, box in pairs:
        out.setdefault(peer, set()).update(itertools.product(*[range(a, b) for a, b in box]))
    return {p: e for p, e in out.items() if e}


@st.composite
def layouts(draw):
    mesh = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    placement = st.sampled_from([Replicate()] + [Shard(d) for d in range(len(shape))])
    src = tuple(draw(placement) for _ in mesh)
    dst = tuple(draw(placement) for _ in mesh)
    return shape, src, dst, mesh, draw(st.sampled_from(["balanced", "chunk"]))


@settings(max_examples=250, deadline=None)
@given(layouts())
def test_a_ranks_own_part_is_what_listing_every_rank_gives(layout):
    shape, src, dst, mesh, rule = layout
    listed = BoxExchange(shape, src, dst, mesh, rule)
    geometry = ExchangeGeometry(shape, src, dst, mesh, rule)
    sent, received = geometry.totals()
    moves = False
    for r in range(listed.size):
        mine = geometry.for_rank(r)
        assert _elements(mine.recvs()) == _elements(listed.recvs(r))
        assert _elements(mine.sends()) == _elements(listed.sends(r))
        assert [p for p, _ in mine.recvs()] == sorted({p for p, _ in mine.recvs()}), "one box per peer, ascending"
        for q, box in mine.sends():  # the receiver computes the very same box
            assert (r, box) in geometry.for_rank(q).recvs()
        assert (int(mine.send_counts.sum()), int(mine.recv_counts.sum())) == (sent[r], received[r])
        moves |= bool(listed.recvs(r))
    assert geometry.moves() == moves


def test_the_planner_gives_one_rank_of_a_65536_rank_world_its_all_to_all():
    n = 65_536
    shape = (n * 3 + 5, n * 2 + 7)
    rows, cols = shard_sizes(shape[0], n), shard_sizes(shape[1], n)
    for r in (0, 4, 12_345, n - 1):
        plan = planner.redistribute(shape, (Shard(0),), (Shard(1),), (n,), r)
        (step,) = plan.steps
        assert isinstance(step, AllToAll) and (step.split_dim, step.concat_dim) == (1, 0)
        assert step.in_shape == (rows[r], shape[1]) and step.out_shape == (shape[0], cols[r])
        assert step.send_sizes == tuple(cols) and step.recv_lengths == tuple(rows)
        (_, sent, received), = planner.rank_traffic(plan, step.in_shape)
        assert len(sent) == len(received) == n - 1 and r not in sent
        assert sum(sent.values()) == rows[r] * (shape[1] - cols[r])
        assert sum(received.values()) == cols[r] * (shape[0] - rows[r])


def test_the_exchange_geometry_gives_one_rank_of_a_65536_rank_world_its_boxes():
    n = 65_536
    shape = (n * 3 + 5, n * 2 + 7)
    rows, cols = shard_sizes(shape[0], n), shard_sizes(shape[1], n)
    geometry = ExchangeGeometry(shape, (Shard(0),), (Shard(1),), (n,))
    for r in (0, 4, 12_345, n - 1):
        mine = geometry.for_rank(r)
        assert mine.send_peers.tolist() == [q for q in range(n) if q != r]
        assert mine.recv_peers.tolist() == mine.send_peers.tolist()
        assert int(mine.send_counts.sum()) == rows[r] * (shape[1] - cols[r])
        assert int(mine.recv_counts.sum()) == cols[r] * (shape[0] - rows[r])
        for q in (0, 7, n - 1):
            if q == r:
                continue
            i = q if q < r else q - 1
            box = tuple(zip(mine.send_lo[i].tolist(), mine.send_hi[i].tolist()))
            held, needed = local_region(shape, Shard(0), r, n), local_region(shape, Shard(1), q, n)
            assert box == (held[0], needed[1])


def test_a_rank_of_a_256x256_mesh_plans_its_part():
    mesh, shape = (256, 256), (256 * 40 + 3, 256 * 24 + 1)
    src, dst = (Shard(0), Shard(1)), (Shard(1), Shard(0))
    geometry = ExchangeGeometry(shape, src, dst, mesh)
    for i, j in ((0, 0), (1, 2), (117, 48), (255, 254)):
        r = i * 256 + j
        mine = geometry.for_rank(r)
        # (i, j) holds rows block i, cols block j; it needs rows block j, cols block i: all from (j, i)
        if i == j:
            assert mine.sends() == [] and mine.recvs() == []
            continue
        peer = j * 256 + i
        held = mesh_region(shape, src, (i, j), mesh)
        assert mine.sends() == [(peer, tuple((max(a, c), min(b, d)) for (a, b), (c, d)
                                             in zip(held, mesh_region(shape, dst, (j, i), mesh))))]
        assert [p for p, _ in mine.recvs()] == [peer]


def test_rank_report_matches_the_world_collectives():
    report = rank_report((6, 6), Shard(0), Shard(1), 1, ranks=3)
    (step,) = report["steps"]
    assert step["collective"] == "all_to_all" and report["peers"] == [0, 2]
    assert step["sends"] == [{"peer": 0, "region": [[2, 4], [0, 2]], "bytes": 16},
                             {"peer": 2, "region": [[2, 4], [4, 6]], "bytes": 16}]
    assert (report["sent_bytes"], report["received_bytes"]) == (32, 32)
    both = rank_report((7, 5), "partial", "replicate", 2, ranks=4)
    assert [s["collective"] for s in both["steps"]] == ["reduce_scatter", "all_gather"]
    pieces = shard_sizes(35, 4)
    assert both["sent_bytes"] == 4 * (35 - pieces[2]) + 4 * pieces[2] * 3
    assert rank_report((4, 4), "replicate", "col", 0, ranks=2)["steps"][0]["collective"] == "local"


def test_a_ranks_part_of_a_world_names_its_layouts_as_the_whole_plan_does():
    """A world's layout is one placement: ``Shard(0)``, as ``reshard plan`` prints it, not a 1-tuple."""
    report = rank_report((6, 6), "row", "replicate", 1, ranks=3)
    assert (report["src"], report["dst"]) == ("Shard(0)", "Replicate()")
    assert parse_placement(report["src"]) == Shard(0)


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reshard", "plan", *args], capture_output=True, text=True, timeout=120)


def test_plan_rank_on_the_command_line():
    run = _plan("--shape", "6x6", "--ranks", "3", "--rank", "2", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["rank"] == 2 and report["peers"] == [0, 1] and report["plan_seconds"] >= 0
    run = _plan("--shape", "8x8", "--mesh", "2x2", "--src", "S(0),S(1)", "--dst", "S(1),S(0)", "--rank", "1", "--json")
    report = json.loads(run.stdout)
    assert report["coord"] == [0, 1] and report["peers"] == [2] and report["sent_bytes"] == 16 * 4
    text = _plan("--shape", "6x6", "--ranks", "3", "--rank", "0").stdout
    assert "send rows 0-1, cols 2-3 to rank 1" in text and "2 peers" in text
    refused = _plan("--shape", "6x6", "--ranks", "3", "--rank", "3")
    assert refused.returncode == 2 and "--rank 3 is outside the 3 ranks" in refused.stderr


def test_a_rank_with_an_empty_piece_still_counts_what_it_receives():
    # (4, 7, 2) split along dim 2 over 3 ranks: rank 2 holds nothing, yet receives 4 x 7 from
    # each of ranks 0 and 1 when the tensor is gathered or reduced (its own length cannot say
    # how many elements a unit of the dim holds)
    from reshard.planning import planner
    from reshard.planning.layout import Partial, Replicate, Shard

    gather = planner.redistribute((4, 7, 2), (Shard(2),), (Replicate(),), (3,), 2)
    assert planner.rank_traffic(gather, (4, 7, 0)) == [("all_gather", {}, {0: 28, 1: 28})]
    scatter = planner.redistribute((4, 7, 2), (Partial(),), (Shard(2),), (3,), 2)
    [(name, sent, received)] = planner.rank_traffic(scatter, (4, 7, 2))
    assert name == "reduce_scatter" and sent == {0: 28, 1: 28} and received == {}
