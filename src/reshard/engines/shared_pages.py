"""How memory shared between same-host ranks is mapped: asking for transparent huge pages.

A memory file's 4 KiB pages each need a TLB entry; on a virtual machine a miss walks two page
tables, and a 16 MiB copy into shared memory that sat idle for 0.2-2 s took 3-9 ms against
about 2 ms in ordinary memory (numpy's large arrays get huge pages). With huge pages allowed
for shared memory (``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` set to ``advise``, by
root) and asked for on the mapping (``MADV_HUGEPAGE``), it took 1.8-2.2 ms idle or not. Where
the kernel does not allow them (``never``, the default on most kernels) the advice does nothing.
"""

from __future__ import annotations

import mmap
from pathlib import Path

_THP = Path("/sys/kernel/mm/transparent_hugepage")
_ALLOWING = ("always", "within_size", "advise", "force")


def map_file(fd: int, length: int, writable: bool) -> mmap.mmap:
    """``length`` bytes of the memory file ``fd``, shared, read-only unless ``writable``, with
    huge pages asked for (``MADV_HUGEPAGE``) where the system offers the advice."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    area = mmap.mmap(fd, length, mmap.MAP_SHARED, prot)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            area.madvise(advice)
        except OSError:  # a kernel without transparent huge pages: 4 KiB pages, as without the advice
            pass
    return area


def _selected(path: Path) -> str | None:
    """The bracketed choice of a sysfs setting such as ``always [never] advise``, or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def huge_pages_allowed() -> tuple[bool, str]:
    """Whether shared memory asked for huge pages gets 2 MiB pages here, and the setting that
    says so (the 2 MiB size's own ``shmem_enabled`` where it does not inherit the global one)."""
    global_choice = _selected(_THP / "shmem_enabled")
    if global_choice is None:
        return False, "this kernel has no transparent huge pages for shared memory"
    size_choice = _selected(_THP / "hugepages-2048kB" / "shmem_enabled")
    if size_choice not in (None, "inherit") and global_choice not in ("deny", "force"):
        return size_choice in _ALLOWING, f"hugepages-2048kB/shmem_enabled is {size_choice}"
    return global_choice in _ALLOWING, f"shmem_enabled is {global_choice}"
