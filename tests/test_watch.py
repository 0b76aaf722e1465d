"""Change notifications: what the daemon takes from a peer's event stream."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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

    # a CR ends its line at once (a LF first in the next read ends nothing): an event
    # ending "\r\r" is dispatched without waiting for the peer's next write
    assert anyio.run(frames, split()) == [b"data: a", b"data: b", b"", b"data: c", b""]


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


def _lines_of(stream: bytes) -> list[bytes]:
    """The complete lines of a whole stream (CR, LF or CRLF ended), the unfinished last
    one left out: what any split of it into reads must give."""
    return stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")[:-1]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"bc", b"\r", b"\n", b"\r\n", b"data: x", b""]),
                max_size=30), st.data())
def test_any_split_into_reads_gives_the_lines_of_the_whole(parts: list[bytes], data) -> None:
    import anyio

    from logsync.watch import line_batches

    stream = b"".join(parts)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(stream)), max_size=12)))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    async def lines() -> list[bytes]:
        async def source():
            for read in reads:
                yield read
        return [line async for batch in line_batches(source(), 1 << 20) for line in batch]

    assert anyio.run(lines) == _lines_of(stream)


def test_a_line_dripped_in_too_many_reads_is_refused_and_its_reads_are_bounded() -> None:
    """Review 2026-12-03: a 1 MiB line in one-byte reads re-scanned the line so far at
    every read (quadratic: minutes of a frozen loop). Now a read's work is its own bytes,
    and a line unfinished after `MAX_LINE_PIECES` reads ends the connection."""
    import anyio

    from logsync.watch import MAX_LINE_PIECES, LineTooLong, bounded_lines

    taken = 0

    async def drip():
        nonlocal taken
        yield b"data: ok\nevent: logsync-page\ndata: "
        while True:
            taken += 1
            yield b"x"

    got: list[bytes] = []

    async def follow() -> None:
        async for line in bounded_lines(drip(), 1 << 20):
            got.append(line)

    with pytest.raises(LineTooLong, match=f"unfinished after {MAX_LINE_PIECES} reads"):
        anyio.run(follow)
    assert got == [b"data: ok", b"event: logsync-page"]
    assert taken == MAX_LINE_PIECES


def test_a_stream_of_tiny_reads_gives_the_event_loop_back() -> None:
    """Reads that are ready at once never suspend the reader: without a checkpoint, a
    peer sending lines as fast as it can starves every other task of the daemon."""
    import anyio

    from logsync.watch import YIELD_EVERY, bounded_lines

    reads = 64 * YIELD_EVERY
    ticks = 0

    async def flood():
        for _ in range(reads):
            yield b"x\n"

    async def main() -> int:
        nonlocal ticks
        async with anyio.create_task_group() as tg:
            async def other() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await anyio.lowlevel.checkpoint()
            tg.start_soon(other)
            await anyio.lowlevel.checkpoint()
            count = 0
            async for _line in bounded_lines(flood(), 1 << 20):
                count += 1
            tg.cancel_scope.cancel()
        return count

    assert anyio.run(main) == reads
    assert ticks >= reads // YIELD_EVERY - 1
