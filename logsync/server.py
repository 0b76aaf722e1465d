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

import contextlib
import hmac
import ipaddress
import json
import logging
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
from logsync.peers import redact_url
from logsync.server_stream import (
    SSE_FILTERS,
    SSE_TYPE,
    ChangeNotifier,
    _LatestProbe,
    logstream_stream,
)

logger = logging.getLogger("logsync.server")

UPSTREAM_PAGE = UPSTREAM_PAGE_LIMIT
JSON_TYPE = "application/json; charset=utf-8"
MSGPACK_TYPE = "application/msgpack"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
ORIGIN_LOOPBACK = ("127.0.0.1", "localhost", "::1")
STORE_RETRY_AFTER_S = 5
DEFAULT_MAX_PAGE_BYTES = 8 * 1024 * 1024
ADVERTISED_MAX_PAGE_BYTES = "max_page_bytes"
EVENT_OVERHEAD_BYTES = 2  # ", " between events in the JSON array
GUARDED_PREFIXES = ("/sync/", "/logstream/")
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
HealthProbe = Callable[[], "str | None"]
__all__ = ["ChangeNotifier", "create_app", "is_loopback_host", "json_bytes", "SSE_FILTERS",
           "SSE_TYPE"]


def is_loopback_host(host: str) -> bool:
    """Whether a bind address (or Host name) only reaches this machine."""
    name = (host or "").strip().lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


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
    health: HealthProbe | None = None
    sse_max_per_client: int = 2
    sse_per_client_exempt: frozenset[str] = frozenset()
    sse_send_timeout_s: float = 10.0
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES


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
        self.sse_by_host: dict[str, int] = {}
        self._shutdown = False
        self.exit_probe: Callable[[], bool] | None = None
        self._unencodable: set[str] = set()
        self._crashed_routes: set[str] = set()
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

    def acquire_slot(self, host: str = "") -> str | None:
        """Take a stream slot for a client address; None when taken, else why not."""
        if self.sse_clients >= self.cfg.sse_max_clients:
            return f"{self.sse_clients} stream clients are connected, the maximum"
        held = self.sse_by_host.get(host, 0)
        limited = host not in self.cfg.sse_per_client_exempt
        if limited and held >= self.cfg.sse_max_per_client:
            return (f"{held} streams are open from {host}, the maximum for one client "
                    "address")
        self.sse_clients += 1
        self.sse_by_host[host] = held + 1
        return None

    def release_slot(self, host: str = "") -> None:
        self.sse_clients -= 1
        left = self.sse_by_host.get(host, 1) - 1
        if left > 0:
            self.sse_by_host[host] = left
        else:
            self.sse_by_host.pop(host, None)

    # ── shutdown and store health ─────────────────────────────────────

    def begin_shutdown(self) -> None:
        """End every event stream now (the daemon calls this when a signal arrives)."""
        self._shutdown = True
        self.notifier.notify()

    def shutting_down(self) -> bool:
        if not self._shutdown and self.exit_probe is not None and self.exit_probe():
            self.begin_shutdown()
        return self._shutdown

    def store_problem(self) -> str | None:
        """The health probe's sentence (None when healthy or when there is no probe)."""
        if self.cfg.health is None:
            return None
        try:
            return self.cfg.health()
        except Exception as exc:  # a broken probe must not take the routes down with it
            logger.warning("the store health probe failed: %s", exc)
            return None

    def first_time(self, seen: set[str], key: str) -> bool:
        if key in seen:
            return False
        seen.add(key)
        return True


# ---------------------------------------------------------------- encoding


def json_bytes(payload: Any) -> bytes:
    """Upstream's encoding: default separators, non-ASCII kept, UTF-8.

    Raises ``ValueError`` (never ``RecursionError``) when the payload cannot be encoded.
    """
    try:
        return json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise ValueError("the payload nests too deeply to encode as JSON") from None


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
    problem = srv.store_problem()
    try:
        replica_id, vector, counts = await srv.run(
            lambda s: (s.replica_id, s.version_vector(), s.counts())
        )
    except StoreError as exc:
        problem = problem or str(exc)
        replica_id, vector, counts = None, None, None
    return _json(
        200,
        {
            "ok": problem is None,
            "store_problem": problem,
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
            "sse": {
                "clients": srv.sse_clients,
                "max_clients": srv.cfg.sse_max_clients,
                "max_per_client": srv.cfg.sse_max_per_client,
            },
            "extensions": _advertisement(srv.cfg)["extensions"],
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


def _advertisement(cfg: Settings) -> dict[str, Any]:
    return {
        "version": __version__,
        "extensions": list(EXTENSIONS),
        ADVERTISED_MAX_PAGE: cfg.max_page,
        ADVERTISED_MAX_PAGE_BYTES: cfg.max_page_bytes,
    }


def _public_peer(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Upstream key order first, additive keys after, anything token-like dropped."""
    safe = {k: v for k, v in entry.items() if "token" not in str(k).lower()}
    if isinstance(safe.get("url"), str):
        safe["url"] = redact_url(safe["url"])
    if isinstance(safe.get("name"), str) and "@" in safe["name"]:
        safe["name"] = redact_url(safe["name"])  # an unnamed peer is known by its URL
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
            ADVERTISEMENT_KEY: _advertisement(srv.cfg),
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
    large = EXT_LARGE_PAGES in ext
    cap = srv.cfg.max_page if large else UPSTREAM_PAGE
    limit = min(limit, cap)
    if large:  # negotiated: pages stop at the byte budget (always at least one event)
        budget = srv.cfg.max_page_bytes
        events = await srv.run(lambda s: _budget_page(s, origin, after, limit, cap, budget))
    else:  # a MemPalace hub client gets exactly upstream's page
        events = await srv.run(lambda s: s.list_ops(origin, after, limit, max_limit=cap))
    payload: dict[str, Any] = {"origin": origin, "events": events, "count": len(events)}
    if EXT_INLINE_ARTIFACTS in ext:
        budget = srv.cfg.inline_artifact_bytes
        payload["artifacts"] = await srv.run(lambda s: _page_artifacts(s, events, budget))
    try:
        return _answer(request, payload)
    except ValueError as exc:
        if srv.first_time(srv._unencodable, origin):
            logger.error("a page of origin %s after %d cannot be encoded: %s", origin, after, exc)
        return _error(500, f"the page of origin {origin} after {after} cannot be encoded "
                           f"({exc}); this replica stored an op it cannot serve")


PAGE_READ_BATCH = 100


def _budget_page(
    store: Any, origin: str, after: int, limit: int, cap: int, budget: int
) -> list[dict]:
    """Up to ``limit`` ops, read in batches, stopping before the one that would push the
    encoded events past ``budget`` bytes (the first op is always included)."""
    events: list[dict] = []
    spent = 0
    cursor = after
    while len(events) < limit:
        batch = store.list_ops(
            origin, cursor, min(PAGE_READ_BATCH, limit - len(events)), max_limit=cap
        )
        for event in batch:
            size = _event_size(event) + EVENT_OVERHEAD_BYTES
            if events and spent + size > budget:
                return events
            events.append(event)
            spent += size
        if len(batch) < PAGE_READ_BATCH:
            return events
        cursor = batch[-1]["origin_seq"]
    return events


def _event_size(event: dict) -> int:
    """The event's JSON size (an undecodable one counts as its body and metadata)."""
    try:
        return len(json_bytes(event))
    except ValueError:
        return len(str(event.get("body", "")).encode("utf-8", "replace"))


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
            await _error(500, f"internal error on {shorten(path)} ({type(exc).__name__}); "
                              "see the server log")(scope, receive, counted)

    def _unavailable(self) -> Response | None:
        problem = self.srv.store_problem()
        if problem is None:
            return None
        return _error(503, f"the store is unavailable: {problem}",
                      {"Retry-After": str(STORE_RETRY_AFTER_S)})

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
    health: HealthProbe | None = None,
    sse_max_per_client: int = 2,
    sse_per_client_exempt: Iterable[str] = ("127.0.0.1", "::1"),
    sse_send_timeout_s: float = 10.0,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
) -> Starlette:
    """Build the ASGI app over a ``Store`` (or a zero-argument factory opening one).

    ``port=None`` accepts any port in a pinned Host header (for a port-0 bind). The Host
    pin applies only when ``bind_host`` is loopback, as upstream. ``app.state.notifier``
    is the ``ChangeNotifier`` writers should poke; ``app.state.logsync`` holds the rest
    (its ``begin_shutdown()`` ends every event stream; ``exit_probe``, a callable such as
    ``lambda: server.should_exit``, lets streams notice a shutdown by themselves).

    ``health`` is a cheap, non-blocking callable: while it returns a sentence, every
    ``/sync/*`` and ``/logstream/*`` request is answered 503 ``{"error": "the store is
    unavailable: <sentence>"}`` with ``Retry-After: 5``; ``/healthz`` stays 200 and
    ``/statusz`` shows the sentence. Event streams allow ``sse_max_per_client`` per client
    address (addresses in ``sse_per_client_exempt`` share only the total) and evict a client
    that takes no write for ``sse_send_timeout_s``. With ``large_pages`` negotiated,
    ``/sync/ops`` stops before the event that would push the page past ``max_page_bytes``
    of event JSON (always at least one event); upstream requests are unchanged.
    """
    _check_settings(sse_max_clients, sse_heartbeat_s, sse_poll_s, max_page, max_body_bytes)
    if sse_max_per_client < 1 or not sse_send_timeout_s > 0 or max_page_bytes < 1:
        raise ValidationError(
            f"sse_max_per_client={sse_max_per_client}, sse_send_timeout_s="
            f"{sse_send_timeout_s} and max_page_bytes={max_page_bytes} must be positive"
        )
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
        health=health,
        sse_max_per_client=sse_max_per_client,
        sse_per_client_exempt=frozenset(sse_per_client_exempt),
        sse_send_timeout_s=float(sse_send_timeout_s),
        max_page_bytes=max_page_bytes,
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
