"""Mutants of logsync/hlc.py that tests/test_hlc.py let live (issue 9,
scripts/mutation.py): the constants' actual values (a 60 s drift bound, a 6-hex
counter, 13-digit milliseconds), the drift ceiling as the exact edge of what `observe`
takes, counter exhaustion at any millisecond, the real wall clock, a fresh clock's
state, and `absorb_own` (our own stamps, whatever the wall clock says; nobody else's).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsync import hlc
from logsync.errors import StoreError

ME = "rep_" + "a" * 32
LOWER = "rep_" + "0" * 32  # sorts before ME
HIGHER = "rep_" + "f" * 32  # sorts after ME
OLD = "rep_" + "c" * 12
BASE = 1_782_962_683_000
TOP_MS = 9_999_999_999_999  # the largest 13-digit millisecond
FAST = settings(max_examples=150, deadline=None)

# Anything from the epoch to the last millisecond a stamp's 13 digits can carry, with
# room for the drift bound above it.
wall_ms = st.integers(0, TOP_MS - 120_000)


def parts(stamp: str) -> tuple[int, int, str]:
    parsed = hlc.parse(stamp)
    assert parsed is not None, f"malformed stamp {stamp!r}"
    return parsed.ms, parsed.counter, parsed.replica_id


# ── the constants are what the stamp format and the RFC say ───────────


@FAST
@given(wall_ms)
def test_the_drift_bound_is_sixty_seconds(now: int) -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: now)
    assert clock.observe(hlc.render(now + 60_000, 0, HIGHER)) is True
    assert clock.observe(hlc.render(now + 60_001, 0, HIGHER)) is False
    assert clock.last == (now + 60_000, 0)


@FAST
@given(wall_ms)
def test_drift_ceiling_is_the_first_millisecond_observe_refuses(now: int) -> None:
    """Everything below the ceiling is absorbable, nothing at or above it is."""
    ceiling = hlc.drift_ceiling(now)
    assert len(ceiling) == 13 and ceiling.isdigit()
    edge = int(ceiling)
    below = hlc.render(edge - 1, 0xFFFFFF, HIGHER)
    at = hlc.render(edge, 0, LOWER)
    assert below < ceiling <= at
    clock = hlc.HybridLogicalClock(ME, lambda: now)
    assert clock.observe(below) is True
    assert clock.observe(at) is False


def test_drift_ceiling_saturates_at_the_largest_thirteen_digit_millisecond() -> None:
    for now in (TOP_MS - 60_000, TOP_MS, 10**13, 10**15):
        assert hlc.drift_ceiling(now) == "9999999999999"


def test_the_counter_runs_to_ffffff_then_steps_the_millisecond() -> None:
    """Six hex digits: ffffff is the last counter value, 1000000 never appears."""
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    clock.absorb_own(f"{BASE:013d}-fffffe-{ME}")
    assert clock.tick() == f"{BASE:013d}-ffffff-{ME}"
    assert clock.tick() == f"{BASE + 1:013d}-000000-{ME}"


@FAST
@given(wall_ms, st.integers(0, 5_000))
def test_counter_exhaustion_steps_exactly_one_millisecond_at_any_millisecond(
    ms: int, behind: int
) -> None:
    """Even or odd, the millisecond after an exhausted counter is ms + 1, counter 0,
    and the ticks stay strictly increasing (the wall clock is at or behind)."""
    clock = hlc.HybridLogicalClock(ME, lambda: max(0, ms - behind))
    clock.absorb_own(hlc.render(ms, 0xFFFFFE, ME))
    stamps = [clock.tick() for _ in range(3)]
    assert [parts(s)[:2] for s in stamps] == [(ms, 0xFFFFFF), (ms + 1, 0), (ms + 1, 1)]
    assert stamps == sorted(set(stamps))


def test_a_wall_clock_beyond_thirteen_digits_saturates_instead_of_widening() -> None:
    for now in (TOP_MS, 10**13, 10**13 + 5, 10**14):
        clock = hlc.HybridLogicalClock(ME, lambda now=now: now)
        stamp = clock.tick()
        assert stamp == f"9999999999999-000000-{ME}"
        assert hlc.parse(stamp) == hlc.Stamp(TOP_MS, 0, ME)


def test_ticks_past_the_last_millisecond_still_increase() -> None:
    """A wall clock past 9999999999999 ms saturates at it: ticks go on increasing (the
    counter), they do not reset to the same stamp on every tick."""
    clock = hlc.HybridLogicalClock(ME, lambda: 10**13 + 5)
    stamps = [clock.tick() for _ in range(3)]
    assert stamps == sorted(set(stamps))
    assert all(hlc.parse(s) is not None for s in stamps)


def test_counter_exhaustion_at_the_last_millisecond_is_one_clear_error() -> None:
    """At 9999999999999-ffffff no later stamp fits the format: the tick refuses with one
    sentence instead of minting a malformed 14-digit stamp."""
    clock = hlc.HybridLogicalClock(ME, lambda: TOP_MS)
    clock.absorb_own(hlc.render(TOP_MS, 0xFFFFFF, ME))
    with pytest.raises(StoreError, match=r"another op: 9999999999999-ffffff is the last stamp "
                       r"the 13-digit format holds$"):
        clock.tick()
    assert clock.last == (TOP_MS, 0xFFFFFF)


# ── the real wall clock and a fresh clock ─────────────────────────────


def test_system_wall_ms_is_unix_milliseconds() -> None:
    before = int(time.time() * 1000)
    got = hlc.system_wall_ms()
    after = int(time.time() * 1000)
    assert isinstance(got, int)
    assert before <= got <= after


def test_a_clock_without_an_injected_wall_uses_the_real_one() -> None:
    before = int(time.time() * 1000)
    ms, counter, rid = parts(hlc.HybridLogicalClock(ME).tick())
    assert before <= ms <= int(time.time() * 1000)
    assert (counter, rid) == (0, ME)


def test_a_fresh_clock_has_absorbed_nothing() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    assert clock.last == (0, 0)
    clock.tick()
    assert clock.last == (BASE, 0)


# ── absorb_own: our own stamps, never anyone else's ───────────────────


def test_absorb_own_takes_our_stamp_even_beyond_the_drift_bound() -> None:
    """A restart after the wall clock went back: our newest stored stamp still wins."""
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    ours = hlc.render(BASE + 3_600_000, 5, ME)
    clock.absorb_own(ours)
    assert clock.last == (BASE + 3_600_000, 5)
    nxt = clock.tick()
    assert nxt == hlc.render(BASE + 3_600_000, 6, ME)
    assert nxt > ours


def test_absorb_own_of_an_older_stamp_changes_nothing() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    for _ in range(3):
        clock.tick()
    for older in (hlc.render(BASE - 10, 9, ME), hlc.render(BASE, 1, ME)):
        clock.absorb_own(older)
        assert clock.last == (BASE, 2)
    assert clock.tick() == hlc.render(BASE, 3, ME)


@pytest.mark.parametrize("other", [LOWER, HIGHER, OLD])
def test_absorb_own_ignores_other_replicas_stamps(other: str) -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    clock.absorb_own(hlc.render(BASE + 3_600_000, 5, other))
    assert clock.last == (0, 0)
    assert clock.tick() == hlc.render(BASE, 0, ME)


@pytest.mark.parametrize("junk", [None, 42, "", "garbage", f"{BASE:013d}-000001", b"x"])
def test_absorb_own_ignores_malformed_stamps(junk: object) -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    clock.tick()
    clock.absorb_own(junk)
    assert clock.last == (BASE, 0)


own_actions = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.integers(-5_000_000, 5_000)),
        st.tuples(st.just("own"), st.integers(-5_000_000, 5_000_000), st.integers(0, 0xFFFFFF)),
        st.tuples(st.just("other"), st.integers(-5_000_000, 5_000_000),
                  st.sampled_from([LOWER, HIGHER, OLD])),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(own_actions)
def test_ticks_exceed_every_earlier_tick_and_own_stamp_and_ignore_the_others(plan) -> None:
    """Invariant 7 with absorb_own: the clock is the max of its ticks and our own stamps
    (whatever the wall clock says); other replicas' stamps never move it."""
    wall = {"now": BASE}
    clock = hlc.HybridLogicalClock(ME, lambda: wall["now"])
    floor = (0, 0)
    for action in plan:
        if action[0] == "tick":
            wall["now"] = max(0, wall["now"] + action[1])
            ms, counter, _ = parts(clock.tick())
            assert (ms, counter) > floor
            floor = (ms, counter)
        elif action[0] == "own":
            ms = max(0, BASE + action[1])
            clock.absorb_own(hlc.render(ms, action[2], ME))
            floor = max(floor, (ms, action[2]))
        else:
            clock.absorb_own(hlc.render(max(0, BASE + action[1]), 7, action[2]))
        assert clock.last == floor
