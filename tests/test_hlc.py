"""The hybrid logical clock (DESIGN invariant 7): string order is merge order,
`tick` never goes backwards whatever the wall clock does, and `observe`
absorbs in-bound remote stamps while ignoring malformed or far-future ones.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from logsync import hlc

ME = "rep_" + "a" * 32
PEER = "rep_" + "b" * 32
OLD_PEER = "rep_" + "c" * 12
BASE = 1_782_962_683_000
FAST = settings(max_examples=150, deadline=None)


class Wall:
    """A wall clock fed from a list; repeats its last value when exhausted."""

    def __init__(self, values: list[int]) -> None:
        self.values = list(values)
        self.i = 0

    def __call__(self) -> int:
        value = self.values[min(self.i, len(self.values) - 1)]
        self.i += 1
        return value


# Wall-clock steps: regressions, big jumps, standing still.
steps = st.lists(
    st.one_of(
        st.just(0),
        st.integers(-5_000_000, -1),
        st.integers(1, 3),
        st.integers(1_000, 10_000_000),
    ),
    min_size=1,
    max_size=60,
)


def walk(deltas: list[int]) -> list[int]:
    out, now = [], BASE
    for d in deltas:
        now = max(0, now + d)
        out.append(now)
    return out


# ── rendering and parsing ─────────────────────────────────────────────


def test_render_is_fixed_width_and_parse_round_trips() -> None:
    stamp = hlc.render(BASE, 0xABC, ME)
    assert stamp == f"{BASE:013d}-000abc-{ME}"
    assert hlc.parse(stamp) == hlc.Stamp(BASE, 0xABC, ME)
    assert hlc.render(5, 1, ME) == f"0000000000005-000001-{ME}"


def test_string_order_is_numeric_order_across_digit_boundaries() -> None:
    a = hlc.render(999_999_999_999, 0xFFFFFF, ME)
    b = hlc.render(1_000_000_000_000, 0, ME)
    assert a < b
    assert hlc.render(BASE, 9, ME) < hlc.render(BASE, 10, ME)


def test_parse_accepts_twelve_hex_replica_ids() -> None:
    assert hlc.parse(f"{BASE:013d}-000001-{OLD_PEER}") == hlc.Stamp(BASE, 1, OLD_PEER)


def test_parse_rejects_malformed_stamps() -> None:
    for bad in (
        None, 42, b"x", "", f"{BASE}-000001", f"{BASE // 10}-000001-{ME}",
        f"{BASE:013d}-00001-{ME}", f"{BASE:013d}-00000G-{ME}", f"{BASE:013d}-000001-rep_ABC",
        f"{BASE:013d}-000001-{ME}x", f"{BASE:013d}-000001-rep_{'a' * 20}",
        f"{BASE:013d}-000001-{ME.upper()}",
    ):
        assert hlc.parse(bad) is None, bad


# ── tick ──────────────────────────────────────────────────────────────


@FAST
@given(steps)
def test_tick_is_strictly_increasing_under_any_wall_clock(deltas: list[int]) -> None:
    clock = hlc.HybridLogicalClock(ME, Wall(walk(deltas)))
    stamps = [clock.tick() for _ in deltas]
    assert all(hlc.parse(s) is not None for s in stamps)
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)


@FAST
@given(steps)
def test_tick_takes_the_highest_wall_time_and_counts_within_it(deltas: list[int]) -> None:
    walls = walk(deltas)
    clock = hlc.HybridLogicalClock(ME, Wall(walls))
    high, counter = -1, 0
    for wall in walls:
        stamp = hlc.parse(clock.tick())
        assert stamp is not None
        counter = 0 if wall > high else counter + 1
        high = max(high, wall)
        assert (stamp.ms, stamp.counter) == (high, counter)


def test_same_millisecond_bumps_the_counter() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    assert [clock.tick() for _ in range(3)] == [
        f"{BASE:013d}-000000-{ME}", f"{BASE:013d}-000001-{ME}", f"{BASE:013d}-000002-{ME}",
    ]


def test_wall_clock_regression_keeps_the_old_millisecond() -> None:
    wall = Wall([BASE, BASE - 3_600_000])
    clock = hlc.HybridLogicalClock(ME, wall)
    first, second = clock.tick(), clock.tick()
    assert first == f"{BASE:013d}-000000-{ME}"
    assert second == f"{BASE:013d}-000001-{ME}"


def test_counter_exhaustion_steps_the_millisecond_instead_of_wrapping() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    assert clock.observe(hlc.render(BASE, hlc.MAX_COUNTER - 1, PEER))
    assert clock.tick() == hlc.render(BASE, hlc.MAX_COUNTER, ME)
    after = clock.tick()
    assert after == hlc.render(BASE + 1, 0, ME)
    assert clock.tick() == hlc.render(BASE + 1, 1, ME)


# ── observe ───────────────────────────────────────────────────────────

remote_stamps = st.tuples(
    st.integers(-10_000_000, 120_000),  # offset from the wall, some beyond the drift bound
    st.integers(0, hlc.MAX_COUNTER),
    st.sampled_from([PEER, OLD_PEER, ME]),
)

actions = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.integers(-5_000_000, 5_000)),
        st.tuples(st.just("observe"), remote_stamps),
        st.tuples(st.just("junk"), st.sampled_from(["", "garbage", "1-2-3", None, 7])),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(actions)
def test_tick_exceeds_every_earlier_tick_and_every_absorbed_stamp(plan: list) -> None:
    """Invariant 7: every tick > every in-bound stamp observed before it."""
    wall = {"now": BASE}
    clock = hlc.HybridLogicalClock(ME, lambda: wall["now"])
    floor = ""  # the largest stamp a later tick must exceed
    for kind, arg in plan:
        if kind == "tick":
            wall["now"] = max(0, wall["now"] + arg)
            stamp = clock.tick()
            assert stamp > floor
            floor = stamp
        elif kind == "observe":
            offset, counter, rid = arg
            ms = max(0, wall["now"] + offset)
            stamp = hlc.render(ms, counter, rid)
            absorbed = clock.observe(stamp)
            assert absorbed == (ms <= wall["now"] + hlc.MAX_FUTURE_DRIFT_MS)
            if absorbed:
                floor = max(floor, stamp)
        else:
            before = clock.last
            assert clock.observe(arg) is False
            assert clock.last == before
    final = clock.tick()
    assert final > floor


@FAST
@given(st.lists(remote_stamps, max_size=30), steps)
def test_observe_never_makes_a_later_tick_smaller(observed: list, deltas: list[int]) -> None:
    """Two clocks on the same wall: the one that also observed is never behind."""
    wall = {"now": BASE}
    plain = hlc.HybridLogicalClock(ME, lambda: wall["now"])
    seen = hlc.HybridLogicalClock(ME, lambda: wall["now"])
    for (offset, counter, rid) in observed:
        seen.observe(hlc.render(max(0, BASE + offset), counter, rid))
    for now in walk(deltas):
        wall["now"] = now
        assert seen.tick() >= plain.tick()


def test_observe_rejects_malformed_stamps_and_leaves_state_alone() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    clock.tick()
    before = clock.last
    for bad in ("", "nonsense", f"{BASE + 5:013d}-000001", f"{BASE + 5:013d}-zz0001-{PEER}",
                None, 123, {"hlc": "x"}, f"{BASE + 5:013d}-000001-{PEER} "):
        assert clock.observe(bad) is False
    assert clock.last == before
    assert clock.tick() == hlc.render(BASE, 1, ME)


def test_observe_ignores_a_stamp_beyond_the_sixty_second_drift_bound() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    too_far = hlc.render(BASE + hlc.MAX_FUTURE_DRIFT_MS + 1, 0, PEER)
    assert clock.observe(too_far) is False
    assert clock.tick() == hlc.render(BASE, 0, ME)


def test_observe_absorbs_a_stamp_exactly_at_the_drift_bound() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    edge = hlc.render(BASE + hlc.MAX_FUTURE_DRIFT_MS, 7, PEER)
    assert clock.observe(edge) is True
    nxt = clock.tick()
    assert nxt == hlc.render(BASE + hlc.MAX_FUTURE_DRIFT_MS, 8, ME)
    assert nxt > edge


def test_observe_of_an_older_stamp_changes_nothing() -> None:
    clock = hlc.HybridLogicalClock(ME, lambda: BASE)
    clock.tick()
    assert clock.observe(hlc.render(BASE - 10, 5, PEER)) is True
    assert clock.tick() == hlc.render(BASE, 1, ME)


def test_same_ms_and_counter_from_a_larger_replica_id_is_still_exceeded() -> None:
    low = "rep_" + "0" * 32
    high = "rep_" + "f" * 32
    clock = hlc.HybridLogicalClock(low, lambda: BASE)
    observed = hlc.render(BASE, 3, high)
    clock.observe(observed)
    assert clock.tick() > observed


def test_drift_ceiling_excludes_exactly_the_out_of_bound_stamps() -> None:
    ceiling = hlc.drift_ceiling(BASE)
    inside = hlc.render(BASE + hlc.MAX_FUTURE_DRIFT_MS, hlc.MAX_COUNTER, PEER)
    outside = hlc.render(BASE + hlc.MAX_FUTURE_DRIFT_MS + 1, 0, PEER)
    assert inside < ceiling < outside
