"""The page cache (`logsync/server/pagecache.py`), paths the other tests leave open, each
checked by planting the defect it names: what a read logs in its arguments counts toward
the bound, and our chain at `after` is replayed even when no op or signature changed."""

from __future__ import annotations

import itertools
from pathlib import Path

import anyio

from logsync import responder
from logsync.server import create_app
from logsync.server.pagecache import PageCache, ReadLog, page_key
from logsync.store import Store
from tests.test_pagecache import TOKEN, author, relay, served
from tests.test_pagecache_paths import _deep


def test_the_ids_a_page_looked_up_count_toward_the_bound(tmp_path: Path) -> None:
    """4 ops naming 256 held artifacts each (ids of 128 characters), none inline (over
    the inline cap): the read log keeps the 1 024 ids it asked about (~190 B each in
    memory, ~130 B each in the answer), counted as one item (256 B) in all."""
    counter = itertools.count()

    def new_id(prefix: str) -> str:
        return f"{prefix}_{next(counter):08d}_" + "x" * 115

    with Store.open(tmp_path / "s", new_id=new_id) as store:
        for e in range(4):
            ids = [store.put_artifact("note", f"c{e}-{a}", "alice")["id"] for a in range(256)]
            store.append_event("note", "main", "lobby", "alice", body="b", artifact_ids=ids)
        params = {"origin": store.replica_id, "after": "0", "ext": "inline_artifacts"}
        log = ReadLog(store)
        status, body = responder.answer(log, "/sync/ops", params,
                                        profile=responder.Profile(inline_artifact_bytes=1))
        assert status == 200 and len(body["events"]) == 4 and body["artifacts"] == []
        data = responder.json_bytes(body)
        cache = PageCache(64 << 20)
        key = page_key("json", params)
        cache.put(store, key, log, data, "json")
        entry = cache._entries[key]
        held = _deep(key) + _deep(entry.reads) + len(entry.data)
        assert held <= cache.bytes_held, (held, cache.bytes_held)


def test_a_page_above_our_top_gets_our_chain_once_we_reach_its_after(tmp_path: Path) -> None:
    """`after=10` of an origin we hold up to 5: no ops, and `prev` null (our chain ends
    below 10). Once we hold 6..10 there are still no ops above 10, no signature at the
    page's seqs, only `prev` differs. Planted defect: `replays` not re-reading
    `chain_digests_at` -> the kept `prev: null` is served (tests/test_pagecache.py
    passes)."""
    with Store.open(tmp_path / "server") as server, Store.open(tmp_path / "other") as other:
        author(other, 10)
        relay(server, other, 5)
        cached = create_app(server, token=TOKEN)
        bare = create_app(server, token=TOKEN, op_cache_bytes=0, page_cache_bytes=0)
        params = {"origin": other.replica_id, "after": 10, "limit": 5, "ext": "chain"}
        first = anyio.run(served, [cached], params, False)[0]
        assert b'"prev": null' in first[2]
        relay(server, other, 5)
        fresh, kept = anyio.run(served, [bare, cached], params, False)
        assert b'"prev": null' not in fresh[2]
        assert kept == fresh


class _NoKeys:
    """A store that reads ops but cannot replay them (no `op_keys`: a fake peer's)."""

    def list_ops(self, *args: object, **kw: object) -> list[dict]:
        return [{"origin_seq": 1, "seq": 1}]


def test_a_store_that_cannot_replay_its_reads_keeps_nothing() -> None:
    """Planted defect: `put` without its check of the replaying reads -> the entry is
    kept, and the next ask of it raises AttributeError out of `answer` (a 500)."""
    log = ReadLog(_NoKeys())
    log.list_ops("rep_a", 0, 5)
    assert log.replayable
    cache = PageCache(1 << 20)
    key = page_key("json", {})
    cache.put(_NoKeys(), key, log, b"{}", "json")
    assert len(cache) == 0 and cache.answer(_NoKeys(), key) is None
