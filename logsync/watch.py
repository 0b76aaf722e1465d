"""Change notifications from a peer's `/logstream/stream` (Server-Sent Events).

A frame on the peer's stream means the peer holds an event we may lack, so
the daemon pulls at once instead of waiting for the next anti-entropy round.
This works against MemPalace hubs too: their stream has the same frames.
Only the fact that something arrived matters here; the pull itself goes
through the engine, so a lost or forged frame costs at most one extra round.
"""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import Callable

import anyio
import httpx

from logsync import __version__

log = logging.getLogger("logsync.watch")

READ_TIMEOUT_S = 45.0  # upstream pings every 15 s; three missed pings = dead stream
MAX_LINE = 8 * 1024 * 1024


async def watch_stream(
    url: str,
    token: str | None,
    on_change: Callable[[], None],
    *,
    rng: random.Random,
    verify: bool | ssl.SSLContext = True,
    backoff_cap: float = 30.0,
) -> None:
    """Call `on_change` for every event frame; reconnect forever with backoff.

    A (re)connect also counts as a change: frames sent while we were away
    are gone, and the stream starts at the newest event.
    """
    delay = 1.0
    headers = {"Accept": "text/event-stream", "User-Agent": f"logsync/{__version__}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout, verify=verify, headers=headers) as http:
        while True:
            try:
                if await _follow(http, url.rstrip("/") + "/logstream/stream", on_change):
                    delay = 1.0
            except (httpx.HTTPError, anyio.EndOfStream, OSError) as exc:
                log.debug("stream %s: %s", url, exc)
            await anyio.sleep(delay / 2 + rng.uniform(0, delay / 2))
            delay = min(delay * 2, backoff_cap)


async def _follow(http: httpx.AsyncClient, url: str, on_change: Callable[[], None]) -> bool:
    """Read one connection's frames; True if it was accepted (resets the backoff)."""
    async with http.stream("GET", url) as response:
        if response.status_code != 200:
            log.info("stream %s answered %s; retrying later", url, response.status_code)
            return False
        on_change()
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                on_change()
    return True
