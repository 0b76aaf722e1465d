"""Server limits with real processes on loopback (issue 8, findings 15, 18, store-fault 503,
page byte budget): request-head deadline, in-flight cap, SSE slots per address and eviction
of clients that never read, clean SIGINT with followers, 503/500 as one JSON sentence."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from logsync.server import create_app, json_bytes
from logsync.server.limits import GuardedH11Protocol, listen_socket, uvicorn_limits
from logsync.store import Store
from tests.interop.hub import free_port

PY = [sys.executable, "-m", "logsync"]
TOKEN = "tok-limits"
AUTH = {"Authorization": f"Bearer {TOKEN}"}



class Serve:
    """`logsync serve` as a subprocess; stderr kept apart for traceback checks."""

    def __init__(self, palace: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.err = palace.parent / f"{palace.name}.err"
        self._err = open(self.err, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*PY, "--palace", str(palace), "serve", "--port", str(self.port), "--token", TOKEN,
             "--no-notify", *extra],
            stdout=subprocess.DEVNULL, stderr=self._err,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.err.read_text()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError("serve never became healthy")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._err.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Serve]:
    palace = tmp_path / "palace"
    with Store.open(palace) as store:
        store.append_event("note", "main", "lobby", "alice", body="hello")
    server = Serve(palace)
    yield server
    server.stop()


def healthz_latency(url: str) -> float:
    start = time.monotonic()
    answer = httpx.get(url + "/healthz", timeout=5)
    assert answer.status_code == 200
    return time.monotonic() - start


# ---------------------------------------------------------------- finding 15: heads


def test_half_open_heads_are_closed_and_healthz_answers_meanwhile(served: Serve) -> None:
    """1000 sockets that send half a request line: /healthz answers within 1 s while they
    are open, and each is closed by the server within the head deadline (10 s)."""
    sockets = []
    try:
        for _ in range(1000):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=5)
            sock.sendall(b"GET /sync/ver")
            sockets.append(sock)
        opened = time.monotonic()
        for _ in range(5):
            assert healthz_latency(served.url) < 1.0
        status = httpx.get(served.url + "/statusz", headers=AUTH, timeout=5)
        assert status.status_code == 200  # idle sockets do not count as requests in flight
        closed = 0
        for sock in sockets:
            sock.settimeout(max(0.1, opened + 14 - time.monotonic()))
            try:
                data = sock.recv(1024)
            except (ConnectionResetError, TimeoutError):
                data = b"timeout"
            if data == b"":
                closed += 1
        assert closed == len(sockets)
        assert time.monotonic() - opened < 14
    finally:
        for sock in sockets:
            sock.close()


def test_uvicorn_limits_are_set() -> None:
    limits = uvicorn_limits()
    assert limits["limit_concurrency"] == 256
    assert limits["timeout_keep_alive"] == 5
    assert limits["h11_max_incomplete_event_size"] == 16 * 1024


# ---------------------------------------------------------------- in-process uvicorn


class LiveApp:
    """create_app(...) on a real uvicorn with our limits, in a thread, on loopback."""

    def __init__(self, store: Store, **settings: Any) -> None:
        self.app = create_app(store, token=TOKEN, **settings)
        self.sock = listen_socket("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", ws="none",
                                **uvicorn_limits())
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> LiveApp:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    @property
    def srv(self) -> Any:
        return self.app.state.logsync


def raw_stream(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /logstream/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                 f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    return sock


def until(predicate: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_sse_slots_are_limited_per_client_address(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store, \
            LiveApp(store, sse_max_per_client=2, sse_per_client_exempt=()) as live:
        first, second = raw_stream(live.port), raw_stream(live.port)
        try:
            assert until(lambda: live.srv.sse_clients == 2, 5)
            third = httpx.get(live.url + "/logstream/stream", headers=AUTH, timeout=5)
            assert third.status_code == 503
            assert third.headers["retry-after"] == "5"
            assert third.json()["error"] == "busy"
            assert "maximum for one client address" in third.json()["reason"]
        finally:
            first.close()
            second.close()
        assert until(lambda: live.srv.sse_clients == 0, 5)


def test_a_stream_client_that_never_reads_loses_its_slot(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store, \
            LiveApp(store, sse_send_timeout_s=1.0, sse_per_client_exempt=()) as live:
        stuck = raw_stream(live.port, rcvbuf=4096)  # never read from
        try:
            assert until(lambda: live.srv.sse_clients == 1, 5)
            body = "x" * 4000
            deadline = time.monotonic() + 20
            while live.srv.sse_clients and time.monotonic() < deadline:
                for _ in range(50):
                    store.append_event("note", "main", "lobby", "alice", body=body)
                live.srv.notifier.notify()
                time.sleep(0.1)
            assert live.srv.sse_clients == 0, "the slot of a client that never reads was kept"
            assert healthz_latency(live.url) < 1.0
        finally:
            stuck.close()


# ---------------------------------------------------------------- store-fault 503, 500


def test_store_problem_makes_sync_routes_503_and_healthz_stays_200(tmp_path: Path) -> None:
    problem: list[str | None] = ["cannot write to X: the disk is full"]
    with Store.open(tmp_path / "p") as store, LiveApp(store, health=lambda: problem[0]) as live:
        for path in ("/sync/version_vector", "/sync/ops?origin=x", "/logstream/stream"):
            answer = httpx.get(live.url + path, headers=AUTH, timeout=5)
            assert answer.status_code == 503, path
            assert answer.headers["retry-after"] == "5"
            sentence = "the store is unavailable: cannot write to X: the disk is full"
            # the routes upstream defines answer as a hub would; the others with a code
            assert answer.json() == ({"error": sentence} if path.startswith("/sync/") else
                                     {"error": "unavailable", "reason": sentence}), path
        assert httpx.get(live.url + "/healthz", timeout=5).status_code == 200
        status = httpx.get(live.url + "/statusz", headers=AUTH, timeout=5).json()
        assert status["ok"] is False and status["store_problem"] == problem[0]
        problem[0] = None
        assert httpx.get(live.url + "/sync/version_vector", headers=AUTH,
                         timeout=5).status_code == 200


def test_unexpected_errors_are_one_json_sentence(tmp_path: Path, caplog: Any) -> None:
    with Store.open(tmp_path / "p") as store:
        def broken() -> list[dict]:
            raise RuntimeError("boom")

        with LiveApp(store, peer_state_provider=broken) as live:
            answers = [httpx.get(live.url + "/sync/peers", headers=AUTH, timeout=5)
                       for _ in range(3)]
    for answer in answers:
        assert answer.status_code == 500
        assert answer.json()["error"] == "internal"
        assert answer.json()["reason"].startswith("internal error on '/sync/peers'")
        assert "Traceback" not in answer.text
    assert sum("unexpected RuntimeError" in r.message for r in caplog.records) == 1


def test_unencodable_page_is_a_json_500_naming_the_origin(tmp_path: Path) -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match="nests too deeply"):
        json_bytes({"m": deep})
    with Store.open(tmp_path / "p") as store:
        store.append_event("note", "main", "lobby", "alice")
        real = store.list_ops

        def poisoned(*args: Any, **kwargs: Any) -> list[dict]:
            return [{**e, "metadata": deep} for e in real(*args, **kwargs)]

        store.list_ops = poisoned  # type: ignore[method-assign]
        with LiveApp(store) as live:
            answer = httpx.get(live.url + "/sync/ops", params={"origin": store.replica_id},
                               headers=AUTH, timeout=5)
    assert answer.status_code == 500
    assert store.replica_id in answer.json()["error"]


# ---------------------------------------------------------------- page byte budget


def test_large_pages_stop_at_the_byte_budget_and_upstream_pages_do_not(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store:
        for _ in range(12):
            store.append_event("note", "main", "lobby", "alice", body="b" * 100_000)
        with LiveApp(store, max_page_bytes=350_000) as live:
            vector = httpx.get(live.url + "/sync/version_vector", headers=AUTH, timeout=5)
            assert vector.json()["logsync"]["max_page_bytes"] == 350_000
            params = {"origin": store.replica_id, "limit": 100}
            large = httpx.get(live.url + "/sync/ops", params={**params, "ext": "large_pages"},
                              headers=AUTH, timeout=5).json()
            upstream = httpx.get(live.url + "/sync/ops", params=params, headers=AUTH,
                                 timeout=5)
        assert [e["origin_seq"] for e in large["events"]] == [1, 2, 3]
        assert large["count"] == 3
        assert len(json_bytes(large["events"])) <= 350_000
        assert upstream.json()["count"] == 12
        assert upstream.content == json_bytes(
            {"origin": store.replica_id, "events": store.list_ops(store.replica_id, 0, 100),
             "count": 12})
        with LiveApp(store, max_page_bytes=1024) as live:
            one = httpx.get(live.url + "/sync/ops", headers=AUTH, timeout=5, params={
                "origin": store.replica_id, "ext": "large_pages", "after": 5}).json()
        assert [e["origin_seq"] for e in one["events"]] == [6] and one["count"] == 1


# ---------------------------------------------------------------- finding 18: shutdown


def test_sigint_with_a_follower_connected_exits_fast_without_traceback(served: Serve) -> None:
    with httpx.Client(timeout=10) as client, client.stream(
            "GET", served.url + "/logstream/stream", headers=AUTH) as stream:
        assert stream.status_code == 200
        time.sleep(0.3)
        start = time.monotonic()
        served.proc.send_signal(signal.SIGINT)
        served.proc.wait(5)
        took = time.monotonic() - start
    served.stop()
    log = served.err.read_text()
    assert took < 1.5, f"shutdown took {took:.2f} s\n{log}"
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
    assert served.proc.returncode in (0, -signal.SIGINT, 130)


def test_redacted_peer_urls_in_sync_peers(tmp_path: Path) -> None:
    entries = [{"name": "http://u:p@h:1/?token=s", "url": "http://user:pass@h:1/x?token=sec&a=1",
                "replica_id": None}]
    with Store.open(tmp_path / "p") as store, \
            LiveApp(store, peer_state_provider=lambda: entries) as live:
        text = httpx.get(live.url + "/sync/peers", headers=AUTH, timeout=5).text
    assert "pass" not in text and "sec" not in text and "u:p" not in text
    assert json.loads(text)["peers"][0]["url"] == "http://h:1/x?token=***&a=1"


def test_clients_that_drip_a_body_or_never_read_an_answer_do_not_hold_request_slots(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A request slot (uvicorn counts LIMIT_CONCURRENCY of them) is freed from a client
    that drips its body or never reads a large answer: otherwise 256 such clients turn
    every request, /healthz included, into a 503 -- and a non-reader's buffered answer is
    freed by aborting its connection (closing would wait for it to drain)."""
    monkeypatch.setattr(GuardedH11Protocol, "write_stall_s", 1.0)
    with Store.open(tmp_path / "p") as store:
        for n in range(300):
            store.append_event("note", "s", "r", "a", body=f"{n}" + "x" * 20_000)
        with LiveApp(store, body_timeout_s=0.5) as live:
            head = (f"GET /sync/ops?origin={store.replica_id}&limit=500 HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{live.port}\r\nAuthorization: Bearer {TOKEN}\r\n")
            dripper = socket.create_connection(("127.0.0.1", live.port))
            dripper.sendall((head + "Content-Length: 100\r\n\r\nx").encode())
            sleeper = socket.socket()
            sleeper.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sleeper.connect(("127.0.0.1", live.port))
            sleeper.sendall((head + "\r\n").encode())
            try:
                dripper.settimeout(5)
                assert dripper.recv(200).startswith(b"HTTP/1.1 408")
                # The non-reader's page (6 MB) cannot fit the socket buffers: writing
                # stalls, and after write_stall_s the server aborts the connection.
                time.sleep(2.0)
                sleeper.settimeout(10)
                total = 0
                with contextlib.suppress(ConnectionResetError):
                    while chunk := sleeper.recv(1 << 20):
                        total += len(chunk)
                assert 0 < total < 6_000_000  # aborted: the rest was never sent
            finally:
                dripper.close()
                sleeper.close()
            assert httpx.get(live.url + "/healthz", timeout=2).status_code == 200


def test_answers_are_sent_without_nagle_on_every_connection() -> None:
    """An answer's head and body are two writes; with Nagle on, the second waits ~40 ms
    for the client's delayed ACK on every reused connection. asyncio turns Nagle off
    only on sockets made with proto IPPROTO_TCP: `listen_socket` names it, and the
    server's protocol turns it off on whatever socket it is handed."""
    import asyncio

    from uvicorn.server import ServerState

    def bare() -> socket.socket:  # proto 0: asyncio leaves Nagle on
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        return sock

    async def accepted(sock: socket.socket, guarded: bool) -> int:
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[int] = loop.create_future()
        config = uvicorn.Config(lambda *a: None, **uvicorn_limits())
        config.load()

        def made(transport: Any) -> None:
            raw = transport.get_extra_info("socket")
            seen.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:  # type: ignore[override]
                made(transport)
                transport.close()

        class Guarded(GuardedH11Protocol):
            def connection_made(self, transport: Any) -> None:  # type: ignore[override]
                try:
                    super().connection_made(transport)
                    made(transport)
                except Exception as exc:
                    seen.set_exception(exc)
                finally:
                    transport.close()

        state = ServerState()
        guard = lambda: Guarded(config=config, server_state=state, app_state={})  # noqa: E731
        server = await loop.create_server(guard if guarded else Probe, sock=sock)
        _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        try:
            return await asyncio.wait_for(seen, 5)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accepted(bare(), guarded=False)) == 0  # the trap
    assert asyncio.run(accepted(bare(), guarded=True)) != 0  # the protocol's own fix
    assert asyncio.run(accepted(listen_socket("127.0.0.1", 0), guarded=False)) != 0
