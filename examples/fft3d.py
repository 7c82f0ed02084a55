"""A spectral Poisson solve on a periodic 3-D grid, on 4 local ranks with a 2x2 pencil mesh,
checked against the same solve in one process.

    python examples/fft3d.py [--engine gloo|mpi] [--n 32]

Solve  laplacian(u) = f  on [0, 2 pi)^3 with periodic boundaries, for the f whose exact
solution is u = sin(x) sin(2y) sin(3z) + cos(2x) cos(y) / 2 (f has zero mean). In Fourier
space the equation is  -|k|^2 u_k = f_k, so u_k = -f_k / |k|^2 (and u_0 = 0). Each rank holds
a pencil of the grid (rows split over mesh dim 0, columns over mesh dim 1); rs.fft.fftn
transforms it (two layout changes), each rank divides its own wavenumbers, and rs.fft.ifftn
brings u back to the pencils it started from. The one-process numpy solve and the exact
solution give the errors printed at the end.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import reshard as rs
from reshard.engines.available import default_engine

RANKS, MESH, SRC = 4, (2, 2), "S(0),S(1)"


def grid(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.arange(n) * (2 * np.pi / n)
    return np.meshgrid(x, x, x, indexing="ij")


def exact(n: int) -> np.ndarray:
    x, y, z = grid(n)
    return np.sin(x) * np.sin(2 * y) * np.sin(3 * z) + 0.5 * np.cos(2 * x) * np.cos(y)


def rhs(n: int) -> np.ndarray:
    """The Laplacian of ``exact``: each Fourier mode is scaled by -|k|^2."""
    x, y, z = grid(n)
    return -14 * np.sin(x) * np.sin(2 * y) * np.sin(3 * z) - 0.5 * 5 * np.cos(2 * x) * np.cos(y)


def inverse_laplacian(f_hat: np.ndarray, region: tuple, n: int) -> np.ndarray:
    """u_k = -f_k / |k|^2 on the wavenumbers of ``region`` (global index ranges), u_0 = 0."""
    k = np.fft.fftfreq(n, d=1.0 / n)
    kx, ky, kz = np.meshgrid(*(k[a:b] for a, b in region), indexing="ij")
    k2 = kx**2 + ky**2 + kz**2
    out = np.zeros_like(f_hat)
    nonzero = k2 != 0
    out[nonzero] = -f_hat[nonzero] / k2[nonzero]
    return out


def solve_rank(comm: rs.Comm, n: int) -> tuple:
    """This rank's pencil of f in, its pencil of u out."""
    mesh = rs.Mesh(MESH, comm=comm)
    src = rs.parse_placements(SRC)
    region = rs.layout.mesh_region((n, n, n), src, mesh.coord, MESH)
    f = np.ascontiguousarray(rhs(n)[tuple(slice(a, b) for a, b in region)])
    f_hat = rs.fft.fftn(f, mesh, src)  # laid out as rs.fft.output_layout: no extra exchange
    spectral = rs.layout.mesh_region((n, n, n), rs.fft.output_layout((n, n, n), mesh, src), mesh.coord, MESH)
    u = rs.fft.ifftn(inverse_laplacian(f_hat, spectral, n), mesh, rs.fft.output_layout((n, n, n), mesh, src), dst=src)
    return region, u.real


def run(engine: str, n: int) -> tuple[float, float]:
    """(largest difference from the one-process solve, largest error against the exact u)."""
    pieces = rs.spawn(solve_rank, RANKS, engine=engine, args=(n,), timeout=300)
    u = np.empty((n, n, n))
    for region, piece in pieces:
        u[tuple(slice(a, b) for a, b in region)] = piece
    f_hat = np.fft.fftn(rhs(n))
    reference = np.fft.ifftn(inverse_laplacian(f_hat, ((0, n),) * 3, n)).real
    return float(np.abs(u - reference).max()), float(np.abs(u - exact(n)).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("gloo", "mpi"), default=None)
    parser.add_argument("--n", type=int, default=32, help="grid points per axis (default 32)")
    args = parser.parse_args(argv)
    engine = args.engine or default_engine()[0]
    vs_numpy, vs_exact = run(engine, args.n)
    print(f"Poisson solve on a {args.n}^3 periodic grid, {RANKS} {engine} ranks, pencil mesh {MESH[0]}x{MESH[1]}")
    print(f"  largest difference from the one-process numpy solve: {vs_numpy:.2e}")
    print(f"  largest error against the exact solution:            {vs_exact:.2e}")
    ok = vs_numpy <= 1e-12 and vs_exact <= 1e-10
    print("  OK" if ok else "  FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
