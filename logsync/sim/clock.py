"""Virtual time, and each node's wall clock derived from it.

The simulation runs on one integer clock in microseconds (floats would make the
trace depend on rounding). A node's wall clock is that virtual time plus a fixed
epoch, plus the node's skew, plus every jump applied to it so far: the store's
HLC and `created_at` read it through `NodeClock.wall_ms`, so a node can run
minutes fast, or have its clock stepped backwards, without anything else knowing.
"""

from __future__ import annotations

from datetime import UTC, datetime

US = 1_000_000
# 2026-09-01T00:00:00Z: a fixed epoch keeps ids and created_at identical per seed.
EPOCH_MS = int(datetime(2026, 9, 1, tzinfo=UTC).timestamp() * 1000)


def to_us(seconds: float) -> int:
    return int(round(seconds * US))


def to_s(micros: int) -> float:
    return micros / US


def stamp(micros: int) -> str:
    """Fixed-width virtual time for trace lines: seconds with microseconds."""
    return f"{micros // US:>8d}.{micros % US:06d}"


class VirtualClock:
    """The one clock of a run; only the event loop moves it, and only forwards."""

    def __init__(self) -> None:
        self.now_us = 0

    def advance(self, to_us_value: int) -> None:
        if to_us_value < self.now_us:
            raise AssertionError(f"virtual time ran backwards: {to_us_value} < {self.now_us}")
        self.now_us = to_us_value

    @property
    def now(self) -> float:
        return self.now_us / US


class NodeClock:
    """A node's wall clock: virtual time + epoch + skew + jumps (all in ms)."""

    def __init__(self, clock: VirtualClock, skew_ms: int = 0) -> None:
        self._clock = clock
        self.offset_ms = skew_ms

    def wall_ms(self) -> int:
        return EPOCH_MS + self._clock.now_us // 1000 + self.offset_ms

    def jump(self, by_ms: int) -> None:
        """Step the wall clock (NTP correction, a user fixing the date, a dead RTC)."""
        self.offset_ms += by_ms
