"""`GET /sync/snapshot` (RFC 004 §7.6): HTTP around `logsync.snapshot.making`.

Bounds: one copy is made at a time (an `anyio.Lock`, so waiting requests hold no worker
thread) and shared by every request while the vector is unchanged; at most
`MAX_STREAMS` downloads run at once (503 beyond); a download must keep the pace of
`snapshot.transfer_behind` on what it was sent, or the connection is cut (the server's
write-stall limit, `limits.WRITE_STALL_S`, already cuts a client that reads nothing).

A joiner that sends `Accept-Encoding: zstd` gets the body as one zstd frame, preamble
and copy, compressed once when the copy was made (`making`): a
store's text shrinks several times over, so a joiner behind a real network waits for far
fewer bytes, and even on loopback the bytes both HTTP stacks handle shrink. Anyone else,
or every joiner when the copy has no frame, gets the file as it is.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, BinaryIO

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from logsync.server.common import _error, _Server
from logsync.snapshot import SHA256_HEADER, SIZE_HEADER, SNAPSHOT_TYPE, transfer_behind
from logsync.snapshot.making import SnapshotCache, SnapshotFile
from logsync.zstdcoding import request_accepts_zstd

logger = logging.getLogger("logsync.server")

MAX_STREAMS = 4
WARM_MAX_BYTES = 256 * 1024 * 1024  # a store up to this size is copied as the server starts
CHUNK = 256 * 1024


class SnapshotStreamTimeout(Exception):
    """A download ran past its deadline (ends the answer; the Guard logs nothing more)."""


async def sync_snapshot(request: Request) -> Response:
    srv: _Server = request.app.state.logsync
    state = _state(srv)
    if state.streams >= MAX_STREAMS:
        return _error(503, f"{state.streams} snapshot downloads are running, the maximum; "
                           "retry later", {"Retry-After": "5"}, code="busy")
    async with state.making:
        made = await srv.run(lambda store: _current(srv, store))
    if made is None:
        return _error(501, "this server's store cannot be copied as a snapshot")
    zstd = made.zstd_path is not None and request_accepts_zstd(request.headers)
    first = b"" if zstd else made.preamble()  # the frame holds the preamble
    try:  # held open: a replaced copy stays readable
        handle = (made.zstd_path if zstd and made.zstd_path else made.path).open("rb")
    except OSError as exc:
        return _error(503, f"the snapshot copy went missing ({exc.strerror}); retry",
                      {"Retry-After": "1"})
    size = os.fstat(handle.fileno()).st_size
    headers = {SHA256_HEADER: made.sha256, SIZE_HEADER: str(made.size),
               "Cache-Control": "no-store", "Vary": "Accept-Encoding",
               "Content-Length": str(len(first) + size)}
    if zstd:
        headers["Content-Encoding"] = "zstd"
    logger.info("serving a snapshot of %d bytes (%d origins%s)", made.size, len(made.vector),
                f", {size} as zstd" if zstd else "")
    state.streams += 1  # released by the answer however it ends, so taken just before it
    return _SnapshotResponse(
        lambda: _release(state, handle),
        _body(handle, first, time.monotonic(), made.size / size if size else 1.0),
        media_type=SNAPSHOT_TYPE, headers=headers,
    )


async def warm(srv: _Server) -> None:
    """Make the copy as the server starts, so the first joiner does not wait for it: for a
    store with events whose file is at most `WARM_MAX_BYTES` (a larger one is copied when
    first asked). A failure is logged once; the route makes its own copy later."""
    state = _state(srv)
    try:
        async with state.making:
            await srv.run(lambda store: _current(srv, store) if _worth_warming(store) else None)
    except Exception as exc:  # never the server's end: the route tries again when asked
        logger.warning("the snapshot could not be made ahead of a request: %s", exc)


def _worth_warming(store: object) -> bool:
    db_path = getattr(store, "db_path", None)
    try:
        small = db_path is not None and db_path.stat().st_size <= WARM_MAX_BYTES
    except OSError:
        return False
    return small and bool(store.version_vector())  # type: ignore[attr-defined]


class _State:
    def __init__(self) -> None:
        self.making = anyio.Lock()
        self.streams = 0
        self.cache: SnapshotCache | None = None

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def _state(srv: _Server) -> _State:
    if srv.snapshots is None:
        srv.snapshots = _State()
    return srv.snapshots


def _current(srv: _Server, store: object) -> SnapshotFile | None:
    state = _state(srv)
    db_path = getattr(store, "db_path", None)
    if db_path is None:
        return None
    if state.cache is None:
        state.cache = SnapshotCache(db_path, store.replica_id)  # type: ignore[attr-defined]
    return state.cache.current(store.version_vector())  # type: ignore[attr-defined]


class _SnapshotResponse(StreamingResponse):
    """Releases its download slot and file however the answer ends (a client that leaves
    before the first byte never starts the body's generator)."""

    def __init__(self, release: Callable[[], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _release(state: _State, handle: BinaryIO) -> None:
    if not handle.closed:
        handle.close()
        state.streams -= 1


async def _body(handle: BinaryIO, first: bytes, started: float,
                file_per_byte: float) -> AsyncIterator[bytes]:
    """The preamble (none before a zstd frame, which holds it), then the file (or the
    frame) a chunk at a time, each read on a worker thread; cut off when the joiner falls
    behind `transfer_behind`, counted in bytes of the file as the joiner counts them
    (`file_per_byte`: of the file per byte sent, above 1 for its zstd frame)."""
    if first:
        yield first
    sent = 0
    while True:
        if transfer_behind(started, int(sent * file_per_byte), time.monotonic()):
            logger.warning("a snapshot download fell behind (%d bytes sent): cut off", sent)
            raise SnapshotStreamTimeout("the snapshot download fell behind")
        chunk = await anyio.to_thread.run_sync(handle.read, CHUNK)
        if not chunk:
            return
        yield chunk
        sent += len(chunk)
