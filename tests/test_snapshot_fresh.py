"""A served snapshot is made ahead and kept while fresh enough (`SnapshotCache.fresh`):
a joiner installs a copy a few ops behind and tails the rest by vector (RFC 004 §9.6),
ending identical to its source."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from test_snapshot import FakePeer, ThreadServer, build, content, wait_for

from logsync.client import sync_once
from logsync.peers import Peer
from logsync.server import create_app
from logsync.snapshot import SERVE_PREFIX
from logsync.snapshot.joining import join_if_empty
from logsync.snapshot.making import SnapshotCache
from logsync.store import Store
from tests.interop.hub import free_port


def test_a_copy_is_fresh_while_a_prefix_few_ops_behind_and_young(tmp_path: Path) -> None:
    store = build(tmp_path / "source", 20)
    cache = SnapshotCache(store.db_path, store.replica_id, stale_ops=5, stale_s=60)
    held = cache.current(store.version_vector())
    me, other = store.replica_id, "rep_" + "ab" * 16
    assert cache.fresh(held, {me: 20})
    assert cache.fresh(held, {me: 23, other: 2})  # 5 behind: served, the joiner tails
    assert not cache.fresh(held, {me: 23, other: 3})  # 6 behind: a new copy
    assert not cache.fresh(held, {me: 19})  # not a prefix of the store (it went back)
    old = dataclasses.replace(held, made_at=time.monotonic() - 61)
    assert not cache.fresh(old, {me: 20})
    assert cache.current({me: 21}) is held  # the same file, not a new copy
    cache.close()
    store.close()


def test_a_joiner_takes_a_copy_behind_its_source_and_tails_the_rest(tmp_path: Path) -> None:
    source = build(tmp_path / "source", 130, patches=3)
    peer = FakePeer(source)
    try:
        first = tmp_path / "first"
        assert join_if_empty(first, [Peer(url=peer.server.url)]) is not None
        served = [p for p in source.palace.iterdir() if p.name.startswith(SERVE_PREFIX)]
        for i in range(40):  # the source moves on; its copy stays fresh enough
            source.append_event(type="t.more", stream="s", room="r", from_agent=f"a{i}@b")
        second = tmp_path / "second"
        joined = join_if_empty(second, [Peer(url=peer.server.url)])
        assert joined is not None
        assert served == [p for p in source.palace.iterdir() if p.name.startswith(SERVE_PREFIX)]
        with Store.open(second) as store:
            assert store.version_vector() == {source.replica_id: 130}  # the copy's prefix
            report = sync_once(store, peer.server.url)
            assert (report.applied, report.conflicts, report.quarantined) == (40, 0, 0)
            assert store.audit().ok
        assert content(second) == content(source.palace)
    finally:
        peer.server.close()
        source.close()


def test_a_server_makes_its_copy_as_it_starts(tmp_path: Path) -> None:
    source = build(tmp_path / "source", 30)
    empty = build(tmp_path / "empty", 0)
    servers: list[Any] = []
    try:
        for store, ahead in ((source, True), (empty, True), (source, False)):
            port = free_port()
            app = create_app(store, snapshot_ahead=ahead)
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                   log_level="warning"))
            servers.append(ThreadServerFor(server))
            made = lambda s=store: [p for p in s.palace.iterdir()  # noqa: E731
                                    if p.name.startswith(SERVE_PREFIX)]
            if store is source and ahead:
                wait_for(lambda m=made: sorted(p.suffix for p in m()) == [".sqlite3", ".zst"],
                         "the copy (and its zstd frame) made as the server started")
            else:
                time.sleep(0.5)
                assert made() == [], "no copy: an empty store, or not asked to"
            servers.pop().close()
            assert made() == []  # removed at shutdown
    finally:
        for server in servers:
            server.close()
        source.close()
        empty.close()


class ThreadServerFor(ThreadServer):
    """`ThreadServer` around a configured `uvicorn.Server` (lifespan on)."""

    def __init__(self, server: uvicorn.Server) -> None:  # noqa: D107
        self.server = server
        self.thread = threading.Thread(target=server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: server.started, "the server never started")
