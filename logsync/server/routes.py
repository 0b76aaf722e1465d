"""The route handlers: health, status, metrics, peers; the /sync/* answers come from
`logsync.responder`, and these handlers add only HTTP: threads, encoding, status codes."""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Mapping
from typing import Any

import anyio
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from logsync import __version__, responder
from logsync.errors import StoreError
from logsync.peers import redact_url
from logsync.responder import VectorExtra
from logsync.server.common import (
    JSON_TYPE,
    MSGPACK_TYPE,
    PEER_KEYS,
    _answer,
    _error,
    _json,
    _Server,
    _wants_msgpack,
)
from logsync.server.opcache import JSON, MSGPACK, page_reads
from logsync.server.pagecache import ReadLog, page_key
from logsync.server.pushroute import sync_push
from logsync.server.snapshotroute import sync_snapshot
from logsync.server.stream import (
    logstream_stream,
)
from logsync.snapshot import SNAPSHOT_PATH
from logsync.wire import EXTENSIONS_PARAM, PUSH_PATH
from logsync.zstdcoding import ZSTD, compress, request_accepts_zstd

logger = logging.getLogger("logsync.server")
# A page this large or larger goes zstd-coded to a puller that accepts it: pages of text
# shrink 5-30x, at ~1 GB/s; below, the frame and the puller's decoder cost more than
# the bytes saved.
MIN_CODED_BYTES = 1024


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
    try:
        peers = await _peer_states(srv)
    except StoreError as exc:
        problem = problem or str(exc)
        peers = []
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
            "extensions": list(srv.profile.extensions),
            "peers": peers,
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
    peers = await _peer_states(_server(request))

    def profiles(replica_id: str, vector: Mapping[str, int]) -> dict[str, Any]:
        own = _self_profile(replica_id, vector)
        return {"profile": own, "profiles": _profiles(peers, replica_id, own)}

    return await sync_answer(request, extra=profiles)


async def sync_answer(request: Request, extra: VectorExtra | None = None) -> Response:
    """A `/sync/*` answer from the responder, in the encoding the client negotiated."""
    srv = _server(request)
    path, params = request.url.path, _params(request)
    status, body = await srv.run(
        lambda s: responder.answer(s, path, params, profile=srv.profile, extra=extra)
    )
    if status != 200:
        return _json(status, body)  # errors are always JSON
    try:
        return _answer(request, body)
    except ValueError as exc:
        return _unencodable(srv, path, params, body, exc)


async def sync_ops(request: Request) -> Response:
    """`/sync/ops`: the answer kept in the server's `PageCache` while its reads replay the
    same, else the responder's page, encoded in the worker thread through the server's
    `OpCache` (the same bytes as `_answer`, ops joined from their held encodings)."""
    srv = _server(request)
    path, params = request.url.path, _params(request)
    encoding = MSGPACK if _wants_msgpack(request) else JSON
    asked = responder.extensions_asked(params, srv.profile)
    zstd = request_accepts_zstd(request.headers)
    key = page_key(encoding, params, ZSTD if zstd else "")

    def build(store: Any) -> tuple[int, dict, bytes | None, str | ValueError, str]:
        kept = srv.page_cache.answer(store, key)
        if kept is not None:
            return 200, {}, kept.data, kept.encoding, kept.coding
        reads = ReadLog(page_reads(store, srv.op_cache, encoding, asked))
        status, body = responder.answer(reads, path, params, profile=srv.profile)
        if status != 200:
            return status, body, None, encoding, ""
        data, how = _encode_page(srv, body, encoding)
        coding = ""
        if data is not None and zstd and len(data) >= MIN_CODED_BYTES:
            data, coding = compress(data), ZSTD
        if data is not None:
            srv.page_cache.put(store, key, reads, data, how, coding)  # type: ignore[arg-type]
        return status, body, data, how, coding

    status, body, data, how, coding = await srv.run(build)
    if status != 200:
        return _json(status, body)  # errors are always JSON
    if isinstance(how, ValueError):
        return _unencodable(srv, path, params, body, how)
    coded = {"Content-Encoding": coding, "Vary": "Accept-Encoding"} if coding else None
    return Response(data, media_type=MSGPACK_TYPE if how == MSGPACK else JSON_TYPE,
                    headers=coded)


def _encode_page(srv: _Server, body: dict, encoding: str) -> tuple[bytes | None,
                                                                  str | ValueError]:
    """The page's bytes and their encoding (msgpack if asked and possible, else JSON), or
    None and why it cannot be encoded."""
    if encoding == MSGPACK:
        try:
            return srv.op_cache.encode(body, MSGPACK), MSGPACK
        except (OverflowError, TypeError, ValueError):
            logger.info("answer not msgpack-encodable (integer out of range); sent JSON")
    try:
        return srv.op_cache.encode(body, JSON), JSON
    except ValueError as exc:
        return None, exc


def _params(request: Request) -> dict[str, str]:
    """The query as the responder reads it: `ext=` may repeat, and an
    `X-Logsync-Extensions` header names extensions too."""
    params = dict(request.query_params)
    asked = [
        *request.query_params.getlist(EXTENSIONS_PARAM),
        request.headers.get("x-logsync-extensions", ""),
    ]
    params[EXTENSIONS_PARAM] = ",".join(chunk for chunk in asked if chunk)
    return params


def _unencodable(
    srv: _Server, path: str, params: Mapping[str, str], body: dict, exc: ValueError
) -> Response:
    """A 500 naming what this replica holds but cannot serve (logged once per origin)."""
    if path != "/sync/ops":
        return _error(500, f"the answer to {path} cannot be encoded ({exc})")
    origin, after = body["origin"], responder.int_param(params, "after", 0)
    if srv.first_time(srv._unencodable, origin):
        logger.error("a page of origin %s after %d cannot be encoded: %s", origin, after, exc)
    return _error(
        500,
        f"the page of origin {origin} after {after} cannot be encoded "
        f"({exc}); this replica stored an op it cannot serve",
    )


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


_ENDPOINTS = {
    "/healthz": healthz,
    "/statusz": statusz,
    "/metrics": metrics,
    "/sync/version_vector": version_vector,
    "/sync/ops": sync_ops,
    "/sync/artifact": sync_answer,
    "/sync/digests": sync_answer,
    PUSH_PATH: sync_push,
    SNAPSHOT_PATH: sync_snapshot,
    "/sync/peers": sync_peers,
    "/logstream/stream": logstream_stream,
}

# Endpoints that take more than GET (everything else is GET only).
_METHODS: dict[str, tuple[str, ...]] = {PUSH_PATH: ("POST",)}
