"""Change notifications from a peer's `/logstream/stream` (Server-Sent Events).

A frame on the peer's stream means the peer holds an event we may lack, so
the daemon pulls at once instead of waiting for the next anti-entropy round.
This works against MemPalace hubs too: their stream has the same frames.
Each frame's event names its (origin_replica, origin_seq): that is all we take
from it, so the daemon can pull just that origin (`schedule.choose_targets`). The
pull itself goes through the engine, which validates everything, so a lost or
forged frame costs at most one extra request.
"""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.lowlevel
import httpx

from logsync import __version__
from logsync.answers import ACCEPT_ENCODING, encoding_problem
from logsync.peers import redact_url
from logsync.streamframes import (
    FRAMES_HEADER,
    PAGE_EVENT,
    PAGES,
    TOPS_EVENT,
    parse_tops,
    tops_frames,
)
from logsync.wire import REPLICA_HEADER, ChangeFrame

log = logging.getLogger("logsync.watch")

READ_TIMEOUT_S = 45.0  # upstream pings every 15 s; three missed pings = dead stream
# One SSE line: a frame's data line is one event (≤256 KiB body, ≤64 KiB metadata, routing).
MAX_LINE_BYTES = 1024 * 1024
# Reads one line may come in: a 1 MiB line of a well-behaved peer takes a few dozen (a
# read is up to 64 KiB; segments of a slow path 1.4 KiB: ~750); a line dripped in more
# is refused, so a peer cannot make us spend a read's overhead per byte.
MAX_LINE_PIECES = 4096
YIELD_EVERY = 64  # reads between two turns given back to the event loop
MAX_PAGES_TAKEN_TOGETHER = 64  # page frames one `on_page` call (one transaction) takes
# ... and their JSON at most (plus the frame that passes it): decoded, a page's ops take
# some 20x their bytes, so the bound is in bytes too, not only in what one read brings
MAX_PAGE_BYTES_TAKEN_TOGETHER = MAX_LINE_BYTES


class LineTooLong(Exception):
    """A peer sent a line past MAX_LINE_BYTES: drop the connection (it is not a frame)."""


Change = Callable[[str | None, int | None], None]
Page = Callable[[list[bytes], str | None], Awaitable[None]]  # pages, the id their stream announced


async def watch_stream(
    url: str,
    token: str | None,
    on_change: Change,
    *,
    rng: random.Random,
    verify: bool | ssl.SSLContext = True,
    backoff_cap: float = 30.0,
    replica: str | None = None,
    on_page: Page | None = None,
    direct: Callable[[], dict[str, str]] | None = None,
) -> None:
    """Call `on_change(origin, origin_seq)` for every event frame; reconnect forever.

    A (re)connect is reported as `on_change(None, None)`: frames sent while we
    were away are gone, and the stream starts at the newest event. `replica` (ours)
    is named in `wire.REPLICA_HEADER`: a logsync peer then sends no frame for an op
    it knows we hold (`logsync.holders`). With `on_page`, we ask for page frames
    (`streamframes`): the page frames one read brings are awaited together in `on_page`
    (with the replica id the stream's answer announced), in order, and each
    tops frame's origins go to `on_change` (a `more` as a reconnect: a full round);
    `direct()` gives the headers naming what we stream directly: read at each connect, and
    a change of it reconnects (after 0.5-1 s).
    """
    delay = 1.0
    headers = {"Accept": "text/event-stream", "User-Agent": f"logsync/{__version__}",
               **ACCEPT_ENCODING}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if replica:
        headers[REPLICA_HEADER] = replica
    if replica and on_page is not None:
        headers[FRAMES_HEADER] = PAGES
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout, verify=verify, headers=headers) as http:
        while True:
            try:
                named = direct if on_page is not None else None
                if await _follow(http, url.rstrip("/") + "/logstream/stream", on_change,
                                 on_page, named):
                    delay = 1.0
            except (httpx.HTTPError, anyio.EndOfStream, OSError) as exc:
                log.debug("stream %s: %s", redact_url(url), exc)
            except LineTooLong as exc:
                log.warning("stream %s: %s; reconnecting later", redact_url(url), exc)
            except Exception as exc:  # noqa: BLE001 - a notification stream is only a hint:
                # whatever breaks it (a bug of ours, httpx's StreamError) must not end the
                # peer's scope; the pull loop's anti-entropy goes on regardless.
                log.warning("stream %s: %s: %s; reconnecting later", redact_url(url),
                            type(exc).__name__, exc)
            await anyio.sleep(delay / 2 + rng.uniform(0, delay / 2))
            delay = min(delay * 2, backoff_cap)


async def _follow(http: httpx.AsyncClient, url: str, on_change: Change,
                  on_page: Page | None = None,
                  direct: Callable[[], dict[str, str]] | None = None) -> bool:
    """Read one connection's frames; True if it was accepted (resets the backoff). When
    what `direct()` names changes (a peer's id learnt from its first round), the
    connection ends after the next line (a frame or a ping) so the next one names it."""
    sent = dict(direct()) if direct is not None else {}
    async with http.stream("GET", url, headers=sent or None) as response:
        if response.status_code != 200:
            log.info("stream %s answered %s; retrying later", redact_url(url), response.status_code)
            return False
        problem = encoding_problem(response.headers)
        if problem:
            log.warning("stream %s %s; retrying later", redact_url(url), problem)
            return False
        on_change(None, None)
        announced = response.headers.get(REPLICA_HEADER)  # a page stream names its server
        kind, pages = b"", []
        async for lines in line_batches(response.aiter_raw(), MAX_LINE_BYTES):
            for line in lines:
                if not line:
                    kind = b""  # a frame ends
                elif line.startswith(b"event:"):
                    kind = line[6:].strip()
                elif line.startswith(b"data:") and kind == PAGE_EVENT.encode() \
                        and on_page is not None:
                    pages.append(line[5:])
                    if len(pages) >= MAX_PAGES_TAKEN_TOGETHER or \
                            sum(map(len, pages)) >= MAX_PAGE_BYTES_TAKEN_TOGETHER:
                        pages = await _take(on_page, pages, announced)
                elif line.startswith(b"data:"):
                    pages = await _take(on_page, pages, announced)  # frames stay in order
                    await _data(kind, line[5:], on_change, on_page, announced)
                if direct is not None and not kind and direct() != sent:
                    await _take(on_page, pages, announced)
                    log.debug("stream %s: the peers we stream from changed; reconnecting",
                              redact_url(url))
                    return True
            pages = await _take(on_page, pages, announced)  # what one read brought
    return True


async def _take(on_page: Page | None, pages: list[bytes], announced: str | None) -> list[bytes]:
    """Hand the page frames gathered so far to `on_page`, together; none are left."""
    if pages and on_page is not None:
        await on_page(pages, announced)
    return []


async def _data(kind: bytes, data: bytes, on_change: Change, on_page: Page | None,
                announced: str | None = None) -> None:
    """One frame's data line (not a page), by the frame's event type."""
    if kind == TOPS_EVENT.encode() and on_page is not None:
        parsed = parse_tops(data)
        if parsed is None:
            return  # not a tops frame: a hint we cannot read costs nothing
        tops, more = parsed
        for origin, top in tops_frames(tops.items(), more):
            on_change(origin, top)
    else:
        on_change(*frame_position(data))


async def bounded_lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """Lines (CR, LF or CRLF ended) of a byte stream, one by one (`line_batches`)."""
    async for lines in line_batches(chunks, limit):
        for line in lines:
            yield line


async def line_batches(chunks: AsyncIterator[bytes], limit: int,
                       pieces: int = MAX_LINE_PIECES) -> AsyncIterator[list[bytes]]:
    """The lines (CR, LF or CRLF ended) each read of a byte stream completes. Bounded
    whatever the peer sends: memory within `limit` bytes a line (httpx's own line
    iterator buffers a line of any size), work linear in the bytes (only the new read is
    scanned; the unfinished line grows in place), a line in at most `pieces` reads, and
    the event loop given back every `YIELD_EVERY` reads (a peer dripping one byte a
    chunk cost whole seconds of a frozen loop a line)."""
    pending = bytearray()
    parts = 0  # reads the unfinished line came in
    after_cr = False  # the last read ended with CR: a LF first in this one ends nothing
    reads = 0
    async for chunk in chunks:
        reads += 1
        if reads % YIELD_EVERY == 0:
            await anyio.lowlevel.checkpoint()
        if after_cr and chunk:
            after_cr = False
            if chunk[:1] == b"\n":  # the rest of a CRLF whose CR ended the last read
                chunk = chunk[1:]
        if not chunk:
            continue
        after_cr = chunk.endswith(b"\r")
        *ends, rest = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        if not ends:  # no line ends here: the unfinished line grows
            pending += rest
            parts += 1
            if len(pending) > limit:
                raise LineTooLong(f"more than {limit} bytes without a line end")
            if parts > pieces:
                raise LineTooLong(f"a line still unfinished after {pieces} reads")
            continue
        lines = [bytes(pending) + ends[0] if pending else ends[0], *ends[1:]]
        pending, parts = bytearray(rest), 1 if rest else 0
        long = next((i for i, line in enumerate(lines) if len(line) > limit), None)
        if long is not None:  # the frames before it still count; the connection ends
            if long:
                yield lines[:long]
            raise LineTooLong(f"a line of {len(lines[long])} bytes; the limit is {limit}")
        yield lines
        if len(pending) > limit:
            raise LineTooLong(f"more than {limit} bytes without a line end")


def frame_position(data: str | bytes) -> tuple[str | None, int | None]:
    """(origin_replica, origin_seq) a frame names (`wire.ChangeFrame`); (None, None) if
    it names none."""
    frame = ChangeFrame.parse(data)
    return (None, None) if frame is None else (frame.origin, frame.seq)
