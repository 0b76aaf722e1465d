"""Planted deviations for the conformance kit (tests/test_conformance.py): an ASGI wrapper
around logsync's real app that breaks one RFC 004 rule on the way out, and hostile peers
on raw sockets (garbage, an endless body, silence, a drip).

Every `/sync/*` answer but the snapshot goes through the same buffering path whatever
the deviation, so `DeviantPeer(app, None)` (no deviation) passing proves the wrapper
itself breaks nothing.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode

# The deviations and the RFC 004 section whose check must catch each.
REVERSED = "reversed"  # §7.2: a page's events in descending origin_seq
OFF_BY_ONE = "off_by_one"  # §7.2: `after=k` serves op k too
NO_BUDGET = "no_budget"  # §8: advertises a small max_page_bytes, serves full pages
UPSTREAM_ERRORS = "upstream_errors"  # §11: {"error": sentence} while advertising logsync
WRONG_DIGEST = "wrong_digest"  # §7.4: /sync/digests gives another chain
TAMPERED_ARTIFACT = "tampered_artifact"  # §7.3: content that no longer hashes to its sha256
NO_STREAM = "no_stream"  # §7.7: no change stream at all (404): allowed, the check is n/a
SMALL_BUDGET = 2048


class DeviantPeer:
    """Wraps an ASGI app; `deviation` None passes every answer through unchanged."""

    def __init__(self, app: Any, deviation: str | None) -> None:
        self.app = app
        self.deviation = deviation

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if self.deviation == NO_STREAM and path == "/logstream/stream":
            body = b'{"error": "not_found", "reason": "no change stream here"}'
            await send({"type": "http.response.start", "status": 404, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] != "http" or not path.startswith("/sync/") or path == "/sync/snapshot":
            await self.app(scope, receive, send)
            return
        if self.deviation == OFF_BY_ONE and path == "/sync/ops":
            scope = dict(scope, query_string=_one_lower(scope.get("query_string", b"")))
        start, whole = await captured(self.app, scope, receive)
        body = self._mutate(path, start["status"], dict(start.get("headers") or []), whole)
        headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": start["status"], "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _mutate(self, path: str, status: int, headers: dict[bytes, bytes], body: bytes) -> bytes:
        if self.deviation is None or not headers.get(b"content-type", b"").startswith(
                b"application/json"):
            return body
        data = json.loads(body)
        if self.deviation == REVERSED and path == "/sync/ops" and status == 200:
            data["events"].reverse()
        elif self.deviation == NO_BUDGET and path == "/sync/version_vector" and status == 200:
            data["logsync"]["max_page_bytes"] = SMALL_BUDGET
        elif self.deviation == UPSTREAM_ERRORS and status >= 400 and "reason" in data:
            data = {"error": data["reason"]}
        elif self.deviation == WRONG_DIGEST and path == "/sync/digests" and status == 200:
            row = data["digests"][-2]  # one the chain reaches ([seq, None] past the top)
            row[1] = ("0" if row[1][0] != "0" else "1") + row[1][1:]
        elif self.deviation == TAMPERED_ARTIFACT and path == "/sync/artifact" and status == 200:
            data["artifact"]["content"] += "tampered"
        else:
            return body
        return json.dumps(data, ensure_ascii=False).encode("utf-8")


async def captured(app: Any, scope: dict[str, Any], receive: Any) -> tuple[dict[str, Any],
                                                                            bytes]:
    """The ASGI app's whole answer to one request: its start message and its body, for a
    wrapper to change before it sends them on."""
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def keep(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, keep)
    return start, b"".join(chunks)


def _one_lower(query: bytes) -> bytes:
    """`after=k` becomes `after=k-1` (k > 0): the page then starts with op k itself."""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    out = [(k, str(int(v) - 1) if k == "after" and v.isdigit() and int(v) > 0 else v)
           for k, v in pairs]
    return urlencode(out).encode("latin-1")


# ── hostile peers on raw sockets ──────────────────────────────────────


@contextmanager
def hostile_peer(kind: str) -> Iterator[str]:
    """A loopback peer that answers every request with `kind`: "garbage" (200 with bytes
    that are not JSON), "endless" (200 JSON that never ends, fast), "silent" (accepts,
    never answers), "drip" (headers, then a byte every 0.2 s) or "header_drip" (a head
that never ends, a byte every 0.2 s). Yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()
    open_conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            open_conns.append(conn)
            threading.Thread(target=_answer, args=(conn, kind, stop), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in open_conns:
            conn.close()
        listener.close()


def _answer(conn: socket.socket, kind: str, stop: threading.Event) -> None:
    try:
        conn.recv(65536)
        if kind == "silent":
            stop.wait(30)
            return
        if kind == "garbage":
            body = b"\x00\xffnot json at all {{{"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            return
        if kind == "header_drip":  # the head itself never ends: per-read timeouts never trip
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not stop.is_set():
                conn.sendall(b"a")
                time.sleep(0.2)
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\n\r\n")
        if kind == "endless":
            chunk = b'{"replica_id": "' + b"x" * (1 << 20)
            while not stop.is_set():
                conn.sendall(chunk)
        elif kind == "drip":
            while not stop.is_set():
                conn.sendall(b" ")
                time.sleep(0.2)
    except OSError:
        return
