"""Everything a peer sends the client is bounded (issue 8, findings 4, 7, 10, 11)."""

from __future__ import annotations

import json
import resource
import threading
import time
from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import patch

import anyio
import httpx
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsync import client as client_mod
from logsync.answers import MAX_CONTAINERS, count_containers
from logsync.client import PeerClient
from logsync.engine import Request
from logsync.errors import (
    ConfigError,
    PeerProtocolError,
    PeerRequestError,
    PeerTooLargeError,
    PeerTransientError,
)

URL = "http://peer.test:8000"


def fetch(handler: Any, **options: Any) -> Any:
    async def go() -> Any:
        async with PeerClient(URL, transport=httpx.MockTransport(handler), attempts=1,
                              **options) as client:
            return await client.fetch(Request("/sync/ops", {"origin": "x"}))

    return anyio.run(go)


def test_a_json_bomb_inside_the_byte_cap_is_refused_before_decoding() -> None:
    """Finding 11: 60 MB of `[[],...]` decoded to 1.56 GB; now refused as too large."""
    body = b"[" + b"[]," * 20_000_000 + b"[]]"  # 60 MB, under the 64 MiB cap
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(PeerTooLargeError, match="arrays or objects"):
        fetch(lambda r: httpx.Response(200, content=body,
                                       headers={"content-type": "application/json"}))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert time.monotonic() - started < 10 and grown_mb < 400


def test_a_msgpack_bomb_inside_the_byte_cap_is_refused_before_decoding() -> None:
    """Finding 11: 60 MB of msgpack 0x90 decoded to 4.3 GB in 41 s."""
    body = b"\xdd" + (20_000_000).to_bytes(4, "big") + b"\x90" * 20_000_000
    with pytest.raises(PeerTooLargeError, match="arrays or objects"):
        fetch(lambda r: httpx.Response(200, content=body,
                                       headers={"content-type": "application/msgpack"}))


def test_an_honest_large_page_is_under_the_container_bound() -> None:
    page = {"events": [{"metadata": {"a": [1, 2]}, "artifact_ids": []} for _ in range(5000)]}
    for packed, body in ((False, json.dumps(page).encode()), (True, msgpack.packb(page))):
        assert count_containers(body, packed) < MAX_CONTAINERS // 10


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(min_value=1, max_value=1024))
def test_the_msgpack_container_count_is_every_byte_that_can_start_a_container(
        body: bytes, chunk: int) -> None:
    """The one-pass count equals the plain per-marker count, across chunk edges too."""
    markers = [*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF]
    expected = sum(body.count(bytes([m])) for m in markers)
    with patch("logsync.answers._COUNT_CHUNK", chunk):
        assert count_containers(body, True) == expected
        assert count_containers(bytearray(body), True) == expected


def test_decoding_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 11: decoding on the loop stalled /healthz for seconds every round. The
    decode runs on a worker thread (json.loads keeps the GIL, so the loop may still wait
    for it on a loaded machine: the stall bound is loose, the thread is the property)."""
    body = json.dumps({"events": ["x" * 100] * 300_000}).encode()
    ticks: list[float] = []
    threads: list[int] = []
    real_decode = client_mod.decode_answer

    def decode(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return real_decode(*args)

    monkeypatch.setattr(client_mod, "decode_answer", decode)

    async def go() -> None:
        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg, PeerClient(
            URL, transport=httpx.MockTransport(
                lambda r: httpx.Response(200, content=body,
                                         headers={"content-type": "application/json"})),
        ) as client:
            tg.start_soon(ticker)
            for _ in range(5):
                await client.fetch(Request("/sync/ops"))
            tg.cancel_scope.cancel()

    anyio.run(go)
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(threads) == 5 and threading.get_ident() not in threads
    assert len(gaps) > 3 and max(gaps) < 2.0


class _Drip(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(1000):
            yield b" "
            await anyio.sleep(0.2)


def test_a_dripping_answer_ends_at_the_request_deadline() -> None:
    """Finding 10: a byte every 20 s never tripped httpx's per-read timeout."""
    started = time.monotonic()
    with pytest.raises(PeerTransientError, match="did not finish within 0.8 s"):
        fetch(lambda r: httpx.Response(200, stream=_Drip()), request_deadline=0.8)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:0"])
def test_a_port_out_of_range_is_a_config_error(url: str) -> None:
    """Finding 4: port 99999 reached the socket layer as an OverflowError."""
    with pytest.raises(ConfigError, match="the port must be a number from 1 to 65535"):
        PeerClient(url)


def test_refused_answers_are_freed_at_once_not_by_the_cyclic_collector() -> None:
    """A refused 60 MB answer stayed alive in its traceback's frames: three in a row took
    the victim daemon past 600 MB."""

    class Bomb(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b'{"events":[[]'
            for _ in range(40_000_000 // 65535):
                yield b",[]" * 21845

    async def go() -> list[float]:
        peaks = []
        async with PeerClient(URL, attempts=1, transport=httpx.MockTransport(
                lambda r: httpx.Response(200, stream=Bomb(),
                                         headers={"content-type": "application/json"}))) as c:
            for _ in range(4):
                with pytest.raises(PeerTooLargeError):
                    await c.fetch(Request("/sync/ops"))
                peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        return peaks

    peaks = anyio.run(go)
    assert peaks[-1] - peaks[0] < 20, peaks


def test_a_round_ends_at_its_deadline_for_sync_and_daemon_alike(tmp_path: Any) -> None:
    """Review finding: `sync` had no round deadline; many slow origins held it for hours."""
    from logsync.client import PeerDeadlineError
    from logsync.store import Store

    origins = {f"rep_{n:032x}": 3 for n in range(1, 9)}

    def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sync/version_vector":
            return httpx.Response(200, json={"replica_id": "rep_" + "a" * 32,
                                             "version_vector": origins})
        return httpx.Response(200, stream=_Drip())

    async def go() -> None:
        with Store.open(tmp_path / "p") as store:
            async with PeerClient(URL, attempts=1, transport=httpx.MockTransport(slow),
                                  request_deadline=30, round_deadline=1.0) as client:
                await client.run_round(store)

    started = time.monotonic()
    with pytest.raises(PeerDeadlineError, match="round did not finish within 1 s"):
        anyio.run(go)
    assert time.monotonic() - started < 5


def test_a_compressed_answer_is_refused_before_it_is_expanded() -> None:
    """Review finding: httpx expanded gzip by itself, 64 KiB into 64 MB, before any bound."""
    import gzip

    bomb = gzip.compress(b"[" * 50_000_000)  # about 50 KB on the wire
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("accept-encoding", ""))
        return httpx.Response(200, content=bomb, headers={
            "content-type": "application/json", "content-encoding": "gzip"})

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(PeerProtocolError, match="gzip.-encoded answer"):
        fetch(handler)
    assert seen == ["zstd, identity"]  # a page may come zstd-coded (bounded), never gzip
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 40


def test_a_coded_refusal_of_a_page_keeps_its_reason() -> None:
    """A peer (or a proxy) that codes a page's error as it codes the page: the puller
    still says why the page was refused. (An ASGI app: a mock transport hands the client
    a body httpx has already decoded.)"""
    import zstandard

    said = json.dumps({"error": "bad_request", "reason": "limit=0 must be from 1 to 5000"})
    coded = zstandard.ZstdCompressor().compress(said.encode())

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 400, "headers": [
            (b"content-type", b"application/json"), (b"content-encoding", b"zstd"),
            (b"content-length", str(len(coded)).encode())]})
        await send({"type": "http.response.body", "body": coded})

    async def go() -> Any:
        async with PeerClient(URL, transport=httpx.ASGITransport(app=app),
                              attempts=1) as client:
            return await client.fetch(Request("/sync/ops", {"origin": "x"}))

    with pytest.raises(PeerRequestError,
                       match=r"answered 400: limit=0 must be from 1 to 5000$"):
        anyio.run(go)
