"""One peer's task in the daemon: its pull loop, what wakes it, and the page frames its
stream brings (`streamframes.py`), applied as pushed pages."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from logsync import peers as peers_mod
from logsync.holders import Holders
from logsync.outbox import direct_header
from logsync.peerloop import PeerLoop
from logsync.streamframes import DIRECT_HEADER, apply_page_frame, parse_page_frame


@dataclass
class PeerTask:
    """One peer's task: its `PeerLoop` (which decides) and what wakes its waiter."""

    peer: peers_mod.Peer
    scope: anyio.CancelScope
    loop: PeerLoop
    wake: anyio.Event = field(default_factory=anyio.Event)
    replica: str | None = None  # the peer's replica id, from its last full round

    @property
    def label(self) -> str:
        """How logs name the peer: its name, else its URL without credentials."""
        return self.peer.name or peers_mod.redact_url(self.peer.url)

    def note(self, origin: str | None, seq: int | None) -> None:
        """A frame from the peer's stream (None, None: the stream (re)connected)."""
        self.loop.frame(origin, seq, anyio.current_time())
        self.wake.set()

    async def take_page(self, data: bytes, store: Any, holders: Holders,
                        applied: Callable[[], None], *, paused: bool = False) -> None:
        """Apply one page frame from this peer as a pushed page (in a worker thread);
        `applied()` wakes our own streams. What it leaves us lacking, and a page we cannot
        take now (the peer's id is not yet known; `paused` by a store fault), is pulled.
        A `StoreError` is the caller's."""
        frame = await anyio.to_thread.run_sync(parse_page_frame, data)  # up to 1 MiB of JSON
        if frame is None:
            return
        if self.replica is None or paused:
            self.note(frame.origin, frame.last)
            return
        holders.note(self.replica, {frame.origin: frame.last})  # it served them: it holds them
        try:
            taken = await anyio.to_thread.run_sync(apply_page_frame, store, frame, self.replica)
        except BaseException:
            self.note(frame.origin, frame.last)
            raise
        if taken.applied:
            applied()
        if taken.lacking:
            self.note(frame.origin, frame.last)


def direct_headers(replicas: Iterable[str | None], publisher: str | None) -> dict[str, str]:
    """The header naming the peers we stream from (all but `publisher`), if any."""
    value = direct_header(replicas, publisher)
    return {DIRECT_HEADER: value} if value else {}
