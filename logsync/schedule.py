"""When to pull: the per-peer schedule, per-origin backoff, and the choice between a
targeted and a full round. Pure: times are the caller's seconds, randomness an
injected `random.Random`; the daemon (and, through the same calls, the simulator)
carries out what these decide.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from logsync.errors import ValidationError

if TYPE_CHECKING:
    from logsync.report import RoundReport

def choose_targets(
    notified: Mapping[str, int],
    local: Mapping[str, int],
    own: str,
    inflight: Mapping[str, int],
    *,
    extensions_known: bool,
    since_full: float,
    interval: float,
) -> dict[str, int] | None:
    """What a round started by change notifications should pull.

    A notification names (origin, origin_seq) pairs -- the events in the peer's
    stream frames. Returns the origins (and how far) to pull without fetching the
    vector first, or None for a full anti-entropy round: when nothing was notified
    (the timer is due: anti-entropy), when we do not know the peer's extensions yet
    (no full round so far) or the last full round is two intervals old. Our own
    origin and origins already being pulled that far (from another peer) are left
    out; an empty dict means the notifications named nothing we lack.
    """
    if not notified or not extensions_known or since_full >= 2 * interval:
        return None
    return {
        origin: top
        for origin, top in sorted(notified.items())
        if origin != own and top > local.get(origin, 0) and top > inflight.get(origin, 0)
    }


@dataclass
class OriginBackoff:
    """Per-origin backoff of one peer (rule 6): an origin that failed is left out of that
    peer's rounds for `base * 2**(n-1)` seconds (capped, equal jitter) after its n-th
    failure in a row; a round in which it does not fail clears it. Times are the
    caller's seconds; nothing here reads a clock. Bounded: an entry lapses `cap`
    seconds after its hold ends, and at most `max_tracked` are kept (the ones whose
    hold ends first go), so origins a peer invents cannot grow it."""

    rng: random.Random
    base: float = 5.0
    cap: float = 60.0  # a recovered origin waits at most about a minute (four intervals)
    max_tracked: int = 4096
    failures: dict[str, tuple[int, float]] = field(default_factory=dict)

    def held(self, now: float) -> set[str]:
        """Origins to leave out of a round starting at `now`."""
        return {origin for origin, (_, until) in self.failures.items() if until > now}

    def record(self, report: RoundReport, now: float) -> None:
        """Fold one finished round in: failed origins back off, pulled ones are cleared."""
        failed = report.failed_origins()
        for origin in report.origins:
            if origin not in failed:
                self.failures.pop(origin, None)
        for origin in failed:
            count = self.failures.get(origin, (0, 0.0))[0] + 1
            delay = min(self.cap, self.base * 2 ** min(count - 1, 32))
            self.failures[origin] = (count, now + delay / 2 + self.rng.uniform(0, delay / 2))
        for origin, (_, until) in list(self.failures.items()):
            if until + self.cap <= now:
                del self.failures[origin]
        if len(self.failures) > self.max_tracked:
            keep = sorted(self.failures.items(), key=lambda kv: kv[1][1])[-self.max_tracked:]
            self.failures = dict(keep)


@dataclass
class PullSchedule:
    """When to pull one peer next. All times are caller-supplied seconds.

    Rules (one place, STYLE.md §4):
    - `start(now)`: the first round is due at once, not after one interval.
    - `begin(now)`: a round is running; nothing is due until it ends.
    - `succeeded(now)`: failures reset; next round after `interval` scaled by
      a factor in [1 - jitter, 1 + jitter]; if notified meanwhile, after `debounce`.
    - `failed(now, retry_after)`: exponential backoff `base * 2**(n-1)` capped at
      `backoff_cap`, with equal jitter (half fixed, half random), never before
      the peer's Retry-After hint.
    - `notified(now)`: due within `debounce` (bursts collapse into one pull), not
      before a Retry-After hold; during a round, remembered for its end.
    - `due_by(at)`: due no later than `at` (a held-back notification's claim lapses).
    """

    rng: random.Random
    interval: float = 15.0
    jitter: float = 0.1
    debounce: float = 0.05
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    next_due: float | None = None
    running: bool = False
    failures: int = 0
    hold_until: float = 0.0
    notify_pending: bool = False

    def __post_init__(self) -> None:
        for name in ("interval", "debounce", "backoff_base", "backoff_cap"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValidationError(f"{name}={value!r} must be a non-negative, finite "
                                      "number of seconds")
        if not 0 <= self.jitter < 1:
            raise ValidationError(f"jitter={self.jitter!r} must be a fraction in [0, 1)")

    def start(self, now: float) -> float:
        self.next_due = now
        return now

    def is_due(self, now: float) -> bool:
        return not self.running and self.next_due is not None and now >= self.next_due

    def wait_time(self, now: float) -> float | None:
        """Seconds until due (0 if due), None while running or not started."""
        if self.running or self.next_due is None:
            return None
        return max(0.0, self.next_due - now)

    def begin(self, now: float) -> None:
        self.running = True
        self.notify_pending = False

    def succeeded(self, now: float) -> float:
        self.running = False
        self.failures = 0
        self.hold_until = 0.0
        if self.notify_pending:
            self.notify_pending = False
            return self._set(now + self.debounce)
        spread = self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        return self._set(now + self.interval * spread)

    def failed(self, now: float, retry_after: float | None = None) -> float:
        self.running = False
        self.notify_pending = False
        self.failures += 1
        delay = min(self.backoff_cap, self.backoff_base * 2 ** min(self.failures - 1, 62))
        delay = delay / 2 + self.rng.uniform(0, delay / 2)
        if retry_after is not None and retry_after > 0:
            self.hold_until = now + retry_after
            delay = max(delay, retry_after)
        return self._set(now + delay)

    def due_by(self, at: float) -> float | None:
        """Due no later than `at` (e.g. when a claim another peer holds lapses)."""
        if not self.running and (self.next_due is None or at < self.next_due):
            self.next_due = at
        return self.next_due

    def notified(self, now: float) -> float | None:
        if self.running:
            self.notify_pending = True
            return None
        soon = max(now + self.debounce, self.hold_until)
        if self.next_due is None or soon < self.next_due:
            return self._set(soon)
        return self.next_due

    def _set(self, due: float) -> float:
        self.next_due = due
        return due
