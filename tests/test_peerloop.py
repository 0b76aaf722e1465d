"""The peer loop's rules table (logsync/peerloop.py), one test per row, driven by events
and checked by plan: no sockets, no sleeps. Plus proof that the daemon and the simulator
both route through it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsync.peerloop import (
    CLAIM_TTL_S,
    MAX_NOTIFIED,
    Claims,
    FullRound,
    NoRound,
    PeerLoop,
    TargetedRound,
)
from logsync.report import STOP_CAPPED, OriginProgress, RoundReport
from logsync.wire import Extensions

OWN = "rep_" + "0" * 32
A = "rep_" + "a" * 32
B = "rep_" + "b" * 32
INTERVAL = 10.0


def make(claims: Claims | None = None, **kw: Any) -> PeerLoop:
    options = {"interval": INTERVAL, "debounce": 0.05, "jitter": 0.0} | kw
    return PeerLoop.make(OWN, claims if claims is not None else Claims(), random.Random(1),
                         **options)


def after_full(loop: PeerLoop, now: float = 0.0, ext: Extensions | None = None) -> None:
    """Start the loop and run its first (full) round to success at `now`."""
    loop.start(now)
    assert loop.is_due(now)
    assert isinstance(loop.begin(now, {}), FullRound)
    report = RoundReport(peer="p")
    report.negotiated = ext if ext is not None else Extensions(msgpack=True)
    loop.succeeded(report, now)


def failed_report(origin: str) -> RoundReport:
    report = RoundReport(peer="p")
    report.origins[origin] = OriginProgress(origin, 0, 5, 0, stop_reason="failed: 500",
                                            error_kind="transport")
    return report


# ── start ─────────────────────────────────────────────────────────────

def test_start_the_first_round_is_due_at_once_and_full() -> None:
    loop = make()
    loop.start(100.0)
    assert loop.is_due(100.0) and loop.wait_time(100.0) == 0
    loop.frame(A, 3, 100.0)  # even with frames: no full round yet, extensions unknown
    assert loop.begin(100.0, {}) == FullRound(frozenset())
    assert loop.wait_time(100.0) is None and not loop.is_due(1e9)  # running


# ── frames ────────────────────────────────────────────────────────────

def test_a_frame_makes_the_next_round_targeted_within_the_debounce() -> None:
    loop = make()
    after_full(loop)
    assert not loop.is_due(1.0)
    loop.frame(A, 3, 1.0)
    loop.frame(A, 2, 1.0)  # a lower seq does not lower what is owed
    assert loop.wait_time(1.0) == pytest.approx(0.05)
    assert loop.is_due(1.05)
    plan = loop.begin(1.05, {A: 1})
    assert plan == TargetedRound({A: 3}, Extensions(msgpack=True))


def test_a_frame_during_a_round_is_due_right_after_it() -> None:
    loop = make()
    after_full(loop)
    loop.frame(A, 3, 1.0)
    loop.begin(1.05, {})
    loop.frame(B, 7, 1.5)  # arrives while the round runs
    due = loop.succeeded(RoundReport(peer="p"), 2.0)
    assert due == pytest.approx(2.05)
    assert loop.begin(2.05, {}) == TargetedRound({B: 7}, Extensions(msgpack=True))


def test_frames_are_bounded_beyond_max_notified_a_full_round_is_owed() -> None:
    loop = make()
    after_full(loop)
    for n in range(MAX_NOTIFIED + 5):
        loop.frame(f"rep_{n:032x}", 1, 1.0)
    assert len(loop.notified) <= MAX_NOTIFIED and loop.wants_full
    assert isinstance(loop.begin(1.05, {}), FullRound)


def test_a_reconnected_stream_owes_a_full_round() -> None:
    loop = make()
    after_full(loop)
    loop.frame(None, None, 1.0)
    loop.frame(A, 3, 1.0)
    assert loop.is_due(1.05)
    assert isinstance(loop.begin(1.05, {}), FullRound)


# ── begin ─────────────────────────────────────────────────────────────

def test_anti_entropy_is_due_on_the_timer_and_full() -> None:
    loop = make()
    after_full(loop)
    assert not loop.is_due(INTERVAL - 0.01) and loop.is_due(INTERVAL)
    assert isinstance(loop.begin(INTERVAL, {}), FullRound)


def test_a_full_round_is_owed_when_the_last_one_is_two_intervals_old() -> None:
    loop = make()
    after_full(loop)
    loop.frame(A, 3, 2 * INTERVAL - 1)
    assert isinstance(loop.begin(2 * INTERVAL - 1, {}), TargetedRound)
    loop.succeeded(RoundReport(peer="p"), 2 * INTERVAL - 1)
    loop.frame(A, 4, 2 * INTERVAL)
    assert isinstance(loop.begin(2 * INTERVAL, {}), FullRound)


def test_frames_naming_only_what_we_hold_or_our_own_origin_mean_no_round() -> None:
    loop = make()
    after_full(loop)
    loop.frame(A, 3, 1.0)
    loop.frame(OWN, 9, 1.0)
    assert loop.begin(1.05, {A: 3}) == NoRound()
    assert loop.running is None and loop.next_due == pytest.approx(1.05 + INTERVAL)


def test_targeted_rounds_claim_their_origins_and_leave_claimed_ones() -> None:
    claims = Claims()
    one, two = make(claims), make(claims)
    after_full(one)
    after_full(two)
    one.frame(A, 5, 1.0)
    two.frame(A, 5, 1.0)
    two.frame(B, 2, 1.0)
    assert one.begin(1.05, {}) == TargetedRound({A: 5}, Extensions(msgpack=True))
    assert claims.active(1.05) == {A: 5}
    assert two.begin(1.05, {}) == TargetedRound({B: 2}, Extensions(msgpack=True))
    assert two.notified == {A: 5}  # held back by one's claim, kept


def test_claims_are_released_on_success() -> None:
    claims = Claims()
    loop = make(claims)
    after_full(loop)
    loop.frame(A, 5, 1.0)
    loop.begin(1.05, {})
    loop.succeeded(RoundReport(peer="p"), 1.5)
    assert claims.entries == {}


def test_claims_are_released_on_failure() -> None:
    claims = Claims()
    loop = make(claims)
    after_full(loop)
    loop.frame(A, 5, 1.0)
    loop.begin(1.05, {})
    loop.failed(RoundReport(peer="p"), 1.5)
    assert claims.entries == {}


def test_a_release_does_not_drop_a_newer_claim_on_the_same_origin() -> None:
    claims = Claims()
    claims.take({A: 5}, 0.0)
    claims.entries[A] = (9, CLAIM_TTL_S)  # another round claimed further since
    claims.release({A: 5})
    assert claims.active(0.0) == {A: 9}


def test_claims_expire_after_the_ttl() -> None:
    claims = Claims()
    assert claims.take({A: 2**62}, 100.0) == {A: 2**62}
    assert claims.active(100.0 + CLAIM_TTL_S - 0.01) == {A: 2**62}
    assert claims.active(100.0 + CLAIM_TTL_S) == {}
    assert CLAIM_TTL_S <= 10


def test_an_origin_held_back_by_a_claim_is_due_when_the_claim_lapses() -> None:
    claims = Claims()
    claims.take({A: 2**62}, 0.0)  # a dripping pull from another peer claims A
    loop = make(claims)
    after_full(loop)
    loop.frame(A, 4, 1.0)
    assert loop.begin(1.05, {}) == NoRound()
    assert loop.notified == {A: 4}
    assert loop.next_due == pytest.approx(CLAIM_TTL_S)
    assert loop.begin(CLAIM_TTL_S, {}) == TargetedRound({A: 4}, Extensions(msgpack=True))


def test_an_origin_backing_off_is_left_out_of_full_and_targeted_rounds() -> None:
    loop = make()
    after_full(loop)
    loop.frame(A, 5, 1.0)
    loop.frame(B, 5, 1.0)
    loop.begin(1.05, {})
    loop.succeeded(failed_report(A), 1.1)  # A failed (rule 6): held for a while
    loop.frame(A, 6, 1.2)
    loop.frame(B, 6, 1.2)
    assert loop.begin(1.25, {}) == TargetedRound({B: 6}, Extensions(msgpack=True))
    loop.succeeded(RoundReport(peer="p"), 1.3)
    loop.frame(None, None, 1.3)
    plan = loop.begin(1.35, {})
    assert isinstance(plan, FullRound) and plan.held_back == frozenset({A})


# ── endings ───────────────────────────────────────────────────────────

def test_a_failed_round_makes_the_next_round_full() -> None:
    loop = make()
    after_full(loop)
    loop.frame(A, 5, 1.0)
    assert isinstance(loop.begin(1.05, {}), TargetedRound)
    due = loop.failed(RoundReport(peer="p"), 1.1)
    assert due > 1.1 and loop.wants_full
    loop.frame(A, 6, due)
    assert isinstance(loop.begin(max(due, loop.next_due or due), {}), FullRound)


def test_a_failed_round_honours_retry_after() -> None:
    loop = make()
    after_full(loop)
    assert loop.failed(RoundReport(peer="p"), 1.0, retry_after=30.0) >= 31.0
    loop.frame(A, 5, 2.0)  # a frame cannot pull before the peer's hold ends
    assert not loop.is_due(30.9) and loop.is_due(31.0)


def test_failures_back_off_exponentially() -> None:
    loop = make(backoff_base=1.0, backoff_cap=60.0)
    loop.start(0.0)
    waits = []
    now = 0.0
    for _ in range(8):
        loop.begin(now, {})
        due = loop.failed(RoundReport(peer="p"), now)
        waits.append(due - now)
        now = due
    assert waits[-1] >= 30.0 and waits[-1] <= 60.0
    assert all(w >= (2 ** min(i, 6)) / 2 for i, w in enumerate(waits))


def test_a_capped_round_goes_again_at_once() -> None:
    loop = make()
    after_full(loop)
    loop.begin(INTERVAL, {})
    report = RoundReport(peer="p")
    report.ops_budget = 0  # what a capped round leaves
    report.origins[A] = OriginProgress(A, 0, 10**6, 250_000, stop_reason=STOP_CAPPED)
    assert report.capped
    assert loop.succeeded(report, INTERVAL + 1) == pytest.approx(INTERVAL + 1.05)


def test_a_full_round_keeps_the_extensions_it_negotiated() -> None:
    loop = make()
    after_full(loop, ext=Extensions())  # an upstream hub: no extensions
    loop.frame(A, 5, 1.0)
    plan = loop.begin(1.05, {})
    assert plan == TargetedRound({A: 5}, Extensions())


def test_round_mode_plans_only_full_rounds() -> None:
    loop = make(targeted=False)
    after_full(loop)
    loop.frame(A, 5, 1.0)
    assert isinstance(loop.begin(1.05, {}), FullRound)


# ── invariants, under any sequence of events ──────────────────────────

EVENTS = st.lists(st.one_of(
    st.tuples(st.just("frame"), st.sampled_from([A, B, None]), st.integers(1, 2**62)),
    st.tuples(st.just("tick"), st.floats(0.0, 30.0)),
    st.tuples(st.just("ok"), st.booleans()),
    st.tuples(st.just("fail"), st.one_of(st.none(), st.floats(0.0, 100.0))),
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(EVENTS)
def test_any_event_sequence_keeps_the_loop_bounded_and_claims_released(events: list) -> None:
    """Whatever happens: claims are only held by a running round, a failed round is
    followed by a full one, and the loop is always either running or due at a time."""
    claims = Claims()
    loop = make(claims)
    now = 0.0
    loop.start(now)
    owed_full = True
    for event in events:
        if event[0] == "frame":
            loop.frame(event[1], event[2] if event[1] else None, now)
            owed_full |= event[1] is None
        elif event[0] == "tick":
            now += event[1]
        if loop.running is None and loop.is_due(now) and event[0] in ("ok", "fail"):
            plan = loop.begin(now, {})
            if owed_full:
                assert isinstance(plan, FullRound)
            if isinstance(plan, NoRound):
                continue
            owed_full = False
            if event[0] == "ok":
                report = RoundReport(peer="p")
                report.negotiated = Extensions(msgpack=event[1])
                loop.succeeded(report, now)
            else:
                loop.failed(RoundReport(peer="p"), now, event[1])
                owed_full = True
            assert claims.entries == {}
        assert len(loop.notified) <= MAX_NOTIFIED
        assert loop.running is not None or loop.next_due is not None


# ── the daemon and the simulator route through it ─────────────────────

class Refusing(PeerLoop):
    """A peer loop that never plans a round: anything that pulls anyway bypassed it."""

    def begin(self, now: float, local: Any) -> Any:
        self.notified.clear()
        self.schedule.begin(now)
        self.running = NoRound()
        self.succeeded(RoundReport(peer=""), now)
        return NoRound()


SMALL = """
name = "routing"
duration = "6s"
[nodes]
count = 3
[sync]
interval = "1s"
[[workload]]
rate = 10
"""


def test_the_simulator_pulls_only_what_its_peer_loops_plan(monkeypatch: Any) -> None:
    from logsync.sim import parse_scenario, run_scenario

    scenario = parse_scenario(SMALL, source="routing.toml").with_seed(1)
    normal = run_scenario(scenario)
    assert normal.rounds > 0 and normal.requests_total > 0
    monkeypatch.setattr("logsync.sim.driver.PeerLoop.make", _refusing_make)
    refused = run_scenario(scenario)
    assert refused.rounds == 0 and refused.requests_total == 0


_MAKE = PeerLoop.make


def _refusing_make(own: str, claims: Claims, rng: random.Random, **kw: Any) -> PeerLoop:
    loop = _MAKE(own, claims, rng, **kw)
    return Refusing(own=own, schedule=loop.schedule, claims=claims, backoff=loop.backoff,
                    targeted=loop.targeted)


def test_the_daemon_pulls_only_what_its_peer_loop_plans(tmp_path: Path) -> None:
    from logsync.client import PeerClient
    from logsync.daemon import Daemon, DaemonConfig, _PeerTask
    from logsync.peers import Peer

    daemon = Daemon(DaemonConfig(palace=tmp_path / "p", port=0), rng=random.Random(1))
    pulls: list[str] = []

    async def pull(self: PeerClient, *args: Any, **kw: Any) -> Any:
        pulls.append("pulled")
        return kw.get("report") or RoundReport(peer="x")

    async def go() -> None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(PeerClient, "run_round", pull)
            mp.setattr(PeerClient, "run_targeted", pull)
            peer = Peer(url="http://127.0.0.1:9", name="p")
            for loop, expect in ((daemon._new_loop(), ["pulled"]),
                                 (_refusing_make(OWN, daemon.claims, random.Random(1),
                                                 interval=1.0, debounce=0.0), [])):
                pulls.clear()
                task = _PeerTask(peer=peer, scope=anyio.CancelScope(), loop=loop)
                loop.start(anyio.current_time())
                async with PeerClient(peer.url, name="p") as client:
                    await daemon._one_round(client, task)
                assert pulls == expect

    try:
        anyio.run(go)
    finally:
        daemon.store.close()


def test_an_abandoned_round_releases_its_claims_at_once() -> None:
    """Review finding: a round cancelled mid-way (its peer removed from peers.json) left
    its claims until they lapsed, holding the origins back from every other peer."""
    claims = Claims()
    one, two = make(claims), make(claims)
    after_full(one)
    after_full(two)
    one.frame(A, 50, 1.0)
    assert isinstance(one.begin(1.05, {}), TargetedRound)
    one.abandon(1.1)
    assert claims.entries == {} and one.running is None and one.wants_full
    two.frame(A, 50, 1.2)
    assert two.begin(1.25, {}) == TargetedRound({A: 50}, Extensions(msgpack=True))
    one.abandon(1.3)  # nothing running: nothing happens
    assert claims.active(1.3) == {A: 50}


def test_the_daemon_releases_the_claims_of_a_cancelled_round(tmp_path: Path) -> None:
    from logsync.client import PeerClient
    from logsync.daemon import Daemon, DaemonConfig, _PeerTask
    from logsync.peers import Peer

    daemon = Daemon(DaemonConfig(palace=tmp_path / "p", port=0), rng=random.Random(1))
    seen: list[dict] = []

    async def hang(self: PeerClient, *args: Any, **kw: Any) -> Any:
        seen.append(dict(daemon.claims.entries))
        await anyio.sleep_forever()

    async def go() -> None:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(PeerClient, "run_targeted", hang)
            loop = daemon._new_loop()
            after_full(loop, now=anyio.current_time())
            task = _PeerTask(peer=Peer(url="http://127.0.0.1:9", name="p"),
                             scope=anyio.CancelScope(), loop=loop)
            task.note(A, 5)
            await anyio.sleep(0.01)
            async with PeerClient("http://127.0.0.1:9", name="p") as client:
                with anyio.move_on_after(0.2):
                    await daemon._one_round(client, task)

    try:
        anyio.run(go)
    finally:
        daemon.store.close()
    assert seen and A in seen[0]  # claimed while it ran
    assert daemon.claims.entries == {}  # released when it was cancelled
