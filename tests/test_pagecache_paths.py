"""The page cache's bounds (its key and read log count, a dropped entry gives its bytes
back, least recently used goes first), `overlap.bulk_settings` leaving automatic GC off,
and paths the first tests leave open; each checked by planting the defect it names."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from logsync.overlap import bulk_settings
from logsync.server.pagecache import PageCache, ReadLog, page_key
from logsync.store import Store


def _deep(obj: object, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep(k, seen) + _deep(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(_deep(x, seen) for x in obj)
    return size


@pytest.mark.parametrize(("pad", "entries"), [("x" * 12_000, 200), ("😀" * 3000, 100)])
def test_the_query_a_client_sends_counts_toward_the_bound(tmp_path: Path, pad: str,
                                                          entries: int) -> None:
    """The key is every query parameter, unknown ones too (`page_key`), and is held as
    Python strs (4 bytes a character outside the BMP): a client padding its query
    (`&pad=<12 KB>` or `&pad=😀...`, distinct each time) for an empty page must not hold
    more than the bound."""
    with Store.open(tmp_path / "s") as store:
        cache = PageCache(64 * 1024)
        for n in range(entries):
            log = ReadLog(store)
            log.list_ops(store.replica_id, 0, 5)
            params = {"origin": store.replica_id, "after": "0", "pad": pad + str(n)}
            cache.put(store, page_key("json", params), log, b'{"events": []}', "json")
        held = sum(_deep(key) + _deep(entry.reads) + len(entry.data)
                   for key, entry in cache._entries.items())
        assert held <= cache.max_bytes, (held, cache.bytes_held, cache.max_bytes)


def test_a_pages_read_log_counts_toward_the_bound(tmp_path: Path) -> None:
    """A page of 3 000 ops logs 3 000 `(origin_seq, seq)` keys (~120 B each, about a
    quarter of the page's own bytes for short ops), counted as ENTRY_OVERHEAD = 1 KiB."""
    with Store.open(tmp_path / "s") as store:
        for n in range(3000):
            store.append_event("note", "main", "lobby", "alice", body=f"b{n}")
        log = ReadLog(store)
        ops = log.list_ops(store.replica_id, 0, 3000, max_limit=3000)
        cache = PageCache(64 << 20)
        data = b"x" * (300 * len(ops))
        cache.put(store, page_key("json", {}), log, data, "json")
        entry = next(iter(cache._entries.values()))
        assert cache.bytes_held >= len(data) + _deep(entry.reads), (
            cache.bytes_held, len(data), _deep(entry.reads))


def test_a_process_that_turned_automatic_gc_off_keeps_it_off() -> None:
    """`gc.set_threshold(0)` turns automatic collection off; `max(0, 100_000)` turns it
    back on for the round (and a collection runs under the writer)."""
    before = gc.get_threshold()
    gc.set_threshold(0, before[1], before[2])
    try:
        with bulk_settings():
            assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)


# ── paths the first tests leave open ──

import anyio  # noqa: E402

from logsync.server import create_app  # noqa: E402
from tests.test_pagecache import TOKEN, author, served  # noqa: E402


def test_the_same_page_asked_in_another_encoding_is_not_the_kept_one(tmp_path: Path) -> None:
    """Planting `page_key` without the encoding (JSON bytes answered to a msgpack ask)
    passed tests/test_pagecache.py: its hypothesis test rarely asks one page both ways
    with no change in between."""
    with Store.open(tmp_path / "s") as store:
        author(store, 5)
        app = create_app(store, token=TOKEN)
        params = {"origin": store.replica_id, "after": 0, "limit": 5, "ext": "chain"}
        as_json = anyio.run(served, [app], params, False)[0]
        as_msgpack = anyio.run(served, [app], params, True)[0]
        assert as_json[1].startswith("application/json")
        assert as_msgpack[1].startswith("application/msgpack")
        assert anyio.run(served, [app], params, False)[0] == as_json



def test_a_dropped_entry_gives_its_bytes_back() -> None:
    """Planting `drop` without `_bytes -= size` passed tests/test_lru.py and
    tests/test_pagecache.py (every stale page would then shrink the cache for good)."""
    from logsync.server.lru import BoundedLRU

    cache: BoundedLRU[bytes] = BoundedLRU(100, len, 1)
    store = object()
    cache.keep(store, "k", b"x" * 10)
    cache.drop("k", cache.peek(store, "k"))
    assert len(cache) == 0 and cache.bytes_held == 0


def test_a_used_entry_outlives_one_kept_before_it() -> None:
    """Planting `used` without `move_to_end` (FIFO, not LRU) passed the merged tests."""
    from logsync.server.lru import BoundedLRU

    cache: BoundedLRU[bytes] = BoundedLRU(30, len, 1)
    store = object()
    cache.keep(store, "a", b"x" * 10)
    cache.keep(store, "b", b"x" * 10)
    cache.used("a", cache.peek(store, "a"))
    cache.keep(store, "c", b"x" * 15)  # evicts the least recently used: b
    assert cache.peek(store, "a") is not None and cache.peek(store, "b") is None


def test_a_fresh_page_without_artifacts_goes_the_fast_path(tmp_path: Path) -> None:
    """`fastpage.fresh` now answers `{}` for a fresh page naming no artifact; planting
    `if not validated:` in `apply_prepared` (every artifact-less page judged op by op)
    passed tests/test_fastpage.py, whose fresh pages all carry artifacts."""
    from unittest import mock

    from logsync.store import apply as apply_mod

    with Store.open(tmp_path / "server") as server, Store.open(tmp_path / "other") as other:
        author(other, 20)
        ops = other.list_ops(other.replica_id, 0, 20)
        assert not any(op["artifact_ids"] for op in ops)
        with mock.patch.object(apply_mod._Applier, "apply_origin",
                               side_effect=AssertionError("judged op by op")):
            assert server.apply_remote(ops, []).applied == 20
