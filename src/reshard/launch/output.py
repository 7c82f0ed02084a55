"""The ranks' output as ``rs.spawn`` passes it on: whole lines, each headed ``[rank N]``.

Bytes arrive in pieces of any size from each rank's stdout and stderr; a line is written out
only once its end has arrived (or the rank is done), so two ranks never share a line. The
prefix goes when ``RESHARD_RANK_PREFIX=0``. Each rank's last stderr bytes are kept for the
report of a rank that dies.
"""

from __future__ import annotations

import sys
from typing import TextIO

from .. import settings

STDERR_TAIL_BYTES = 4096  # what the report keeps of a rank's stderr


class RankOutput:
    """Per rank and stream, the bytes of an unfinished line; whole lines go out prefixed."""

    def __init__(self, size: int, prefix: bool | None = None):
        self.prefix = settings.read("RESHARD_RANK_PREFIX") if prefix is None else prefix
        self.partial: dict[tuple[int, str], bytes] = {}
        self.stderr_tail: dict[int, bytes] = {r: b"" for r in range(size)}

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        """``data`` that rank ``rank`` wrote to ``stream`` ("stdout" or "stderr")."""
        if not data:
            return
        if stream == "stderr":
            self.stderr_tail[rank] = (self.stderr_tail[rank] + data)[-STDERR_TAIL_BYTES:]
        text = self.partial.pop((rank, stream), b"") + data
        whole, _, rest = text.rpartition(b"\n")
        if rest:
            self.partial[(rank, stream)] = rest
        if whole or text.endswith(b"\n"):
            self._write(rank, stream, whole + b"\n")

    def flush(self) -> None:
        """Everything still held: the unfinished last lines, each ended."""
        for (rank, stream), rest in sorted(self.partial.items()):
            self._write(rank, stream, rest + b"\n")
        self.partial.clear()

    def _write(self, rank: int, stream: str, lines: bytes) -> None:
        out: TextIO = sys.stdout if stream == "stdout" else sys.stderr
        text = lines.decode(errors="replace")
        if self.prefix:
            head = f"[rank {rank}] "
            text = "".join(head + line for line in text.splitlines(keepends=True))
        out.write(text)
        out.flush()
