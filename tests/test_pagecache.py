"""The server's cache of whole `/sync/ops` answers (`logsync/server/pagecache.py`): a kept
answer is served only while it is the answer a fresh build gives (whatever the store
went through since), it stays within its bound, and a read it cannot replay keeps an
answer out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync.server import create_app
from logsync.server.pagecache import PageCache, ReadLog, page_key, replays
from logsync.store import Store

TOKEN = "t0ken"
BASE = "http://127.0.0.1:8765"
EXTS = ["", "large_pages", "large_pages,inline_artifacts,chain", "chain", "inline_artifacts"]


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """A server's store and a second origin whose ops it receives."""
    with Store.open(tmp_path / "server") as server, Store.open(tmp_path / "other") as other:
        yield server, other


async def served(apps: list[Any], params: dict[str, Any], msgpack_asked: bool
                 ) -> list[tuple[int, str, bytes]]:
    """The same request to each app: (status, content type, body)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if msgpack_asked:
        headers["Accept"] = "application/msgpack"
    out = []
    for app in apps:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE,
                                     headers=headers) as client:
            answer = await client.get("/sync/ops", params=params)
            out.append((answer.status_code, answer.headers["content-type"], answer.content))
    return out


def author(store: Store, count: int, *, artifact: bool = False) -> None:
    ids = [store.put_artifact("note", f"content {store.version_vector()}", "alice")["id"]] \
        if artifact else []
    for n in range(count):
        store.append_event("note", "main", "lobby", "alice", body=f"héllo ☃ {n}",
                           artifact_ids=ids if n == 0 else [])


def relay(server: Store, other: Store, count: int) -> None:
    """The server takes `count` more of the other origin's ops (and their artifacts)."""
    held = server.version_vector().get(other.replica_id, 0)
    ops = other.list_ops(other.replica_id, held, count)
    named = [a for op in ops for a in op["artifact_ids"]]
    server.apply_remote(ops, other.get_artifacts(named))


actions = st.lists(st.one_of(
    st.tuples(st.just("author"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("other"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("relay"), st.integers(1, 8), st.booleans()),
    st.tuples(st.just("ask"), st.sampled_from(["server", "other"]), st.integers(0, 12),
              st.integers(1, 9), st.sampled_from(EXTS), st.booleans()),
), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=actions)
def test_a_kept_answer_is_always_the_fresh_answer(tmp_path_factory: Any, steps: list) -> None:
    """Ops authored, relayed (short pages grow), artifacts arriving, any page asked in
    any encoding: the caching server answers byte for byte what a server keeping
    nothing answers from the same store at that moment."""
    root = tmp_path_factory.mktemp("pages")
    with Store.open(root / "server") as server, Store.open(root / "other") as other:
        cached = create_app(server, token=TOKEN, max_page_bytes=2048)
        bare = create_app(server, token=TOKEN, max_page_bytes=2048, op_cache_bytes=0,
                          page_cache_bytes=0)
        for step in steps:
            if step[0] == "author":
                author(server, step[1], artifact=step[2])
            elif step[0] == "other":
                author(other, step[1], artifact=step[2])
            elif step[0] == "relay":
                relay(server, other, step[1])
            else:
                _, whose, after, limit, ext, packed = step
                origin = (server if whose == "server" else other).replica_id
                params = {"origin": origin, "after": after, "limit": limit, "ext": ext}
                for _ in range(2):  # the second time from the cache, if it kept it
                    fresh, kept = anyio.run(served, [bare, cached], params, packed)
                    assert kept == fresh
        assert len(bare.state.logsync.page_cache) == 0


def test_a_kept_page_is_served_from_the_cache(stores: tuple[Store, Store]) -> None:
    server, _ = stores
    author(server, 30, artifact=True)
    app = create_app(server, token=TOKEN)
    params = {"origin": server.replica_id, "after": 5, "limit": 10,
              "ext": "large_pages,inline_artifacts,chain"}
    first, again = (anyio.run(served, [app], params, True)[0] for _ in range(2))
    assert first == again and first[0] == 200
    cache = app.state.logsync.page_cache
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
    events = msgpack.unpackb(first[2])["events"]
    assert [e["origin_seq"] for e in events] == list(range(6, 16))


def test_a_signature_taken_later_changes_the_page(stores: tuple[Store, Store]) -> None:
    """A relay holding an origin's ops unsigned serves its page without signatures; once
    it adopts the origin's tip signature, the same request carries it."""
    server, other = stores
    author(other, 12)
    relay(server, other, 12)
    server.pin_keys({other.replica_id: other.public_keys()[other.replica_id]}, "peer")
    app = create_app(server, token=TOKEN)
    params = {"origin": other.replica_id, "after": 0, "limit": 12, "ext": "chain"}
    before = anyio.run(served, [app], params, True)[0]
    assert msgpack.unpackb(before[2])["chain"]["sigs"] == []
    tips = other.chain_tips()
    seq, digest = tips[other.replica_id]
    signature = other.tip_signatures(tips)[other.replica_id]
    assert server.adopt_tip_signatures([(other.replica_id, seq, digest, signature)]) == 1
    after = anyio.run(served, [app], params, True)[0]
    assert msgpack.unpackb(after[2])["chain"]["sigs"] == [[seq, signature.hex()]]
    assert app.state.logsync.page_cache.hits == 0  # the replay saw the signature


def test_the_cache_stays_within_its_bound(stores: tuple[Store, Store]) -> None:
    server, _ = stores
    author(server, 40)
    app = create_app(server, token=TOKEN, page_cache_bytes=64 * 1024)
    for after in range(0, 40, 2):
        params = {"origin": server.replica_id, "after": after, "limit": 5,
                  "ext": "large_pages,chain"}
        assert anyio.run(served, [app], params, False)[0][0] == 200
    cache = app.state.logsync.page_cache
    assert 0 < len(cache) < 20 and cache.bytes_held <= 64 * 1024


class _Fake:
    """A store with one read the log does not know."""

    def list_ops(self, *args: Any, **kw: Any) -> list[dict[str, Any]]:
        return [{"origin_seq": 1, "seq": 1}]

    def origin_top(self, origin: str) -> int:
        return 1


def test_an_unknown_read_keeps_the_answer_out() -> None:
    log = ReadLog(_Fake())
    log.list_ops("rep_a", 0, 5, max_limit=5)
    assert log.replayable and log.reads == [("op_keys", ("rep_a", 0, 5, 5), [(1, 1)])]
    log.origin_top("rep_a")
    assert not log.replayable
    cache = PageCache(1 << 20)
    cache.put(_Fake(), page_key("json", {}), log, b"{}", "json")
    assert len(cache) == 0


def test_ops_without_their_keys_keep_the_answer_out() -> None:
    log = ReadLog(_Fake())
    log._store = type("S", (), {"list_ops": lambda *a, **k: [object()]})()
    log.list_ops("rep_a", 0, 5)
    assert not log.replayable


def test_another_store_object_empties_the_cache(stores: tuple[Store, Store]) -> None:
    server, other = stores
    author(server, 3)
    log = ReadLog(server)
    log.list_ops(server.replica_id, 0, 5)
    cache = PageCache(1 << 20)
    key = page_key("json", {"after": "0"})
    cache.put(server, key, log, b"x", "json")
    assert replays(server, log.reads) and cache.answer(server, key) is not None
    assert cache.answer(other, key) is None and len(cache) == 0
