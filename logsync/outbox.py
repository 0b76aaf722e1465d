"""What a change stream owes one subscriber, and when: one rule for the daemon's stream
(`server/pagestream.py`) and the simulator (`sim/runner.py`).

Plumtree's split between eager push and lazy announcement, decided with what a replica
knows anyway (no prune or graft messages):

- **eager**: an op of the publisher itself, or of an origin the subscriber does not
  stream from directly, goes out within `coalesce` seconds of the last write to that
  subscriber (ops owed meanwhile ride in one write). With `pages`, it goes as a page frame
  (the op, its chain and its artifacts, applied by the subscriber as a pulled page: no
  request follows); without, it is named and the subscriber pulls it.
- **lazy**: an op of an origin the subscriber streams from directly (it names those
  origins when it subscribes: `direct`) is only named, riding on the next eager write or
  alone `lazy` seconds after it was first owed. If the direct stream delivered it, the
  name costs the subscriber nothing; if it did not (a cut between the subscriber and the
  origin), the name makes it pull the op from us.
- **none**: an op the subscriber is known to hold (`holders.Holders`), checked when the
  write is built, so what the subscriber taught us meanwhile counts.

A frame is a hint or a page the subscriber validates, and the anti-entropy round covers
anything lost, so forgetting is always safe: at most `MAX_OWED` origins are owed; past
that the outbox owes "run a full round" instead (`Write.more`). Sans-IO: times are the
caller's seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MAX_OWED = 4096  # origins owed to one subscriber; beyond: one "more" flag, a full round
MAX_DIRECT = 128  # origins a subscriber may name as streamed directly
LAZY_S = 1.0  # how long a lazy name waits for an eager write to ride on


@dataclass
class Write:
    """One write to the subscriber: pages to build, names to send."""

    pages: dict[str, tuple[int, int]] = field(default_factory=dict)  # origin -> (after, top)
    named: dict[str, int] = field(default_factory=dict)  # origin -> top
    more: bool = False  # more changed than is named: the subscriber runs a full round

    def __bool__(self) -> bool:
        return bool(self.pages or self.named or self.more)


@dataclass
class Outbox:
    """What one subscriber is owed. `own`: the publisher's replica id; `direct`: the
    origins the subscriber streams from directly (its own ops need no entry: `holds`
    says the subscriber holds them)."""

    own: str
    direct: frozenset[str] = frozenset()
    pages: bool = False
    coalesce: float = 0.02
    lazy: float = LAZY_S
    eager_owed: dict[str, list[int]] = field(default_factory=dict)  # origin -> [first, top]
    lazy_owed: dict[str, int] = field(default_factory=dict)  # origin -> top
    lazy_since: float | None = None
    last_write: float = -math.inf
    overflow: bool = False

    def add(self, origin: str, first: int, top: int, now: float) -> None:
        """Ops `first..top` of `origin` are newly stored here."""
        if origin in self.direct and origin != self.own:
            if origin not in self.lazy_owed and not self._room():
                return
            self.lazy_owed[origin] = max(top, self.lazy_owed.get(origin, 0))
            if self.lazy_since is None:
                self.lazy_since = now
            return
        span = self.eager_owed.get(origin)
        if span is None:
            if self._room():
                self.eager_owed[origin] = [first, top]
        else:
            span[0], span[1] = min(span[0], first), max(span[1], top)

    def _room(self) -> bool:
        if len(self.eager_owed) + len(self.lazy_owed) < MAX_OWED:
            return True
        self.overflow = True
        self.eager_owed.clear()
        self.lazy_owed.clear()
        return False

    def due(self) -> float | None:
        """When the next write is due (maybe already past); None: nothing is owed."""
        if self.eager_owed or self.overflow:
            return self.last_write + self.coalesce
        if self.lazy_owed:
            assert self.lazy_since is not None
            return self.lazy_since + self.lazy
        return None

    def take(self, now: float, holds: Callable[[str, int], bool]) -> Write | None:
        """The write due at `now` (None: none is due), less what the subscriber is known
        to hold; what it names is no longer owed."""
        due = self.due()
        if due is None or due > now:
            return None
        write = Write(more=self.overflow)
        for origin, (first, top) in self.eager_owed.items():
            if holds(origin, top):
                continue
            if self.pages:
                write.pages[origin] = (first - 1, top)
            else:
                write.named[origin] = top
        for origin, top in self.lazy_owed.items():
            if not holds(origin, top) and origin not in write.pages:
                write.named[origin] = max(top, write.named.get(origin, 0))
        self.eager_owed, self.lazy_owed, self.lazy_since = {}, {}, None
        self.overflow = False
        if write:
            self.last_write = now
        return write


def parse_direct(value: str | None, is_id: Callable[[object], bool]) -> frozenset[str] | str:
    """The origins a subscriber names as streamed directly (a comma-separated header);
    a string is the sentence why the value is refused."""
    if not value:
        return frozenset()
    names = [part.strip() for part in value.split(",")]
    if len(names) > MAX_DIRECT:
        return f"{len(names)} direct origins named; at most {MAX_DIRECT} are taken"
    bad = next((n for n in names if not is_id(n)), None)
    if bad is not None:
        return f"direct origin {bad[:80]!r} is not a replica id"
    return frozenset(names)


def direct_header(replicas: Iterable[str | None], publisher: str | None) -> str:
    """The subscriber's side: the replica ids it streams from, less the publisher."""
    ids = sorted({r for r in replicas if r and r != publisher})
    return ",".join(ids[:MAX_DIRECT])
