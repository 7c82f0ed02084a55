"""The communicator's replay cache stays bounded: in count, and in the bytes of the records its
plans keep; when full it starts over rather than growing."""

from __future__ import annotations

from reshard.execution.replay_cache import ReplayCache


def test_the_cache_keeps_plans_until_full_then_starts_over():
    cache = ReplayCache(max_plans=5, max_bytes=1 << 30)
    for i in range(5):
        cache.put(("sig", i), f"plan {i}", 100)
    assert len(cache) == 5 and cache.get(("sig", 3)) == "plan 3"
    cache.put(("sig", 5), "plan 5", 100)
    assert len(cache) == 1 and cache.get(("sig", 3)) is None and cache.get(("sig", 5)) == "plan 5"


def test_large_records_lower_the_count_but_never_below_four():
    cache = ReplayCache(max_plans=256, max_bytes=1000)
    for i in range(4):
        cache.put(i, i, 400)  # 1000 // 400 = 2 plans' worth, but four are always kept
    assert len(cache) == 4
    cache.put(4, 4, 400)
    assert len(cache) == 1 and cache.get(4) == 4
    cache.clear()
    assert len(cache) == 0 and cache.get(4) is None
