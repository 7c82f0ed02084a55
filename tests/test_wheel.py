"""The package as a user gets it: a wheel built from this tree, installed into a fresh virtual
environment, runs `reshard --version` and `reshard demo` from there (not from the source tree)."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_wheel_installs_and_runs_the_demo(tmp_path):
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT)])
    assert "deprecat" not in (built.stdout + built.stderr).lower(), "the build printed a deprecation warning"
    wheel = next(dist.glob("reshard-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("reshard/py.typed", "reshard/launch/mpi_rank.py", "reshard/engines/base.py", "reshard/viz/pictures.py"):
        assert needed in names, needed

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # numpy, torch and rich come from this environment (installing torch again would take minutes);
    # reshard itself only from the wheel.
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = [p for p in {sysconfig.get_paths()["purelib"], *site.getsitepackages()} if Path(p).is_dir()]
    (purelib / "deps.pth").write_text("\n".join(deps) + "\n")
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = _run([str(py), "-c", "import reshard; print(reshard.__file__)"], cwd=tmp_path, env=env).stdout
    assert str(env_dir) in where, f"reshard was imported from {where}, not from the wheel"
    version = _run([str(env_dir / "bin" / "reshard"), "--version"], cwd=tmp_path, env=env).stdout
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version.strip() == f"reshard {declared}"
    demo = _run([str(env_dir / "bin" / "reshard"), "demo", "--no-color"], cwd=tmp_path, env=env).stdout
    assert "OK: all 3 ranks hold exactly their part of A under Shard(1)" in demo
