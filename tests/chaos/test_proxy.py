"""The fault-injecting proxy (no root needed): Host rewriting across chunk boundaries and
keep-alive requests, pass-through, a frozen link that delivers once thawed, resets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from logsync.chaos.proxy import HostRewriter, ProxyHub

REQUESTS = (b"GET /a HTTP/1.1\r\nHost: 127.0.0.1:1111\r\nX: y\r\n\r\n"
            b"GET /b HTTP/1.1\r\nhost: elsewhere\r\nContent-Length: 5\r\n\r\nHost:"
            b"GET /c HTTP/1.1\r\nHost: 127.0.0.1:1111\r\n\r\n")
WANTED = (b"GET /a HTTP/1.1\r\nHost: peer:9\r\nX: y\r\n\r\n"
          b"GET /b HTTP/1.1\r\nHost: peer:9\r\nContent-Length: 5\r\n\r\nHost:"
          b"GET /c HTTP/1.1\r\nHost: peer:9\r\n\r\n")


def test_host_lines_are_rewritten_wherever_the_stream_is_cut() -> None:
    for cut in range(1, len(REQUESTS)):
        rewriter = HostRewriter("peer:9")
        assert rewriter.feed(REQUESTS[:cut]) + rewriter.feed(REQUESTS[cut:]) == WANTED, cut


def test_a_chunked_request_body_passes_unchanged() -> None:
    rewriter = HostRewriter("peer:9")
    stream = (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nHost:\r\n0\r\n\r\n")
    out = rewriter.feed(stream)
    assert out.startswith(b"POST / HTTP/1.1\r\nHost: peer:9\r\n") and out.endswith(
        b"5\r\nHost:\r\n0\r\n\r\n")


BIG = 256 * 1024


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = bytes(BIG) if self.path == "/big" else (self.headers.get("Host") or "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def link() -> Iterator[tuple[ProxyHub, str, int]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    hub = ProxyHub(seed=1)
    hub.start()
    try:
        target = int(server.server_address[1])
        port = hub.add("a>b", "127.0.0.1", "127.0.0.1", target, rewrite_host=True)
        yield hub, f"http://127.0.0.1:{port}", target
    finally:
        hub.stop()
        server.shutdown()
        server.server_close()


def test_a_link_passes_requests_with_the_peers_host(link) -> None:
    hub, url, target = link
    with httpx.Client(trust_env=False, timeout=5) as client:
        for path in ("/x", "/y"):  # one kept-alive connection
            assert client.get(url + path).text == f"127.0.0.1:{target}"
    assert hub.stats()["a>b"]["connections"] == 1


def test_a_frozen_link_holds_requests_and_delivers_them_when_thawed(link) -> None:
    hub, url, _ = link
    hub.set("a>b", frozen=True)
    answers: list[int] = []
    thread = threading.Thread(
        target=lambda: answers.append(httpx.get(url, timeout=10, trust_env=False).status_code))
    thread.start()
    time.sleep(0.7)
    assert answers == [] and thread.is_alive()
    hub.set("a>b", frozen=False)
    thread.join(10)
    assert answers == [200]


def test_a_resetting_link_cuts_connections_until_cleared(link) -> None:
    hub, url, _ = link
    hub.set("a>b", reset=1.0)
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=5, trust_env=False)
    assert hub.stats()["a>b"]["resets"] >= 1
    hub.clear("a>b")
    hub.set("a>b", delay=0.05, loss=0.0)
    assert httpx.get(url, timeout=5, trust_env=False).status_code == 200


def test_a_rate_limited_link_takes_its_bytes_time_and_clearing_lifts_it(link) -> None:
    """Two answers of 256 KiB over 1 MB/s, one medium: at least 0.5 s, whatever the load
    (a lower bound only); the bytes are counted."""
    hub, url, _ = link
    hub.set("a>b", rate=1e6)
    with httpx.Client(trust_env=False, timeout=10) as client:
        began = time.monotonic()
        sizes = [len(client.get(url + "/big").content) for _ in range(2)]
        assert time.monotonic() - began >= 2 * BIG / 1e6 * 0.95
        assert sizes == [BIG, BIG] and hub.stats()["a>b"]["bytes"] >= 2 * BIG
        hub.clear("a>b")
        assert hub.links["a>b"].rate == 0 and len(client.get(url + "/big").content) == BIG
