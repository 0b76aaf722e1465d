"""``/logstream/stream``: Server-Sent Events, and the ``ChangeNotifier`` that wakes them.

One stream per client, within ``sse_max_clients`` slots in total and
``sse_max_per_client`` per client address (loopback clients are exempt unless the app
says otherwise: on a loopback bind every client shares one address). A client that stops
reading loses its slot: every write is bounded by ``sse_send_timeout_s``, so a socket whose
buffer stays full ends the stream instead of holding the slot for good. When the server
begins to shut down, every stream ends its body cleanly within one poll interval, so
uvicorn has nothing to cancel (no CancelledError traceback, no graceful-shutdown wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from logsync.defaults import DEFAULT_COALESCE_S
from logsync.errorcodes import error_body
from logsync.errors import StoreError
from logsync.ids import is_replica_id
from logsync.outbox import parse_direct
from logsync.server.pagestream import PagePump
from logsync.streamframes import DIRECT_HEADER, FRAMES_HEADER, PAGES
from logsync.wire import REPLICA_HEADER

logger = logging.getLogger("logsync.server")

SSE_TYPE = "text/event-stream; charset=utf-8"
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
SHUTDOWN_FLUSH_S = 0.5  # how long the last (empty) write of a stream may wait at shutdown
COALESCE_S = DEFAULT_COALESCE_S  # frames within this long of the last write wait, batched


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


class StreamSettings(Protocol):
    """The stream's settings (part of `common.Settings`)."""

    sse_send_timeout_s: float
    sse_heartbeat_s: float
    sse_poll_s: float


class StreamHost(Protocol):
    """What the change stream needs of the server's shared state (`common._Server`); the
    stream holds this, so it never imports the module that imports it."""

    cfg: StreamSettings
    notifier: ChangeNotifier
    probe: _LatestProbe
    vector_probe: _LatestProbe  # the store's version vector, for page streams

    async def run(self, fn: Callable[[Any], Any]) -> Any: ...

    def acquire_slot(self, host: str = "") -> str | None: ...

    def release_slot(self, host: str = "") -> None: ...

    def shutting_down(self) -> bool: ...


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _LatestProbe:
    """The newest event id (or what `read` reads), looked up at most once per interval
    for all streams, and at once after a change."""

    def __init__(self, server: StreamHost, interval: float,
                 read: Callable[[Any], Any] = lambda store: store.latest_event_id()) -> None:
        self._server = server
        self._interval = interval
        self._read = read
        self._value: Any = None
        self._at = -math.inf
        self._generation = -1
        self._pending: anyio.Event | None = None

    async def latest(self, generation: int) -> Any:
        fresh = time.monotonic() - self._at < self._interval
        if generation == self._generation and fresh:
            return self._value
        if self._pending is not None:
            await self._pending.wait()
            return self._value
        self._pending = anyio.Event()
        try:
            value = await self._server.run(self._read)
            self._value, self._at, self._generation = value, time.monotonic(), generation
        finally:
            pending, self._pending = self._pending, None
            pending.set()
        return self._value


def _error(status: int, message: str, headers: Mapping[str, str] | None = None,
           code: str | None = None) -> Response:
    """An error answer (`logsync.errorcodes`); this module sits below `server.common`."""
    body = json.dumps(error_body(status, message, code), ensure_ascii=False).encode("utf-8")
    return Response(
        body, status_code=status, media_type="application/json; charset=utf-8", headers=headers
    )


def _client_host(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


async def logstream_stream(request: Request) -> Response:
    """Validate filters and cursor (400 before any slot is taken), then stream."""
    srv: StreamHost = request.app.state.logsync
    query = request.query_params
    filters = {key: (query.get(key) or None) for key in SSE_FILTERS}
    cursor = query.get("since_event_id") or request.headers.get("last-event-id") or None

    def check(store: Any) -> tuple[str | None, str | None]:
        latest = store.latest_event_id()
        start = cursor if cursor is not None else latest
        store.list_events(since_event_id=start, limit=1, **filters)
        return start, latest

    subscriber = request.headers.get(REPLICA_HEADER)
    holders = getattr(request.app.state, "holders", None)  # a daemon's `holders.Holders`
    coalesce = getattr(request.app.state, "frame_coalesce_s", COALESCE_S)  # a daemon's
    if request.headers.get(FRAMES_HEADER) == PAGES and holders is not None \
            and is_replica_id(subscriber) and not any(filters.values()):
        direct = parse_direct(request.headers.get(DIRECT_HEADER), is_replica_id)
        if isinstance(direct, str):
            return _error(400, f"{DIRECT_HEADER}: {direct}", code="bad_request")
        holders.forget(subscriber)  # a new stream: it may have restarted from a backup
        own = await srv.run(lambda store: store.replica_id)  # no SQL: the id it opened with
        pump = PagePump(direct, coalesce, functools.partial(holders.holds, subscriber))
        return _EventStream(srv, {}, None, None, pump=pump,
                            headers=[(REPLICA_HEADER.lower().encode(), own.encode())])
    start, latest = await srv.run(check)
    held = None
    if holders is not None and is_replica_id(subscriber):
        holders.forget(subscriber)  # a new stream: it may have restarted from a backup
        held = functools.partial(_held, holders, subscriber)
    return _EventStream(srv, filters, start, latest, held, coalesce)


def _held(holders: Any, subscriber: str, event: Mapping[str, Any]) -> bool:
    """No frame for an op the subscriber is known to hold (`logsync.holders`)."""
    seq = event.get("origin_seq")
    return isinstance(seq, int) and holders.holds(subscriber, event.get("origin_replica"), seq)


class _SendTimeout(Exception):
    """The client did not take a write within the send timeout: it is not reading."""


class _EventStream(Response):
    """One SSE client: takes a slot, streams, and frees the slot the moment it leaves."""

    def __init__(self, srv: StreamHost, filters: dict, cursor: str | None,
                 latest: str | None,
                 held: Callable[[Mapping[str, Any]], bool] | None = None,
                 coalesce: float = COALESCE_S,
                 pump: Callable[[StreamHost, Any], Any] | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(status_code=200)
        self.sse_headers = _SSE_HEADERS + (headers or [])  # a page stream names its server
        self.srv, self.filters, self.cursor, self.latest = srv, filters, cursor, latest
        self.held, self.coalesce = held, coalesce
        self.pump = pump  # a page-taking subscriber's writes (`pagestream.PagePump`)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        srv = self.srv
        host = _client_host(scope)
        refusal = srv.acquire_slot(host)
        if refusal is not None:
            busy = _error(
                503,
                f"{refusal}; retry after {SSE_RETRY_AFTER_S} s",
                {"Retry-After": str(SSE_RETRY_AFTER_S)},
                code="busy",
            )
            await busy(scope, receive, send)
            return
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._until_disconnect, receive, group.cancel_scope)
                await self._stream(scope, send, host)
                group.cancel_scope.cancel()
        finally:
            srv.release_slot(host)

    async def _stream(self, scope: Scope, send: Send, host: str) -> None:
        """Stream until the client leaves, stops reading, the store fails or we shut down."""
        timed = functools.partial(self._send, send)
        try:
            await timed({"type": "http.response.start", "status": 200,
                         "headers": self.sse_headers})
            if scope.get("method") == "HEAD":
                await timed({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await (self.pump(self.srv, timed) if self.pump is not None else self._pump(timed))
        except OSError as exc:  # the client went away mid-write: the normal end of a stream
            logger.debug("stream client gone: %s", exc)
            return
        except _SendTimeout:
            logger.info(
                "stream client %s evicted: it took no data for %g s",
                host or "?",
                self.srv.cfg.sse_send_timeout_s,
            )
            return
        except StoreError as exc:
            logger.error("stream ended, the store failed: %s", exc)
        with anyio.move_on_after(SHUTDOWN_FLUSH_S), contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send: Send, message: dict[str, Any]) -> None:
        try:
            with anyio.fail_after(self.srv.cfg.sse_send_timeout_s):
                await send(message)
        except TimeoutError:
            raise _SendTimeout from None

    @staticmethod
    async def _until_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def _pump(self, send: Any) -> None:
        """Frames until shutdown begins (then return: the caller ends the body)."""
        srv = self.srv
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        generation, seen, fetch = srv.notifier.generation, self.latest, True
        last_write, last_frames = time.monotonic(), -math.inf
        while not srv.shutting_down():
            if fetch:
                hold = last_frames + self.coalesce - time.monotonic()
                if hold > 0:  # frames went out within the window: the next batch at its end
                    await anyio.sleep(hold)
                    if srv.shutting_down():
                        return
                async for frames in self._frames(seen):
                    await send({"type": "http.response.body", "body": frames, "more_body": True})
                    last_write = last_frames = time.monotonic()
            idle = time.monotonic() - last_write
            if idle >= srv.cfg.sse_heartbeat_s:
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
                last_write, idle = time.monotonic(), 0.0
            wait = min(srv.cfg.sse_poll_s, srv.cfg.sse_heartbeat_s - idle)
            generation = await srv.notifier.wait(generation, wait)
            if srv.shutting_down():
                return
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
                held = self.held
                frames = b"".join(_frame(e) for e in events if held is None or not held(e))
                if frames:
                    yield frames
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
    try:
        data = json.dumps(event, ensure_ascii=False)
    except (RecursionError, ValueError, TypeError) as exc:
        logger.error(
            "event %s cannot be encoded as JSON (%s); left out of the stream",
            event.get("id"),
            type(exc).__name__,
        )
        return b""
    return f"id: {event['id']}\nevent: logstream\ndata: {data}\n\n".encode()
