"""The API key cache of an API process: bounded, each entry for a while (no I/O)."""

from __future__ import annotations

from app.services.owners import _Recent


def test_entries_expire_and_the_least_recently_used_leave_past_the_size():
    cache = _Recent(3)
    for key in "abc":
        cache.put(key, key.upper(), until=10.0)
    assert cache.get("a", now=1.0) == "A"  # a is now the most recently used
    cache.put("d", "D", until=10.0)
    assert cache.get("b", now=1.0) is None and len(cache) == 3  # b was the least recent
    assert [cache.get(k, now=1.0) for k in "acd"] == ["A", "C", "D"]
    assert cache.get("a", now=10.0) is None and len(cache) == 2  # expired: dropped


def test_a_flood_of_keys_keeps_the_cache_at_its_size():
    cache = _Recent(100)
    for n in range(10_000):
        cache.put(f"made-up-{n}", True, until=10.0)
    assert len(cache) == 100 and cache.get("made-up-9999", now=1.0) is True
