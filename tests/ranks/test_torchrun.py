"""rs.init() under torchrun: the same code the README shows for several hosts, on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import reshard as rs

    comm = rs.init()
    A = np.arange(7 * 5, dtype=np.float64).reshape(7, 5)
    mine = rs.local_shard(A, rs.Shard(0), comm.rank, comm.size)
    cols = rs.redistribute(mine, rs.Shard(0), rs.Shard(1))
    assert np.array_equal(cols, rs.local_shard(A, rs.Shard(1), comm.rank, comm.size))
    assert comm.group is not None and comm.engine == "gloo"
    with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as f:
        f.write(f"rank {comm.rank} of {comm.size} ok")
    comm.close()
    """
)


def test_init_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))  # torchrun's own files too
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
         "--master-port", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert [(tmp_path / f"rank{r}").read_text() for r in range(3)] == [f"rank {r} of 3 ok" for r in range(3)]


def test_init_alone_is_size_one(tmp_path):
    code = "import numpy as np, reshard as rs; c = rs.init(); x = np.ones((2, 3)); print(c.size, rs.all_to_all(x, 1, 0).shape); c.close()"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["TMPDIR"] = str(tmp_path)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "(2,", "3)"]
    assert list(tmp_path.iterdir()) == []  # its private rendezvous directory is gone


def test_bad_launcher_environment(tmp_path):
    for env_patch, word in [({"RANK": "0", "WORLD_SIZE": "0"}, "at least 1"), ({"RANK": "3", "WORLD_SIZE": "2"}, "outside"),
                            ({"RANK": "x", "WORLD_SIZE": "2"}, "not an integer")]:
        code = "import reshard as rs\ntry:\n    rs.init()\nexcept rs.InvalidArgument as e:\n    print('ERR', e)\n"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=dict(os.environ, **env_patch))
        assert run.stdout.startswith("ERR") and word in run.stdout, (env_patch, run.stdout, run.stderr)


EARLY = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import reshard as rs

    comm = rs.init()
    x = np.zeros((comm.size, 6), np.float32)
    rs.all_gather(x)
    if comm.rank == 2:
        comm.close()  # its job is done: it never joins the redistribute below
        sys.exit(0)
    start = time.monotonic()
    try:
        rs.redistribute(x, rs.Shard(0), rs.Shard(1))
        said = "no error"
    except rs.ReshardError as exc:
        said = f"{type(exc).__name__}: {exc}"
    with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as f:
        f.write(f"{time.monotonic() - start:.2f} {said}")
    """
)


def test_a_rank_that_leaves_early_under_torchrun_is_named_by_its_peers(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(EARLY)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", TMPDIR=str(tmp_path), RESHARD_TIMEOUT="60")
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
         "--master-port", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    for r in (0, 1):
        seconds, said = (tmp_path / f"rank{r}").read_text().split(" ", 1)
        assert said.startswith("RankFailed") and "rank 2 " in said, said  # named, not a timeout
        assert float(seconds) < 5, seconds

