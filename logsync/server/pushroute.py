"""`POST /sync/push`: HTTP around `logsync.pushed.accept_push` (the body's cap and
deadline, JSON decoding, the log line); the page's fate is decided there."""

from __future__ import annotations

import json
import logging

import anyio
from starlette.requests import Request
from starlette.responses import Response

from logsync.answers import MAX_CONTAINERS, count_containers
from logsync.errors import shorten
from logsync.ids import is_replica_id
from logsync.pushed import MAX_PUSH_BYTES, PUSHES_AT_ONCE, accept_push, push_answer_summary
from logsync.server.common import BodyRefused, _error, _json, _Server, read_body
from logsync.wire import PUSH_PATH

logger = logging.getLogger("logsync.server")


def _slots(srv: _Server) -> anyio.Semaphore:
    """The server's push slots, made on first use (on its event loop)."""
    slots = getattr(srv, "push_slots", None)
    if slots is None:
        slots = srv.push_slots = anyio.Semaphore(PUSHES_AT_ONCE)  # type: ignore[attr-defined]
    return slots


async def sync_push(request: Request) -> Response:
    srv: _Server = request.app.state.logsync
    if not srv.cfg.token:
        return _error(403, "this replica takes pushes only from authenticated peers and has "
                           "no token: serve it with --token, or let it pull from you")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        return _error(415, f"POST {PUSH_PATH} takes an application/json page, not "
                           f"{shorten(ctype or 'no Content-Type')}")
    async with _slots(srv):  # bodies in memory at once are bounded, whoever pushes
        try:
            raw = await read_body(request, MAX_PUSH_BYTES, srv.cfg.body_timeout_s)
        except BodyRefused as refused:
            return refused.response
        containers = count_containers(raw, packed=False)
        if containers > MAX_CONTAINERS:  # the bound a pulled answer has, before decoding
            return _error(413, f"the pushed body holds up to {containers} arrays or objects; "
                               f"the bound is {MAX_CONTAINERS}")
        try:
            body = await anyio.to_thread.run_sync(json.loads, raw)
        except (ValueError, RecursionError) as exc:
            return _error(400, f"the pushed body is not JSON ({str(exc)[:80]})")
        del raw
        sender = body.get("from") if isinstance(body, dict) else None
        host = request.client.host if request.client else "?"
        named = sender if isinstance(sender, str) and is_replica_id(sender) else "unnamed"
        pusher = f"{named}@{host}"  # a label for logs and ledgers, never trusted
        answer = await srv.run(lambda store: accept_push(store, body, pusher))
    if answer["applied"]:
        srv.notifier.notify()
        logger.info("push from %s: %s", pusher, push_answer_summary(answer))
    return _json(200, answer)
