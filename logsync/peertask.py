"""One peer's task in the daemon: its pull loop, what wakes it, and the page frames its
stream brings (`streamframes.py`), applied as pushed pages."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread

from logsync import peers as peers_mod
from logsync.holders import Holders
from logsync.ids import is_replica_id
from logsync.outbox import direct_header
from logsync.peerloop import PeerLoop
from logsync.streamframes import DIRECT_HEADER, take_pages


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

    async def take_pages(self, pages: list[bytes], store: Any, holders: Holders,
                         applied: Callable[[], None], *, paused: bool = False,
                         announced: str | None = None) -> None:
        """Page frames from this peer's stream, taken together by
        `streamframes.take_pages` in a worker thread (decoding included); `applied()`
        wakes our own streams, and what they leave us lacking goes to the pull loop. The
        peer is the one our full rounds know, else the one its stream's answer
        announced. A `StoreError` is the caller's."""
        replica = self.replica or (announced if is_replica_id(announced) else None)

        def served(held: dict[str, int]) -> None:  # holders live on the event loop
            anyio.from_thread.run_sync(holders.note, replica, held)

        try:
            taken = await anyio.to_thread.run_sync(functools.partial(
                take_pages, store, pages, replica, paused=paused, served=served))
        except BaseException:
            self.note(None, None)  # what the pages held is pulled by a full round
            raise
        if any(took.applied for took in taken):
            applied()
        for took in taken:
            if took.pull is not None:
                self.note(*took.pull)


def direct_headers(replicas: Iterable[str | None], publisher: str | None) -> dict[str, str]:
    """The header naming the peers we stream from (all but `publisher`), if any."""
    value = direct_header(replicas, publisher)
    return {DIRECT_HEADER: value} if value else {}
