"""The httpx driver: whole rounds against httpx.MockTransport peers (STYLE.md §3),
failure translation and retries, and one round against a real uvicorn server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgpack
import pytest
import uvicorn

from logsync.answers import parse_retry_after
from logsync.client import PeerClient, sync_once
from logsync.engine import Extensions, Request, RoundReport
from logsync.errors import (
    ConfigError,
    PeerAuthError,
    PeerProtocolError,
    PeerRequestError,
    PeerTransientError,
)
from logsync.fetchpolicy import prefetch_guess
from logsync.responder import UPSTREAM_HUB, Profile, answer
from logsync.store import Store
from logsync.wire import EXT_MSGPACK
from tests.interop.hub import free_port

URL = "http://peer.test:8000"
Handler = Callable[[httpx.Request], httpx.Response]


class StorePeer:
    """An httpx handler serving one Store through `logsync.responder` (an upstream hub
    unless given a profile), with a peer's token check and msgpack; counts calls."""

    def __init__(self, store: Store, *, profile: Profile = UPSTREAM_HUB) -> None:
        self.store = store
        self.profile = profile
        self.calls: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        if request.headers.get("authorization") != "Bearer secret":
            return httpx.Response(401, json={"error": "missing or wrong bearer token"})
        status, body = answer(self.store, request.url.path, dict(request.url.params),
                              profile=self.profile)
        packed = request.headers.get("accept") == "application/msgpack"
        if status == 200 and packed and EXT_MSGPACK in self.profile.extensions:
            return httpx.Response(200, content=msgpack.packb(body),
                                  headers={"content-type": "application/msgpack"})
        return httpx.Response(status, json=body)


class Sleeps:
    """Stands in for anyio.sleep so retries cost no wall time; records each wait."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def pair(tmp_path: Path):
    source, target = Store.open(tmp_path / "source"), Store.open(tmp_path / "target")
    yield source, target
    source.close()
    target.close()


def fill(store: Store, count: int) -> str:
    art = store.put_artifact("patch", "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", "alice")
    for i in range(count):
        store.append_event("task.ask", "s", "r", "alice", body=f"op {i}",
                           artifact_ids=[art["id"]] if i == 0 else None)
    return art["id"]


def run_round(store: Store, handler: Handler, **options: Any) -> RoundReport:
    round_keys = {"page_limit", "use_extensions", "report"}
    round_opts = {k: v for k, v in options.items() if k in round_keys}
    client_opts = {k: v for k, v in options.items() if k not in round_keys}

    async def go() -> RoundReport:
        async with PeerClient(URL, "secret", transport=httpx.MockTransport(handler),
                              **client_opts) as client:
            return await client.run_round(store, **round_opts)

    return anyio.run(go)


def answering(*responses: Callable[[httpx.Request], httpx.Response]) -> tuple[Handler, list]:
    """A handler giving these responses in turn (the last one repeats), counting calls."""
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return responses[min(len(calls), len(responses)) - 1](request)

    return handler, calls


def fetch(handler: Handler, **options: Any) -> Any:
    async def go() -> Any:
        async with PeerClient(URL, "secret", transport=httpx.MockTransport(handler),
                              **options) as client:
            return await client.fetch(Request("/sync/version_vector"))

    return anyio.run(go)


VECTOR = {"replica_id": "rep_" + "a" * 32, "version_vector": {}}


def ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=VECTOR)


# ── whole rounds ─────────────────────────────────────────────────────


def test_round_pulls_everything_with_artifacts_and_counts_bytes(pair):
    source, target = pair
    art_id = fill(source, 7)
    peer = StorePeer(source)
    report = run_round(target, peer, page_limit=3)
    assert (report.applied, report.artifacts) == (7, 1)
    assert report.bytes_received > 0 and report.requests == len(peer.calls) == 5
    assert target.version_vector() == source.version_vector()
    assert target.get_artifact(art_id) == source.get_artifact(art_id)
    assert run_round(target, StorePeer(source)).applied == 0


def _ops_afters(peer: StorePeer) -> list[int]:
    return [int(c.url.params["after"]) for c in peer.calls if c.url.path == "/sync/ops"]


def test_the_page_after_a_full_page_is_prefetched_once_and_used(pair):
    """1 200 ops in upstream pages of 500: after=0, 500, 1000, each fetched exactly once
    (1000 speculatively, while 500 was applied); the short last page ends the guessing."""
    source, target = pair
    fill(source, 1200)
    peer = StorePeer(source)
    report = run_round(target, peer)
    assert report.applied == 1200
    assert _ops_afters(peer) == [0, 500, 1000]
    assert target.version_vector() == source.version_vector()


def test_the_page_after_a_budget_cut_page_is_prefetched_but_never_past_the_target(pair):
    """A peer with a byte budget cuts pages short of their limit: the next page is still
    fetched while one is applied (without it a large pull was strictly serial), each
    page once, and nothing is asked past the origin's top."""
    source, target = pair
    fill(source, 1200)
    profile = Profile(max_page_bytes=40_000)  # a few hundred of these ops per page
    top_when_asked: list[tuple[int, int]] = []
    peer = StorePeer(source, profile=profile)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sync/ops":
            held = target.version_vector().get(source.replica_id, 0)
            top_when_asked.append((int(request.url.params["after"]), held))
        return peer(request)

    report = run_round(target, handler)
    assert report.applied == 1200
    afters = [after for after, _ in top_when_asked]
    assert len(afters) > 3 and afters == sorted(set(afters))  # each page once, in order
    assert afters[-1] < 1200  # no page asked past the top
    assert any(held < after for after, held in top_when_asked), "no page was prefetched"
    assert target.version_vector() == source.version_vector()


def test_prefetch_guess_past_a_short_page_only_below_until() -> None:
    full = {"events": [{"origin_seq": 1}, {"origin_seq": 2}]}
    short = {"events": [{"origin_seq": 1}]}
    asked = Request("/sync/ops", {"origin": "o", "after": 0, "limit": 2}, until=5)
    assert prefetch_guess(asked, full).params["after"] == 2
    assert prefetch_guess(asked, short) is None  # as before unless asked to go on
    guess = prefetch_guess(asked, short, past_short=True)
    assert guess is not None and guess.params["after"] == 1 and guess.until == 5
    at_top = Request("/sync/ops", {"origin": "o", "after": 0, "limit": 2}, until=1)
    assert prefetch_guess(at_top, short, past_short=True) is None
    no_hint = Request("/sync/ops", {"origin": "o", "after": 0, "limit": 2})
    assert prefetch_guess(no_hint, short, past_short=True) is None


def test_a_wrong_guess_is_dropped_and_an_error_in_it_is_never_raised(pair):
    """The store stops the origin at op 500 (a missing artifact), so the prefetched page
    after 500 is never asked for: its 503 must not fail the round."""
    source, target = pair
    fill(source, 1001)
    _, first = answer(source, "/sync/ops", {"origin": source.replica_id}, profile=UPSTREAM_HUB)
    first["events"][-1] = {**first["events"][-1], "artifact_ids": ["art_gone"]}
    peer = StorePeer(source)

    def handler(request: httpx.Request) -> httpx.Response:
        params = request.url.params
        if request.url.path == "/sync/ops" and params["after"] == "0":
            peer.calls.append(request)
            return httpx.Response(200, json=first)
        if request.url.path == "/sync/ops":
            peer.calls.append(request)
            return httpx.Response(503, json={"error": "busy"})
        return peer(request)

    report = run_round(target, handler, sleep=Sleeps())
    assert report.applied == 499 and report.quarantined == 1
    assert target.version_vector()[source.replica_id] == 499


def test_msgpack_is_used_only_when_advertised(pair):
    source, target = pair
    fill(source, 2)
    plain = StorePeer(source)
    run_round(target, plain)
    assert all(c.headers["accept"] == "application/json" for c in plain.calls)
    source.append_event("task.reply", "s", "r", "bob")
    fancy = StorePeer(source, profile=Profile(extensions=("msgpack",), max_page=500))
    report = run_round(target, fancy)
    assert report.applied == 1 and report.extensions == ["msgpack"]
    assert fancy.calls[-1].headers["accept"] == "application/msgpack"


def test_missing_artifact_404_is_an_answer_not_a_failure(pair):
    source, target = pair
    art_id = fill(source, 2)
    peer = StorePeer(source)

    def lost(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sync/artifact":
            return httpx.Response(404, json={"error": f"artifact {art_id!r} not found"})
        return peer(request)

    report = run_round(target, lost)
    assert report.quarantined == 1 and report.applied == 0
    assert report.stopped_origins()


def test_sync_once_runs_a_blocking_round(pair):
    source, target = pair
    fill(source, 3)
    report = sync_once(target, URL, "secret", transport=httpx.MockTransport(StorePeer(source)),
                       page_limit=2)
    assert report.applied == 3
    assert report.as_upstream_stats(URL)["pulled_events"] == 3


def test_bad_token_fails_the_round_with_an_auth_error(pair):
    source, target = pair
    fill(source, 1)
    peer = StorePeer(source)

    async def go() -> None:
        async with PeerClient(URL, "wrong", transport=httpx.MockTransport(peer)) as client:
            await client.run_round(target)

    with pytest.raises(PeerAuthError, match="answered 401: missing or wrong bearer token"):
        anyio.run(go)
    assert len(peer.calls) == 1


# ── retries ──────────────────────────────────────────────────────────


def test_503_with_retry_after_is_retried_after_the_hint():
    busy = lambda r: httpx.Response(503, headers={"Retry-After": "3"}, json={"error": "busy"})  # noqa: E731
    handler, calls = answering(busy, busy, ok)
    sleeps = Sleeps()
    answer, size = fetch(handler, sleep=sleeps)
    assert answer == VECTOR and size > 0
    assert len(calls) == 3
    assert len(sleeps.waits) == 2 and all(w >= 3 for w in sleeps.waits)


def test_429_and_500_are_retried_with_growing_backoff():
    limited = lambda r: httpx.Response(429)  # noqa: E731
    broken = lambda r: httpx.Response(500, text="oops")  # noqa: E731
    handler, calls = answering(limited, broken, ok)
    sleeps = Sleeps()
    assert fetch(handler, sleep=sleeps, backoff=0.5)[0] == VECTOR
    assert len(calls) == 3 and all(0 <= w <= 10 for w in sleeps.waits)


def test_connect_errors_are_retried():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    handler, calls = answering(refuse, refuse, ok)
    sleeps = Sleeps()
    assert fetch(handler, sleep=sleeps)[0] == VECTOR
    assert len(calls) == 3 and len(sleeps.waits) == 2


def test_retries_end_after_the_attempt_limit_with_a_transient_error():
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    handler, calls = answering(timeout)
    with pytest.raises(PeerTransientError, match="peer http://peer.test:8000: GET "
                       "/sync/version_vector timed out"):
        fetch(handler, sleep=Sleeps(), attempts=3)
    assert len(calls) == 3


def test_a_retry_after_beyond_our_patience_ends_at_once_and_carries_the_hint():
    handler, calls = answering(lambda r: httpx.Response(503, headers={"Retry-After": "120"}))
    with pytest.raises(PeerTransientError) as caught:
        fetch(handler, sleep=Sleeps(), max_retry_after=30)
    assert len(calls) == 1 and caught.value.retry_after == 120


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, PeerAuthError), (403, PeerAuthError), (404, PeerRequestError),
     (400, PeerRequestError), (302, PeerProtocolError)],
)
def test_other_client_errors_are_never_retried(status, error):
    handler, calls = answering(
        lambda r: httpx.Response(status, json={"error": "origin must be a non-empty replica id"})
    )
    with pytest.raises(error, match=f"answered {status}"):
        fetch(handler, sleep=Sleeps())
    assert len(calls) == 1


# What a MemPalace 3.11 hub answers a request without the right token, and any unknown
# route with 404 (its HTTP server's default page); only its artifact 404 is JSON.
HUB_HTML_ERROR = (b'<!DOCTYPE HTML>\n<html lang="en">\n    <head>\n        <meta charset="utf-8">'
                  b"\n        <title>Error response</title>\n    </head>\n    <body>\n        "
                  b"<h1>Error response</h1>\n        <p>Error code: 401</p>\n        <p>Message: "
                  b"Unauthorized.</p>\n    </body>\n</html>\n")


@pytest.mark.parametrize(("status", "error"), [(401, PeerAuthError), (404, PeerRequestError)])
def test_a_hubs_html_error_page_is_one_line_naming_the_status(status, error):
    """The sentence of an error answer is read from JSON only: a hub's HTML page leaves
    the line at what the status says, never a page of markup."""
    handler, calls = answering(lambda r: httpx.Response(
        status, content=HUB_HTML_ERROR, headers={"content-type": "text/html;charset=utf-8"}))
    with pytest.raises(error) as caught:
        fetch(handler, sleep=Sleeps())
    text = str(caught.value)
    assert f"answered {status}" in text and "<" not in text and "\n" not in text, text
    assert len(calls) == 1


def test_retry_after_accepts_seconds_and_http_dates():
    assert parse_retry_after(httpx.Headers({"Retry-After": "5"})) == 5.0
    date = httpx.Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert parse_retry_after(date, now=1445412470.0) == 10.0
    assert parse_retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None


# ── untrusted answers ────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("response", "problem"),
    [
        (httpx.Response(200, content=b"{not json", headers={"content-type": "application/json"}),
         "malformed application/json body"),
        (httpx.Response(200, content=b"\xff\xfe", headers={"content-type": "application/json"}),
         "malformed application/json body"),
        (httpx.Response(200, content=b"[" * 100_000 + b"]" * 100_000,
                        headers={"content-type": "application/json"}),
         "malformed application/json body"),
        (httpx.Response(200, content=b"\xc1", headers={"content-type": "application/msgpack"}),
         "malformed application/msgpack body"),
        (httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"}),
         "Content-Type 'text/html'"),
    ],
    ids=["truncated", "not-utf8", "too-deep", "bad-msgpack", "html"],
)
def test_undecodable_answers_are_protocol_errors_and_not_retried(response, problem):
    handler, calls = answering(lambda r: response)
    with pytest.raises(PeerProtocolError, match=problem):
        fetch(handler, sleep=Sleeps())
    assert len(calls) == 1


def test_wrong_shapes_fail_the_round_with_a_protocol_error(pair):
    _, target = pair
    handler, _ = answering(lambda r: httpx.Response(200, json={"replica_id": 7}))
    with pytest.raises(PeerProtocolError, match="replica_id=7"):
        run_round(target, handler)


def test_oversize_answers_are_refused_announced_or_streamed():
    big = json.dumps({"pad": "x" * 5000}).encode()
    handler, _ = answering(lambda r: httpx.Response(200, content=big))
    with pytest.raises(PeerProtocolError, match="announced a 5011-byte answer; the cap is 1000"):
        fetch(handler, max_response_bytes=1000)

    async def chunks():
        for _ in range(10):
            yield b"x" * 500

    streamed, _ = answering(lambda r: httpx.Response(200, content=chunks()))
    with pytest.raises(PeerProtocolError, match="larger than the 1000-byte cap"):
        fetch(streamed, max_response_bytes=1000)


def test_batch_failure_fails_only_its_origin(pair):
    source, target = pair
    ids = [source.put_artifact("note", f"n{i}", "alice")["id"] for i in range(4)]
    source.append_event("task.ask", "s", "r", "alice", artifact_ids=ids)
    peer = StorePeer(source)

    def bad_artifact(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("id") == ids[2]:
            return httpx.Response(200, json={"artifact": "nope"})
        return peer(request)

    report = run_round(target, bad_artifact)
    (reason,) = report.failed_origins().values()
    assert f"id={ids[2]}" in reason
    assert target.counts()["events"] == 0


def test_bad_urls_and_ca_files_are_config_errors(tmp_path):
    for url in ("ftp://x", "no-scheme", "http://"):
        with pytest.raises(ConfigError, match="is invalid: must be an http:// or https:// URL"):
            PeerClient(url)
    with pytest.raises(ConfigError, match="CA file"):
        PeerClient(URL, ca_file=str(tmp_path / "missing.pem"))


# ── a real server on loopback ───────────────────────────────────────



@pytest.fixture
def live_server(tmp_path: Path):
    """logsync's own app served by uvicorn in a thread on 127.0.0.1."""
    from logsync.server import create_app

    store = Store.open(tmp_path / "served")
    port = free_port()
    app = create_app(store, token="secret", port=port)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.02)
    assert server.started, "uvicorn did not start within 10 s"
    try:
        yield store, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.close()


def test_round_against_a_real_logsync_server(live_server, tmp_path):
    served, url = live_server
    ids = [served.put_artifact("note", f"artifact {i}", "alice")["id"] for i in range(3)]
    for i in range(1200):
        served.append_event("task.ask", "s", "r", "alice", body=f"op {i}",
                            artifact_ids=ids if i % 400 == 0 else None)
    with Store.open(tmp_path / "puller") as puller:
        report = sync_once(puller, url, "secret")
        assert (report.applied, report.artifacts) == (1200, 3)
        assert set(report.extensions) >= {"msgpack", "large_pages", "inline_artifacts"}
        assert report.requests == 2                     # vector + one large page
        assert puller.version_vector() == served.version_vector()
        assert sync_once(puller, url, "secret").applied == 0
        with pytest.raises(PeerAuthError):
            sync_once(puller, url, "wrong")
        upstream = sync_once(puller, url, "secret", use_extensions=False)
        assert upstream.applied == 0 and upstream.extensions == []


def test_a_targeted_round_pulls_the_named_origins_without_the_vector(pair, tmp_path):
    source, target = pair
    fill(source, 700)
    other = Store.open(tmp_path / "other")
    other.append_event("task.ask", "s", "r", "bob")
    source.apply_remote(other.list_ops(other.replica_id))
    other.close()
    peer = StorePeer(source)
    tops = source.version_vector()

    async def go() -> RoundReport:
        async with PeerClient(URL, "secret", transport=httpx.MockTransport(peer)) as client:
            return await client.run_targeted(target, tops, Extensions())

    report = anyio.run(go)
    assert report.applied == 701 and report.artifacts == 1
    assert not [c for c in peer.calls if c.url.path == "/sync/version_vector"]
    assert target.version_vector() == source.version_vector()
    assert report.local_vector_after == target.version_vector()
