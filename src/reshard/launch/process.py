"""What every way of starting local ranks sets in their processes: the failure grace, and
memory that stays mapped between calls (the library's own settings are ``reshard.settings``)."""

from __future__ import annotations

# After one rank fails, how long the others get to report (their own errors are often the
# more telling ones) before they are stopped.
FAILURE_GRACE_S = 5.0

# glibc hands big freed blocks back to the OS at once, so every call's fresh result would
# page-fault again: ranks that rs.spawn starts keep freed memory mapped (mallopt, or these
# variables for MPI ranks), with a top pad for torch's slightly larger re-allocations
# (docs/performance.md, "Memory"). A process you start yourself keeps its own settings.
KEEP_FREED_BYTES = 1 << 30
TOP_PAD_BYTES = 16 << 20
MALLOC_KEEP = {
    "MALLOC_MMAP_THRESHOLD_": str(KEEP_FREED_BYTES),
    "MALLOC_TRIM_THRESHOLD_": str(KEEP_FREED_BYTES),
    "MALLOC_TOP_PAD_": str(TOP_PAD_BYTES),
}

