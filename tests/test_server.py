"""The HTTP server: upstream shapes byte for byte, the request policy, the negotiated
extensions, metrics, and Server-Sent Events on a real uvicorn server over loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgpack
import pytest
import uvicorn

from logsync import __version__
from logsync.engine import parse_extensions
from logsync.errorcodes import UPSTREAM_PATHS
from logsync.responder import json_bytes
from logsync.server import ChangeNotifier, create_app, is_loopback_host
from logsync.store import Store

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE = "http://127.0.0.1:8765"
EVENT_KEYS = [
    "id",
    "seq",
    "origin_replica",
    "origin_seq",
    "hlc",
    "type",
    "stream",
    "room",
    "topic",
    "from_agent",
    "to_agent",
    "correlation_id",
    "branch",
    "base_commit",
    "status",
    "artifact_ids",
    "body",
    "created_at",
    "metadata",
]
ARTIFACT_KEYS = [
    "id",
    "kind",
    "sha256",
    "size_bytes",
    "content",
    "created_by",
    "created_at",
    "origin_replica",
    "metadata",
]
JSON_TYPE = "application/json; charset=utf-8"
UNAUTHORIZED = {"error": "missing or wrong bearer token (send Authorization: Bearer <token>)"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "palace") as opened:
        yield opened


def upstream_bytes(payload: Any) -> bytes:
    """How the upstream hub encodes every JSON answer."""
    return json.dumps(payload, ensure_ascii=False).encode("utf-8")


def client(app: Any, **headers: str | bytes) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE, headers=headers)


def append(store: Store, count: int = 1, **fields: Any) -> list[dict]:
    base = {"type": "note", "stream": "main", "room": "lobby", "from_agent": "alice"}
    base.update(fields)
    kind, stream, room, author = (base.pop(k) for k in ("type", "stream", "room", "from_agent"))
    return [store.append_event(kind, stream, room, author, **base) for _ in range(count)]


# ---------------------------------------------------------------- policy


def test_is_loopback_host() -> None:
    for host in ("127.0.0.1", "localhost", "LOCALHOST ", "::1", "[::1]", "127.0.0.2"):
        assert is_loopback_host(host), host
    for host in ("0.0.0.0", "", "10.0.0.1", "example.com", "::", "localhost.evil.com"):
        assert not is_loopback_host(host), host


def test_create_app_rejects_bad_settings(store: Store) -> None:
    with pytest.raises(ValueError, match="max_page=100 must be at least 500"):
        create_app(store, max_page=100)
    with pytest.raises(ValueError, match="sse_max_clients=-1"):
        create_app(store, sse_max_clients=-1)
    with pytest.raises(ValueError, match="must be positive seconds"):
        create_app(store, sse_heartbeat_s=0)


@pytest.mark.anyio
async def test_healthz_needs_no_token(store: Store) -> None:
    async with client(create_app(store, token=TOKEN)) as c:
        answer = await c.get("/healthz")
    assert answer.status_code == 200
    assert answer.content == b"ok\n"
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"


PROTECTED = [
    "/statusz",
    "/metrics",
    "/sync/version_vector",
    "/sync/ops?origin=x",
    "/sync/artifact?id=a",
    "/sync/peers",
    "/logstream/stream",
    "/no/such/route",
    "/sync/nope",
]


@pytest.mark.anyio
@pytest.mark.parametrize("path", PROTECTED)
@pytest.mark.parametrize(
    "header",
    [None, "Bearer wrong", f"bearer {TOKEN}", TOKEN, f"Bearer {TOKEN} ", "Bearer é".encode()],
)
async def test_every_route_but_healthz_needs_the_token(
    store: Store, path: str, header: str | bytes | None
) -> None:
    headers = {"Authorization": header} if header is not None else {}
    async with client(create_app(store, token=TOKEN), **headers) as c:
        answer = await c.get(path)
    assert answer.status_code == 401
    # the routes upstream defines answer as a hub would; the others with a code
    expected = UNAUTHORIZED if path.split("?")[0] in UPSTREAM_PATHS else {
        "error": "unauthorized", "reason": UNAUTHORIZED["error"]}
    assert answer.content == upstream_bytes(expected)
    assert answer.headers["content-type"] == JSON_TYPE
    assert answer.headers["www-authenticate"] == "Bearer"


@pytest.mark.anyio
async def test_no_token_configured_means_open_on_loopback(store: Store) -> None:
    async with client(create_app(store)) as c:
        assert (await c.get("/sync/version_vector")).status_code == 200


@pytest.mark.anyio
async def test_unknown_route_is_404_json_and_wrong_method_405(store: Store) -> None:
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        missing = await c.get("/sync/nope")
        wrong = await c.post("/sync/ops", content=b"{}")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == JSON_TYPE
    assert missing.json()["reason"].startswith("no route '/sync/nope'; routes are /healthz, ")
    assert missing.json()["error"] == "not_found"  # not an upstream route: coded
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "GET, HEAD"  # as RFC 004 §7 writes it, every process
    assert wrong.json() == {"error": "method POST is not allowed on /sync/ops; use GET"}


@pytest.mark.anyio
async def test_logsync_errors_sent_on_two_header_lines_counts_as_one_list(store: Store) -> None:
    """Repeated lines mean their values joined with commas (RFC 9110 §5.3): a client or
    proxy that splits the header still gets coded errors."""
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        split = await c.get("/sync/ops", params={"origin": store.replica_id, "after": "x"},
                            headers=[("Logsync-Errors", "foo"), ("Logsync-Errors", "codes")])
        plain = await c.get("/sync/ops", params={"origin": store.replica_id, "after": "x"})
    assert split.status_code == plain.status_code == 400
    assert split.json()["error"] == "bad_request" and "reason" in split.json()
    assert set(plain.json()) == {"error"}  # upstream's shape without the header


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:8765", 200),
        ("localhost", 200),
        ("[::1]:8765", 200),
        ("LOCALHOST:8765", 200),
        ("evil.example:8765", 403),
        ("127.0.0.1:9999", 403),
        ("127.0.0.1.evil.example", 403),
        ("::1:8765", 403),  # an IPv6 literal takes a port only in brackets
    ],
)
async def test_loopback_bind_pins_host(store: Store, host: str, status: int) -> None:
    app = create_app(store, token=TOKEN, port=8765)
    async with client(app, Host=host, **AUTH) as c:
        answer = await c.get("/healthz")
    assert answer.status_code == status
    if status == 403:
        assert answer.content == upstream_bytes(
            {"error": f"Host header {host.lower()!r} is not a loopback name"}
        )


@pytest.mark.anyio
async def test_host_pin_without_known_port_accepts_any_port_and_extras(store: Store) -> None:
    app = create_app(store, port=None, extra_allowed_hosts=["box.tailnet.ts.net"])
    async with client(app) as c:
        for host, status in [
            ("localhost:41234", 200),
            ("box.tailnet.ts.net", 200),
            ("box.tailnet.ts.net:443", 200),
            ("evil.example:41234", 403),
            ("localhost:", 403),
            ("localhost:80:80", 403),
        ]:
            answer = await c.get("/healthz", headers={"Host": host})
            assert answer.status_code == status, host


@pytest.mark.anyio
async def test_non_loopback_bind_does_not_pin_host(store: Store) -> None:
    app = create_app(store, token=TOKEN, bind_host="0.0.0.0", port=8765)
    async with client(app, Host="replica.example:8765", **AUTH) as c:
        assert (await c.get("/sync/version_vector")).status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("origin", "status"),
    [
        ("http://localhost:3000", 200),
        ("http://127.0.0.1", 200),
        ("http://[::1]:8080", 200),
        ("https://evil.example", 403),
        ("null", 403),
        ("http://localhost.evil.example", 403),
    ],
)
async def test_origin_must_be_loopback(store: Store, origin: str, status: int) -> None:
    async with client(create_app(store, token=TOKEN), Origin=origin, **AUTH) as c:
        answer = await c.get("/sync/version_vector")
    assert answer.status_code == status
    if status == 403:
        assert answer.json() == {"error": f"Origin {origin!r} is not a loopback origin"}


@pytest.mark.anyio
async def test_host_and_origin_are_checked_before_the_token(store: Store) -> None:
    async with client(create_app(store, token=TOKEN, port=8765)) as c:
        assert (await c.get("/statusz", headers={"Host": "evil.example"})).status_code == 403
        assert (await c.get("/statusz", headers={"Origin": "http://evil"})).status_code == 403
        assert (await c.get("/statusz")).status_code == 401


@pytest.mark.anyio
async def test_request_bodies_are_capped(store: Store) -> None:
    app = create_app(store, token=TOKEN, max_body_bytes=1024)
    async with client(app, **AUTH) as c:
        big = await c.request("GET", "/sync/version_vector", content=b"x" * 1025)
        chunked = await c.request("GET", "/sync/version_vector", content=_chunks(600, 600))
        small = await c.request("GET", "/sync/version_vector", content=b"x" * 1024)
        unauth = await c.post("/sync/ops", content=b"x" * 5000, headers={"Authorization": ""})
    assert big.status_code == 413
    assert big.json() == {"error": "request body is 1025 bytes; maximum is 1024 bytes"}
    assert chunked.status_code == 413
    assert chunked.json() == {"error": "request body exceeds the maximum of 1024 bytes"}
    assert small.status_code == 200
    assert unauth.status_code == 401


async def _chunks(*sizes: int) -> Any:
    for size in sizes:
        yield b"x" * size


# ---------------------------------------------------------------- /sync/*


@pytest.mark.anyio
async def test_version_vector_shape_and_advertisement(store: Store) -> None:
    append(store, 3)
    async with client(create_app(store, token=TOKEN, max_page=2000), **AUTH) as c:
        answer = await c.get("/sync/version_vector")
    assert answer.headers["content-type"] == JSON_TYPE
    body = answer.json()
    assert list(body)[:2] == ["replica_id", "version_vector"]
    assert body["replica_id"] == store.replica_id
    assert body["version_vector"] == {store.replica_id: 3}
    assert body["profile"]["roles"] == ["agents"]
    assert body["profiles"] == {store.replica_id: body["profile"]}
    assert body["logsync"] == {
        "version": __version__,
        "extensions": ["msgpack", "large_pages", "inline_artifacts", "notify", "chain", "push",
                       "snapshot"],
        "max_page": 2000,
        "max_page_bytes": 8 * 1024 * 1024,
        "max_push_bytes": 32 * 1024 * 1024,
        "tips": {store.replica_id: [3, store.chain_digest(store.replica_id, 3).hex()]},
        "keys": {store.replica_id: store.public_key.hex()},
        "tip_sigs": {store.replica_id: store.chain_signatures(store.replica_id, [3])[3].hex()},
    }
    ext = parse_extensions(body)
    assert (ext.msgpack, ext.inline_artifacts, ext.max_page_limit) == (True, True, 2000)
    assert (ext.push, ext.max_push_bytes) == (True, 32 * 1024 * 1024)


@pytest.mark.anyio
async def test_push_is_advertised_only_with_a_token(store: Store) -> None:
    async with client(create_app(store)) as c:
        body = (await c.get("/sync/version_vector")).json()
        refused = await c.post("/sync/push", content=b"{}")
    assert "push" not in body["logsync"]["extensions"]
    assert "max_push_bytes" not in body["logsync"]
    assert not parse_extensions(body).push
    assert refused.status_code == 403
    assert "only from authenticated peers" in refused.json()["reason"]
    assert refused.json()["error"] == "forbidden"


@pytest.mark.anyio
async def test_ops_answer_is_upstream_bytes(store: Store) -> None:
    note = store.put_artifact("note", "naïve ☃ content", "alice")
    append(store, 2, body="héllo wörld ☃\nline two", metadata={"k": "ü"}, to_agent="*")
    append(store, 1, artifact_ids=[note["id"]], topic="t")
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        answer = await c.get("/sync/ops", params={"origin": store.replica_id, "after": 1})
    events = store.list_ops(store.replica_id, 1)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == JSON_TYPE
    assert answer.content == upstream_bytes(
        {"origin": store.replica_id, "events": events, "count": 2}
    )
    assert "héllo wörld ☃".encode() in answer.content and b"\\u" not in answer.content
    assert list(json.loads(answer.content)) == ["origin", "events", "count"]
    assert [list(e) for e in answer.json()["events"]] == [EVENT_KEYS, EVENT_KEYS]
    assert [e["origin_seq"] for e in answer.json()["events"]] == [2, 3]


@pytest.mark.anyio
async def test_ops_page_limits(store: Store) -> None:
    append(store, 620)
    origin = store.replica_id
    async with client(create_app(store, token=TOKEN, max_page=600), **AUTH) as c:

        async def count(**params: Any) -> int:
            answer = await c.get("/sync/ops", params={"origin": origin, **params})
            assert answer.status_code == 200, answer.text
            return answer.json()["count"]

        assert await count() == 500
        assert await count(limit=1000) == 500
        assert await count(limit=7) == 7
        assert await count(after=615) == 5
        assert await count(after="", limit="") == 500
        assert await count(limit=1000, ext="large_pages") == 600
        assert await count(limit=550, ext="inline_artifacts,large_pages") == 550
        assert await count(limit=550, ext="inline_artifacts") == 500  # only what is asked
        assert await count(limit=550, ext="msgpack") == 500
        answer = await c.get(
            "/sync/ops",
            params={"origin": origin, "limit": 1000},
            headers={"X-Logsync-Extensions": "large_pages"},
        )
        assert answer.json()["count"] == 600


@pytest.mark.anyio
async def test_ops_unknown_origin_is_empty(store: Store) -> None:
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        answer = await c.get("/sync/ops", params={"origin": "rep_" + "0" * 32})
    assert answer.content == upstream_bytes({"origin": "rep_" + "0" * 32, "events": [], "count": 0})


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "origin must be a non-empty replica id"),
        ("origin=", "origin must be a non-empty replica id"),
        ("origin=rep_a&after=-1", "after=-1 must be a non-negative integer"),
        ("origin=rep_a&after=x", "after='x' is not an integer"),
        ("origin=rep_a&after=1.5", "after='1.5' is not an integer"),
        ("origin=rep_a&limit=0", "limit=0 must be a positive integer"),
        ("origin=rep_a&limit=-3", "limit=-3 must be a positive integer"),
        ("origin=rep_a&limit=lots", "limit='lots' is not an integer"),
    ],
)
async def test_ops_bad_parameters_are_400(store: Store, query: str, message: str) -> None:
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        answer = await c.get(f"/sync/ops?{query}")
    assert answer.status_code == 400
    assert answer.headers["content-type"] == JSON_TYPE
    assert answer.content == upstream_bytes({"error": message})


@pytest.mark.anyio
async def test_ops_origin_is_validated_by_the_store(store: Store) -> None:
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        answer = await c.get("/sync/ops?origin=bad%01origin")
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("origin='bad\\x01origin' is invalid")


@pytest.mark.anyio
async def test_ops_inline_artifacts(store: Store) -> None:
    first = store.put_artifact("patch", "--- a\n+++ b\n", "alice")
    second = store.put_artifact("note", "ä" * 100, "alice")
    append(store, 1, artifact_ids=[second["id"], first["id"]])
    append(store, 1, artifact_ids=[first["id"]])
    append(store, 1)
    origin = store.replica_id
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        plain = await c.get("/sync/ops", params={"origin": origin})
        inline = await c.get("/sync/ops", params={"origin": origin, "ext": "inline_artifacts"})
        by_header = await c.get(
            "/sync/ops",
            params={"origin": origin},
            headers={"X-Logsync-Extensions": "future_thing, inline_artifacts"},
        )
        repeated = await c.get(f"/sync/ops?ext=large_pages&ext=INLINE_ARTIFACTS&origin={origin}")
        none = await c.get("/sync/ops", params={"origin": origin, "after": 2, "ext": "x,y"})
    assert "artifacts" not in plain.json()
    body = inline.json()
    assert list(body) == ["origin", "events", "count", "artifacts"]
    wanted = sorted([first["id"], second["id"]])
    assert [a["id"] for a in body["artifacts"]] == wanted
    assert body["artifacts"] == [store.get_artifact(i) for i in wanted]
    assert [list(a) for a in body["artifacts"]] == [ARTIFACT_KEYS, ARTIFACT_KEYS]
    assert by_header.json() == body
    assert repeated.json() == body
    assert "artifacts" not in none.json()


@pytest.mark.anyio
async def test_inline_artifacts_respect_the_byte_budget(store: Store) -> None:
    big = [store.put_artifact("note", f"{i}" * 600, "alice") for i in range(3)]
    append(store, 1, artifact_ids=[a["id"] for a in big])
    one = len(json_bytes(store.get_artifact(big[0]["id"]))) + 2
    for allowed, inline in ((3 * one - 1, 0), (3 * one, 3)):  # an event's go together
        app = create_app(store, token=TOKEN, inline_artifact_bytes=allowed)
        async with client(app, **AUTH) as c:
            answer = await c.get(
                "/sync/ops", params={"origin": store.replica_id, "ext": "inline_artifacts"}
            )
        assert len(answer.json()["artifacts"]) == inline


@pytest.mark.anyio
async def test_msgpack_when_asked(store: Store) -> None:
    art = store.put_artifact("note", "blob ☃", "alice")
    append(store, 2, artifact_ids=[art["id"]], body="ü")
    origin = store.replica_id
    packed = {"Accept": "application/msgpack"}
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        as_json = await c.get("/sync/ops", params={"origin": origin})
        as_pack = await c.get("/sync/ops", params={"origin": origin}, headers=packed)
        artifact = await c.get("/sync/artifact", params={"id": art["id"]}, headers=packed)
        vector = await c.get("/sync/version_vector", headers=packed)
        zero_q = await c.get(
            "/sync/ops",
            params={"origin": origin},
            headers={"Accept": "application/msgpack;q=0, application/json"},
        )
        anything = await c.get("/sync/ops", params={"origin": origin}, headers={"Accept": "*/*"})
        error = await c.get("/sync/ops", params={"limit": 0, "origin": "x"}, headers=packed)
        missing = await c.get("/sync/artifact", params={"id": "art_nope"}, headers=packed)
    assert as_pack.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(as_pack.content) == as_json.json()
    assert list(msgpack.unpackb(as_pack.content)["events"][0]) == EVENT_KEYS
    assert msgpack.unpackb(artifact.content) == {"artifact": store.get_artifact(art["id"])}
    assert msgpack.unpackb(vector.content)["replica_id"] == store.replica_id
    assert zero_q.content == as_json.content
    assert anything.content == as_json.content
    assert error.headers["content-type"] == JSON_TYPE and error.status_code == 400
    assert missing.headers["content-type"] == JSON_TYPE and missing.status_code == 404


@pytest.mark.anyio
async def test_msgpack_falls_back_to_json_for_huge_integers(store: Store) -> None:
    append(store, 1, metadata={"n": 2**70})
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        answer = await c.get(
            "/sync/ops",
            params={"origin": store.replica_id},
            headers={"Accept": "application/msgpack"},
        )
    assert answer.headers["content-type"] == JSON_TYPE
    assert answer.json()["events"][0]["metadata"] == {"n": 2**70}


@pytest.mark.anyio
async def test_artifact_route(store: Store) -> None:
    art = store.put_artifact("log", "ünïcode log\n", "bob")
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        found = await c.get("/sync/artifact", params={"id": art["id"]})
        missing = await c.get("/sync/artifact", params={"id": "art_nope"})
        quoted = await c.get("/sync/artifact", params={"id": "it's"})
        empty = await c.get("/sync/artifact")
    assert found.content == upstream_bytes({"artifact": store.get_artifact(art["id"])})
    assert list(found.json()["artifact"]) == ARTIFACT_KEYS
    assert missing.status_code == 404
    assert missing.content == b'{"error": "artifact \'art_nope\' not found"}'
    assert quoted.content == b'{"error": "artifact \\"it\'s\\" not found"}'
    assert empty.status_code == 400
    assert empty.json() == {"error": "id must be a non-empty artifact id"}


@pytest.mark.anyio
async def test_peers_estate_has_upstream_shape_and_no_tokens(store: Store) -> None:
    other, unnamed = "rep_" + "a" * 32, "rep_" + "b" * 32
    peers = [
        {
            "drift_total": 4,
            "name": "laptop",
            "url": "http://10.0.0.2:7000",
            "token": "peer-secret",
            "auth_token": "peer-secret-2",
            "replica_id": other,
            "reachable": True,
            "last_error": None,
            "last_error_at": None,
            "last_success_at": "2026-01-01T00:00:00Z",
            "last_pulled_events": 3,
            "last_pulled_artifacts": 0,
            "remote_version_vector": {other: 4},
            "profile": {"roles": ["agents"], "advertised_at": "2026-01-01T00:00:00Z"},
        },
        {"name": "never", "url": "http://10.0.0.3:7000", "token": "peer-secret"},
    ]
    append(store, 1)
    for origin in (other, unnamed):
        store.apply_remote([_remote_event(origin)])
    app = create_app(
        store, token=TOKEN, peer_state_provider=lambda: peers, node_name="box", sync_interval_s=7
    )
    async with client(app, **AUTH) as c:
        answer = await c.get("/sync/peers")
    assert b"peer-secret" not in answer.content and TOKEN.encode() not in answer.content
    body = answer.json()
    assert list(body) == [
        "self",
        "peers",
        "unnamed_origins",
        "origin_profiles",
        "sync_interval_s",
        "estate_source",
    ]
    assert list(body["self"]) == ["replica_id", "name", "version_vector", "profile"]
    assert body["self"]["name"] == "box"
    assert body["self"]["version_vector"] == store.version_vector()
    assert list(body["peers"][0]) == [
        "name",
        "url",
        "replica_id",
        "reachable",
        "last_error",
        "last_error_at",
        "last_success_at",
        "last_pulled_events",
        "last_pulled_artifacts",
        "remote_version_vector",
        "profile",
        "drift_total",
    ]
    assert body["peers"][1] == {"name": "never", "url": "http://10.0.0.3:7000"}
    assert body["unnamed_origins"] == [unnamed]
    assert set(body["origin_profiles"]) == {store.replica_id, other}
    assert body["sync_interval_s"] == 7.0
    assert body["estate_source"] == {"in_process": True, "published_at": None, "writer_alive": True}


def _remote_event(origin: str) -> dict[str, Any]:
    stamp = "2026-01-01T00:00:00Z"
    return {
        "id": f"evt_20260101T000000_{origin[-12:]}",
        "seq": 1,
        "origin_replica": origin,
        "origin_seq": 1,
        "hlc": f"1767225600000-000000-{origin}",
        "type": "note",
        "stream": "main",
        "room": "lobby",
        "topic": None,
        "from_agent": "carol",
        "to_agent": None,
        "correlation_id": None,
        "branch": None,
        "base_commit": None,
        "status": None,
        "artifact_ids": [],
        "body": "",
        "created_at": stamp,
        "metadata": {},
    }


@pytest.mark.anyio
async def test_peers_without_provider(store: Store) -> None:
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        body = (await c.get("/sync/peers")).json()
    assert body["peers"] == [] and body["unnamed_origins"] == []
    assert body["estate_source"]["in_process"] is False


@pytest.mark.anyio
async def test_statusz_and_metrics(store: Store) -> None:
    append(store, 4)
    store.put_artifact("note", "x", "alice")
    app = create_app(store, token=TOKEN)
    async with client(app, **AUTH) as c:
        await c.get("/sync/ops", params={"origin": store.replica_id})
        await c.get("/sync/ops")
        await c.get("/nowhere")
        status = (await c.get("/statusz")).json()
        metrics = await c.get("/metrics")
    assert status["replica_id"] == store.replica_id
    assert status["version_vector"] == {store.replica_id: 4}
    assert status["counts"] == {"events": 4, "artifacts": 1, "conflicts": 0, "quarantined": 0}
    assert status["server"]["name"] == "logsync"
    assert status["requests"]["by_status"] == {"200": 1, "400": 1, "404": 1}
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert "logsync_store_events 4.0" in text
    assert "logsync_store_artifacts 1.0" in text
    assert "logsync_store_quarantined 0.0" in text
    assert "\nlogsync_conflicts 0.0" in text and "\nlogsync_quarantined 0.0" in text
    assert 'logsync_http_requests_total{route="/sync/ops",status="200"} 1.0' in text
    assert 'logsync_http_requests_total{route="/sync/ops",status="400"} 1.0' in text
    assert 'logsync_http_requests_total{route="other",status="404"} 1.0' in text
    assert "logsync_sse_clients 0.0" in text
    async with client(create_app(store, token=TOKEN), **AUTH) as c:
        fresh = (await c.get("/metrics")).text
    assert 'route="/sync/ops"' not in fresh  # each app has its own registry


@pytest.mark.anyio
async def test_factory_store_is_opened_lazily_and_closed_at_shutdown(tmp_path: Path) -> None:
    opened: list[Store] = []

    def factory() -> Store:
        opened.append(Store.open(tmp_path / "lazy"))
        return opened[-1]

    app = create_app(store_factory=factory, token=TOKEN)
    assert opened == []
    async with client(app, **AUTH) as c:
        assert (await c.get("/sync/version_vector")).status_code == 200
        assert (await c.get("/statusz")).status_code == 200
    assert len(opened) == 1
    app.state.logsync.close()
    with pytest.raises(Exception, match="closed"):
        opened[0].counts()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("query", "headers", "message"),
    [
        ("type=BAD!", {}, "type='BAD!' is invalid: must be 1-64 chars"),
        ("status=nonsense", {}, "status='nonsense' is invalid"),
        ("since_event_id=evt_nope", {}, "since_event_id 'evt_nope' not found in this replica"),
        ("", {"Last-Event-ID": "evt_gone"}, "since_event_id 'evt_gone' not found"),
    ],
)
async def test_stream_rejects_bad_filters_before_taking_a_slot(
    store: Store, query: str, headers: dict, message: str
) -> None:
    app = create_app(store, token=TOKEN, sse_max_clients=1)
    async with client(app, **AUTH) as c:
        answer = await c.get(f"/logstream/stream?{query}", headers=headers)
    assert answer.status_code == 400
    assert answer.headers["content-type"] == JSON_TYPE
    assert answer.json()["reason"].startswith(message)
    assert app.state.logsync.sse_clients == 0


@pytest.mark.anyio
async def test_stream_cap_zero_answers_503_with_retry_after(store: Store) -> None:
    app = create_app(store, token=TOKEN, sse_max_clients=0)
    async with client(app, **AUTH) as c:
        answer = await c.get("/logstream/stream")
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "5"
    assert answer.json()["reason"].endswith("retry after 5 s")
    assert answer.json()["error"] == "busy"  # a code a client branches on


@pytest.mark.anyio
async def test_stream_head_answers_headers_and_frees_its_slot(store: Store) -> None:
    app = create_app(store, token=TOKEN, sse_max_clients=1)
    async with client(app, **AUTH) as c:
        first = await c.head("/logstream/stream")
        second = await c.head("/logstream/stream")
    assert (first.status_code, second.status_code) == (200, 200)
    assert first.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert first.content == b""
    assert app.state.logsync.sse_clients == 0


@pytest.mark.anyio
async def test_change_notifier_wakes_from_loop_and_threads() -> None:
    notifier = ChangeNotifier()
    assert await notifier.wait(notifier.generation, 0.01) == 0  # times out, nothing changed
    started = time.monotonic()
    async with anyio.create_task_group() as group:
        group.start_soon(_notify_later, notifier)
        assert await notifier.wait(0, 5.0) == 1
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    timer = threading.Timer(0.05, notifier.notify)
    timer.start()
    assert await notifier.wait(1, 5.0) == 2
    timer.join()
    assert time.monotonic() - started < 1.0
    notifier.notify()
    assert await notifier.wait(1, 5.0) == 3  # already past: no waiting


async def _notify_later(notifier: ChangeNotifier) -> None:
    await anyio.sleep(0.05)
    notifier.notify()


# ---------------------------------------------------------------- real uvicorn, SSE


class LiveServer:
    """A real uvicorn server on a pre-bound loopback socket, in a thread."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start within 10 s"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not stop within 10 s"


class SSEReader:
    """Read an SSE response incrementally with a deadline on every wait."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.chunks = response.iter_raw()
        self.buffer = b""

    def until(self, marker: bytes, within: float = 5.0) -> bytes:
        deadline = time.monotonic() + within
        while marker not in self.buffer:
            assert time.monotonic() < deadline, f"no {marker!r} within {within} s"
            self.buffer += next(self.chunks)
        head, _, self.buffer = self.buffer.partition(marker)
        return head + marker


def frame(event: dict) -> bytes:
    data = json.dumps(event, ensure_ascii=False)
    return f"id: {event['id']}\nevent: logstream\ndata: {data}\n\n".encode()


def open_stream(http: httpx.Client, query: str = "", **headers: str) -> httpx.Response:
    request = http.build_request("GET", f"/logstream/stream{query}", headers=headers)
    return http.send(request, stream=True)


@pytest.fixture
def http_client() -> Iterator[Any]:
    clients: list[httpx.Client] = []

    def make(url: str) -> httpx.Client:
        clients.append(httpx.Client(base_url=url, headers=AUTH, timeout=httpx.Timeout(5.0)))
        return clients[-1]

    yield make
    for made in clients:
        made.close()


def test_stream_delivers_new_events_filters_and_resumes(store: Store, http_client: Any) -> None:
    before = append(store, 2)
    app = create_app(store, token=TOKEN, sse_heartbeat_s=0.3)
    with LiveServer(app) as live:
        http = http_client(live.url)
        tail = open_stream(http)
        assert tail.status_code == 200
        assert tail.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert tail.headers["cache-control"] == "no-cache"
        reader = SSEReader(tail)
        # Only a heartbeat comes first: events from before the connection are not replayed.
        assert reader.until(b": ping\n\n", within=3) == b": ping\n\n"
        fresh = append(store, 1, body="naïve ☃\nnext", to_agent="*")[0]
        assert reader.until(b"\n\n") == frame(fresh)

        bob = open_stream(http, "?to_agent=bob&room=lobby")
        bob_reader = SSEReader(bob)
        for_carol = append(store, 1, to_agent="carol")[0]
        for_bob = append(store, 1, to_agent="bob")[0]
        broadcast = append(store, 1, to_agent="*")[0]
        assert bob_reader.until(b"\n\n") == frame(for_bob)
        assert bob_reader.until(b"\n\n") == frame(broadcast)
        assert reader.until(b"\n\n") == frame(for_carol)

        replay = open_stream(http, f"?since_event_id={before[0]['id']}", **{"Last-Event-ID": "x"})
        replay_reader = SSEReader(replay)
        for event in [before[1], fresh, for_carol, for_bob, broadcast]:
            assert replay_reader.until(b"\n\n") == frame(event)
        resumed = open_stream(http, **{"Last-Event-ID": for_bob["id"]})
        assert SSEReader(resumed).until(b"\n\n") == frame(broadcast)
        for response in (tail, bob, replay, resumed):
            response.close()


def test_stream_sees_writes_from_another_process_and_the_notifier(
    store: Store, http_client: Any, tmp_path: Path
) -> None:
    notifier = ChangeNotifier()
    app = create_app(store, token=TOKEN, notifier=notifier, sse_poll_s=30.0)
    with LiveServer(app) as live:
        stream = open_stream(http_client(live.url))
        reader = SSEReader(stream)
        time.sleep(0.2)  # let the stream settle into its 30 s wait
        event = append(store, 1)[0]
        started = time.monotonic()
        notifier.notify()  # from this (non-loop) thread
        assert reader.until(b"\n\n", within=5) == frame(event)
        assert time.monotonic() - started < 1.0, "the notifier did not wake the stream"
        stream.close()
    polled = create_app(store, token=TOKEN, sse_poll_s=0.05)
    with LiveServer(polled) as live, Store.open(store.palace) as other_writer:
        stream = open_stream(http_client(live.url), "?type=note")
        reader = SSEReader(stream)
        time.sleep(0.2)
        event = other_writer.append_event("note", "main", "lobby", "zed")
        assert reader.until(b"\n\n", within=2) == frame(event)
        stream.close()


def test_stream_slots_free_on_disconnect_and_cap_answers_503(
    store: Store, http_client: Any
) -> None:
    app = create_app(store, token=TOKEN, sse_max_clients=2)
    with LiveServer(app) as live:
        http = http_client(live.url)
        first, second = open_stream(http), open_stream(http)
        assert (first.status_code, second.status_code) == (200, 200)
        refused = http.get("/logstream/stream")
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        assert refused.json()["reason"].startswith("2 stream clients are connected")
        first.close()
        deadline, admitted = time.monotonic() + 2.0, None
        while admitted is None:
            assert time.monotonic() < deadline, "the closed client's slot was not freed in 2 s"
            attempt = open_stream(http)
            if attempt.status_code == 200:
                admitted = attempt
            else:
                attempt.close()
                time.sleep(0.02)
        assert app.state.logsync.sse_clients == 2
        metrics = http.get("/metrics").text
        assert "logsync_sse_clients 2.0" in metrics
        second.close()
        admitted.close()
        deadline = time.monotonic() + 2.0
        while app.state.logsync.sse_clients:
            assert time.monotonic() < deadline, "slots still held 2 s after every client left"
            time.sleep(0.02)


def test_real_server_serves_sync_routes(store: Store, http_client: Any) -> None:
    append(store, 3, body="ü")
    with LiveServer(create_app(store, token=TOKEN)) as live:
        http = http_client(live.url)
        ops = http.get("/sync/ops", params={"origin": store.replica_id})
        health = httpx.get(f"{live.url}/healthz", timeout=5)
        denied = httpx.get(f"{live.url}/sync/ops", timeout=5)
        evil = http.get("/healthz", headers={"Host": "evil.example"})
    assert ops.content == upstream_bytes(
        {"origin": store.replica_id, "events": store.list_ops(store.replica_id), "count": 3}
    )
    assert health.content == b"ok\n"
    assert denied.status_code == 401
    assert evil.status_code == 403


# ---------------------------------------------------------------- side by side with a real hub


def _mempalace_exe() -> Path:
    import os

    venv = os.environ.get("LOGSYNC_MEMPALACE_VENV") or str(
        Path.home() / ".cache" / "logsync" / "mempalace-3.11.0"
    )
    exe = Path(venv).expanduser() / "bin" / "mempalace"
    assert exe.is_file(), (
        f"MemPalace 3.11.0 is not installed at {exe}: run scripts/install-mempalace.sh"
    )
    return exe


class HubProcess:
    """`mempalace serve` over a palace, own HOME, stopped with SIGTERM then SIGKILL."""

    def __init__(self, palace: Path, home: Path) -> None:
        import os
        import subprocess

        from tests.interop.hub import free_port  # below the ephemeral range: no race

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MEMPALACE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
        }
        env.update(
            HOME=str(home), NO_PROXY="127.0.0.1", HF_HUB_OFFLINE="1", MEMPALACE_SYNC_INTERVAL="0"
        )
        argv = [str(_mempalace_exe()), "serve", "--palace", str(palace), "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--token", TOKEN]
        self.log = home / "hub.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )

    def wait_healthy(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while True:
            assert self.proc.poll() is None, f"hub exited early:\n{self.log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0, trust_env=False).is_success:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"hub not healthy in {within} s"
            time.sleep(0.05)

    def stop(self) -> None:
        from tests.procs import stop_process

        stop_process(self.proc)


@pytest.mark.interop
def test_same_palace_served_by_hub_and_logsync_gives_the_same_bytes(tmp_path: Path) -> None:
    palace = tmp_path / "palace"
    with Store.open(palace) as writer:
        patch = writer.put_artifact("patch", "--- a/x\r\n+++ b/x\r\n+ünï ☃\n", "alice")
        note = writer.put_artifact("note", "plain", "bob", metadata={"k": ["é", 1]})
        append(writer, 3, body='héllo\nwörld ☃ \u2028 "q" \\ \t', metadata={"n": {"é": None}})
        append(writer, 1, artifact_ids=[patch["id"], note["id"]], topic="t", to_agent="*")
        append(writer, 2, status="applied", correlation_id="c-1", branch="main", base_commit="abc")
        origin, artifact_id = writer.replica_id, patch["id"]
    hub = HubProcess(palace, tmp_path / "home")
    try:
        hub.wait_healthy()
        store = Store.open(palace)
        try:
            _compare_with_hub(hub, store, origin, artifact_id)
        finally:
            store.close()
    finally:
        hub.stop()


def _compare_with_hub(hub: HubProcess, store: Store, origin: str, artifact_id: str) -> None:
    same_bytes = [
        f"/sync/ops?origin={origin}",
        f"/sync/ops?origin={origin}&after=2&limit=2",
        f"/sync/ops?origin={origin}&limit=1000",
        f"/sync/ops?origin={origin}&after=&limit=",
        "/sync/ops?origin=rep_00000000000000000000000000000000",
        f"/sync/artifact?id={artifact_id}",
        "/sync/artifact?id=art_missing",
        "/healthz",
    ]
    bad = ["/sync/ops", "/sync/ops?origin=x&after=-1", "/sync/ops?origin=x&limit=0",
           "/sync/ops?origin=x&limit=abc", "/sync/artifact"]  # fmt: skip
    with LiveServer(create_app(store, token=TOKEN)) as live:
        for path in same_bytes:
            theirs, mine = (_get(base, path) for base in (hub.url, live.url))
            assert (mine.status_code, mine.content) == (theirs.status_code, theirs.content), path
            assert mine.headers["content-type"] == theirs.headers["content-type"], path
        for path in bad:
            theirs, mine = (_get(base, path) for base in (hub.url, live.url))
            assert mine.status_code == theirs.status_code == 400, path
            assert list(mine.json()) == list(theirs.json()) == ["error"], path
        vectors = [_get(base, "/sync/version_vector").json() for base in (hub.url, live.url)]
        assert [v["replica_id"] for v in vectors] == [origin, origin]
        assert vectors[0]["version_vector"] == vectors[1]["version_vector"]
        assert set(vectors[0]) <= set(vectors[1])
        for base in (hub.url, live.url):
            assert _get(base, "/sync/ops", Authorization="").status_code == 401
            assert _get(base, "/sync/ops", Authorization="Bearer nope").status_code == 401
            assert _get(base, "/healthz", Host="evil.example").status_code == 403
            assert _get(base, "/healthz", Origin="https://evil.example").status_code == 403


def _get(base: str, path: str, **headers: str) -> httpx.Response:
    sent = {**AUTH, **headers}
    sent = {k: v for k, v in sent.items() if v}
    return httpx.get(f"{base}{path}", headers=sent, timeout=10, trust_env=False)
