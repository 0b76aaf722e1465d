"""The server's cache of encoded ops (`logsync/server/opcache.py`): an answer joined from
held ops is the bytes a fresh encoding gives, the cache stays within its bound, and which
ops a page holds is always read from the store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsync.responder import json_bytes
from logsync.server import create_app
from logsync.server.opcache import ENTRY_OVERHEAD, JSON, MSGPACK, HeldOp, OpCache
from logsync.store import Store

TOKEN = "t0ken"
BASE = "http://127.0.0.1:8765"
MSGPACK_ACCEPT = {"Accept": "application/msgpack"}

texts = st.text(max_size=30)  # any code point, lone surrogates included
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | texts
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=8)


@st.composite
def events(draw: Any) -> dict[str, Any]:
    """An op as `list_ops` reads it (key order kept), or now and then a malformed one."""
    event = {"id": draw(texts), "seq": draw(st.integers(1, 50)),
             "origin_replica": draw(st.sampled_from(["rep_a", "rep_b"])),
             "origin_seq": draw(st.integers(1, 20)), "body": draw(texts),
             "artifact_ids": draw(st.lists(texts, max_size=2)),
             "metadata": draw(st.dictionaries(texts, json_values, max_size=3))}
    if draw(st.booleans()):
        event.pop(draw(st.sampled_from(["seq", "origin_seq", "id"])))
    return event


def fresh(body: dict[str, Any], encoding: str) -> bytes:
    return json_bytes(body) if encoding == JSON else msgpack.packb(body, use_bin_type=True)


def outcome(encode: Any) -> tuple[str, Any]:
    try:
        return "ok", encode()
    except (OverflowError, TypeError, ValueError) as exc:
        return "error", type(exc)


@settings(max_examples=300, deadline=None)
@given(st.lists(events(), max_size=6), st.lists(events(), max_size=6),
       st.sampled_from([JSON, MSGPACK]), st.booleans())
def test_a_joined_answer_is_the_fresh_encoding(
        first: list[dict], second: list[dict], encoding: str, with_extras: bool) -> None:
    """Cold, then warm (the same ops again, plus others): byte for byte what
    `json_bytes` / `packb` give, and the same failure when those fail."""
    cache = OpCache(1 << 20)
    rows: dict[tuple, dict] = {}  # a stored row never changes: one content per row
    first, second = ([rows.setdefault(_row_key(e), e) for e in page] for page in (first, second))
    for events_now in (first, first + second):
        body: dict[str, Any] = {"origin": "rep_a", "events": events_now,
                                "count": len(events_now)}
        if with_extras:
            body["chain"] = {"prev": None, "sigs": [[1, "ab"]]}
        assert outcome(lambda b=body: cache.encode(b, encoding)) == \
            outcome(lambda b=body: fresh(b, encoding))


def _row_key(event: dict[str, Any]) -> tuple:
    return (event.get("origin_replica"), event.get("origin_seq"), event.get("seq"),
            None if {"origin_seq", "seq"} <= set(event) else id(event))


def op(origin_seq: int, seq: int, body: str = "x") -> dict[str, Any]:
    return {"id": f"evt_{origin_seq}", "seq": seq, "origin_replica": "rep_a",
            "origin_seq": origin_seq, "body": body, "metadata": {}}


def test_a_held_op_is_used_only_for_the_same_row() -> None:
    cache = OpCache(1 << 20)
    cache.encode({"events": [op(1, 7, "first")]}, JSON)
    assert cache.get(JSON, "rep_a", 1, 7) == json_bytes(op(1, 7, "first"))
    assert cache.get(JSON, "rep_a", 1, 8) is None  # another row at that origin_seq
    assert cache.get(MSGPACK, "rep_a", 1, 7) is None  # each encoding on its own
    # a row at the same (origin, origin_seq) with another local seq is encoded afresh
    body = {"events": [op(1, 8, "second")]}
    assert cache.encode(body, JSON) == json_bytes(body)


def test_the_cache_stays_within_its_bound_and_keeps_no_huge_op() -> None:
    cache = OpCache(50_000)
    for n in range(1, 200):
        cache.encode({"events": [op(n, n, "y" * 900)]}, JSON)
        assert cache.bytes_held <= cache.max_bytes
    assert 0 < len(cache) < 199
    assert cache.get(JSON, "rep_a", 199, 199) is not None  # the newest stay
    assert cache.get(JSON, "rep_a", 1, 1) is None  # the oldest went
    before = cache.bytes_held
    cache.encode({"events": [op(500, 500, "z" * (50_000 // 8))]}, JSON)  # > max // 8
    assert cache.get(JSON, "rep_a", 500, 500) is None and cache.bytes_held == before
    assert cache.bytes_held == sum(len(cache.get(JSON, "rep_a", n, n) or b"") + ENTRY_OVERHEAD
                                   for n in range(1, 200)
                                   if cache.get(JSON, "rep_a", n, n) is not None)


def test_a_page_is_held_only_when_every_op_is() -> None:
    cache = OpCache(1 << 20)
    cache.encode({"events": [op(1, 1), op(2, 2)]}, MSGPACK)
    held = cache.held_page(MSGPACK, "rep_a", [(1, 1), (2, 2)])
    assert held is not None and [h.data for h in held] == [
        msgpack.packb(op(1, 1), use_bin_type=True), msgpack.packb(op(2, 2), use_bin_type=True)]
    assert cache.held_page(MSGPACK, "rep_a", [(1, 1), (2, 2), (3, 3)]) is None
    assert cache.held_page(JSON, "rep_a", [(1, 1)]) is None
    assert cache.encode({"events": held}, MSGPACK) == msgpack.packb(
        {"events": [op(1, 1), op(2, 2)]}, use_bin_type=True)
    assert isinstance(held[0], HeldOp)


def test_another_store_object_empties_the_cache(tmp_path: Path) -> None:
    cache = OpCache(1 << 20)
    with Store.open(tmp_path / "a") as a, Store.open(tmp_path / "b") as b:
        cache.bind(a)
        cache.encode({"events": [op(1, 1)]}, JSON)
        cache.bind(a)
        assert len(cache) == 1
        cache.bind(b)
        assert len(cache) == 0 and cache.bytes_held == 0


# ── through the server ────────────────────────────────────────────────


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "palace") as opened:
        yield opened


def append(store: Store, count: int, **fields: Any) -> None:
    for n in range(count):
        store.append_event("note", "main", "lobby", "alice", body=f"héllo ☃ {n}", **fields)


async def pages(app: Any, params: dict[str, Any], headers: dict[str, str]) -> list[bytes]:
    """The same request three times: cold, warm, warm."""
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE,
                                 headers={"Authorization": f"Bearer {TOKEN}", **headers}) as c:
        for _ in range(3):
            answer = await c.get("/sync/ops", params=params)
            assert answer.status_code == 200
            out.append(answer.content)
    return out


@pytest.mark.parametrize("ext", ["", "large_pages", "large_pages,inline_artifacts,chain"])
@pytest.mark.parametrize("headers", [{}, MSGPACK_ACCEPT])
def test_served_pages_are_the_same_bytes_cold_and_warm(
        store: Store, ext: str, headers: dict[str, str]) -> None:
    note = store.put_artifact("note", "naïve ☃ content", "alice")
    append(store, 30, metadata={"k": "ü"})
    append(store, 2, artifact_ids=[note["id"]])
    app = create_app(store, token=TOKEN)
    params = {"origin": store.replica_id, "after": 3, "limit": 20, "ext": ext}
    cold, *warm = anyio.run(pages, app, params, headers)
    assert warm == [cold, cold]
    decoded = msgpack.unpackb(cold) if headers else json.loads(cold)
    assert [e["origin_seq"] for e in decoded["events"]] == list(range(4, 24))
    if not ext:  # the upstream shape: exactly the fresh encoding of the page
        events = store.list_ops(store.replica_id, 3, 20)
        assert cold == fresh({"origin": store.replica_id, "events": events, "count": 20},
                             MSGPACK if headers else JSON)
    served = app.state.logsync
    assert len(served.op_cache) > 0 and served.page_cache.hits == 2  # warm: kept answers


def test_an_op_stored_later_is_in_the_next_answer(store: Store) -> None:
    """Which ops a page holds is read every time: a short page grows, nothing stale."""
    append(store, 5)
    app = create_app(store, token=TOKEN)
    params = {"origin": store.replica_id, "after": 0, "limit": 10}
    short = anyio.run(pages, app, params, {})[0]
    assert json.loads(short)["count"] == 5
    append(store, 3)
    longer = anyio.run(pages, app, params, {})
    assert [json.loads(body)["count"] for body in longer] == [8, 8, 8]
    events = store.list_ops(store.replica_id, 0, 10)
    assert longer[0] == json_bytes({"origin": store.replica_id, "events": events, "count": 8})


def test_a_server_with_no_op_cache_answers_the_same(store: Store) -> None:
    append(store, 12)
    params = {"origin": store.replica_id, "after": 2, "limit": 5}
    with_cache = anyio.run(pages, create_app(store, token=TOKEN), params, {})
    app = create_app(store, token=TOKEN, op_cache_bytes=0, page_cache_bytes=0)
    without = anyio.run(pages, app, params, {})
    assert with_cache == without and len(app.state.logsync.op_cache) == 0
