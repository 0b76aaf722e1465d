"""The server caches' bounded memory (`server/lru.py`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from logsync.server.lru import BoundedLRU


@given(st.lists(st.tuples(st.integers(0, 20), st.binary(max_size=40)), max_size=200),
       st.integers(0, 200))
def test_held_bytes_never_pass_the_bound_and_the_newest_fit_stays(puts, bound) -> None:
    cache: BoundedLRU[bytes] = BoundedLRU(bound, len, 2)
    store = object()
    for key, data in puts:
        cache.keep(store, key, data)
        assert cache.bytes_held == sum(len(cache.peek(store, k) or b"") for k in range(21))
        assert cache.bytes_held <= max(bound, 0)
        if bound > 0 and len(data) <= bound // 2:
            assert cache.peek(store, key) == data  # just kept: never the one evicted


def test_another_store_forgets_and_lookups_are_counted() -> None:
    cache: BoundedLRU[bytes] = BoundedLRU(100, len, 1)
    first, second = object(), object()
    cache.keep(first, "k", b"x")
    cache.used("k", cache.peek(first, "k"))
    assert cache.peek(second, "k") is None and len(cache) == 0 and cache.bytes_held == 0
    cache.used("k", None)
    assert (cache.hits, cache.misses) == (1, 1)
    cache.keep(second, "k", b"yy")
    cache.drop("k", b"other")  # not the held entry: kept
    assert cache.peek(second, "k") == b"yy"
