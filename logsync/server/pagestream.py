"""The change stream of a subscriber that takes page frames (`streamframes.py`).

A logsync subscriber that sends `X-Logsync-Frames: pages` with its replica id gets, in
place of one upstream frame per event, what its `outbox.Outbox` owes it: pages of the
ops it is not known to hold, named tops for the origins it streams directly, written
at most once per coalescing window. What changed is read from the store's version
vector (index seeks, whatever the backlog; read once per poll for all page streams, at
once after a change), never by listing events. The slot,
heartbeat, send timeout and shutdown rules are the event stream's (`stream.py`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

from logsync.outbox import Outbox
from logsync.streamframes import encode_write


class PagePump:
    """One page-taking subscriber's writes; `stream._EventStream` runs it in its slot.
    `srv` is the stream's `StreamHost`, `send` its timed send."""

    def __init__(self, direct: frozenset[str], coalesce: float,
                 holds: Callable[[str, int], bool]) -> None:
        self.direct, self.coalesce, self.holds = direct, coalesce, holds
        self.tops: dict[str, int] = {}  # what this stream has seen of the store, per origin
        self.read: Any = None  # the probe's last answer (a new dict on each read)

    async def __call__(self, srv: Any, send: Any) -> None:
        """Writes until shutdown begins (then return: the caller ends the body). The store
        is first read here, once the stream holds its slot."""
        own, self.tops = await srv.run(lambda store: (store.replica_id, store.version_vector()))
        outbox = Outbox(own, self.direct, pages=True, coalesce=self.coalesce)
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        generation = srv.notifier.generation
        last_write, changed = time.monotonic(), False
        while not srv.shutting_down():
            vector = await srv.vector_probe.latest(generation) if changed else self.read
            if vector is not self.read:  # the probe read anew: what grew is owed
                self.read, now = vector, time.monotonic()
                for origin, top in vector.items():
                    old = self.tops.get(origin, 0)
                    if top > old:
                        outbox.add(origin, old + 1, top, now)
                        self.tops[origin] = top
            write = outbox.take(time.monotonic(), self.holds)
            if write:
                body = await srv.run(functools.partial(encode_write, write=write,
                                                       own=outbox.own))
                if body:
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    last_write = time.monotonic()
            idle = time.monotonic() - last_write
            if idle >= srv.cfg.sse_heartbeat_s:
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
                last_write, idle = time.monotonic(), 0.0
            due = outbox.due()
            until_due = math.inf if due is None else max(due - time.monotonic(), 0.0)
            wait = min(srv.cfg.sse_poll_s, srv.cfg.sse_heartbeat_s - idle, until_due)
            generation = await srv.notifier.wait(generation, wait)
            changed = True  # a wake, a due write or a poll: the vector is read again
