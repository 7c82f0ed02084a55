"""The distributed FFT against numpy's on the full array: forward, inverse, real forms, on
slabs and pencils of 4 ranks, uneven and odd shapes, length-1 axes, both engines. The error is
the largest absolute difference over the largest absolute value of the reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reshard as rs
from reshard.fft import Move, schedule
from tests.helpers import rank_fns

MESHES = [(4,), (1, 4), (4, 1), (2, 2)]
TOL = {"float64": 1e-12, "float32": 1e-5}


@st.composite
def cases(draw, kind=None):
    kind = kind or draw(st.sampled_from(["fft", "ifft", "rfft", "irfft"]))
    ndim = draw(st.sampled_from([2, 3]))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    mesh = draw(st.sampled_from(MESHES))
    axes = tuple(draw(st.permutations(range(ndim)))[: draw(st.integers(1, ndim))])
    case = {"kind": kind, "mesh": mesh, "axes": axes, "norm": draw(st.sampled_from(["backward", "ortho", "forward"])),
            "dtype": draw(st.sampled_from(["float64", "float32"])), "seed": draw(st.integers(0, 2**16)),
            "arrays": draw(st.sampled_from(["numpy", "torch"])), "dst": None, "s": None}
    if kind == "irfft":
        case["real_shape"] = shape
        last = axes[-1]
        case["in_shape"] = tuple(n // 2 + 1 if d == last else n for d, n in enumerate(shape))
        case["s"] = [shape[a] for a in axes]
    else:
        case["in_shape"] = shape
    case["src"] = draw(layouts(ndim, mesh))
    if draw(st.booleans()):
        case["dst"] = draw(layouts(ndim, mesh))
    return case


@st.composite
def layouts(draw, ndim, mesh):
    """A layout as text: one placement per mesh dim, or on a 2-D mesh sometimes a Spec that
    splits one tensor dim over both mesh dims in a drawn order."""
    if len(mesh) == 2 and draw(st.booleans()):
        entries = ["None"] * ndim
        entries[draw(st.integers(0, ndim - 1))] = str(tuple(draw(st.permutations([0, 1]))))
        return f"Spec({', '.join(entries)})"
    return ",".join(draw(st.sampled_from([f"S({d})" for d in range(ndim)] + ["R"])) for _ in mesh)


def _reference(case):
    full = rank_fns.fft_full(case)
    fn = {"fft": np.fft.fftn, "ifft": np.fft.ifftn, "rfft": np.fft.rfftn}.get(case["kind"])
    if fn is None:
        return full, np.fft.irfftn(full, s=case["s"], axes=case["axes"], norm=case["norm"])
    return full, fn(full, axes=case["axes"], norm=case["norm"])


def _check(cases_, results):
    for k, case in enumerate(cases_):
        full, want = _reference(case)
        tol = TOL[case["dtype"]]
        scale = max(float(np.abs(want).max()), 1e-300)
        for coord, y, back, layout in (results[r][k] for r in range(4)):
            out_layout = rs.parse_placements(case["dst"] or layout)
            region = rs.layout.mesh_region(want.shape, out_layout, coord, case["mesh"])
            piece = want[tuple(slice(a, b) for a, b in region)]
            assert y.shape == piece.shape, (case, coord, y.shape, piece.shape)
            err = float(np.abs(y - piece).max()) / scale if piece.size else 0.0
            assert err <= tol, (case, coord, err)
            if back is not None:
                region = rs.layout.mesh_region(full.shape, rs.parse_placements(case["src"]), coord, case["mesh"])
                orig = full[tuple(slice(a, b) for a, b in region)]
                err = float(np.abs(back - orig).max()) / max(float(np.abs(full).max()), 1e-300) if orig.size else 0.0
                assert err <= tol, ("round trip", case, coord, err)


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(cases(), min_size=12, max_size=12))
def test_distributed_fft_equals_numpy_on_the_full_array(engine, batch):
    results = rs.spawn(rank_fns.fft_cases, 4, engine=engine, args=(batch,), timeout=300)
    _check(batch, results)


def test_slab_and_pencil_schedules_use_one_and_two_exchanges():
    """A 3-D array: one layout change on a slab, two on a pencil, and the result's layout."""
    assert [type(s).__name__ for s in schedule((8, 8, 8), (4,), (rs.Shard(0),), (0, 1, 2), "fft")] == [
        "Transform", "Move", "Transform"]
    steps = schedule((8, 8, 8), (2, 2), (rs.Shard(0), rs.Shard(1)), (0, 1, 2), "fft")
    assert [type(s).__name__ for s in steps] == ["Transform", "Move", "Transform", "Move", "Transform"]
    assert [s.layout for s in steps if isinstance(s, Move)][-1] == rs.fft.output_layout((8, 8, 8), (2, 2), "S(0),S(1)")
    assert rs.fft.output_layout((8, 8, 8), (4,), "S(0)") == (rs.Shard(1),)
    # the inverse back to where the forward began takes as many exchanges, and ends there
    back = schedule((8, 8, 8), (2, 2), (rs.Shard(1), rs.Shard(2)), (0, 1, 2), "ifft", (rs.Shard(0), rs.Shard(1)))
    assert [type(s).__name__ for s in back] == ["Transform", "Move", "Transform", "Move", "Transform"]
    assert back[-2].layout == (rs.Shard(0), rs.Shard(1))


@pytest.mark.parametrize("name, value, says", [("norm", "bogus", "norm must be one of"),
                                               ("dst", "S(0),S(7)", "dst Shard dim"),
                                               ("dst", "S(0),P", "not Partial"),
                                               ("dst", "S(0)", "one placement per mesh dim"),
                                               ("axes", 1, "axes must be a sequence of ints"),
                                               ("s", 5, "s must be a sequence of ints"),
                                               ("s", ("a", 7), "s must be an int"),
                                               ("s", (6.5, 7), "s must be an int"),
                                               ("x", "bfloat16", "bfloat16"),
                                               ("mesh", "a string", "mesh must be an rs.Mesh")])
def test_a_bad_argument_on_one_rank_raises_on_every_rank(name, value, says):
    results = rs.spawn(rank_fns.fft_bad_argument, 4, engine="gloo", args=(2, name, value), timeout=120)
    kind = "UnsupportedDType" if name == "x" else "InvalidArgument"
    assert results[2] is not None and results[2][0] == kind and says in results[2][1], results[2]
    # the peers raise the same kind of error, naming the rank and what it got wrong
    assert all(r is not None and r[0] == kind and "rank 2" in r[1] and says in r[1]
               for i, r in enumerate(results) if i != 2), results


def test_a_transform_along_an_axis_of_length_zero_is_refused_on_every_rank():
    # numpy's own refusal came out of every rank's local transform as a bare ValueError
    for rank, seen in enumerate(rs.spawn(rank_fns.fft_empty_axis, 4, engine="gloo", args=((1, 2),), timeout=120)):
        assert seen[0] == "InvalidArgument" and "axis 1" in seen[1] and "length 0" in seen[1], (rank, seen)
    # along the other axes only, the empty one just comes along
    assert rs.spawn(rank_fns.fft_empty_axis, 4, engine="gloo", args=((2,),), timeout=120) == [("ok", (1, 0, 5))] * 4


def test_irfftn_refuses_an_s_that_would_pad_or_crop_an_axis_before_the_last():
    """numpy's irfftn pads or crops the axes before the last to ``s``; here every rank refuses."""
    results = rs.spawn(rank_fns.fft_bad_argument, 4, engine="gloo", args=("every", "s", (5, 7)), timeout=120)
    for rank, seen in enumerate(results):
        assert seen is not None and seen[0] == "InvalidArgument", (rank, seen)
        assert "padding or cropping" in seen[1], (rank, seen)


def test_irfftn_of_a_last_axis_of_length_one_asks_for_s_and_takes_it():
    # the output length it implies is 0: the refusal named an s the caller never passed
    for rank, seen in enumerate(rs.spawn(rank_fns.fft_irfftn_last_axis_one, 4, engine="gloo", timeout=120)):
        assert seen[0] == "InvalidArgument" and "axis 2" in seen[1] and "has length 1" in seen[1], (rank, seen)
        assert "pass s" in seen[1] and "s[-1]=0" not in seen[1], (rank, seen)
    assert rs.spawn(rank_fns.fft_irfftn_last_axis_one, 4, engine="gloo", args=((4, 6, 1),), timeout=120) == [
        ("ok", True)] * 4


@pytest.mark.parametrize("field", sorted(rank_fns.FFT_DIFFERENCES))
def test_arguments_that_differ_on_one_rank_raise_on_every_rank(field):
    """A valid value on each rank, but not the same one (the norm, the axes, the transform, the
    dtype, the result's layout, the input's layout, irfftn's s): every rank raises a
    MismatchError naming the argument and the rank, where the pieces alone would let some ranks
    return another transform's values and others wait for an exchange that never comes."""
    results = rs.spawn(rank_fns.fft_different_arguments, 4, engine="gloo", args=(field, 2), timeout=120)
    for rank, seen in enumerate(results):
        assert seen is not None and seen[0] == "MismatchError", (rank, seen)
        named = "different collectives" if field == "transform" else field  # the transform is the op
        assert named in seen[1] and "rank 2" in seen[1], (rank, seen)


@pytest.mark.parametrize("engine", ["gloo", "mpi"])
def test_example_poisson_solve_matches_one_process(engine):
    import sys
    from pathlib import Path

    examples = str(Path(__file__).resolve().parents[2] / "examples")
    sys.path.append(examples)  # here and in the rank processes, which import the example by name
    try:
        import fft3d

        vs_numpy, vs_exact = fft3d.run(engine, 16)
    finally:
        sys.path.remove(examples)
    assert vs_numpy <= 1e-12 and vs_exact <= 1e-10, (vs_numpy, vs_exact)


def test_the_scipy_backend_transforms_or_says_what_to_install():
    import importlib.util

    results = rs.spawn(rank_fns.fft_scipy_backend, 4, engine="gloo", timeout=120)
    if importlib.util.find_spec("scipy") is None:
        assert all(r[0] == "MissingDependency" and "pip install scipy" in r[1] for r in results), results
        return
    full = np.arange(4 * 6 * 5, dtype=np.float64).reshape(4, 6, 5) + 0.5j
    want = np.fft.fftn(full)
    for r, (status, piece, layout) in enumerate(results):
        assert status == "ok"
        region = rs.layout.mesh_region(full.shape, layout, (r,), (4,))
        ref = want[tuple(slice(a, b) for a, b in region)]
        assert np.abs(piece - ref).max() <= 1e-12 * np.abs(want).max()
