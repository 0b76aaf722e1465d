"""The status page at `/` (issue 11, item 4): its login (a form trading the token for a
cookie that is not the token), the guard taking that cookie wherever it takes the bearer
header and never a token in the URL, escaping of what other machines wrote, the ledger JSON
routes and their `limit` bounds; then the whole thing in a real headless Chromium against
two real `logsync serve` daemons."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from logsync.server import create_app
from logsync.server.policy import SESSION_COOKIE, session_value
from logsync.server.statuspage import LEDGER_MAX_LIMIT, preview, reachability, render_page
from logsync.store import Store
from logsync.store.ledgers import conflict_row, record_conflicts
from tests.conftest import unavailable
from tests.test_daemon import Daemon, free_port, peer, run, wait_for

TOKEN = "page-s3cret"
BASE = "http://127.0.0.1:8765"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = '<script>document.title="pwned"</script><img src=x onerror="document.title=1">'
PEER_B = {
    "name": "b", "url": "http://user:pw@127.0.0.1:9/?token=peer-secret", "token": "peer-secret",
    "replica_id": "rep_" + "b" * 32, "reachable": False, "last_error_kind": "auth",
    "last_error": "peer b: 401 <b>nope</b>", "last_error_at": "2026-01-01T00:00:00Z",
    "last_success_at": "2026-01-01T00:00:00Z", "we_lack": 7, "they_lack": 11,
    "they_lack_by_origin": {"rep_" + "a" * 32: 11}, "consecutive_failures": 2,
    "totals": {"rounds_ok": 4, "rounds_failed": 2, "pulled_events": 9},
    "catchup": {"done": 10, "total": 100, "rate": 5.0, "eta_s": 18.0, "began_at": None},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "palace") as opened:
        yield opened


def client(app: Any, base: str = BASE) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)


def cookie_header(token: str = TOKEN) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={session_value(token)}"}


async def log_in(c: httpx.AsyncClient, token: str = TOKEN, **headers: str) -> httpx.Response:
    return await c.post("/login", data={"token": token}, headers=headers)


# ---------------------------------------------------------------- login


@pytest.mark.anyio
async def test_without_a_credential_the_page_is_a_login_form_and_shows_nothing(
        store: Store) -> None:
    store.append_event("note", "main", "lobby", "alice", body="private body")
    app = create_app(store, token=TOKEN, peer_state_provider=lambda: [PEER_B])
    async with client(app) as c:
        answer = await c.get("/")
    assert answer.status_code == 401
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert '<form method="post" action="/login"' in answer.text
    assert 'name="token"' in answer.text and 'type="password"' in answer.text
    for secret in (store.replica_id, "private body", "127.0.0.1:9", TOKEN):
        assert secret not in answer.text
    assert "script-src" not in answer.headers["content-security-policy"]
    assert "default-src 'none'" in answer.headers["content-security-policy"]


@pytest.mark.anyio
async def test_a_wrong_token_shows_the_form_again_with_one_sentence(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(store, token=TOKEN)
    with caplog.at_level(logging.DEBUG, logger="logsync"):
        async with client(app) as c:
            wrong = await log_in(c, "not-it")
            empty = await log_in(c, "")
    assert wrong.status_code == 401
    assert "set-cookie" not in wrong.headers
    assert "That is not this server&#x27;s token; try again." in wrong.text
    assert 'action="/login"' in wrong.text
    assert empty.status_code == 400 and "set-cookie" not in empty.headers
    assert "Enter the token this server was started with." in empty.text
    assert "not-it" not in caplog.text and TOKEN not in caplog.text
    assert "wrong token" in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_the_right_token_sets_an_httponly_strict_cookie_that_is_not_the_token(
        store: Store, scheme: str, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(store, token=TOKEN, scheme=scheme)
    with caplog.at_level(logging.DEBUG, logger="logsync"):
        async with client(app) as c:
            answer = await log_in(c)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"]
    name_value, *attributes = [part.strip() for part in cookie.split(";")]
    assert name_value == f"{SESSION_COOKIE}={session_value(TOKEN)}"
    assert TOKEN not in cookie
    assert "HttpOnly" in attributes and "SameSite=Strict" in attributes and "Path=/" in attributes
    assert ("Secure" in attributes) == (scheme == "https")
    assert TOKEN not in caplog.text


def test_the_session_value_is_derived_from_the_token() -> None:
    value = session_value(TOKEN)
    assert len(value) == 64 and TOKEN not in value
    assert value == session_value(TOKEN)
    assert value != session_value(TOKEN + "x")


@pytest.mark.anyio
async def test_the_cookie_is_a_credential_on_sync_routes_and_the_bearer_still_works(
        store: Store) -> None:
    app = create_app(store, token=TOKEN)
    async with client(app) as c:
        cookie = (await log_in(c)).headers["set-cookie"].split(";")[0]
        c.cookies.clear()
        with_cookie = await c.get("/sync/version_vector", headers={"Cookie": cookie})
        with_bearer = await c.get("/sync/version_vector", headers=BEARER)
        nothing = await c.get("/sync/version_vector")
        other_token = await c.get("/sync/version_vector", headers=cookie_header("other"))
        the_token = await c.get("/sync/version_vector",
                                headers={"Cookie": f"{SESSION_COOKIE}={TOKEN}"})
        page = await c.get("/", headers={"Cookie": cookie})
        ledger = await c.get("/quarantine.json", headers={"Cookie": cookie})
    assert with_cookie.status_code == 200, with_cookie.text
    assert with_cookie.json()["replica_id"] == store.replica_id
    assert with_bearer.status_code == 200
    for refused in (nothing, other_token, the_token):
        assert refused.status_code == 401
        assert refused.json()["error"].startswith("missing or wrong bearer token")
    assert page.status_code == 200 and store.replica_id in page.text
    assert ledger.status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/sync/version_vector", "/statusz", "/metrics",
                                  "/conflicts.json", "/sync/peers"])
@pytest.mark.parametrize("name", ["token", "access_token", SESSION_COOKIE])
async def test_a_token_in_the_query_string_is_never_a_credential(
        store: Store, path: str, name: str) -> None:
    app = create_app(store, token=TOKEN)
    value = session_value(TOKEN) if name == SESSION_COOKIE else TOKEN
    async with client(app) as c:
        answer = await c.get(path, params={name: value})
        page = await c.get("/", params={name: value})
    assert answer.status_code == 401
    assert page.status_code == 401 and 'action="/login"' in page.text


@pytest.mark.anyio
async def test_logout_clears_the_cookie_and_needs_a_credential(store: Store) -> None:
    app = create_app(store, token=TOKEN, scheme="https")
    async with client(app) as c:
        refused = await c.post("/logout")
        answer = await c.post("/logout", headers=cookie_header())
    assert refused.status_code == 401
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=;") and "Max-Age=0" in cookie
    assert "Secure" in cookie and "HttpOnly" in cookie


@pytest.mark.anyio
async def test_login_takes_a_small_urlencoded_form_by_post_only(store: Store) -> None:
    app = create_app(store, token=TOKEN)
    async with client(app) as c:
        as_json = await c.post("/login", json={"token": TOKEN})
        too_big = await c.post("/login", data={"token": TOKEN, "pad": "x" * 5000})
        by_get = await c.get("/login", params={"token": TOKEN})
        two_tokens = await c.post("/login", content=f"token={TOKEN}&token=x",
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert as_json.status_code == 415
    assert as_json.json()["reason"] == ("POST /login takes application/x-www-form-urlencoded "
                                       "with a token field, not 'application/json'")
    assert too_big.status_code == 413 and "maximum is 4096 bytes" in too_big.json()["reason"]
    assert by_get.status_code == 405
    assert by_get.json()["reason"] == "method GET is not allowed on /login; use POST"
    assert two_tokens.status_code == 303  # the first value counts, as in any form


@pytest.mark.anyio
async def test_a_cross_origin_login_is_refused_and_a_same_origin_one_is_not(
        store: Store) -> None:
    """The page's own form posts with the server's Origin: on a non-loopback bind that is
    not a loopback origin, yet it must log in; a foreign page's form must not."""
    app = create_app(store, token=TOKEN, bind_host="0.0.0.0", port=8742)
    async with client(app, "http://myhost:8742") as c:
        foreign = await log_in(c, Origin="http://evil.example")
        lookalike = await log_in(c, Origin="http://myhost:8743")
        other_scheme = await log_in(c, Origin="https://myhost:8742")
        own = await log_in(c, Origin="http://myhost:8742")
        elsewhere = await c.get("/statusz", headers={**BEARER, "Origin": "http://myhost:8742"})
    for refused in (foreign, lookalike, other_scheme):
        assert refused.status_code == 403
        assert "is not a loopback origin" in refused.json()["reason"]
    assert own.status_code == 303 and SESSION_COOKIE in own.headers["set-cookie"]
    assert elsewhere.status_code == 403  # the exception is the page's forms only


@pytest.mark.anyio
async def test_without_a_token_the_page_shows_directly(store: Store) -> None:
    app = create_app(store, peer_state_provider=lambda: [PEER_B])
    async with client(app) as c:
        page = await c.get("/")
        login = await log_in(c)
    assert page.status_code == 200 and store.replica_id in page.text
    assert 'action="/logout"' not in page.text
    assert login.status_code == 303 and "set-cookie" not in login.headers


# ---------------------------------------------------------------- the page's content


@pytest.mark.anyio
async def test_the_page_shows_peers_lag_reachability_catchup_and_counts(store: Store) -> None:
    store.apply_remote([{"bogus": 1}])  # one quarantined item
    never = {"name": "c", "url": "http://127.0.0.1:10", "reachable": None, "we_lack": None,
             "they_lack": None, "totals": {}}
    app = create_app(store, token=TOKEN, peer_state_provider=lambda: [PEER_B, never])
    async with client(app) as c:
        page = (await c.get("/", headers=BEARER)).text
    assert '<meta http-equiv="refresh" content="5">' in page
    assert f'<code id="replica-id">{store.replica_id}</code>' in page
    row_b, row_c = page.split('<tr class="peer"')[1:3]
    assert '<td class="bad reach">auth failed</td>' in row_b
    assert '<td class="num we-lack">7</td>' in row_b
    assert '<td class="num they-lack">11' in row_b
    assert "10 / 100 ops · 5.0 ops/s · eta 18 s" in row_b
    assert "peer b: 401 &lt;b&gt;nope&lt;/b&gt;" in row_b
    assert "4 / 2" in row_b
    assert "peer-secret" not in page and "user:pw" not in page
    assert '<td class="unknown reach">not contacted yet</td>' in row_c
    assert '<td class="num we-lack">?</td>' in row_c
    assert '<td class="num" id="quarantined">1</td>' in page
    assert 'href="/conflicts.json"' in page and 'href="/quarantine.json"' in page
    assert 'action="/logout"' in page


@pytest.mark.parametrize(("kind", "words"), [
    ("auth", "auth failed"), ("transport", "unreachable"), ("protocol", "protocol error"),
    ("store", "store error"), ("internal", "internal error"), (None, "last round failed"),
])
def test_reachability_words(kind: str | None, words: str) -> None:
    assert reachability({"reachable": False, "last_error_kind": kind}) == ("bad", words)
    assert reachability({"reachable": True, "last_error_kind": kind}) == ("ok", "reachable")


@pytest.mark.anyio
async def test_a_hostile_event_body_renders_as_text(store: Store) -> None:
    store.append_event("note", "main", "lobby", "mallory", body=HOSTILE)
    app = create_app(store, token=TOKEN)
    async with client(app) as c:
        page = (await c.get("/", headers=BEARER)).text
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in page
    assert "onerror=&quot;document.title=1&quot;" in page


def test_every_shown_field_is_escaped() -> None:
    evil = "<i>x</i>\"'&"
    escaped = "&lt;i&gt;x&lt;/i&gt;&quot;&#x27;&amp;"
    entry = {key: evil for key in ("name", "url", "last_error", "last_error_at",
                                   "last_success_at", "last_error_kind")}
    entry.update(reachable=False, they_lack_by_origin={evil: 1}, totals={"rounds_ok": evil},
                 catchup={"done": evil, "total": evil, "rate": evil, "eta_s": None})
    event = {key: evil for key in ("created_at", "from_agent", "to_agent", "type", "stream",
                                   "room", "body")}
    page = render_page({"replica_id": evil, "node": evil, "problem": evil, "peers": [entry],
                        "counts": {"events": evil}, "events": [event]}, time.time(), True)
    assert "<i>" not in page and evil not in page
    assert page.count("&lt;i&gt;x") >= 20
    assert escaped in page


def test_preview_is_one_line_and_short() -> None:
    assert preview("a\n\n b\tc") == "a b c"
    long = preview("x" * 1000)
    assert len(long) == 160 and long.endswith("…")
    assert preview(None) == ""


@pytest.mark.anyio
async def test_recent_events_are_the_newest_twenty_newest_first(store: Store) -> None:
    for n in range(25):
        store.append_event("note", "main", "lobby", "alice", body=f"event number {n:02d}")
    app = create_app(store)
    async with client(app) as c:
        page = (await c.get("/")).text
    rows = page.split('<tr class="event"')[1:]
    shown = [int(row.split("event number ")[1][:2]) for row in rows]
    assert shown == list(range(24, 4, -1))


@pytest.mark.anyio
async def test_statusz_stays_json_and_carries_the_peers_without_tokens(store: Store) -> None:
    app = create_app(store, token=TOKEN, peer_state_provider=lambda: [PEER_B])
    async with client(app) as c:
        answer = await c.get("/statusz", headers=BEARER)
    assert answer.headers["content-type"].startswith("application/json")
    peers = answer.json()["peers"]
    assert [p["name"] for p in peers] == ["b"]
    assert peers[0]["we_lack"] == 7 and peers[0]["they_lack"] == 11
    assert "token" not in peers[0] and "peer-secret" not in answer.text


# ---------------------------------------------------------------- ledger JSON


def add_conflicts(store: Store, count: int) -> None:
    rows = [conflict_row("2026-01-01T00:00:00Z", "event", f"evt_{n}", None, n, "differs",
                         {"n": n}, {"n": -n}) for n in range(1, count + 1)]
    with sqlite3.connect(store.db_path) as conn:
        record_conflicts(conn, rows)


@pytest.mark.anyio
async def test_ledger_json_honours_limit_newest_first(store: Store) -> None:
    add_conflicts(store, 120)
    store.apply_remote([{"bogus": n} for n in range(3)])
    app = create_app(store, token=TOKEN)
    async with client(app) as c:
        default = (await c.get("/conflicts.json", headers=BEARER)).json()
        two = (await c.get("/conflicts.json", params={"limit": "2"}, headers=BEARER)).json()
        most = await c.get("/conflicts.json", params={"limit": LEDGER_MAX_LIMIT}, headers=BEARER)
        quarantine = (await c.get("/quarantine.json", params={"limit": 1},
                                  headers=BEARER)).json()
    assert (default["count"], default["limit"], default["total"]) == (100, 100, 120)
    assert [row["item_id"] for row in two["conflicts"]] == ["evt_120", "evt_119"]
    assert two["conflicts"][0]["remote"] == {"n": -120}
    assert most.status_code == 200 and most.json()["count"] == 120
    assert quarantine["count"] == 1 and quarantine["total"] == 3
    assert quarantine["quarantine"][0]["payload"] == {"bogus": 2}


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/conflicts.json", "/quarantine.json"])
@pytest.mark.parametrize("limit", ["0", "-1", "abc", "1.5", "", str(LEDGER_MAX_LIMIT + 1),
                                   "１０", "99999999999999999999"])
async def test_a_bad_ledger_limit_is_one_sentence(store: Store, path: str, limit: str) -> None:
    app = create_app(store, token=TOKEN)
    async with client(app) as c:
        answer = await c.get(path, params={"limit": limit}, headers=BEARER)
    assert answer.status_code == 400
    assert answer.json() == {"error": "bad_request",
                             "reason": f"limit={limit!r} is invalid: must be a whole number "
                                       f"from 1 to {LEDGER_MAX_LIMIT}"}


@pytest.mark.anyio
async def test_a_repeated_ledger_limit_is_refused(store: Store) -> None:
    app = create_app(store, token=TOKEN)
    async with client(app) as c:
        answer = await c.get("/conflicts.json?limit=1&limit=2", headers=BEARER)
    assert answer.status_code == 400
    assert answer.json() == {"error": "bad_request",
                             "reason": "limit is given 2 times; give it once"}


# ---------------------------------------------------------------- a real browser


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    unavailable("no chromium binary on PATH (Debian: apt-get install chromium)")
    raise AssertionError("unreachable")


def append(palace: Path, body: str, author: str) -> None:
    run(palace, "append", "--type", "note", "--stream", "main", "--room", "lobby",
        "--from-agent", author, "--body", body)


def test_the_page_in_chromium_against_two_real_daemons(tmp_path: Path) -> None:
    """a pulls from b (b does not pull from a): a's page shows peer b reachable, we lack 0
    (a has b's events) and they lack 3 (a's own, which b never pulls); b's hostile event
    reaches a's page as text; logging in and out works in a real browser."""
    binary = chromium_binary()
    from playwright.sync_api import expect, sync_playwright

    daemons: list[Daemon] = []
    try:
        b = Daemon(tmp_path / "b", free_port(), "tok-b", interval=0.5)
        daemons.append(b)
        a = Daemon(tmp_path / "a", free_port(), "tok-a", interval=0.5)
        daemons.append(a)
        peer(a, b)
        for n in range(3):
            append(a.palace, f"from a {n}", "alice")
        append(b.palace, HOSTILE, "mallory")
        append(b.palace, "from b", "bob")

        def a_sees_b() -> bool:
            peers = a.get("/sync/peers").json()["peers"]
            return bool(peers) and peers[0]["reachable"] is True and \
                peers[0]["we_lack"] == 0 and peers[0]["they_lack"] == 3
        wait_for(a_sees_b, 30, "a never saw b with we_lack 0 and they_lack 3", a)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=binary)
            try:
                page = browser.new_page()
                page.goto(a.url + "/")
                expect(page.locator("form#login")).to_be_visible()
                expect(page.locator("#replica-id")).to_have_count(0)

                page.fill("input[name=token]", "wrong")
                page.click("button[type=submit]")
                expect(page.locator("#login-error")).to_have_text(
                    "That is not this server's token; try again.")

                page.fill("input[name=token]", a.token)
                page.click("button[type=submit]")
                expect(page.locator("#replica-id")).to_be_visible()
                row = page.locator('tr.peer[data-peer="b"]')
                expect(row.locator(".reach")).to_have_text("reachable")
                expect(row.locator(".we-lack")).to_have_text("0")
                expect(row.locator(".they-lack")).to_contain_text("3")
                expect(page.locator("td.body", has_text="from b")).to_have_count(1)
                hostile = page.locator("td.body", has_text="<script>")
                expect(hostile).to_have_text(HOSTILE)
                assert page.title() != "pwned" and page.title() != "1"
                assert page.locator("#events img, #events script").count() == 0

                cookies = {c["name"]: c for c in page.context.cookies()}
                assert cookies[SESSION_COOKIE]["httpOnly"] is True
                assert cookies[SESSION_COOKIE]["sameSite"] == "Strict"
                assert a.token not in cookies[SESSION_COOKIE]["value"]

                append(a.palace, "after the first render", "alice")  # the refresh shows it
                expect(page.locator("td.body", has_text="after the first render")) \
                    .to_have_count(1, timeout=15_000)

                page.click("#logout button")
                expect(page.locator("form#login")).to_be_visible()
                assert SESSION_COOKIE not in {c["name"] for c in page.context.cookies()}
            finally:
                browser.close()
    finally:
        stop_all(daemons)


def stop_all(daemons: list[Daemon]) -> None:
    """SIGTERM each (a clean stop is part of the test), SIGKILL whatever is left."""
    failures = []
    for daemon in daemons:
        try:
            daemon.stop()
        except AssertionError as exc:
            failures.append(str(exc))
    for daemon in daemons:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(5)
        daemon.close()
    assert not failures, failures
