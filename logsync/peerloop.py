"""One peer's pull loop as a sans-IO state machine: what to pull from a peer, and when.

The daemon and the simulator keep one `PeerLoop` per peer they pull from and only
carry out its plans (h11's habit: the rules in one place, the I/O at the edges). A
loop never reads a clock, a socket or the store: every input carries the caller's
time in seconds and whatever the caller read (the local vector); randomness is an
injected `random.Random`. Claims on origins are shared by the loops of one replica
through a `Claims` table, so no origin is pulled from two peers at once.

Rules (input: what the loop does), one unit test each in tests/test_peerloop.py:

    start(now)            the first round is due at once, and it is full
    frame(o, seq, now)    remember o -> highest seq (at most MAX_NOTIFIED origins; beyond:
                          forget them and owe a full round); due within the debounce, or
                          right after the running round
    frame(None, None)     the stream (re)connected, frames may have been missed: the next
                          round is full; due within the debounce
    begin(now, local)     nothing named (the timer): a full round (anti-entropy)
                          a full round owed (none yet: extensions unknown; the last one
                          failed; the stream reconnected; the last full round is
                          2 * interval old): a full round
                          else a targeted round of the named origins we lack, minus those
                          another peer's round claims that far and those backing off,
                          claimed for CLAIM_TTL_S; none left: NoRound, a success
    succeeded(report)     claims released; per-origin backoff folds the report in; a full
                          round's extensions kept; next round after the jittered interval,
                          at once if frames came meanwhile or the round was capped; an
                          origin held back by a claim is due when the claim lapses
    failed(report, hint)  claims released; per-origin backoff folds in what the round did;
                          the next round is full, after exponential backoff, never before
                          the peer's Retry-After
    abandon(now)          a cancelled round: as failed (claims released at once)
    (time passes)         a claim lapses after CLAIM_TTL_S: a claiming pull that drips
                          holds no one back for long
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from logsync.report import RoundReport
from logsync.schedule import OriginBackoff, PullSchedule, choose_targets
from logsync.wire import Extensions

# A claim keeps a second peer from pulling the same origin at once; it is a courtesy, not
# a lock (applying twice is idempotent), so it lapses soon: a claiming pull that drips
# must not hold back an honest peer's newer ops for long.
CLAIM_TTL_S = 10.0
MAX_NOTIFIED = 1024  # origins remembered from frames between rounds; beyond: a full round


@dataclass(frozen=True)
class FullRound:
    """Run `engine.pull_round`, leaving out the origins in `held_back`."""

    held_back: frozenset[str]


@dataclass(frozen=True)
class TargetedRound:
    """Run `engine.targeted_origin` for each origin up to its top, with these extensions."""

    targets: Mapping[str, int]
    extensions: Extensions


@dataclass(frozen=True)
class NoRound:
    """Nothing to pull now (the frames named only what we hold or what is claimed)."""


Plan = FullRound | TargetedRound | NoRound


@dataclass
class Claims:
    """Origins being pulled by some peer's targeted round: origin -> (top, lapses at).
    One table per replica, shared by all its peer loops."""

    ttl: float = CLAIM_TTL_S
    entries: dict[str, tuple[int, float]] = field(default_factory=dict)

    def active(self, now: float) -> dict[str, int]:
        """Unlapsed claims, origin -> top; lapsed ones are dropped."""
        for origin, (_, lapses) in list(self.entries.items()):
            if lapses <= now:
                del self.entries[origin]
        return {origin: top for origin, (top, _) in self.entries.items()}

    def take(self, targets: Mapping[str, int], now: float) -> dict[str, int]:
        """Claim the targets no one holds that far; returns what this round claimed."""
        held = self.active(now)
        claimed = {o: t for o, t in targets.items() if t > held.get(o, 0)}
        self.entries.update({o: (t, now + self.ttl) for o, t in claimed.items()})
        return claimed

    def release(self, claimed: Mapping[str, int]) -> None:
        """Drop this round's claims (not a newer claim on the same origin)."""
        for origin, top in claimed.items():
            if self.entries.get(origin, (None,))[0] == top:
                del self.entries[origin]

    def lapse_of(self, origins: set[str] | Mapping[str, int]) -> float | None:
        """When the first claim on these origins lapses (None: none is claimed)."""
        times = [self.entries[o][1] for o in origins if o in self.entries]
        return min(times) if times else None


@dataclass
class PeerLoop:
    """The pull loop of one peer: its schedule, notified origins, claims, backoff."""

    own: str  # this replica's id: never pulled by a targeted round
    schedule: PullSchedule
    claims: Claims
    backoff: OriginBackoff
    targeted: bool = True  # False: every round is full (the daemon before targeted rounds)
    notified: dict[str, int] = field(default_factory=dict)  # origin -> top seen in frames
    wants_full: bool = True
    extensions: Extensions | None = None  # known after the first full round
    last_full: float = float("-inf")
    running: Plan | None = None
    claimed: dict[str, int] = field(default_factory=dict)  # by the running round

    @classmethod
    def make(cls, own: str, claims: Claims, rng: random.Random, *, interval: float,
             debounce: float, jitter: float = 0.1, backoff_base: float = 1.0,
             backoff_cap: float = 60.0, targeted: bool = True) -> PeerLoop:
        schedule = PullSchedule(rng=rng, interval=interval, jitter=jitter, debounce=debounce,
                                backoff_base=backoff_base, backoff_cap=backoff_cap)
        return cls(own=own, schedule=schedule, claims=claims, backoff=OriginBackoff(rng=rng),
                   targeted=targeted)

    # ── inputs ────────────────────────────────────────────────────────

    def start(self, now: float) -> None:
        self.schedule.start(now)

    def frame(self, origin: str | None, seq: int | None, now: float) -> None:
        """A change frame named (origin, seq), or the stream (re)connected (None, None)."""
        if origin is None or seq is None:
            self.wants_full = True
        elif seq > self.notified.get(origin, 0):
            if origin not in self.notified and len(self.notified) >= MAX_NOTIFIED:
                self.notified.clear()  # bounded: a full round covers whatever was named
                self.wants_full = True
            self.notified[origin] = seq
        self.schedule.notified(now)

    def is_due(self, now: float) -> bool:
        return self.running is None and self.schedule.is_due(now)

    def wait_time(self, now: float) -> float | None:
        """Seconds until the next round is due; None while a round runs."""
        return None if self.running is not None else self.schedule.wait_time(now)

    @property
    def next_due(self) -> float | None:
        return None if self.running is not None else self.schedule.next_due

    def begin(self, now: float, local: Mapping[str, int]) -> Plan:
        """The round to run now, given the local vector. Call only when due."""
        self.schedule.begin(now)
        targets = None
        if self.targeted:
            targets = choose_targets(
                self.notified, local, self.own, self.claims.active(now),
                extensions_known=self.extensions is not None and not self.wants_full,
                since_full=now - self.last_full, interval=self.schedule.interval,
            )
        held = self.claims.active(now)
        # Origins another peer's round has claimed that far wait for its claim.
        self.notified = {} if targets is None else {
            o: t for o, t in self.notified.items()
            if o not in targets and t > local.get(o, 0) and held.get(o, 0) >= t}
        backing_off = self.backoff.held(now)
        if targets is None:
            self.wants_full = False
            self.last_full = now
            plan: Plan = FullRound(frozenset(backing_off))
        else:
            targets = {o: t for o, t in targets.items() if o not in backing_off}
            if not targets:
                self.running = NoRound()
                self.succeeded(RoundReport(peer=""), now)
                return NoRound()
            assert self.extensions is not None
            self.claimed = self.claims.take(targets, now)
            plan = TargetedRound(targets, self.extensions)
        self.running = plan
        return plan

    def succeeded(self, report: RoundReport, now: float) -> float:
        """The round ended (some origins may have failed: `report` says which)."""
        plan = self._end(report, now)
        if isinstance(plan, FullRound):
            self.extensions = report.negotiated
        if report.capped:  # more is owed: go again at once
            self.schedule.notified(now)
        due = self.schedule.succeeded(now)
        if self.notified:  # held back by a claim: due when it lapses (or soon: released)
            lapse = self.claims.lapse_of(self.notified)
            due = min(due, lapse if lapse is not None else now + self.schedule.debounce)
            self.schedule.due_by(due)
        return due

    def failed(self, report: RoundReport, now: float, retry_after: float | None = None) -> float:
        """The round failed as a whole (auth, transport, a store fault, a bug)."""
        self._end(report, now)
        self.wants_full = True
        return self.schedule.failed(now, retry_after)

    def abandon(self, now: float) -> None:
        """The round was cancelled (the peer was removed or changed, the daemon stops):
        its claims go at once, so no other peer waits for them to lapse."""
        if self.running is not None:
            self.failed(RoundReport(peer=""), now)

    def _end(self, report: RoundReport, now: float) -> Plan | None:
        plan, self.running = self.running, None
        self.claims.release(self.claimed)
        self.claimed = {}
        self.backoff.record(report, now)  # a failed round still says which origins failed
        return plan
