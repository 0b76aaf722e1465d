"""Hybrid logical clock: `<unix ms, 13 digits>-<counter, 6 hex>-<replica id>`.

Fixed width, so plain string comparison is the fleet-wide merge order. The
wall clock is injected (a callable returning unix milliseconds), so the
simulator and tests can make it regress, jump or stand still.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from logsync.errors import StoreError

HLC_RE = re.compile(r"([0-9]{13})-([0-9a-f]{6})-(rep_(?:[0-9a-f]{12}|[0-9a-f]{32}))")
MAX_COUNTER = 0xFFFFFF
MAX_FUTURE_DRIFT_MS = 60_000
MAX_MS = 10**13 - 1

WallClock = Callable[[], int]


class Stamp(NamedTuple):
    ms: int
    counter: int
    replica_id: str


def system_wall_ms() -> int:
    """The real wall clock; only the edges (CLI, daemon) pass this in."""
    return int(time.time() * 1000)


def parse(stamp: object) -> Stamp | None:
    """Split a stamp into its parts, or None if it is not well-formed."""
    if not isinstance(stamp, str):
        return None
    m = HLC_RE.fullmatch(stamp)
    if m is None:
        return None
    return Stamp(int(m.group(1)), int(m.group(2), 16), m.group(3))


def render(ms: int, counter: int, replica_id: str) -> str:
    return f"{ms:013d}-{counter:06x}-{replica_id}"


def drift_ceiling(now_ms: int) -> str:
    """Smallest stamp that lies beyond the future-drift bound at `now_ms`."""
    return f"{min(now_ms + MAX_FUTURE_DRIFT_MS + 1, MAX_MS):013d}"


class HybridLogicalClock:
    """Thread-safe HLC bound to one replica id.

    `tick()` is strictly greater than every earlier tick and every observed
    stamp within the drift bound, whatever the wall clock does.
    """

    def __init__(self, replica_id: str, wall_ms: WallClock | None = None) -> None:
        self.replica_id = replica_id
        self._wall_ms = wall_ms or system_wall_ms
        self._lock = threading.Lock()
        self._ms = 0
        self._counter = 0

    @property
    def last(self) -> tuple[int, int]:
        return self._ms, self._counter

    def tick(self) -> str:
        """Stamp a new local op."""
        with self._lock:
            now = min(self._wall_ms(), MAX_MS)  # a clock past the format saturates
            if now > self._ms:
                self._ms, self._counter = now, 0
            elif self._counter < MAX_COUNTER:
                self._counter += 1
            elif self._ms < MAX_MS:
                # Exhausted within one ms: step the physical part, never wrap.
                self._ms, self._counter = self._ms + 1, 0
            else:
                raise StoreError(
                    f"the clock cannot stamp another op: {render(MAX_MS, MAX_COUNTER, '')[:-1]} "
                    "is the last stamp the 13-digit format holds")
            return render(self._ms, self._counter, self.replica_id)

    def absorb_own(self, stamp: object) -> None:
        """Absorb a stamp this replica issued earlier, whatever the wall clock says now.

        Our own stamps are not a remote clock to distrust: skipping one because
        the wall clock went back would let the next tick sort before it.
        """
        parsed = parse(stamp)
        if parsed is None or parsed.replica_id != self.replica_id:
            return
        with self._lock:
            if (parsed.ms, parsed.counter) > (self._ms, self._counter):
                self._ms, self._counter = parsed.ms, parsed.counter

    def observe(self, stamp: object) -> bool:
        """Absorb a remote stamp; False if malformed or beyond the drift bound.

        A stamp too far in the future is stored by the caller but not
        absorbed: one peer with a broken clock must not drag ours along.
        """
        parsed = parse(stamp)
        if parsed is None:
            return False
        with self._lock:
            if parsed.ms > self._wall_ms() + MAX_FUTURE_DRIFT_MS:
                return False
            if (parsed.ms, parsed.counter) > (self._ms, self._counter):
                self._ms, self._counter = parsed.ms, parsed.counter
            return True
