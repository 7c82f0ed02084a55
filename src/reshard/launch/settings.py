"""The process settings that every way of starting local ranks shares."""

from __future__ import annotations

ENGINES = ("gloo", "nccl", "mpi")

# After one rank fails, how long the others get to report (their own errors are often the
# more telling ones) before they are stopped.
FAILURE_GRACE_S = 5.0

# glibc hands big freed blocks back to the OS at once (munmap), so every call's fresh result
# buffer page-faults again: a new 16 MiB buffer cost 6 ms of faults against 1 ms to fill it
# (measured, 2 cores). Ranks that rs.spawn starts keep freed memory mapped instead (mallopt,
# or these variables for MPI ranks); a process you start yourself keeps its own settings.
# The top pad is for torch: it allocates with posix_memalign, whose request is a little larger
# than the block it freed, so without slack at the top of the heap a repeated 64 MiB
# allocation grew the heap into fresh pages every time (16,384 faults, 26 ms; with the pad,
# 0 faults and 1.9 ms in a plain process). Inside ranks the pad did not always suffice, so
# reshard's own large results come from numpy (arrays.TorchArrays.empty); the pad still helps
# the torch code around them.
KEEP_FREED_BYTES = 1 << 30
TOP_PAD_BYTES = 16 << 20
MALLOC_KEEP = {
    "MALLOC_MMAP_THRESHOLD_": str(KEEP_FREED_BYTES),
    "MALLOC_TRIM_THRESHOLD_": str(KEEP_FREED_BYTES),
    "MALLOC_TOP_PAD_": str(TOP_PAD_BYTES),
}
