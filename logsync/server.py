"""The HTTP face of a replica: what peers, MemPalace hubs and operators talk to.

Routes (GET only; HEAD is answered like GET):

- ``/healthz``  200 ``text/plain`` ``ok\\n``; the only route without a token.
- ``/statusz``  this server's status: replica id, vector, store counts, version, requests.
- ``/sync/version_vector``  ``{"replica_id", "version_vector", "profile", "profiles",
  "logsync"}``; the last key advertises our extensions (upstream clients read only the keys
  they know, see ``mempalace/logsync.py``).
- ``/sync/ops?origin=&after=&limit=``  ``{"origin", "events", "count"}``, exactly upstream.
- ``/sync/artifact?id=``  ``{"artifact": ...}``, 404 ``{"error": "artifact '<id>' not found"}``.
- ``/sync/peers``  the estate in the upstream shape; tokens never appear.
- ``/logstream/stream``  Server-Sent Events with upstream filters, cursor and frames.
- ``/metrics``  Prometheus text from a per-app registry.

Request policy, as upstream (``mcp_server/http.py``) except where noted: on a loopback bind
the ``Host`` header is pinned to loopback names (403); an ``Origin`` header must be loopback
(403); ``Authorization: Bearer <token>`` compared in constant time on every route but
``/healthz`` (401) -- unknown routes too, so route probing needs the token (upstream answers
404 there). A request body over ``max_body_bytes`` is refused with 413. Every error body is
``{"error": "<one sentence>"}`` (upstream sends HTML for 401/403/404).

Extensions, additive and negotiated (constants shared with ``logsync.engine``, the pulling
side); a request without them gets upstream bytes, including the silent 500 cap:

- advertised in ``/sync/version_vector`` as ``"logsync": {"version": "<logsync version>",
  "extensions": ["msgpack", "large_pages", "inline_artifacts", "notify"], "max_page": N}``.
- ``Accept: application/msgpack`` on a ``/sync/*`` route: a 200 answer is the same object
  msgpack-encoded (``Content-Type: application/msgpack``); error bodies stay JSON.
- ``ext=<name>[,<name>...]`` on ``/sync/ops`` (repeatable; an ``X-Logsync-Extensions``
  header works too); unknown names are ignored so newer peers never break us.
  ``large_pages``: ``limit`` is honoured up to ``max_page`` (default 5000) instead of 500.
  ``inline_artifacts``: the answer gains ``"artifacts": [...]``, the artifacts the page's
  events name, ordered by id, up to ``inline_artifact_bytes`` of content; any left out
  are fetched with ``/sync/artifact``.
- ``notify``: ``/logstream/stream`` frees its slot when the client leaves and wakes on a
  ``ChangeNotifier``, so a peer may hold a stream open as its pull trigger.

New events reach streams two ways: a ``ChangeNotifier`` that writers in this process poke
(from the event loop or any thread), and a cheap shared poll of the newest event id every
``sse_poll_s`` that catches writers in other processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import ipaddress
import json
import logging
import math
import platform
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

import anyio
import msgpack
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from logsync import __version__
from logsync.engine import (
    ADVERTISED_MAX_PAGE,
    ADVERTISEMENT_KEY,
    EXT_INLINE_ARTIFACTS,
    EXT_LARGE_PAGES,
    EXT_MSGPACK,
    EXTENSIONS_PARAM,
    LARGE_PAGE_CEILING,
    UPSTREAM_PAGE_LIMIT,
)
from logsync.errors import NotFoundError, StoreError, ValidationError, shorten

logger = logging.getLogger("logsync.server")

UPSTREAM_PAGE = UPSTREAM_PAGE_LIMIT
JSON_TYPE = "application/json; charset=utf-8"
MSGPACK_TYPE = "application/msgpack"
SSE_TYPE = "text/event-stream; charset=utf-8"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
ORIGIN_LOOPBACK = ("127.0.0.1", "localhost", "::1")
SSE_FILTERS = (
    "stream",
    "room",
    "topic",
    "type",
    "to_agent",
    "from_agent",
    "correlation_id",
    "status",
)
SSE_BATCH = 500
SSE_RETRY_AFTER_S = 5
EXT_NOTIFY = "notify"
EXTENSIONS = (EXT_MSGPACK, EXT_LARGE_PAGES, EXT_INLINE_ARTIFACTS, EXT_NOTIFY)
PEER_KEYS = (
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
)
ROUTES = (
    "/healthz",
    "/statusz",
    "/metrics",
    "/sync/version_vector",
    "/sync/ops",
    "/sync/artifact",
    "/sync/peers",
    "/logstream/stream",
)

PeerStateProvider = Callable[[], list[dict[str, Any]]]


def is_loopback_host(host: str) -> bool:
    """Whether a bind address (or Host name) only reaches this machine."""
    name = (host or "").strip().lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


class ChangeNotifier:
    """Wakes waiting streams the moment the store changes.

    ``notify()`` may be called from the event loop or from any thread (a store writer
    running in a worker thread): it bumps a generation counter and, when a loop is
    waiting, schedules the wake on that loop. Waiters re-check the generation on every
    timeout, so a missed wake costs at most one poll interval.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._event: anyio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def generation(self) -> int:
        """How many changes have been announced so far."""
        return self._generation

    def notify(self) -> None:
        """Announce a change; safe from any thread, never blocks."""
        with self._lock:
            self._generation += 1
            loop = self._loop
        if loop is None:
            return
        if _running_loop() is loop:
            self._wake()
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to wake
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def wait(self, seen: int, within: float) -> int:
        """Wait until the generation moves past ``seen`` or ``within`` seconds pass."""
        with self._lock:
            self._loop = _running_loop()
            if self._generation != seen:
                return self._generation
            if self._event is None:
                self._event = anyio.Event()
            event = self._event
        with anyio.move_on_after(max(within, 0.0)):
            await event.wait()
        return self._generation


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _LatestProbe:
    """The newest event id, looked up at most once per interval for all streams."""

    def __init__(self, server: _Server, interval: float) -> None:
        self._server = server
        self._interval = interval
        self._value: str | None = None
        self._at = -math.inf
        self._generation = -1
        self._pending: anyio.Event | None = None

    async def latest(self, generation: int) -> str | None:
        fresh = time.monotonic() - self._at < self._interval
        if generation == self._generation and fresh:
            return self._value
        if self._pending is not None:
            await self._pending.wait()
            return self._value
        self._pending = anyio.Event()
        try:
            value = await self._server.run(lambda store: store.latest_event_id())
            self._value, self._at, self._generation = value, time.monotonic(), generation
        finally:
            pending, self._pending = self._pending, None
            pending.set()
        return self._value


class _StoreCollector:
    """Store counts read at scrape time (the scrape runs in a worker thread)."""

    NAMES = ("events", "artifacts", "conflicts", "quarantined")

    def __init__(self, server: _Server) -> None:
        self._server = server

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family(name) for name in self.NAMES]

    def collect(self) -> list[GaugeMetricFamily]:
        counts = self._server.store_now().counts()
        families = []
        for name in self.NAMES:
            family = self._family(name)
            family.add_metric([], float(counts.get(name, 0)))
            families.append(family)
        return families

    @staticmethod
    def _family(name: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"logsync_store_{name}", f"{name} held in this replica's store")


@dataclass(frozen=True)
class Settings:
    """The knobs of one app, fixed at creation (see ``create_app``)."""

    token: str | None
    peer_state_provider: PeerStateProvider | None
    bind_host: str
    port: int | None
    pin_host: bool
    allowed_hosts: frozenset[str]
    sse_max_clients: int
    sse_heartbeat_s: float
    sse_poll_s: float
    max_page: int
    max_body_bytes: int
    inline_artifact_bytes: int
    sync_interval_s: float
    node_name: str
    scheme: str


class _Server:
    """Everything the routes share: the store, the policy, SSE slots, metrics."""

    def __init__(self, store: Any, settings: Settings, notifier: ChangeNotifier | None) -> None:
        self.cfg = settings
        self._store_lock = threading.Lock()
        if hasattr(store, "version_vector"):
            self._store, self._factory, self.owns_store = store, None, False
        else:
            self._store, self._factory, self.owns_store = None, store, True
        self.notifier = notifier or ChangeNotifier()
        self.probe = _LatestProbe(self, settings.sse_poll_s)
        self.sse_clients = 0
        self.started_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.started_monotonic = time.monotonic()
        self.request_total = 0
        self.status_counts: dict[str, int] = {}
        self.registry = CollectorRegistry()
        self.requests_metric = Counter(
            "logsync_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        sse_gauge = Gauge(
            "logsync_sse_clients", "open /logstream/stream clients", registry=self.registry
        )
        sse_gauge.set_function(lambda: self.sse_clients)
        self.registry.register(_StoreCollector(self))

    def store_now(self) -> Any:
        """The store, opened on first use when a factory was given (call from a thread)."""
        with self._store_lock:
            if self._store is None:
                self._store = self._factory()
            return self._store

    async def run(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(store)`` in a worker thread: store calls are blocking SQLite."""
        return await anyio.to_thread.run_sync(lambda: fn(self.store_now()))

    def close(self) -> None:
        """Close a store this app opened itself; a store handed in belongs to the caller."""
        with self._store_lock:
            if self.owns_store and self._store is not None:
                self._store.close()
                self._store = None

    def record(self, path: str, status: int) -> None:
        route = path if path in ROUTES else "other"
        self.request_total += 1
        key = str(status)
        self.status_counts[key] = self.status_counts.get(key, 0) + 1
        self.requests_metric.labels(route=route, status=key).inc()

    def acquire_slot(self) -> bool:
        if self.sse_clients >= self.cfg.sse_max_clients:
            return False
        self.sse_clients += 1
        return True

    def release_slot(self) -> None:
        self.sse_clients -= 1


# ---------------------------------------------------------------- encoding


def json_bytes(payload: Any) -> bytes:
    """Upstream's encoding: default separators, non-ASCII kept, UTF-8."""
    return json.dumps(payload, ensure_ascii=False).encode("utf-8")


def _json(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(json_bytes(payload), status_code=status, media_type=JSON_TYPE, headers=headers)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return _json(status, {"error": message}, headers)


def _wants_msgpack(request: Request) -> bool:
    """True when Accept names msgpack with a non-zero quality."""
    for part in request.headers.get("accept", "").split(","):
        media, *params = [piece.strip().lower() for piece in part.split(";")]
        if media in (MSGPACK_TYPE, "application/x-msgpack") and _quality(params) > 0:
            return True
    return False


def _quality(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def _answer(request: Request, payload: Any) -> Response:
    """A 200 answer in the encoding the client negotiated (JSON unless it asked)."""
    if _wants_msgpack(request):
        try:
            body = msgpack.packb(payload, use_bin_type=True)
        except (OverflowError, TypeError, ValueError):
            logger.info("answer not msgpack-encodable (integer out of range); sent JSON")
        else:
            return Response(body, media_type=MSGPACK_TYPE)
    return _json(200, payload)


def _extensions(request: Request) -> set[str]:
    """Extensions this request asks for by name."""
    raw = [
        *request.query_params.getlist(EXTENSIONS_PARAM),
        request.headers.get("x-logsync-extensions", ""),
    ]
    return {name.strip().lower() for chunk in raw for name in chunk.split(",") if name.strip()}


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValidationError(f"{name}={shorten(raw)} is not an integer") from None


# ---------------------------------------------------------------- routes


def _server(request: Request) -> _Server:
    return request.app.state.logsync


async def healthz(request: Request) -> Response:
    return Response(b"ok\n", media_type="text/plain; charset=utf-8")


async def statusz(request: Request) -> Response:
    srv = _server(request)
    replica_id, vector, counts = await srv.run(
        lambda s: (s.replica_id, s.version_vector(), s.counts())
    )
    return _json(
        200,
        {
            "ok": True,
            "server": {
                "name": "logsync",
                "version": __version__,
                "transport": "http",
                "scheme": srv.cfg.scheme,
                "bind_host": srv.cfg.bind_host,
                "port": srv.cfg.port,
                "started_at": srv.started_at,
                "uptime_seconds": round(time.monotonic() - srv.started_monotonic, 3),
            },
            "replica_id": replica_id,
            "version_vector": vector,
            "counts": counts,
            "requests": {"total": srv.request_total, "by_status": dict(srv.status_counts)},
            "sse": {"clients": srv.sse_clients, "max_clients": srv.cfg.sse_max_clients},
            "extensions": _advertisement(srv.cfg.max_page)["extensions"],
        },
    )


async def metrics(request: Request) -> Response:
    srv = _server(request)
    body = await anyio.to_thread.run_sync(generate_latest, srv.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def _self_profile(replica_id: str, vector: Mapping[str, int]) -> dict[str, Any]:
    """Upstream's node self-description, every field derived, never configured."""
    return {
        "roles": ["agents"] if vector.get(replica_id) else [],
        "accelerator": None,
        "drawers": None,
        "hardware": platform.platform(),
        "advertised_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


async def _peer_states(srv: _Server) -> list[dict[str, Any]]:
    if srv.cfg.peer_state_provider is None:
        return []
    raw = await anyio.to_thread.run_sync(srv.cfg.peer_state_provider)
    return [_public_peer(entry) for entry in raw or [] if isinstance(entry, Mapping)]


def _advertisement(max_page: int) -> dict[str, Any]:
    return {"version": __version__, "extensions": list(EXTENSIONS), ADVERTISED_MAX_PAGE: max_page}


def _public_peer(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Upstream key order first, additive keys after, anything token-like dropped."""
    safe = {k: v for k, v in entry.items() if "token" not in str(k).lower()}
    ordered = {key: safe[key] for key in PEER_KEYS if key in safe}
    ordered.update((k, v) for k, v in safe.items() if k not in ordered)
    return ordered


def _profiles(peers: list[dict[str, Any]], replica_id: str, own: dict) -> dict[str, Any]:
    known = {
        peer["replica_id"]: peer["profile"]
        for peer in peers
        if isinstance(peer.get("replica_id"), str) and isinstance(peer.get("profile"), dict)
    }
    known[replica_id] = own
    return known


async def version_vector(request: Request) -> Response:
    srv = _server(request)
    replica_id, vector = await srv.run(lambda s: (s.replica_id, s.version_vector()))
    own = _self_profile(replica_id, vector)
    peers = await _peer_states(srv)
    return _answer(
        request,
        {
            "replica_id": replica_id,
            "version_vector": vector,
            "profile": own,
            "profiles": _profiles(peers, replica_id, own),
            ADVERTISEMENT_KEY: _advertisement(srv.cfg.max_page),
        },
    )


async def sync_ops(request: Request) -> Response:
    srv = _server(request)
    ext = _extensions(request)
    after = _int_param(request, "after", 0)
    limit = _int_param(request, "limit", UPSTREAM_PAGE)
    origin = request.query_params.get("origin") or ""
    if not origin:
        raise ValidationError("origin must be a non-empty replica id")
    if after < 0:
        raise ValidationError(f"after={after} must be a non-negative integer")
    if limit < 1:
        raise ValidationError(f"limit={limit} must be a positive integer")
    cap = srv.cfg.max_page if EXT_LARGE_PAGES in ext else UPSTREAM_PAGE
    limit = min(limit, cap)
    events = await srv.run(lambda s: s.list_ops(origin, after, limit, max_limit=cap))
    payload: dict[str, Any] = {"origin": origin, "events": events, "count": len(events)}
    if EXT_INLINE_ARTIFACTS in ext:
        budget = srv.cfg.inline_artifact_bytes
        payload["artifacts"] = await srv.run(lambda s: _page_artifacts(s, events, budget))
    return _answer(request, payload)


def _page_artifacts(store: Any, events: list[dict], budget: int) -> list[dict]:
    """The artifacts the page names (ordered by id), within a content byte budget."""
    wanted = {artifact_id for event in events for artifact_id in event.get("artifact_ids") or []}
    found, spent = [], 0
    for artifact in store.get_artifacts(wanted) if wanted else []:
        size = len(str(artifact.get("content", "")).encode("utf-8"))
        if found and spent + size > budget:
            break
        found.append(artifact)
        spent += size
    return found


async def sync_artifact(request: Request) -> Response:
    srv = _server(request)
    artifact_id = request.query_params.get("id") or ""
    if not artifact_id:
        raise ValidationError("id must be a non-empty artifact id")
    artifact = await srv.run(lambda s: s.get_artifact(artifact_id))
    if artifact is None:
        return _error(404, f"artifact {artifact_id!r} not found")
    return _answer(request, {"artifact": artifact})


async def sync_peers(request: Request) -> Response:
    srv = _server(request)
    replica_id, vector = await srv.run(lambda s: (s.replica_id, s.version_vector()))
    peers = await _peer_states(srv)
    own = _self_profile(replica_id, vector)
    named = {replica_id} | {p["replica_id"] for p in peers if isinstance(p.get("replica_id"), str)}
    in_process = srv.cfg.peer_state_provider is not None
    return _answer(
        request,
        {
            "self": {
                "replica_id": replica_id,
                "name": srv.cfg.node_name,
                "version_vector": vector,
                "profile": own,
            },
            "peers": peers,
            "unnamed_origins": sorted(set(vector) - named),
            "origin_profiles": _profiles(peers, replica_id, own),
            "sync_interval_s": srv.cfg.sync_interval_s,
            "estate_source": {
                "in_process": in_process,
                "published_at": None,
                "writer_alive": in_process,
            },
        },
    )


# ---------------------------------------------------------------- SSE


async def logstream_stream(request: Request) -> Response:
    """Validate filters and cursor (400 before any slot is taken), then stream."""
    srv = _server(request)
    query = request.query_params
    filters = {key: (query.get(key) or None) for key in SSE_FILTERS}
    cursor = query.get("since_event_id") or request.headers.get("last-event-id") or None

    def check(store: Any) -> tuple[str | None, str | None]:
        latest = store.latest_event_id()
        start = cursor if cursor is not None else latest
        store.list_events(since_event_id=start, limit=1, **filters)
        return start, latest

    start, latest = await srv.run(check)
    return _EventStream(srv, filters, start, latest)


class _EventStream(Response):
    """One SSE client: takes a slot, streams, and frees the slot the moment it leaves."""

    def __init__(self, srv: _Server, filters: dict, cursor: str | None, latest: str | None) -> None:
        super().__init__(status_code=200)
        self.srv, self.filters, self.cursor, self.latest = srv, filters, cursor, latest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        srv = self.srv
        if not srv.acquire_slot():
            busy = _error(
                503,
                f"{srv.sse_clients} stream clients are connected, the maximum; "
                f"retry after {SSE_RETRY_AFTER_S} s",
                {"Retry-After": str(SSE_RETRY_AFTER_S)},
            )
            await busy(scope, receive, send)
            return
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._until_disconnect, receive, group.cancel_scope)
                await self._stream(scope, send)
                group.cancel_scope.cancel()
        finally:
            srv.release_slot()

    async def _stream(self, scope: Scope, send: Send) -> None:
        """Stream until cancelled (client gone); a failing store or socket ends it cleanly."""
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        try:
            await self._pump(send)
        except OSError as exc:  # the client went away mid-write: the normal end of a stream
            logger.debug("stream client gone: %s", exc)
        except StoreError as exc:
            logger.error("stream ended, the store failed: %s", exc)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _until_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def _pump(self, send: Send) -> None:
        srv = self.srv
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        generation, seen, fetch = srv.notifier.generation, self.latest, True
        last_write = time.monotonic()
        while True:
            if fetch:
                async for frames in self._frames(seen):
                    await send({"type": "http.response.body", "body": frames, "more_body": True})
                    last_write = time.monotonic()
            idle = time.monotonic() - last_write
            if idle >= srv.cfg.sse_heartbeat_s:
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
                last_write, idle = time.monotonic(), 0.0
            wait = min(srv.cfg.sse_poll_s, srv.cfg.sse_heartbeat_s - idle)
            generation = await srv.notifier.wait(generation, wait)
            latest = await srv.probe.latest(generation)
            fetch, seen = latest != seen, latest

    async def _frames(self, seen: str | None) -> AsyncIterator[bytes]:
        """Every matching event after the cursor, in pages, as encoded SSE frames."""
        while True:
            events = await self.srv.run(
                functools.partial(_list_after, cursor=self.cursor, filters=self.filters)
            )
            if events:
                self.cursor = events[-1]["id"]
                yield b"".join(_frame(event) for event in events)
            elif self.cursor is None and seen is not None:
                # Nothing matched in a log that was empty at connect: resume after what we saw.
                self.cursor = seen
            if len(events) < SSE_BATCH:
                return


def _list_after(store: Any, *, cursor: str | None, filters: dict) -> list[dict]:
    return store.list_events(since_event_id=cursor, limit=SSE_BATCH, **filters)


_SSE_HEADERS = [
    (b"content-type", SSE_TYPE.encode()),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _frame(event: Mapping[str, Any]) -> bytes:
    return (
        f"id: {event['id']}\nevent: logstream\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
    ).encode()


# ---------------------------------------------------------------- policy


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
        refusal = self._refusal(path, headers) or await self._oversize(headers, receive)
        if refusal is not None:
            await refusal(scope, receive, counted)
            return
        await self.app(scope, receive, counted)

    def _refusal(self, path: str, headers: Headers) -> Response | None:
        srv = self.srv
        host = headers.get("host", "").strip().lower()
        if srv.cfg.pin_host and not _host_allowed(host, srv.cfg.allowed_hosts, srv.cfg.port):
            logger.warning("request refused: Host %r not allowed", host)
            return _error(403, f"Host header {shorten(host)} is not a loopback name")
        origin = headers.get("origin")
        if origin and not _origin_allowed(origin):
            logger.warning("request refused: cross-origin %r", origin)
            return _error(403, f"Origin {shorten(origin)} is not a loopback origin")
        if path != "/healthz" and srv.cfg.token and not _token_ok(headers, srv.cfg.token):
            return _error(
                401,
                "missing or wrong bearer token (send Authorization: Bearer <token>)",
                {"WWW-Authenticate": "Bearer"},
            )
        return None

    async def _oversize(self, headers: Headers, receive: Receive) -> Response | None:
        """413 for a body over the cap; a small body is read and dropped (all routes GET)."""
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
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            total += len(message.get("body", b""))
            if total > cap:
                return _error(413, f"request body exceeds the maximum of {cap} bytes")
            if not message.get("more_body", False):
                return None


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
    if port is not None:
        values |= {f"{name}:{port}" for name in names}
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
    return bool(sep) and port_text.isdigit() and name in allowed and not name.endswith(":")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}; use GET"
    elif exc.status_code == 404:
        message = f"no route {shorten(request.url.path)}; routes are {', '.join(ROUTES)}"
    else:
        message = str(exc.detail)
    return _error(exc.status_code, message, exc.headers)


async def _bad_input(request: Request, exc: Exception) -> Response:
    return _error(400, str(exc))


async def _store_failed(request: Request, exc: Exception) -> Response:
    logger.error("store error on %s: %s", request.url.path, exc)
    return _error(503, f"the store failed: {exc}", {"Retry-After": "1"})


# ---------------------------------------------------------------- factory


def create_app(
    store: Any,
    *,
    token: str | None = None,
    peer_state_provider: PeerStateProvider | None = None,
    bind_host: str = "127.0.0.1",
    port: int | None = None,
    extra_allowed_hosts: Iterable[str] = (),
    notifier: ChangeNotifier | None = None,
    sse_max_clients: int = 8,
    sse_heartbeat_s: float = 15.0,
    sse_poll_s: float = 0.1,
    max_page: int = LARGE_PAGE_CEILING,
    max_body_bytes: int = 64 * 1024,
    inline_artifact_bytes: int = 32 * 1024 * 1024,
    sync_interval_s: float = 15.0,
    node_name: str | None = None,
    scheme: str = "http",
) -> Starlette:
    """Build the ASGI app over a ``Store`` (or a zero-argument factory opening one).

    ``port=None`` accepts any port in a pinned Host header (for a port-0 bind). The Host
    pin applies only when ``bind_host`` is loopback, as upstream. ``app.state.notifier``
    is the ``ChangeNotifier`` writers should poke; ``app.state.logsync`` holds the rest.
    """
    _check_settings(sse_max_clients, sse_heartbeat_s, sse_poll_s, max_page, max_body_bytes)
    settings = Settings(
        token=token or None,
        peer_state_provider=peer_state_provider,
        bind_host=bind_host,
        port=port,
        pin_host=is_loopback_host(bind_host),
        allowed_hosts=frozenset(_allowed_host_values(bind_host, port, extra_allowed_hosts)),
        sse_max_clients=sse_max_clients,
        sse_heartbeat_s=sse_heartbeat_s,
        sse_poll_s=sse_poll_s,
        max_page=max_page,
        max_body_bytes=max_body_bytes,
        inline_artifact_bytes=inline_artifact_bytes,
        sync_interval_s=float(sync_interval_s),
        node_name=node_name or socket.gethostname(),
        scheme=scheme,
    )
    server = _Server(store, settings, notifier)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(server.close)

    app = Starlette(
        routes=[Route(path, endpoint, methods=["GET"]) for path, endpoint in _ENDPOINTS.items()],
        middleware=[Middleware(_Guard, server=server)],
        exception_handlers={
            HTTPException: _http_exception,
            ValueError: _bad_input,
            NotFoundError: _bad_input,
            StoreError: _store_failed,
        },
        lifespan=lifespan,
    )
    app.state.logsync = server
    app.state.notifier = server.notifier
    return app


def _check_settings(clients: int, heartbeat: float, poll: float, page: int, body: int) -> None:
    if clients < 0:
        raise ValidationError(f"sse_max_clients={clients} must be zero or more")
    if not heartbeat > 0 or not poll > 0:
        raise ValidationError(
            f"sse_heartbeat_s={heartbeat} and sse_poll_s={poll} must be positive seconds"
        )
    if page < UPSTREAM_PAGE:
        raise ValidationError(f"max_page={page} must be at least {UPSTREAM_PAGE}")
    if body < 0:
        raise ValidationError(f"max_body_bytes={body} must be zero or more")


_ENDPOINTS = {
    "/healthz": healthz,
    "/statusz": statusz,
    "/metrics": metrics,
    "/sync/version_vector": version_vector,
    "/sync/ops": sync_ops,
    "/sync/artifact": sync_artifact,
    "/sync/peers": sync_peers,
    "/logstream/stream": logstream_stream,
}
