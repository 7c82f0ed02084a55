"""How shared memory between same-host ranks is mapped (engines/shared_pages.py): huge pages
asked for on every mapping, and the kernel's setting for them read as the kernel means it."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from reshard.engines import shared_pages
from reshard.engines.arena import Arena
from reshard.engines.shared_pages import huge_pages_allowed, map_file

THP = Path("/sys/kernel/mm/transparent_hugepage")
needs_thp = pytest.mark.skipif(not (THP / "shmem_enabled").exists() or not hasattr(mmap, "MADV_HUGEPAGE"),
                               reason="this kernel has no transparent huge pages for shared memory")


def smaps_entry(address: int) -> dict[str, str]:
    """The fields of this process's mapping that holds ``address`` (from /proc/self/smaps)."""
    entry: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(v, 16) for v in head.split("-"))
            inside = start <= address < end
        elif inside:
            key, _, value = line.partition(":")
            entry[key] = value.strip()
    return entry


@needs_thp
def test_shared_mappings_ask_for_huge_pages():
    fd = os.memfd_create("test-pages", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 8 << 20)
        for writable in (True, False):
            area = map_file(fd, 8 << 20, writable)
            address = np.frombuffer(area, dtype=np.uint8).ctypes.data
            assert "hg" in smaps_entry(address)["VmFlags"].split(), f"writable={writable}"
    finally:
        os.close(fd)


@needs_thp
def test_the_arena_asks_for_huge_pages():
    arena = Arena(cap=8 << 20)
    try:
        assert "hg" in smaps_entry(arena.base)["VmFlags"].split()
    finally:
        arena.map.close()
        os.close(arena.fd)


@needs_thp
def test_huge_pages_are_reported_as_the_kernel_gives_them():
    fd = os.memfd_create("test-pages", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, 16 << 20)
        area = map_file(fd, 16 << 20, writable=True)
        pages = np.frombuffer(area, dtype=np.uint8)
        pages[:] = 1
        got_huge = smaps_entry(pages.ctypes.data).get("ShmemPmdMapped", "0 kB") != "0 kB"
        assert got_huge == huge_pages_allowed()[0]
    finally:
        del pages
        area.close()
        os.close(fd)


@pytest.mark.parametrize(("global_choice", "size_choice", "allowed", "named"), [
    ("never", "inherit", False, "shmem_enabled is never"),
    ("advise", "inherit", True, "shmem_enabled is advise"),
    ("never", "advise", True, "hugepages-2048kB/shmem_enabled is advise"),
    ("always", "never", False, "hugepages-2048kB/shmem_enabled is never"),
    ("deny", "always", False, "shmem_enabled is deny"),
    ("force", "never", True, "shmem_enabled is force"),
])
def test_the_kernel_setting_is_read_from_its_bracketed_choice(tmp_path, monkeypatch, global_choice, size_choice,
                                                              allowed, named):
    choices = ["always", "within_size", "advise", "never", "deny", "force"]
    (tmp_path / "shmem_enabled").write_text(" ".join(f"[{c}]" if c == global_choice else c for c in choices) + "\n")
    (tmp_path / "hugepages-2048kB").mkdir()
    (tmp_path / "hugepages-2048kB" / "shmem_enabled").write_text(
        " ".join(f"[{c}]" if c == size_choice else c for c in ["always", "inherit", "within_size", "advise", "never"]))
    monkeypatch.setattr(shared_pages, "_THP", tmp_path)
    assert huge_pages_allowed() == (allowed, named)


def test_a_kernel_without_the_setting_has_no_huge_pages(tmp_path, monkeypatch):
    monkeypatch.setattr(shared_pages, "_THP", tmp_path / "absent")
    assert huge_pages_allowed() == (False, "this kernel has no transparent huge pages for shared memory")
