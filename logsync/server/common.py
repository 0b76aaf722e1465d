"""What the server's modules share: settings, the per-app state, answer encoding."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import msgpack
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response

from logsync.errorcodes import error_body
from logsync.pushed import MAX_PUSH_BYTES
from logsync.responder import DEFAULT_MAX_PAGE_BYTES, EXTENSIONS, Profile, json_bytes
from logsync.server.opcache import DEFAULT_OP_CACHE_BYTES, OpCache
from logsync.server.pagecache import DEFAULT_PAGE_CACHE_BYTES, PageCache
from logsync.server.stream import (
    ChangeNotifier,
    _LatestProbe,
)
from logsync.store.checkpoints import LogState
from logsync.wire import EXT_PUSH, EXT_SNAPSHOT, PUSH_PATH, UPSTREAM_PAGE_LIMIT

logger = logging.getLogger("logsync.server")


UPSTREAM_PAGE = UPSTREAM_PAGE_LIMIT
JSON_TYPE = "application/json; charset=utf-8"
MSGPACK_TYPE = "application/msgpack"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")
ORIGIN_LOOPBACK = ("127.0.0.1", "localhost", "::1")
STORE_RETRY_AFTER_S = 5
GUARDED_PREFIXES = ("/sync/", "/logstream/")
# Routes that read their own request body under their own cap (`read_body`); the guard
# neither caps nor drains it for them (`/login`: the status page's form).
OWN_BODY_ROUTES: set[str] = {PUSH_PATH, "/login"}
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
    "/sync/digests",
    "/sync/push",
    "/sync/snapshot",
    "/sync/peers",
    "/logstream/stream",
    "/",
    "/login",
    "/logout",
    "/conflicts.json",
    "/quarantine.json",
)

PeerStateProvider = Callable[[], list[dict[str, Any]]]
HealthProbe = Callable[[], "str | None"]


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
    # the operator's two ledgers also under the short names dashboards look for first;
    # `logsync_conflicts_unreviewed` where the store counts reviews
    SHORT = {"logsync_conflicts": "conflicts", "logsync_quarantined": "quarantined",
             "logsync_conflicts_unreviewed": "conflicts_unreviewed"}

    def __init__(self, server: _Server) -> None:
        self._server = server

    def describe(self) -> list[Metric]:
        return [self._family(f"logsync_store_{name}", name) for name in self.NAMES] + [
            self._family(metric, name) for metric, name in self.SHORT.items()] + \
            self._log_families(LogState(0, 0, 0, 0, None))

    def collect(self) -> list[Metric]:
        store = self._server.store_now()
        counts = store.counts(unreviewed=True)
        families: list[Metric] = self._log_families(store.log_state())
        named = [(f"logsync_store_{name}", name) for name in self.NAMES]
        for metric, name in named + list(self.SHORT.items()):
            if name not in counts and metric not in dict(named):
                continue
            family = self._family(metric, name)
            family.add_metric([], float(counts.get(name, 0)))
            families.append(family)
        return families

    @staticmethod
    def _family(metric: str, name: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(metric, f"{name} held in this replica's store")

    @staticmethod
    def _log_families(state: LogState) -> list[Metric]:
        """The write-ahead log: its size, and the copies bulk mode made beside a pull."""
        size = GaugeMetricFamily("logsync_store_log_bytes",
                                 "size of the store's write-ahead log file (-wal)")
        size.add_metric([], float(state.log_bytes))
        families: list[Metric] = [size]
        for name, value, text in (
                ("checkpoints", state.checkpoints, "log copies into the database run beside "
                 "a pull (bulk mode)"),
                ("checkpoints_busy", state.busy, "log copies another connection kept busy"),
                ("checkpoint_failures", state.failures, "log copies, checkpointer threads or "
                 "their connections that failed")):
            family = CounterMetricFamily(f"logsync_store_log_{name}", text)
            family.add_metric([], float(value))
            families.append(family)
        return families


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
    # A request body must arrive within this: a client dripping one would otherwise hold
    # one of the LIMIT_CONCURRENCY request slots for good (answers: limits.WRITE_STALL_S).
    body_timeout_s: float = 10.0
    # Encoded ops kept for `/sync/ops` answers (`opcache.py`); 0 keeps none.
    op_cache_bytes: int = DEFAULT_OP_CACHE_BYTES
    # Whole encoded `/sync/ops` answers (`pagecache.py`); 0 keeps none.
    page_cache_bytes: int = DEFAULT_PAGE_CACHE_BYTES


class ServedStore(Protocol):
    """What the server reads of `logsync.store.Store` (the responder's reads included)."""

    @property
    def replica_id(self) -> str: ...

    def version_vector(self) -> dict[str, int]: ...

    def list_ops(self, origin: str, after: int = 0, limit: int = 500, *,
                 max_limit: int = 500) -> list[dict]: ...

    def get_artifact(self, artifact_id: str) -> dict | None: ...

    def get_artifacts(self, ids: Iterable[str]) -> list[dict]: ...

    def list_events(self, **filters: Any) -> list[dict]: ...

    def latest_event_id(self) -> str | None: ...

    def counts(self) -> dict[str, int]: ...

    def close(self) -> None: ...


StoreFactory = Callable[[], ServedStore]


class _Server:
    """Everything the routes share: the store, the policy, SSE slots, metrics."""

    def __init__(self, store: ServedStore | None, factory: StoreFactory | None,
                 settings: Settings, notifier: ChangeNotifier | None) -> None:
        self.cfg = settings
        self.profile = Profile(
            # pushes are taken only from authenticated peers: a server with a token
            # a snapshot is a read like /sync/ops: served with or without a token
            extensions=EXTENSIONS + ((EXT_PUSH,) if settings.token else ()) + (EXT_SNAPSHOT,),
            max_page=settings.max_page,
            max_page_bytes=settings.max_page_bytes,
            inline_artifact_bytes=settings.inline_artifact_bytes,
            max_push_bytes=MAX_PUSH_BYTES,
        )
        self._store_lock = threading.Lock()
        if (store is None) == (factory is None):
            raise ValueError("create_app takes a store or a store_factory, one of the two")
        # A store handed in belongs to the caller; one the factory opens, to this app.
        self._store, self._factory, self.owns_store = store, factory, store is None
        self.notifier = notifier or ChangeNotifier()
        self.probe = _LatestProbe(self, settings.sse_poll_s)
        self.vector_probe = _LatestProbe(self, settings.sse_poll_s,
                                         read=lambda store: store.version_vector())
        self.sse_clients = 0
        self.sse_by_host: dict[str, int] = {}
        self._shutdown = False
        self.exit_probe: Callable[[], bool] | None = None
        self._unencodable: set[str] = set()
        self.op_cache = OpCache(settings.op_cache_bytes)
        self.page_cache = PageCache(settings.page_cache_bytes)
        self.snapshots: Any = None  # `snapshotroute._State`, made on the first request
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
                assert self._factory is not None
                self._store = self._factory()
            return self._store

    async def run(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(store)`` in a worker thread: store calls are blocking SQLite."""
        return await anyio.to_thread.run_sync(lambda: fn(self.store_now()))

    def close(self) -> None:
        """Close a store this app opened itself; a store handed in belongs to the caller."""
        if self.snapshots is not None:
            self.snapshots.close()  # the cached copy goes at shutdown
        self.op_cache.clear()
        self.page_cache.clear()
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
            return f"{held} streams are open from {host}, the maximum for one client address"
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


def _json(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(json_bytes(payload), status_code=status, media_type=JSON_TYPE, headers=headers)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None,
           code: str | None = None) -> Response:
    """An error answer: `{"error": CODE, "reason": message}` (`logsync.errorcodes`; the
    guard rewords it as upstream's on the upstream routes, `server/policy.py`)."""
    return _json(status, error_body(status, message, code), headers)


class BodyRefused(Exception):
    """A request body over its cap or too slow; `response` is the one-sentence answer."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


async def read_body(request: Request, cap: int, timeout_s: float) -> bytes:
    """The whole body of a route in `OWN_BODY_ROUTES`, at most `cap` bytes, arriving within
    `timeout_s`: a bigger one is 413 and a slow one 408 (`BodyRefused`), never buffered."""
    length = request.headers.get("content-length", "").strip()
    if length.isdigit() and int(length) > cap:
        raise BodyRefused(_error(413, f"request body is {int(length)} bytes; maximum is "
                                      f"{cap} bytes"))
    chunks, total = [], 0
    with anyio.move_on_after(timeout_s) as scope:
        async for chunk in request.stream():
            total += len(chunk)
            if total > cap:
                raise BodyRefused(_error(413, f"request body exceeds the maximum of {cap} "
                                              "bytes"))
            chunks.append(chunk)
    if scope.cancelled_caught:
        raise BodyRefused(_error(408, f"the request body did not arrive within {timeout_s:g} s"))
    return b"".join(chunks)


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
