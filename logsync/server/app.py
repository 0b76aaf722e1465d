"""``create_app``: the Starlette app over a store, with its policy and routes."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterable

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Route

from logsync.errors import NotFoundError, StoreError, ValidationError
from logsync.responder import (
    DEFAULT_INLINE_ARTIFACT_BYTES,
    DEFAULT_MAX_PAGE_BYTES,
    MAX_PAGE_BYTES_CEILING,
    MIN_PAGE_BYTES,
)
from logsync.server.common import (
    UPSTREAM_PAGE,
    HealthProbe,
    PeerStateProvider,
    ServedStore,
    Settings,
    StoreFactory,
    _Server,
    is_loopback_host,
)
from logsync.server.opcache import DEFAULT_OP_CACHE_BYTES
from logsync.server.pagecache import DEFAULT_PAGE_CACHE_BYTES
from logsync.server.peermetrics import PeerCollector
from logsync.server.policy import (
    _allowed_host_values,
    _bad_input,
    _Guard,
    _http_exception,
    _store_failed,
)
from logsync.server.routes import (
    _ENDPOINTS,
    _METHODS,
)
from logsync.server.snapshotroute import warm as warm_snapshot
from logsync.server.statuspage import PAGE_ENDPOINTS, PAGE_METHODS
from logsync.server.stream import (
    ChangeNotifier,
)
from logsync.wire import (
    LARGE_PAGE_CEILING,
)

# ---------------------------------------------------------------- factory


def create_app(
    store: ServedStore | None = None,
    *,
    store_factory: StoreFactory | None = None,
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
    inline_artifact_bytes: int = DEFAULT_INLINE_ARTIFACT_BYTES,
    sync_interval_s: float = 15.0,
    node_name: str | None = None,
    scheme: str = "http",
    health: HealthProbe | None = None,
    sse_max_per_client: int = 2,
    sse_per_client_exempt: Iterable[str] = ("127.0.0.1", "::1"),
    sse_send_timeout_s: float = 10.0,
    body_timeout_s: float = 10.0,
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
    snapshot_ahead: bool = True,
    op_cache_bytes: int = DEFAULT_OP_CACHE_BYTES,
    page_cache_bytes: int = DEFAULT_PAGE_CACHE_BYTES,
) -> Starlette:
    """Build the ASGI app over a ``Store``, or over ``store_factory``, a zero-argument
    callable that opens one on first use (the app then closes it).

    ``port=None`` accepts any port in a pinned Host header (for a port-0 bind). The Host
    pin applies only when ``bind_host`` is loopback, as upstream. ``app.state.notifier``
    is the ``ChangeNotifier`` writers should poke; ``app.state.logsync`` holds the rest
    (its ``begin_shutdown()`` ends every event stream; ``exit_probe``, a callable such as
    ``lambda: server.should_exit``, lets streams notice a shutdown by themselves).

    ``health`` is a cheap, non-blocking callable: while it returns a sentence, every
    ``/sync/*`` and ``/logstream/*`` request is answered 503 (code ``unavailable``, "the
    store is unavailable: <sentence>") with ``Retry-After: 5``; ``/healthz`` stays 200 and
    ``/statusz`` shows the sentence. Event streams allow ``sse_max_per_client`` per client
    address (addresses in ``sse_per_client_exempt`` share only the total) and evict a client
    that takes no write for ``sse_send_timeout_s``. With ``large_pages`` negotiated,
    ``/sync/ops`` stops before the event that would push the page past ``max_page_bytes``
    of event JSON (always at least one event); upstream requests are unchanged.
    ``snapshot_ahead`` makes the snapshot copy as the server starts (`snapshotroute.warm`).
    ``op_cache_bytes`` bounds the encoded ops kept for ``/sync/ops`` answers (0: none;
    `opcache.py`), ``page_cache_bytes`` the whole answers kept (0: none; `pagecache.py`).
    """
    _check_settings(sse_max_clients, sse_heartbeat_s, sse_poll_s, max_page, max_body_bytes)
    if not body_timeout_s > 0:
        raise ValidationError(f"body_timeout_s={body_timeout_s} must be positive seconds")
    if sse_max_per_client < 1 or not sse_send_timeout_s > 0 or max_page_bytes < 1:
        raise ValidationError(
            f"sse_max_per_client={sse_max_per_client}, sse_send_timeout_s="
            f"{sse_send_timeout_s} and max_page_bytes={max_page_bytes} must be positive"
        )
    if not MIN_PAGE_BYTES <= max_page_bytes <= MAX_PAGE_BYTES_CEILING:
        raise ValidationError(f"max_page_bytes={max_page_bytes} must be from {MIN_PAGE_BYTES} "
                              f"(an empty page with its chain) to {MAX_PAGE_BYTES_CEILING} "
                              "(32 MiB, half what a puller takes)")
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
        body_timeout_s=float(body_timeout_s),
        max_page_bytes=max_page_bytes,
        op_cache_bytes=max(0, op_cache_bytes),
        page_cache_bytes=max(0, page_cache_bytes),
    )
    server = _Server(store, store_factory, settings, notifier)
    server.registry.register(PeerCollector(peer_state_provider))
    endpoints = {**_ENDPOINTS, **PAGE_ENDPOINTS}
    methods = {**_METHODS, **PAGE_METHODS}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with anyio.create_task_group() as group:
                if snapshot_ahead:
                    group.start_soon(warm_snapshot, server)
                yield
                group.cancel_scope.cancel()
        finally:
            await anyio.to_thread.run_sync(server.close)

    app = Starlette(
        routes=[Route(path, endpoint, methods=list(methods.get(path, ("GET",))))
                for path, endpoint in endpoints.items()],
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
