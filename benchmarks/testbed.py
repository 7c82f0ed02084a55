"""Two "hosts" on this machine: two network namespaces joined by a veth pair, each with its own
address, the link optionally shaped with ``tc ... tbf`` on both ends, and a job started by
torchrun in each namespace as it would be on two machines. Needs root and iproute2 (``tc``).

    with two_hosts(rate="200mbit") as hosts:
        outputs = run_torchrun(hosts, "job.py", ["arg"], ranks_per_host=2, timeout=600)

Everything made is removed on the way out (the namespaces take the veth pair with them), and
every process started is killed with its group if it overruns.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUBNET = "10.213.9"


@dataclass(frozen=True)
class Host:
    namespace: str
    device: str  # its end of the veth pair
    address: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def link_bytes(host: Host) -> tuple[int, int]:
    """(received, sent) bytes on the host's end of the link, from the interface's own counters."""
    stats = f"/sys/class/net/{host.device}/statistics"
    read = subprocess.run(["ip", "netns", "exec", host.namespace, "cat", f"{stats}/rx_bytes", f"{stats}/tx_bytes"],
                          check=True, capture_output=True, text=True).stdout.split()
    return int(read[0]), int(read[1])


@contextlib.contextmanager
def two_hosts(rate: str | None = None, burst: str = "64kb", latency: str = "50ms") -> Iterator[list[Host]]:
    """Two namespaces and the veth between them; ``rate`` (e.g. "200mbit") shapes each end's
    sending with a token bucket. Removed on exit."""
    tag = uuid.uuid4().hex[:6]
    hosts = [Host(f"rsb0{tag}", f"rb0{tag}", f"{SUBNET}.1"), Host(f"rsb1{tag}", f"rb1{tag}", f"{SUBNET}.2")]
    try:
        for h in hosts:
            _ip("netns", "add", h.namespace)
        _ip("link", "add", hosts[0].device, "type", "veth", "peer", "name", hosts[1].device)
        for h in hosts:
            _ip("link", "set", h.device, "netns", h.namespace)
            _ip("-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", h.device)
            _ip("-n", h.namespace, "link", "set", h.device, "up")
            _ip("-n", h.namespace, "link", "set", "lo", "up")
            if rate:
                subprocess.run(["ip", "netns", "exec", h.namespace, "tc", "qdisc", "add", "dev", h.device, "root", "tbf",
                                "rate", rate, "burst", burst, "latency", latency], check=True, capture_output=True)
        yield hosts
    finally:
        for h in hosts:
            subprocess.run(["ip", "netns", "del", h.namespace], capture_output=True)


def run_torchrun(hosts: Sequence[Host], script: str, args: Sequence[str], ranks_per_host: int = 2,
                 timeout: float = 600, port: int = 29541) -> list[str]:
    """``script args`` under torchrun on every host (host 0 holds the rendezvous); each host's
    output. Raises RuntimeError with every host's output if any fails or overruns."""
    procs, logs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for node, h in enumerate(hosts):
            env = dict(os.environ, GLOO_SOCKET_IFNAME=h.device, OMP_NUM_THREADS="1", TMPDIR=tmp)
            cmd = ["ip", "netns", "exec", h.namespace, sys.executable, "-m", "torch.distributed.run",
                   "--nnodes", str(len(hosts)), "--node-rank", str(node), "--nproc-per-node", str(ranks_per_host),
                   "--master-addr", hosts[0].address, "--master-port", str(port), script, *args]
            log = open(os.path.join(tmp, f"node{node}.log"), "w")  # a file: nothing blocks on a full pipe
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            logs.append(log.name)
            log.close()
        deadline = time.monotonic() + timeout
        overran = False
        try:
            for p in procs:
                try:
                    p.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    overran = True
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        outputs = [Path(name).read_text() for name in logs]
    if overran or any(p.returncode for p in procs):
        raise RuntimeError("\n".join(f"--- host {i} (exit {p.returncode}) ---\n{out}"
                                     for i, (p, out) in enumerate(zip(procs, outputs))))
    return outputs


def run_job(job_source: str, args: Sequence[str], rate: str | None, timeout: float = 3000,
            ranks_per_host: int = 2) -> Any:
    """``job_source`` (a script whose rank 0 writes JSON to the path in ``sys.argv[1]``) under
    torchrun on two hosts of ``ranks_per_host`` ranks, the link shaped to ``rate``; what it
    wrote. A SIGTERM still removes the namespaces (it becomes SystemExit)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory() as tmp:
        script, out = os.path.join(tmp, "job.py"), os.path.join(tmp, "result.json")
        with open(script, "w") as f:
            f.write(job_source)
        with two_hosts(rate) as hosts:
            run_torchrun(hosts, script, [out, *args], ranks_per_host=ranks_per_host, timeout=timeout)
        with open(out) as f:
            return json.load(f)
