"""Request policy before any route runs (Host, Origin, token, body size, store health)
and the error answers: every refusal and failure is one JSON sentence.

The credential is the bearer header or the status page's session cookie (what `POST
/login` sets: an HMAC of a fixed label keyed with the token, so the cookie proves the token
without holding it). A token in the URL query is never read: URLs land in logs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

import anyio
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request, cookie_parser
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from logsync.errorcodes import ERRORS_HEADER, upstream_shape, wants_upstream_shape
from logsync.errors import shorten
from logsync.responder import json_bytes
from logsync.server.common import (
    GUARDED_PREFIXES,
    LOOPBACK_NAMES,
    ORIGIN_LOOPBACK,
    OWN_BODY_ROUTES,
    ROUTES,
    STORE_RETRY_AFTER_S,
    _error,
    _Server,
)

logger = logging.getLogger("logsync.server")

SESSION_COOKIE = "logsync_session"
_SESSION_LABEL = b"logsync status page session v1"
# No credential needed: the health probe, the page (it shows the login form instead of a
# 401) and the login itself.
AUTH_EXEMPT = frozenset({"/healthz", "/", "/login"})
# The page's forms: a POST from the page itself carries the server's own Origin, which is
# not loopback when the server is reached by another name (a non-loopback bind).
FORM_ROUTES = frozenset({"/login", "/logout"})


# ---------------------------------------------------------------- policy


def _upstream_errors(send: Send) -> Send:
    """`send`, rewording a coded JSON error answer as a MemPalace hub's `{"error":
    SENTENCE}` (`logsync.errorcodes`): a client of the upstream routes that did not ask
    for codes gets the hub's shape. Error answers are one small body; others pass as sent."""
    held: dict[str, Any] | None = None

    async def reworded(message: dict[str, Any]) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held = message
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        start, held = held, None
        ctype = Headers(raw=start.get("headers", [])).get("content-type", "")
        if not ctype.startswith("application/json") or message.get("more_body"):
            await send(start)
            await send(message)
            return
        try:
            body = json_bytes(upstream_shape(json.loads(message.get("body", b""))))
        except ValueError:
            body = message.get("body", b"")
        raw = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*raw, (b"content-length", str(len(body)).encode())]})
        await send({**message, "body": body})

    return reworded


class _Guard:
    """Host, Origin, token and body-size checks before any route runs; counts answers."""

    def __init__(self, app: ASGIApp, server: _Server) -> None:
        self.app = app
        self.srv = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]

        async def counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.srv.record(path, message["status"])
            await send(message)

        headers = Headers(scope=scope)
        # repeated header lines mean their values joined with commas (RFC 9110 §5.3)
        if wants_upstream_shape(path, ",".join(headers.getlist(ERRORS_HEADER))):
            counted = _upstream_errors(counted)
        refusal = self._refusal(path, headers)
        if refusal is None and path not in OWN_BODY_ROUTES:
            refusal = await self._oversize(headers, receive)
        if refusal is None and path.startswith(GUARDED_PREFIXES):
            refusal = self._unavailable()
        if refusal is not None:
            await refusal(scope, receive, counted)
            return
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await counted(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # one sentence to the client, one log line, no traceback
            route = path if path in ROUTES else "other"
            if self.srv.first_time(self.srv._crashed_routes, f"{route}:{type(exc).__name__}"):
                logger.error("unexpected %s on %s: %s", type(exc).__name__, route, exc)
            logger.debug("unexpected error on %s", path, exc_info=True)
            if started:
                return  # the answer is under way: all we can do is end it
            await _error(
                500, f"internal error on {shorten(path)} ({type(exc).__name__}); see the server log"
            )(scope, receive, counted)

    def _unavailable(self) -> Response | None:
        problem = self.srv.store_problem()
        if problem is None:
            return None
        return _error(
            503, f"the store is unavailable: {problem}", {"Retry-After": str(STORE_RETRY_AFTER_S)}
        )

    def _refusal(self, path: str, headers: Headers) -> Response | None:
        srv = self.srv
        host = headers.get("host", "").strip().lower()
        if srv.cfg.pin_host and not _host_allowed(host, srv.cfg.allowed_hosts, srv.cfg.port):
            logger.warning("request refused: Host %r not allowed", host)
            return _error(403, f"Host header {shorten(host)} is not a loopback name")
        origin = headers.get("origin")
        same_origin = path in FORM_ROUTES and _same_origin(origin, host, srv.cfg.scheme)
        if origin and not _origin_allowed(origin) and not same_origin:
            logger.warning("request refused: cross-origin %r", origin)
            return _error(403, f"Origin {shorten(origin)} is not a loopback origin")
        if path not in AUTH_EXEMPT and srv.cfg.token and not credential_ok(headers,
                                                                            srv.cfg.token):
            return _error(
                401,
                "missing or wrong bearer token (send Authorization: Bearer <token>)",
                {"WWW-Authenticate": "Bearer"},
            )
        return None

    async def _oversize(self, headers: Headers, receive: Receive) -> Response | None:
        """413 for a body over the cap; a small body is read and dropped (the routes
        outside OWN_BODY_ROUTES take none)."""
        cap = self.srv.cfg.max_body_bytes
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit():
            if int(length) > cap:
                return _error(413, f"request body is {int(length)} bytes; maximum is {cap} bytes")
            if int(length) == 0:
                return None
        elif "chunked" not in headers.get("transfer-encoding", "").lower():
            return None
        total = 0
        with anyio.move_on_after(self.srv.cfg.body_timeout_s):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None
                total += len(message.get("body", b""))
                if total > cap:
                    return _error(413, f"request body exceeds the maximum of {cap} bytes")
                if not message.get("more_body", False):
                    return None
        return _error(408, f"the request body did not arrive within "
                           f"{self.srv.cfg.body_timeout_s:g} s")


def session_value(token: str) -> str:
    """The session cookie's value: a changed token voids every cookie, and a leaked cookie
    does not give away the token (peers need the token itself)."""
    return hmac.new(token.encode("utf-8"), _SESSION_LABEL, hashlib.sha256).hexdigest()


def credential_ok(headers: Headers, token: str) -> bool:
    """The bearer header or the session cookie, each compared in constant time."""
    if _token_ok(headers, token):
        return True
    cookies = cookie_parser("; ".join(headers.getlist("cookie")))
    given = cookies.get(SESSION_COOKIE, "").encode("utf-8", "replace")
    return hmac.compare_digest(given, session_value(token).encode("ascii"))


def _same_origin(origin: str | None, host: str, scheme: str) -> bool:
    """Whether `origin` is this server as the request reached it (scheme and Host)."""
    return bool(origin and host) and origin.strip().lower().rstrip("/") == f"{scheme}://{host}"


def _token_ok(headers: Headers, token: str) -> bool:
    provided = headers.get("authorization", "").encode("latin-1", "replace")
    return hmac.compare_digest(provided, f"Bearer {token}".encode())


def _origin_allowed(origin: str) -> bool:
    try:
        host = (urlparse(origin).hostname or "").strip().lower()
    except ValueError:
        return False
    return host in ORIGIN_LOOPBACK


def _allowed_host_values(bind_host: str, port: int | None, extra: Iterable[str]) -> set[str]:
    """Upstream's pin: loopback names and the bind host, with and without the port."""
    names = set(LOOPBACK_NAMES) | ({bind_host.strip().lower()} if bind_host else set())
    values = set(names)
    if port is not None:  # an IPv6 literal takes a port only in brackets: `[::1]:8742`
        values |= {f"{name}:{port}" for name in names if ":" not in name or name[0] == "["}
    for raw in extra:
        entry = raw.strip().lower()
        if entry:
            values.add(entry)
            if ":" not in entry and port is not None:
                values.add(f"{entry}:{port}")
    return values


def _host_allowed(host: str, allowed: frozenset[str], port: int | None) -> bool:
    if host in allowed:
        return True
    if port is not None:
        return False
    name, sep, port_text = host.rpartition(":")
    bare_v6 = ":" in name and not name.startswith("[")  # `::1:8742` is no Host value
    return (bool(sep) and port_text.isdigit() and name in allowed and not name.endswith(":")
            and not bare_v6)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = exc.headers
    if exc.status_code == 405:
        allow = _method_order((exc.headers or {}).get("Allow", "GET"))
        headers = {**(exc.headers or {}), "Allow": ", ".join(allow)}
        allowed = " or ".join(m for m in allow if m != "HEAD") or "GET"
        message = f"method {request.method} is not allowed on {request.url.path}; use {allowed}"
    elif exc.status_code == 404:
        message = f"no route {shorten(request.url.path)}; routes are {', '.join(ROUTES)}"
    else:
        message = str(exc.detail)
    return _error(exc.status_code, message, headers)


def _method_order(allow: str) -> list[str]:
    """The router's `Allow` (from a set: its order varies between processes) in the
    order RFC 004 writes it, `GET, HEAD`, then any other method by name."""
    methods = {m.strip().upper() for m in allow.split(",") if m.strip()}
    known = [m for m in ("GET", "HEAD", "POST") if m in methods]
    return known + sorted(methods - set(known))


async def _bad_input(request: Request, exc: Exception) -> Response:
    return _error(400, str(exc))


async def _store_failed(request: Request, exc: Exception) -> Response:
    logger.error("store error on %s: %s", request.url.path, exc)
    return _error(503, f"the store failed: {exc}", {"Retry-After": str(STORE_RETRY_AFTER_S)})
