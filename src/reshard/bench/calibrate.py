"""Fit the two-level cost model (``host_costs.Levels``) to the machines a job runs on.

``calibrate_job(comm)`` runs on every rank of a communicator that spans hosts (under torchrun or
mpirun, e.g. ``reshard bench --calibrate`` on each host; ``benchmarks/two_level.py`` on the
two-host test bed) and times, as the slowest rank's seconds (median of ``repeats``), the
row -> column ``all_to_all`` on each level alone: inside each host (the hosts mesh's "local"
communicators, all hosts at once) and across hosts (its "host" communicators, every local index
at once, so each host link carries what it carries in a real exchange), at a small and a large
size; ``host_costs.fit_levels`` puts a line through each level's two points. The flat and
two-level exchanges are not timed here: ``reshard plan --hosts ... --levels FILE`` predicts them
from these numbers.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

SIZES = (64 << 10, 16 << 20)  # bytes per rank: the small and the large point of each line


def _level_seconds(comm: Any, sub: Any, nbytes: int, repeats: int) -> float:
    from .. import ops

    x = np.ones((max(1, nbytes // 4 // 256), 256), dtype=np.float32)
    ops.all_to_all(x, 0, 1, comm=sub, algorithm="flat")  # planned and connected first
    samples = []
    for _ in range(repeats):
        comm.barrier()
        start = time.perf_counter()
        ops.all_to_all(x, 0, 1, comm=sub, algorithm="flat")
        took = ops.all_reduce(np.array([time.perf_counter() - start]), op="max", comm=comm, check=False)[0]
        samples.append(float(took))
    return statistics.median(samples)


def calibrate_job(comm: Any, repeats: int = 9) -> dict[str, Any]:
    """Every rank: the fitted levels (``host_costs.Levels`` fields) and the points they come from."""
    from ..mesh import Mesh
    from ..planning.host_costs import fit_levels

    mesh = Mesh.from_hosts(comm)
    hosts, local = mesh.shape
    if hosts < 2:
        raise ValueError("calibration needs ranks on at least two hosts (comm.hosts names one)")
    inside, across = mesh.sub("local"), mesh.sub("host")
    points = {"inside": {}, "across": {}}
    for nbytes in SIZES:
        points["inside"][nbytes] = _level_seconds(comm, inside, nbytes, repeats)
        points["across"][nbytes] = _level_seconds(comm, across, nbytes, repeats)
    levels = fit_levels(points["inside"], points["across"], hosts, local)
    return {"hosts": hosts, "ranks_per_host": local, "levels": levels.__dict__,
            "points_s": {level: {str(b): t for b, t in by.items()} for level, by in points.items()}}
