"""A clean-room RFC 004 peer, written from the RFC text alone (no `logsync` import).

It authors a few origins' ops from a seed at start-up (§3, §4, §5, §6), keeps them in
memory, and serves §7.1–§7.4 with the §8 extensions msgpack, large_pages,
inline_artifacts and chain, §11 errors and the §12 bearer token. Its purpose is to prove
the RFC is enough to write a peer that logsync pulls and `logsync conformance` passes.

    python -m tests.clean_room.peer --port 0 --token T --ops 700 --seed 7
"""

from __future__ import annotations

import argparse
import hmac
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from tests.clean_room.authoring import UPSTREAM_PAGE, Store

try:  # §8 item 3: msgpack is offered only when the package is there
    import msgpack
except ImportError:  # pragma: no cover - the venv has it
    msgpack = None

MAX_SEQ = 2**62
BODY_CAP = 64 * 1024
MAX_CONNECTIONS = 32
UPSTREAM_ROUTES = ("/healthz", "/sync/version_vector", "/sync/ops", "/sync/artifact")
ROUTES = UPSTREAM_ROUTES + ("/sync/digests", "/logstream/stream")
STREAM_FILTERS = ("stream", "room", "topic", "type", "to_agent", "from_agent",
                  "correlation_id", "status")
STATUSES = ("open", "claimed", "ready", "applied", "blocked", "failed", "superseded")
STREAM_CAP, PING_AFTER, STREAM_LIFETIME = 8, 15.0, 3600.0
REPLICA_ID = re.compile(r"rep_(?:[0-9a-f]{32}|[0-9a-f]{12})\Z")
DIGITS = re.compile(r"[0-9]{1,20}\Z")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
EXTENSIONS = (["msgpack"] if msgpack else []) + ["large_pages", "inline_artifacts", "chain"]
STATUS_TEXT = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 408: "timeout", 413: "too_large",
               500: "internal", 503: "busy"}


# ---------------------------------------------------------------- HTTP (§7, §11, §12)

class BadRequest(Exception):
    def __init__(self, status: int, sentence: str, headers: dict | None = None):
        super().__init__(sentence)
        self.status, self.sentence, self.headers = status, sentence, headers or {}


def _one(query: dict, name: str) -> str | None:
    values = query.get(name)
    if values is None:
        return None
    if len(values) > 1:
        raise BadRequest(400, f"{name} is given {len(values)} times; give it once")
    return values[0]


def _int(name: str, raw: str, low: int, high: int) -> int:
    if raw.startswith("-") and DIGITS.match(raw[1:]):
        raise BadRequest(400, f"{name}={raw[:80]!r} is negative; it must be at least {low}")
    if not DIGITS.match(raw):
        raise BadRequest(400, f"{name}={raw[:80]!r} is not an integer")
    value = int(raw)
    if not low <= value <= high:
        raise BadRequest(400, f"{name}={value} is outside {low}..{high}")
    return value


def _label_ok(value: str) -> bool:
    """§4.1 routing label: 1..256 code points, not only whitespace, no controls."""
    return (0 < len(value) <= 256 and not value.isspace()
            and not any(ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF
                        for c in value))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "clean-room-peer"
    timeout = 10

    def log_message(self, fmt, *args):  # quiet: the test reads stdout
        pass

    def _dispatch(self):
        url = urlsplit(self.path)
        coded = (url.path not in UPSTREAM_ROUTES
                 or self.headers.get("Logsync-Errors", "").strip().lower() == "codes")
        try:
            self._check_transport()
            if url.path == "/healthz" and self.command in ("GET", "HEAD"):
                return self._send(200, b"ok\n", "text/plain; charset=utf-8")
            self._check_token()
            if url.path not in ROUTES:
                raise BadRequest(404, f"no route {url.path[:80]!r}")
            if self.command != "GET":
                raise BadRequest(405, f"{self.command} is not allowed on {url.path}; use GET",
                                 {"Allow": "GET"})
            query: dict[str, list[str]] = {}
            for k, v in parse_qsl(url.query, keep_blank_values=True, max_num_fields=32):
                query.setdefault(k, []).append(v)
            if url.path == "/logstream/stream":
                return self._stream(query)
            self._answer(getattr(self, "_r_" + url.path.rsplit("/", 1)[1])(query))
        except BadRequest as e:
            body = ({"error": STATUS_TEXT[e.status], "reason": e.sentence} if coded
                    else {"error": e.sentence})
            self._send(e.status, json.dumps(body, ensure_ascii=False).encode("utf-8"),
                       "application/json; charset=utf-8", e.headers)
        except ValueError as e:  # parse_qsl over its field cap
            body = {"error": "bad_request", "reason": f"the query string is refused: {e}"}
            self._send(400, json.dumps(body if coded else {"error": body["reason"]}).encode(),
                       "application/json; charset=utf-8")

    def _check_transport(self):
        """§7 common rules: loopback Host/Origin (403, before the token), body cap (413)."""
        port = self.server.server_address[1]
        host = (self.headers.get("Host") or "").strip().lower()
        name, _, hport = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if not name:
            name, hport = host, ""
        if name not in LOOPBACK_NAMES or (hport and hport != str(port)):
            raise BadRequest(403, f"Host {host[:80]!r} is not this loopback server")
        origin = self.headers.get("Origin")
        if origin is not None:
            oname = urlsplit(origin.strip()).hostname or ""
            if oname not in ("127.0.0.1", "localhost", "::1"):
                raise BadRequest(403, f"Origin {origin[:80]!r} is not loopback")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise BadRequest(400, "a chunked request body is not taken; send Content-Length")
        raw = self.headers.get("Content-Length") or "0"
        length = int(raw) if raw.isdigit() and len(raw) < 12 else -1
        if length < 0:
            self.close_connection = True
            raise BadRequest(400, f"Content-Length {raw[:40]!r} is not a byte count")
        if length > BODY_CAP:
            self.close_connection = True
            raise BadRequest(413, f"a request body of {length} bytes is over {BODY_CAP}")
        try:
            self.rfile.read(length)
        except OSError:
            self.close_connection = True
            raise BadRequest(408, "the request body did not arrive in time") from None

    def _check_token(self):
        token = self.server.token
        if token is None:
            return
        given = (self.headers.get("Authorization") or "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, b"Bearer " + token.encode("utf-8")):
            raise BadRequest(401, "the bearer token is missing or wrong",
                             {"WWW-Authenticate": "Bearer"})

    def _answer(self, obj):
        accept = self.headers.get("Accept") or ""
        if msgpack and _wants_msgpack(accept):
            try:
                return self._send(200, msgpack.packb(obj, use_bin_type=True),
                                  "application/msgpack")
            except (OverflowError, ValueError, TypeError):
                pass  # §8 item 3: an integer beyond 64 bits falls back to JSON
        self._send(200, json.dumps(obj, ensure_ascii=False).encode("utf-8"),
                   "application/json; charset=utf-8")

    def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _stream(self, query) -> None:
        """§7.7: check filters and cursor before taking a slot; frames after the cursor in
        local seq order, then `: ping` every 15 s of silence (this store never grows)."""
        filters = {}
        for name in STREAM_FILTERS:
            value = _one(query, name)
            if value is None:
                continue
            if not _label_ok(value) or (name == "status" and value not in STATUSES):
                raise BadRequest(400, f"filter {name}={value[:80]!r} is not a valid {name}")
            filters[name] = value
        store = self.server.store
        cursor = _one(query, "since_event_id") or self.headers.get("Last-Event-ID")
        if cursor is None:
            start = len(store.timeline)
        elif cursor in store.by_id:
            start = store.by_id[cursor] + 1
        else:
            raise BadRequest(400, f"since_event_id {cursor[:140]!r} is not an event held here")
        if not self.server.stream_slots.acquire(blocking=False):
            raise BadRequest(503, f"all {STREAM_CAP} stream slots are taken", {"Retry-After": "5"})
        try:
            self.close_connection = True
            self.send_response(200)
            for k, v in (("Content-Type", "text/event-stream; charset=utf-8"),
                         ("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no"),
                         ("Connection", "close")):
                self.send_header(k, v)
            self.end_headers()
            if self.command == "HEAD":
                return
            for op in store.timeline[start:]:
                if all(op.get(k) == v or (k == "to_agent" and op.get(k) == "*")
                       for k, v in filters.items()):
                    data = json.dumps(op, ensure_ascii=False)
                    self.wfile.write(f"id: {op['id']}\nevent: logstream\ndata: {data}\n\n"
                                        .encode())
            self.wfile.flush()
            deadline = time.monotonic() + STREAM_LIFETIME
            while time.monotonic() < deadline and not self.server.closing.wait(PING_AFTER):
                self.wfile.write(b": ping\n\n")
                self.wfile.flush()
        except OSError:
            pass  # the client left: its slot is freed below
        finally:
            self.server.stream_slots.release()

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _dispatch

    # ------------------------------------------------------------------ routes
    def _r_version_vector(self, query):
        return self.server.store.vector(self.server.max_page_bytes, EXTENSIONS)

    def _r_ops(self, query):
        origin = _one(query, "origin")
        if not origin:
            raise BadRequest(400, "origin is required and must not be empty")
        if not _label_ok(origin):
            raise BadRequest(400, f"origin={origin[:80]!r} breaks the routing-label rule")
        after_raw = _one(query, "after")
        after = 0 if not after_raw else _int("after", after_raw, 0, MAX_SEQ)  # "": the default
        limit_raw = _one(query, "limit")
        limit = UPSTREAM_PAGE if not limit_raw else _int("limit", limit_raw, 1, 10**12)
        ext = {e.strip().lower() for e in (_one(query, "ext") or "").split(",")[:32]}
        return self.server.store.page(origin, after, limit, ext, self.server.max_page_bytes)

    def _r_artifact(self, query):
        art_id = _one(query, "id")
        if not art_id:
            raise BadRequest(400, "id is required and must not be empty")
        art = self.server.store.artifacts.get(art_id)
        if art is None:
            raise BadRequest(404, f"artifact {art_id[:140]!r} not found")
        return {"artifact": art}

    def _r_digests(self, query):
        origin = _one(query, "origin") or ""
        if not REPLICA_ID.match(origin):
            raise BadRequest(400, f"origin={origin[:80]!r} is not a replica id")
        parts = (_one(query, "at") or "").split(",")
        if not 1 <= len(parts) <= 64 or parts == [""]:
            raise BadRequest(400, f"at must hold 1 to 64 comma-separated seqs, not {len(parts)}")
        return self.server.store.digests(origin, [_int("at", p, 0, MAX_SEQ) for p in parts])


def _wants_msgpack(accept: str) -> bool:
    for item in accept.split(",")[:32]:
        media, *params = [p.strip().lower() for p in item.split(";")]
        if media in ("application/msgpack", "application/x-msgpack"):
            q = next((p[2:] for p in params if p.startswith("q=")), "1")
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 16

    def __init__(self, address, store: Store, token: str | None, max_page_bytes: int):
        super().__init__(address, Handler)
        self.store, self.token, self.max_page_bytes = store, token, max_page_bytes
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.stream_slots = threading.BoundedSemaphore(STREAM_CAP)
        self.closing = threading.Event()

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):  # bounded: refuse over the cap
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                            b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default=None)
    p.add_argument("--ops", type=int, default=700, choices=range(1, 100_001), metavar="1..100000")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--max-page-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--unsigned", action="store_true")
    p.add_argument("--no-bigint", action="store_true",
                   help="author no metadata integer beyond 64 bits (msgpack can encode all)")
    p.add_argument("--plant", choices=("prev", "tips", "sigs", "budget"),
                   help="serve a planted defect (tests of the tests only)")
    a = p.parse_args(argv)
    if not 4096 <= a.max_page_bytes <= 32 * 1024 * 1024:
        p.error(f"--max-page-bytes {a.max_page_bytes} is outside 4096..33554432 (§8.1)")
    store = Store(a.ops, a.seed, signed=not a.unsigned, bigint=not a.no_bigint)
    store.plant = a.plant
    server = Server(("127.0.0.1", a.port), store, a.token, a.max_page_bytes)
    vector = store.vector(a.max_page_bytes, EXTENSIONS)["version_vector"]
    print(json.dumps({"port": server.server_address[1], "replica_id": store.replica_id,
                      "vector": vector}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.closing.set()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
