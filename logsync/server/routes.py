"""The route handlers: health, status, metrics, the /sync/* routes and the page budget."""

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

from logsync import __version__
from logsync.errors import StoreError, ValidationError
from logsync.peers import redact_url
from logsync.server.common import (
    EVENT_OVERHEAD_BYTES,
    EXTENSIONS,
    PEER_KEYS,
    UPSTREAM_PAGE,
    Settings,
    _answer,
    _error,
    _extensions,
    _int_param,
    _json,
    _Server,
    json_bytes,
)
from logsync.server.stream import (
    logstream_stream,
)
from logsync.wire import (
    ADVERTISED_MAX_PAGE,
    ADVERTISED_MAX_PAGE_BYTES,
    ADVERTISEMENT_KEY,
    EXT_INLINE_ARTIFACTS,
    EXT_LARGE_PAGES,
)

logger = logging.getLogger("logsync.server")


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
        return _error(
            500,
            f"the page of origin {origin} after {after} cannot be encoded "
            f"({exc}); this replica stored an op it cannot serve",
        )


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
