"""The status page at `/`: one HTML page rendered here (no build step, no script), for an
operator's browser: this replica, each peer's lag both ways, reachability, last success and
error, a running catch-up, the ledgers' counts with links to their JSON, recent events.

A browser cannot send the bearer header, so when the server has a token `/` shows a login
form instead of a 401, `POST /login` trades the token once for a cookie holding
`policy.session_value(token)` (never the token), and the guard takes that cookie wherever it
takes the header. `POST /logout` clears it.

Everything shown that a person or another machine wrote (event bodies, agent names, peer
errors, peer names) is HTML-escaped, and the page's Content-Security-Policy allows no
script at all: markup in an event body can only render as text. It refreshes itself with
`<meta http-equiv=refresh>`.
"""

from __future__ import annotations

import hmac
import html
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import Response

from logsync import __version__
from logsync.errors import StoreError, shorten
from logsync.peerstate import KIND_WORDS
from logsync.server.common import BodyRefused, _error, _json, _Server, read_body
from logsync.server.peermetrics import iso_to_unix
from logsync.server.policy import SESSION_COOKIE, credential_ok, session_value
from logsync.server.routes import _peer_states
from logsync.store.reads import MAX_LIST_LIMIT

logger = logging.getLogger("logsync.server")

LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
LOGIN_BODY_CAP = 4096
FORM_TYPE = "application/x-www-form-urlencoded"
REFRESH_S = 5
RECENT_EVENTS = 20
BODY_PREVIEW = 160
LEDGER_DEFAULT_LIMIT = 100
# The store answers at most this many ledger rows (`store.reads.MAX_LIST_LIMIT`); a larger
# limit would be cut silently, so it is refused instead.
LEDGER_MAX_LIMIT = MAX_LIST_LIMIT
HTML_TYPE = "text/html; charset=utf-8"
# No script, no frames, forms only to this server: an injected tag can do nothing.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: under it Chromium sends `Origin: null` with the page's own forms,
    # which the guard's Origin check refuses.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
ERROR_WORDS = KIND_WORDS  # one table with `logsync status` (peerstate.KIND_WORDS)
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f4f4f4}.num{text-align:right}
.ok{color:#176b21;font-weight:600}.bad{color:#b00020;font-weight:600}.unknown{color:#777}
.small{font-size:.85em;color:#555}.problem{background:#fde8e8;padding:.5em}
code{font-size:.9em}.when{white-space:nowrap}
"""


def esc(value: object) -> str:
    """Text for HTML content or a quoted attribute: `None` is empty, the rest escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def _server(request: Request) -> _Server:
    return request.app.state.logsync


def _html(status: int, body: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(body.encode("utf-8"), status_code=status, media_type=HTML_TYPE,
                    headers={**PAGE_HEADERS, **(headers or {})})


# ---------------------------------------------------------------- routes


async def status_page(request: Request) -> Response:
    """The page, or the login form when the server has a token and the request no
    credential (the guard lets `/` through for that)."""
    srv = _server(request)
    if srv.cfg.token and not credential_ok(request.headers, srv.cfg.token):
        return _html(401, render_login(None), {"WWW-Authenticate": "Bearer"})
    return _html(200, render_page(await page_data(srv), time.time(), bool(srv.cfg.token)))


async def login(request: Request) -> Response:
    """Trade the token, sent once as a form field, for the session cookie."""
    srv = _server(request)
    token = srv.cfg.token
    if not token:
        return _see_root()  # nothing to log in to
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != FORM_TYPE:
        return _error(415, f"POST {LOGIN_PATH} takes {FORM_TYPE} with a token field, not "
                           f"{shorten(kind or 'no content type')}")
    try:
        raw = await read_body(request, LOGIN_BODY_CAP, srv.cfg.body_timeout_s)
    except BodyRefused as refused:
        return refused.response
    try:
        fields = parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        return _html(400, render_login("The form was not readable; enter the token again."))
    given = (fields.get("token") or [""])[0]
    if not given:
        return _html(400, render_login("Enter the token this server was started with."))
    if not hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8")):
        host = request.client.host if request.client else "?"
        logger.info("status page login from %s refused: wrong token", host)
        return _html(401, render_login("That is not this server's token; try again."),
                     {"WWW-Authenticate": "Bearer"})
    secure = "; Secure" if srv.cfg.scheme == "https" else ""
    return _see_root(f"{SESSION_COOKIE}={session_value(token)}; Path=/; HttpOnly; "
                     f"SameSite=Strict{secure}")


async def logout(request: Request) -> Response:
    """Clear the session cookie (the guard has checked the credential, as everywhere)."""
    secure = "; Secure" if _server(request).cfg.scheme == "https" else ""
    return _see_root(f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict{secure}")


def _see_root(cookie: str | None = None) -> Response:
    headers = {"Location": "/", "Cache-Control": "no-store"}
    if cookie is not None:
        headers["Set-Cookie"] = cookie
    return Response(b"", status_code=303, headers=headers)


async def conflicts_json(request: Request) -> Response:
    """`store.list_conflicts(limit)`, newest first; `total` says how many are held."""
    return await _ledger(request, "conflicts", lambda store, n: store.list_conflicts(n))


async def quarantine_json(request: Request) -> Response:
    """`store.list_quarantine(limit)`, newest first; `total` says how many are held."""
    return await _ledger(request, "quarantined", lambda store, n: store.list_quarantine(n))


async def _ledger(request: Request, count_key: str,
                  read: Callable[[Any, int], list[dict[str, Any]]]) -> Response:
    values = request.query_params.getlist("limit")
    if len(values) > 1:
        return _error(400, f"limit is given {len(values)} times; give it once")
    limit, problem = ledger_limit(values[0] if values else None)
    if problem is not None:
        return _error(400, problem)
    rows, total = await _server(request).run(lambda s: (read(s, limit), s.counts()[count_key]))
    key = "conflicts" if count_key == "conflicts" else "quarantine"
    return _json(200, {key: rows, "count": len(rows), "limit": limit, "total": total})


def ledger_limit(raw: str | None) -> tuple[int, str | None]:
    """The `limit` of a ledger route: absent is the default; else a whole number within
    bounds, or one sentence naming the value and the rule."""
    if raw is None:
        return LEDGER_DEFAULT_LIMIT, None
    text = raw.strip()
    if text.isascii() and text.isdigit() and 1 <= int(text) <= LEDGER_MAX_LIMIT:
        return int(text), None
    return 0, (f"limit={shorten(raw)} is invalid: must be a whole number from 1 to "
               f"{LEDGER_MAX_LIMIT}")


# ---------------------------------------------------------------- data


def _snapshot(store: Any) -> dict[str, Any]:
    return {
        "replica_id": store.replica_id,
        "counts": store.counts(),
        "log": asdict(store.log_state()),
        "events": store.list_events(limit=RECENT_EVENTS, order="desc"),
    }


async def page_data(srv: _Server) -> dict[str, Any]:
    """What the page shows; a failing store becomes a sentence on the page, not a 500."""
    problem = srv.store_problem()
    try:
        snapshot = await srv.run(_snapshot)
    except StoreError as exc:
        problem = problem or str(exc)
        snapshot = {"replica_id": None, "counts": {}, "events": []}
    try:
        peers = await _peer_states(srv)
    except StoreError as exc:
        problem = problem or str(exc)
        peers = []
    return {**snapshot, "peers": peers, "problem": problem, "node": srv.cfg.node_name,
            "uptime_s": time.monotonic() - srv.started_monotonic}


# ---------------------------------------------------------------- rendering


def _document(title: str, body: str, refresh: bool) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}'
            f'<meta name="viewport" content="width=device-width">'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head>"
            f"<body>{body}</body></html>")


def render_login(message: str | None) -> str:
    """The login form; `message` is one sentence about the last try."""
    note = f'<p class="bad" id="login-error">{esc(message)}</p>' if message else ""
    return _document("logsync: log in", (
        "<h1>logsync</h1><p>This server needs its token to show its status.</p>"
        f'{note}<form method="post" action="{LOGIN_PATH}" id="login">'
        '<label>Token <input type="password" name="token" autocomplete="current-password" '
        'required autofocus></label> <button type="submit">Log in</button></form>'
    ), refresh=False)


def render_page(data: Mapping[str, Any], now: float, logout_button: bool) -> str:
    """The status page from `page_data`."""
    replica = data.get("replica_id") or "unknown"
    problem = data.get("problem")
    parts = [
        f'<h1>logsync <code id="replica-id">{esc(replica)}</code></h1>',
        f'<p class="small">node {esc(data.get("node"))} · logsync {esc(__version__)} · up '
        f'{esc(_duration(data.get("uptime_s")))} · refreshes every {REFRESH_S} s</p>',
    ]
    if logout_button:
        parts.append(f'<form method="post" action="{LOGOUT_PATH}" id="logout">'
                     '<button type="submit">Log out</button></form>')
    if problem:
        parts.append(f'<p class="problem" id="store-problem">Store problem: {esc(problem)}</p>')
    parts += [_peers_section(data.get("peers") or [], now),
              _ledgers_section(data.get("counts") or {}, data.get("log") or {}),
              _events_section(data.get("events") or [])]
    return _document(f"logsync {replica}", "".join(parts), refresh=True)


def reachability(entry: Mapping[str, Any]) -> tuple[str, str]:
    """(css class, words) for a peer's last round."""
    reachable = entry.get("reachable")
    if reachable is True:
        return "ok", "reachable"
    if reachable is False:
        return "bad", ERROR_WORDS.get(str(entry.get("last_error_kind")), "last round failed")
    return "unknown", "not contacted yet"


def _peers_section(peers: list[Mapping[str, Any]], now: float) -> str:
    if not peers:
        return "<h2>Peers</h2><p>No peers are configured (peers.json).</p>"
    rows = []
    for entry in peers:
        css, words = reachability(entry)
        totals = entry.get("totals") if isinstance(entry.get("totals"), Mapping) else {}
        rows.append(
            f'<tr class="peer" data-peer="{esc(entry.get("name"))}">'
            f'<td>{esc(entry.get("name"))}<br><span class="small">{esc(entry.get("url"))}'
            f"</span></td>"
            f'<td class="{css} reach">{esc(words)}</td>'
            f'<td class="num we-lack">{_count(entry.get("we_lack"))}</td>'
            f'<td class="num they-lack">{_count(entry.get("they_lack"))}'
            f'{_by_origin(entry.get("they_lack_by_origin"))}</td>'
            f"<td>{_when(entry.get('last_success_at'), now)}</td>"
            f"<td>{_last_error(entry, now)}</td>"
            f"<td>{_catchup(entry.get('catchup'))}</td>"
            f'<td class="num">{esc(totals.get("rounds_ok", 0))} / '
            f'{esc(totals.get("rounds_failed", 0))}</td></tr>'
        )
    return ("<h2>Peers</h2><table id=\"peers\"><tr><th>Peer</th><th>Last round</th>"
            "<th>We lack</th><th>They lack</th><th>Last success</th><th>Last error</th>"
            "<th>Catch-up</th><th>Rounds ok / failed</th></tr>" + "".join(rows) + "</table>"
            '<p class="small">We lack: ops the peer holds that we do not. They lack: ops we '
            "hold that the peer does not (as of its last version vector).</p>")


def _count(value: object) -> str:
    return esc(value) if isinstance(value, int) and not isinstance(value, bool) else "?"


def _by_origin(by_origin: object) -> str:
    if not isinstance(by_origin, Mapping) or not by_origin:
        return ""
    top = sorted(by_origin.items(), key=lambda item: (-_as_int(item[1]), str(item[0])))
    shown = ", ".join(f"{esc(str(origin)[:16])}…: {esc(gap)}" for origin, gap in top[:3])
    more = f" and {len(top) - 3} more" if len(top) > 3 else ""
    return f'<br><span class="small">{shown}{more}</span>'


def _as_int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _last_error(entry: Mapping[str, Any], now: float) -> str:
    message = entry.get("last_error")
    if not entry.get("last_error_at") and not message:
        return "never"
    text = _when(entry.get("last_error_at"), now)
    if message:
        short = str(message) if len(str(message)) <= 200 else str(message)[:199] + "…"
        text += f'<br><span class="small">{esc(short)}</span>'
    return text


def _catchup(catchup: object) -> str:
    if not isinstance(catchup, Mapping):
        return "—"
    eta = catchup.get("eta_s")
    return (f'<span class="catchup">{esc(catchup.get("done"))} / {esc(catchup.get("total"))}'
            f' ops · {esc(catchup.get("rate"))} ops/s · eta '
            f'{esc(_duration(eta) if eta is not None else "unknown")}</span>')


def _ledgers_section(counts: Mapping[str, Any], log: Mapping[str, Any]) -> str:
    return (
        "<h2>Store</h2><table id=\"store\">"
        f"{_log_row(log)}"
        f'<tr><th>Events</th><td class="num">{esc(counts.get("events", "?"))}</td></tr>'
        f'<tr><th>Artifacts</th><td class="num">{esc(counts.get("artifacts", "?"))}</td></tr>'
        f'<tr><th>Conflicts</th><td class="num" id="conflicts">'
        f'{esc(counts.get("conflicts", "?"))}</td><td><a href="/conflicts.json">JSON</a>'
        "</td></tr>"
        f'<tr><th>Quarantined</th><td class="num" id="quarantined">'
        f'{esc(counts.get("quarantined", "?"))}</td><td><a href="/quarantine.json">JSON</a>'
        "</td></tr></table>"
    )


def _log_row(log: Mapping[str, Any]) -> str:
    """The write-ahead log's size and copies; the last failed copy until one succeeds."""
    if not log:
        return ""
    failure = log.get("failure")
    said = (f' <span class="bad" id="log-failure">{esc(failure)}</span>' if failure else "")
    return (f'<tr><th>Write-ahead log</th><td class="num" id="log-bytes">'
            f'{esc(_as_int(log.get("log_bytes")) // 1024)} KiB</td><td>'
            f'{esc(_as_int(log.get("checkpoints")))} copies beside pulls, '
            f'{esc(_as_int(log.get("failures")))} failed{said}</td></tr>')


def _events_section(events: list[Mapping[str, Any]]) -> str:
    if not events:
        return "<h2>Recent events</h2><p>The log is empty.</p>"
    rows = []
    for event in events:
        route = esc(event.get("from_agent"))
        if event.get("to_agent"):
            route += f" → {esc(event.get('to_agent'))}"
        rows.append(
            f'<tr class="event"><td>{esc(event.get("created_at"))}</td><td>{route}</td>'
            f'<td>{esc(event.get("type"))}</td><td>{esc(event.get("stream"))} / '
            f'{esc(event.get("room"))}</td><td class="body">{esc(preview(event.get("body")))}'
            "</td></tr>"
        )
    return (f"<h2>Recent events (newest {RECENT_EVENTS})</h2><table id=\"events\"><tr>"
            "<th>Time</th><th>Author → to</th><th>Kind</th><th>Stream / room</th>"
            "<th>Body</th></tr>" + "".join(rows) + "</table>")


def preview(body: object) -> str:
    """An event body on one line, cut to `BODY_PREVIEW` characters (not yet escaped)."""
    text = " ".join(str(body or "").split())
    return text if len(text) <= BODY_PREVIEW else text[: BODY_PREVIEW - 1] + "…"


def _when(iso: object, now: float) -> str:
    stamp = iso_to_unix(iso)
    if stamp is None:
        return "never" if iso is None else esc(iso)
    return (f'<span class="when">{esc(iso)}</span><br>'
            f'<span class="small">{esc(_ago(now - stamp))}</span>')


def _ago(seconds: float) -> str:
    if seconds < 1:
        return "just now"
    return f"{_duration(seconds)} ago"


def _duration(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    value = float(seconds)
    for limit, unit, size in ((90, "s", 1), (90 * 60, "min", 60), (48 * 3600, "h", 3600)):
        if value < limit:
            return f"{value / size:.0f} {unit}"
    return f"{value / 86400:.0f} d"


# The page's routes, merged with `routes._ENDPOINTS` by `create_app`.
PAGE_ENDPOINTS: dict[str, Callable[[Request], Any]] = {
    "/": status_page,
    LOGIN_PATH: login,
    LOGOUT_PATH: logout,
    "/conflicts.json": conflicts_json,
    "/quarantine.json": quarantine_json,
}
PAGE_METHODS: dict[str, tuple[str, ...]] = {LOGIN_PATH: ("POST",), LOGOUT_PATH: ("POST",)}
