"""The page cache's bound against what a read logs in its arguments: a page whose ops
name many held artifacts logs every id it looked up (`missing_artifacts`'s argument),
and the entry holds those strings as long as it is kept."""

from __future__ import annotations

import itertools
from pathlib import Path

from logsync import responder
from logsync.server.pagecache import PageCache, ReadLog, page_key
from logsync.store import Store
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
