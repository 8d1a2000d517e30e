"""The weighted LRU cache that planned streams, their noise and the wire server's answers share."""

from __future__ import annotations

import threading

from dpsql.lru import WeightedLru


def test_drops_the_least_recently_used_once_the_weights_pass_the_limit() -> None:
    cache = WeightedLru(10)
    for key in "abc":
        cache.put(key, key.upper(), 4)
    assert cache.get("a") is None and cache.get("b") == "B" and cache.total == 8
    cache.put("d", "D", 4)  # b was read last: c goes
    assert cache.get("c") is None and cache.get("b") == "B" and cache.get("d") == "D"


def test_a_key_put_again_replaces_its_value_and_weight() -> None:
    cache = WeightedLru(10)
    cache.put("a", 1, 6)
    cache.put("a", 2, 3)
    assert cache.get("a") == 2 and cache.total == 3


def test_too_heavy_values_are_not_kept_but_the_newest_always_stays() -> None:
    cache = WeightedLru(10, largest=5)
    cache.put("big", 1, 6)
    assert cache.get("big") is None and cache.total == 0
    whole = WeightedLru(10)
    whole.put("a", 1, 3)
    whole.put("b", 2, 10)  # alone it fills the limit: the rest goes, it stays
    assert whole.get("a") is None and whole.get("b") == 2 and whole.total == 10


def test_threads_share_one_cache_without_losing_count() -> None:
    cache = WeightedLru(1_000_000)

    def fill(offset: int) -> None:
        for i in range(2_000):
            cache.put((offset, i), i, 1)

    threads = [threading.Thread(target=fill, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.total == 8_000 and cache.get((3, 1_999)) == 1_999
