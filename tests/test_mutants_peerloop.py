"""Rules of `logsync/peerloop.py` that its mutation run (scripts/mutation.py) showed no
test pinned: the exact bounds (claim TTL, notified origins), the claim comparisons, what
a round keeps of its frames, the daemon's default backoff, and plans as values."""

from __future__ import annotations

import dataclasses
import random

import pytest

from logsync.peerloop import (
    CLAIM_TTL_S,
    MAX_NOTIFIED,
    Claims,
    FullRound,
    NoRound,
    PeerLoop,
    TargetedRound,
)
from logsync.report import RoundReport
from logsync.schedule import OriginBackoff, PullSchedule
from logsync.wire import Extensions

OWN = "rep_" + "0" * 32
A = "rep_" + "a" * 32
B = "rep_" + "b" * 32
EXT = Extensions(msgpack=True)


def ready(claims: Claims | None = None, **kw: object) -> PeerLoop:
    """A loop past its first full round at t=0, extensions known."""
    options = {"interval": 10.0, "debounce": 0.0, "jitter": 0.0} | kw
    loop = PeerLoop.make(OWN, claims if claims is not None else Claims(), random.Random(4),
                         **options)  # type: ignore[arg-type]
    loop.start(0.0)
    loop.begin(0.0, {})
    report = RoundReport(peer="p")
    report.negotiated = EXT
    loop.succeeded(report, 0.0)
    return loop


def test_a_claim_is_held_for_exactly_ten_seconds() -> None:
    claims = Claims()
    claims.take({A: 3}, 50.0)
    assert CLAIM_TTL_S == 10.0
    assert claims.active(59.999) == {A: 3}
    assert claims.active(60.0) == {}


def test_a_long_lapsed_claim_is_gone_whenever_it_is_looked_at() -> None:
    claims = Claims()
    claims.take({A: 3}, 0.0)
    assert claims.active(1000.0) == {} and claims.entries == {}


def test_exactly_max_notified_origins_are_remembered_and_one_more_owes_a_full_round() -> None:
    loop = ready()
    for n in range(MAX_NOTIFIED):
        loop.frame(f"rep_{n:032x}", 1, 1.0)
    assert MAX_NOTIFIED == 1024
    assert len(loop.notified) == MAX_NOTIFIED and not loop.wants_full
    loop.frame(f"rep_{MAX_NOTIFIED:032x}", 1, 1.0)
    assert len(loop.notified) == 1 and loop.wants_full


@pytest.mark.parametrize(("origin", "seq"), [(A, None), (None, 5)])
def test_a_frame_missing_either_half_owes_a_full_round(origin: str | None,
                                                       seq: int | None) -> None:
    loop = ready()
    loop.frame(origin, seq, 1.0)
    assert loop.wants_full and loop.notified == {}
    assert isinstance(loop.begin(1.0, {}), FullRound)


def test_take_claims_only_what_no_one_holds_that_far() -> None:
    claims = Claims()
    assert claims.take({A: 1}, 0.0) == {A: 1}  # nothing held: even seq 1 is claimed
    assert claims.take({A: 1}, 0.0) == {}  # held that far already
    claims.entries[B] = (7, 10.0)
    assert claims.take({B: 5}, 0.0) == {}  # held further: not ours to claim
    assert claims.take({B: 8}, 0.0) == {B: 8}


def test_release_drops_only_this_rounds_claim_compared_by_value() -> None:
    claims = Claims()
    top = 2**62
    claims.take({A: top}, 0.0)
    claims.release({A: int(str(top))})  # an equal int, not the same object
    assert claims.entries == {}
    claims.entries[A] = (3, 10.0)  # a lower claim taken after ours lapsed
    claims.release({A: 5})
    assert claims.active(0.0) == {A: 3}


def test_a_round_keeps_only_frames_held_back_by_a_claim() -> None:
    claims = Claims()
    loop = ready(claims)
    claims.entries.update({A: (9, 5.0), B: (1, 5.0)})
    loop.frame(A, 5, 1.0)  # claimed further, but we hold 7: nothing owed
    loop.frame(B, 1, 1.0)  # claimed to 1, we hold nothing of it: kept for the lapse
    loop.frame(OWN, 1, 1.0)  # our own origin: never pulled by a targeted round
    assert loop.begin(1.0, {A: 7}) == NoRound()
    assert loop.notified == {B: 1}

    loop = ready(claims)
    loop.frame(A, 5, 1.0)  # we hold exactly 5 and it is claimed: nothing owed
    assert loop.begin(1.0, {A: 5}) == NoRound()
    assert loop.notified == {}


def test_the_daemons_loop_backs_off_from_one_second_up_to_sixty() -> None:
    loop = PeerLoop.make(OWN, Claims(), random.Random(9), interval=10.0, debounce=0.0)
    loop.start(0.0)
    waits, now = [], 0.0
    for _ in range(10):
        loop.begin(now, {})
        due = loop.failed(RoundReport(peer="p"), now)
        waits.append(due - now)
        now = due
    assert 0.5 <= waits[0] <= 1.0
    assert 1.0 <= waits[1] <= 2.0
    assert all(30.0 <= w <= 60.0 for w in waits[6:])
    assert max(waits) > 59.0 / 2


def test_make_takes_its_options_by_keyword_only() -> None:
    with pytest.raises(TypeError):
        PeerLoop.make(OWN, Claims(), random.Random(1), 10.0, 0.0)  # type: ignore[misc]


def test_a_loop_made_by_hand_plans_targeted_rounds_by_default() -> None:
    rng = random.Random(1)
    loop = PeerLoop(own=OWN, schedule=PullSchedule(rng=rng, interval=10.0, jitter=0.0),
                    claims=Claims(), backoff=OriginBackoff(rng=rng))
    loop.start(0.0)
    loop.begin(0.0, {})
    report = RoundReport(peer="p")
    report.negotiated = EXT
    loop.succeeded(report, 0.0)
    loop.frame(A, 2, 1.0)
    assert loop.begin(1.1, {}) == TargetedRound({A: 2}, EXT)


@pytest.mark.parametrize("plan", [FullRound(frozenset()), TargetedRound({A: 1}, EXT), NoRound()])
def test_plans_are_values_a_driver_cannot_change(plan: object) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.extra = 1  # type: ignore[attr-defined]


class Highest(random.Random):
    """Jitter at its top: the backoff's upper bound, exactly."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_the_daemons_backoff_cap_is_sixty_seconds_exactly() -> None:
    loop = PeerLoop.make(OWN, Claims(), Highest(1), interval=10.0, debounce=0.0, jitter=0.0)
    loop.start(0.0)
    now, waits = 0.0, []
    for _ in range(9):
        loop.begin(now, {})
        due = loop.failed(RoundReport(peer="p"), now)
        waits.append(due - now)
        now = due
    assert waits[:3] == [1.0, 2.0, 4.0]
    assert waits[-1] == 60.0
