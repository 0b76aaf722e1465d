"""Change notifications: what the daemon takes from a peer's event stream."""

from __future__ import annotations

import json

import pytest

from logsync.watch import frame_position

ORIGIN = "rep_" + "a" * 32


def test_a_frame_names_its_origin_and_origin_seq() -> None:
    data = json.dumps({"id": "evt_1", "origin_replica": ORIGIN, "origin_seq": 12, "body": "x"})
    assert frame_position(" " + data) == (ORIGIN, 12)


@pytest.mark.parametrize("data", [
    "not json", "[1, 2]", json.dumps({"origin_replica": ORIGIN}),
    json.dumps({"origin_replica": ORIGIN, "origin_seq": "12"}),
    json.dumps({"origin_replica": 5, "origin_seq": 12}),
    json.dumps({"origin_replica": ORIGIN, "origin_seq": True}),
])
def test_a_frame_without_a_usable_position_asks_for_a_full_round(data: str) -> None:
    assert frame_position(data) == (None, None)


@pytest.mark.parametrize("seq", [0, -1, 2**62 + 1, 2**63])
def test_a_frame_naming_a_seq_out_of_range_is_not_a_claim(seq: int) -> None:
    """Finding 10: a frame at 2**62+ held its origin 'in flight' for good."""
    assert frame_position(json.dumps({"origin_replica": ORIGIN, "origin_seq": seq})) == (
        None, None)
    assert frame_position(json.dumps({"origin_replica": ORIGIN + "\n", "origin_seq": 1})) == (
        None, None)


def test_lines_are_bounded_whatever_the_peer_sends() -> None:
    """Finding 10: 400 MB without a newline was buffered whole (554 MB RSS)."""
    import anyio

    from logsync.watch import LineTooLong, bounded_lines

    sent = 0

    async def endless():
        nonlocal sent
        while True:
            sent += 65536
            yield b"x" * 65536

    async def frames(chunks):
        return [line async for line in bounded_lines(chunks, 1024 * 1024)]

    with pytest.raises(LineTooLong, match="without a line end"):
        anyio.run(frames, endless())
    assert sent <= 1024 * 1024 + 65536

    async def split():
        for chunk in (b"data: a\r", b"\ndata: b\n\nda", b"ta: c\r\r"):
            yield chunk

    assert anyio.run(frames, split()) == [b"data: a", b"data: b", b"", b"data: c"]


def test_a_compressed_stream_is_dropped_not_expanded() -> None:
    import gzip

    import anyio
    import httpx

    from logsync.watch import _follow

    calls: list[tuple] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers.get("accept-encoding") == "identity"
        return httpx.Response(200, content=gzip.compress(b"x" * 10_000_000),
                              headers={"content-type": "text/event-stream",
                                       "content-encoding": "gzip"})

    async def go() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                     headers={"Accept-Encoding": "identity"}) as http:
            return await _follow(http, "http://peer.test/logstream/stream",
                                 lambda *a: calls.append(a))

    assert anyio.run(go) is False and calls == []
