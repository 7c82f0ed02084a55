"""Two 'hosts' in network namespaces joined by a veth pair, each with its own address, ranks
started by torchrun on each as they would be on two machines. Needs root and iproute2."""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

JOB = textwrap.dedent(
    """
    import os
    import sys
    import numpy as np
    import reshard as rs

    comm = rs.init(timeout=120)
    REPEATS = 4
    # (4096, 1024): 1 MiB messages, through shared memory within a host and TCP between them
    for shape in [(6, 6), (7, 5), (4096, 1024)]:
        A = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
        rows = rs.local_shard(A, rs.Shard(0), comm.rank, comm.size)
        cols = rs.redistribute(rows, rs.Shard(0), rs.Shard(1))
        assert np.array_equal(cols, rs.local_shard(A, rs.Shard(1), comm.rank, comm.size)), (shape, comm.rank)
        back = rs.all_to_all(np.ascontiguousarray(cols), split_dim=0, concat_dim=1)
        assert np.array_equal(back, rows)
    # the two-level exchange (inside each host, then across) gives the flat exchange's result
    for shape, s, c in [((9, 5), 0, 1), ((4, 6, 3), 2, 0), ((9, 5), 0, 0), ((4, 6, 3), 1, 1)]:
        lengths = [shape[c] + q for q in range(comm.size)]  # uneven along concat_dim
        mine = [*shape[:c], lengths[comm.rank], *shape[c + 1:]]
        x = (np.arange(int(np.prod(mine)), dtype=np.float32) + 1000 * comm.rank).reshape(mine)
        flat = rs.all_to_all(x, s, c, algorithm="flat")
        reorder = ["local"] if s == c else []  # all_to_all_single's form: what arrived put in host order
        two_level = ["local", "all_to_all (inside the host)", *reorder, "all_to_all (across hosts)"]
        for algorithm in ("hierarchical", "auto"):
            two = rs.all_to_all(x, s, c, algorithm=algorithm)
            assert two.shape == flat.shape and np.array_equal(two, flat), (algorithm, shape, comm.rank)
            ran = [step.collective for step in rs.last_exchange().steps]
            # auto: on two hosts of two the model keeps to flat (one message saved, one step more)
            assert ran == (two_level if algorithm == "hierarchical" else ["all_to_all"]), (algorithm, ran)
    # all_to_all_v in two levels: the same rows as flat
    counts = [(comm.rank + d) % 3 * 50 for d in range(comm.size)]
    rows = np.arange(sum(counts) * 8, dtype=np.float32).reshape(-1, 8) + 1000 * comm.rank
    flat_v, got = rs.all_to_all_v(rows, counts, algorithm="flat")
    two_v, got_two = rs.all_to_all_v(rows, counts, algorithm="hierarchical")
    assert np.array_equal(flat_v, two_v) and got == got_two
    # cross-host bytes as the plan counts them, against the link's own counter (this host's end)
    dev = os.environ["GLOO_SOCKET_IFNAME"]
    def sent_on_link():
        with open(f"/sys/class/net/{dev}/statistics/tx_bytes") as f:
            return int(f.read())
    link = {}
    x = np.ones((1024, 1024), dtype=np.float32)  # 4 MiB per rank
    for algorithm in ("flat", "hierarchical"):
        rs.all_to_all(x, 0, 1, algorithm=algorithm)  # planned and connected first
        comm.barrier()
        before = sent_on_link()
        comm.barrier()
        for _ in range(REPEATS):  # several calls: a stray packet of the calls before weighs less
            rs.all_to_all(x, 0, 1, algorithm=algorithm)
        st = rs.last_exchange()
        comm.barrier()
        after = sent_on_link()
        counted = rs.all_gather(np.array([[st.cross_host_bytes_sent, st.cross_host_messages]]), check=False)
        host_bytes = int(counted[[q for q in range(comm.size) if comm.hosts[q] == comm.host], 0].sum())
        link[algorithm] = (host_bytes, (after - before) / REPEATS, st.cross_host_messages)
    # MoE across hosts: each token crosses once per remote host holding one of its experts
    rng = np.random.default_rng(comm.rank)
    tokens = rng.standard_normal((1024, 256)).astype(np.float32)
    ids = np.argsort(rng.random((1024, 8)), axis=1)[:, :2]  # top-2 of 8 experts, 2 per rank
    weights = rng.random((1024, 2)).astype(np.float32)
    moe = {}
    for algorithm in ("flat", "hierarchical", "flat", "hierarchical"):  # the second round counted
        comm.barrier()
        before = sent_on_link()
        comm.barrier()
        inputs, handle = rs.moe.dispatch(tokens, ids, 8, algorithm=algorithm)
        across = rs.last_exchange().cross_host_bytes_sent
        out = rs.moe.combine(inputs * 3, handle, weights)
        across += rs.last_exchange().cross_host_bytes_sent
        comm.barrier()
        after = sent_on_link()
        assert handle.algorithm == algorithm
        counted = rs.all_gather(np.array([[across]]), check=False)
        host_bytes = int(counted[[q for q in range(comm.size) if comm.hosts[q] == comm.host], 0].sum())
        moe[algorithm] = (host_bytes, after - before, inputs, out)
    assert np.array_equal(moe["flat"][2], moe["hierarchical"][2])  # the experts see the same rows
    assert np.allclose(moe["flat"][3], moe["hierarchical"][3], rtol=1e-5, atol=1e-5)
    link["moe"] = tuple((moe[a][0], moe[a][1]) for a in ("flat", "hierarchical"))
    # the check's vote in two levels: through shared memory on each host, one all-reduce among
    # the hosts' lowest ranks; a checked replay still names the rank whose call differs
    assert comm.primitives.board is not None and comm.primitives.board.two_level
    y = np.ones((comm.size * 3, 5), dtype=np.float32)
    for _ in range(3):
        rs.all_to_all(y, 0, 1, check=True)
    assert rs.last_exchange().replayed
    odd = y[:-1] if comm.rank == 3 else y
    try:
        rs.all_to_all(np.ascontiguousarray(odd), 0, 1, check=True)
        raise AssertionError("a different shape on rank 3 went through")
    except rs.ReshardError as exc:
        assert "rank 3" in str(exc), exc
    # the cost model fitted on these two hosts: every number found, none negative, and a
    # positive cost per byte across wherever the large exchange took longer than the small one
    from reshard.bench.calibrate import calibrate_job
    cal = calibrate_job(comm, repeats=2)
    fitted, across = cal["levels"], cal["points_s"]["across"]
    assert all(np.isfinite(v) and v >= 0 for v in fitted.values()), (fitted, cal["points_s"])
    sloped = across[str(16 << 20)] > across[str(64 << 10)]
    assert fitted["beta_link"] > 0 if sloped else fitted["alpha_link"] > 0, (fitted, cal["points_s"])
    local = comm.primitives.local
    mesh = rs.Mesh.from_hosts(comm)
    assert comm.hosts == [0, 0, 1, 1] and comm.host == comm.rank // 2, comm.hosts
    # a sub-communicator numbers its own hosts: one host along "local", two along "host"
    assert mesh.shape == (2, 2) and mesh.sub("local").hosts == [0, 0] and mesh.sub("host").hosts == [0, 1]
    with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as f:
        f.write(" ".join(str(q) for q in sorted(local.peers)) if local else "")
    with open(f"{sys.argv[1]}/link{comm.rank}", "w") as f:
        f.write(repr(link))
    # a rank that ends: every rank, on either host, names it at the next checked call's vote
    for _ in range(2):
        rs.all_to_all(y, 0, 1, check=True)
    comm.barrier()
    if comm.rank == 3:
        os._exit(0)
    try:
        rs.all_to_all(y, 0, 1, check=True)
        outcome = "no error"
    except rs.ReshardError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    with open(f"{sys.argv[1]}/gone{comm.rank}", "w") as f:
        f.write(outcome)
    comm.close()
    """
)


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (the ip command) is not installed"
    probe = f"rsprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    why = _can_make_namespaces()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    hosts = [(f"rsh0{tag}", f"rv0{tag}", "10.213.7.1"), (f"rsh1{tag}", f"rv1{tag}", "10.213.7.2")]
    try:
        for ns, _, _ in hosts:
            _ip("netns", "add", ns)
        _ip("link", "add", hosts[0][1], "type", "veth", "peer", "name", hosts[1][1])
        for ns, dev, addr in hosts:
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _run_on_two_hosts(two_hosts, tmp_path, job: str, *args: str, limit: float = 240) -> tuple[list, bool]:
    """torchrun on each namespace (two ranks per host) runs ``job`` with ``tmp_path`` and
    ``args``; returns the agents, finished or killed (their whole groups), and whether the
    limit was reached. Each node's output goes to ``node<i>.log``."""
    script = tmp_path / "job.py"
    script.write_text(job)
    master = two_hosts[0][2]
    procs = []
    for node, (ns, dev, _) in enumerate(two_hosts):
        env = dict(os.environ, GLOO_SOCKET_IFNAME=dev, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))  # torchrun's files too
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node-rank", str(node), "--nproc-per-node", "2", "--master-addr", master, "--master-port", "29533",
               str(script), str(tmp_path), *args]
        log = open(tmp_path / f"node{node}.log", "w")  # a file, not a pipe: nothing blocks on a full pipe
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    deadline = time.monotonic() + limit
    timed_out = False
    try:
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        for p in procs:  # the whole group: torchrun's ranks must not outlive a failed run
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return procs, timed_out


def test_row_to_column_exchange_across_two_hosts(two_hosts, tmp_path):
    procs, timed_out = _run_on_two_hosts(two_hosts, tmp_path, JOB)
    # every node's output, in order, whatever happened: a hang names who was waiting for whom
    outputs = [f"--- node {i} (exit {p.returncode}) ---\n{(tmp_path / f'node{i}.log').read_text()}" for i, p in enumerate(procs)]
    assert not timed_out and all(p.returncode == 0 for p in procs), "\n".join(outputs)
    assert sorted(f.name for f in tmp_path.glob("rank*")) == [f"rank{r}" for r in range(4)], "\n".join(outputs)
    # shared memory joins the two ranks of each host (comm.hosts agrees), never ranks of different hosts
    peers = {r: (tmp_path / f"rank{r}").read_text() for r in range(4)}
    assert peers == {0: "1", 1: "0", 2: "3", 3: "2"}, peers

    # rank 3 ended: its host's lowest rank saw it, and the other host learned its name through
    # the leaders' all-reduce of the vote
    for r in range(3):
        outcome = (tmp_path / f"gone{r}").read_text()
        assert outcome.startswith("RankFailed") and "rank 3 gone" in outcome, (r, outcome)

    # each host's ranks counted what they sent across: the veth's own counter carries that and
    # its framing, at most 8% more (TCP/IP headers are up to 66 bytes per 1,448 of payload at the
    # veth's 1,500-byte MTU, 4.6%, where the kernel does not merge segments; gloo's framing and the
    # checks' small messages add a little); the two-level form sends one message per remote host
    def carried(on_link, counted):
        return -0.01 < on_link / counted - 1 < 0.08

    for r in range(4):
        link = ast.literal_eval((tmp_path / f"link{r}").read_text())
        # MoE top-2: the two-level path counts fewer bytes across, and the link agrees
        (flat_counted, flat_link), (two_counted, two_link) = link.pop("moe")
        assert carried(flat_link, flat_counted) and carried(two_link, two_counted), link
        assert two_counted < 0.9 * flat_counted, (two_counted, flat_counted)
        for algorithm, (planned, on_link, messages) in link.items():
            assert planned == 2 * 2 * (1 << 20), (r, algorithm, planned)  # 2 ranks x 2 remote peers x 1 MiB
            assert carried(on_link, planned), (r, algorithm, planned, on_link)
            assert messages == (2 if algorithm == "flat" else 1), (r, algorithm, messages)


SILENT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import reshard as rs

    comm = rs.init(timeout=8)
    assert comm.primitives.board is not None and comm.primitives.board.two_level
    x = np.zeros((comm.size, 2))
    rs.all_to_all(x, 0, 1)
    rs.all_to_all(x, 0, 1, check=True)  # the plan with its records: the next call votes
    who, how = int(sys.argv[2]), sys.argv[3]
    start = time.monotonic()
    if comm.rank == who:
        if how == "returns":
            comm.close()
            sys.exit(0)
        time.sleep(12)  # past the others' limit for naming it (the timeout and 2 s)
        said = "slept"
    else:
        try:
            rs.all_to_all(x, 0, 1, check=True)
            said = "no error"
        except rs.ReshardError as exc:
            said = f"{type(exc).__name__}: {exc}"
    with open(f"{sys.argv[1]}/rank{comm.rank}", "w") as f:
        f.write(f"{time.monotonic() - start:.2f} {said}")
    comm.close()
    """
)


@pytest.mark.parametrize(("who", "how"), [(3, "sleeps"), (3, "returns"), (2, "sleeps")])
def test_a_rank_that_never_votes_is_named_on_every_host(two_hosts, tmp_path, who, how):
    # hosts (0, 1) and (2, 3); rank 2 is the second host's lowest, which gathers its host's votes
    # and takes the all-reduce among the hosts' lowest ranks. Rank ``who`` never reaches the call:
    # it sleeps past the timeout (8 s) or returns, closing its communicator
    procs, timed_out = _run_on_two_hosts(two_hosts, tmp_path, SILENT, str(who), how, limit=120)
    logs = "\n".join((tmp_path / f"node{i}.log").read_text() for i in range(2))
    assert not timed_out, logs
    said = {r: (tmp_path / f"rank{r}").read_text().split(" ", 1) for r in range(4) if r != who}
    assert len(said) == 3, logs
    for r, (seconds, text) in said.items():
        if how == "returns":  # seen at once through its board, and told to the other host
            assert text.startswith("RankFailed") and f"rank {who} " in text, (r, text)
            assert float(seconds) < 3, (r, seconds, text)
        elif r == 3 or who == 3:  # named by its host's ranks, and by the other host's through the leaders
            assert text.startswith("CommTimeout") and (f"rank {who} " in text), (r, text)
            assert float(seconds) < 8 + 2, (r, seconds, text)
        else:  # the first host: its lowest rank's all-reduce with rank 2 ran out of time
            assert text.startswith("CommTimeout") and "lowest ranks (0, 2) ran out of time" in text, (r, text)
            assert "rank 2 never reached this collective" in text and "gloo" not in text, (r, text)
