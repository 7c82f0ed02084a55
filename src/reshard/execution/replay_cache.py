"""The plans a communicator keeps for replay: call signature -> what that call's first run
worked out (``call.CachedRun``). Bounded in count and in the bytes of the records kept, so a
long run over many shapes starts over instead of growing."""

from __future__ import annotations

from typing import Any

PLANS_MAX = 256  # signatures kept per communicator
PLANS_BYTES = 64 << 20  # records kept (N records of about N ints each per plan)
HOT_PER_OP = 4  # hot replays kept per op: a loop may alternate a few signatures (forward, backward)


class ReplayCache:
    """A bounded mapping of call signatures to their plans, owned by one communicator."""

    def __init__(self, max_plans: int = PLANS_MAX, max_bytes: int = PLANS_BYTES) -> None:
        self.max_plans, self.max_bytes = max_plans, max_bytes
        self._plans: dict[tuple, Any] = {}
        self.hot: dict[str, list] = {}  # op -> its last unchecked replays, newest first (hot_replay.HotReplay)
        self.hot_checked: dict[str, list] = {}  # op -> its last checked replays, likewise
        self.votes: tuple[str, Any] | None = None  # (op, votes) a checked hot replay cast and did not run on

    def take_votes(self, op: str) -> Any:
        """The votes a checked hot replay of ``op`` cast just before this call's ``Call`` (None)."""
        votes, self.votes = self.votes, None
        return votes[1] if votes is not None and votes[0] == op else None

    def get(self, key: tuple) -> Any:
        return self._plans.get(key)

    def put(self, key: tuple, plan: Any, record_bytes: int) -> None:
        """Keep ``plan``; when full (in count, or in records of ``record_bytes`` each), start over."""
        if len(self._plans) >= max(4, min(self.max_plans, self.max_bytes // max(1, record_bytes))):
            self.clear()
        self._plans[key] = plan

    def put_for(self, op: str, key: tuple, plan: Any, record_bytes: int) -> None:
        """``put``, for a plan of ``op``: its checked hot replays go, as one may hold the plan
        this one replaces (they are kept by arguments, not by signature)."""
        self.put(key, plan, record_bytes)
        self.hot_checked.pop(op, None)

    def keep_hot(self, op: str, hot: Any, checked: bool = False) -> None:
        """``hot`` first among ``op``'s hot replays; the oldest beyond ``HOT_PER_OP`` dropped."""
        kept = (self.hot_checked if checked else self.hot).setdefault(op, [])
        kept.insert(0, hot)
        del kept[HOT_PER_OP:]

    def clear(self) -> None:
        self._plans.clear()
        self.hot.clear()
        self.hot_checked.clear()

    def __len__(self) -> int:
        return len(self._plans)
