"""A fault stays with its cause in the daemon's peer loop (issue 8, findings 3, 4, 10).

Driven in-process: the round is replaced by one that raises, and the test checks
what the loop records and decides. The hostile suite (tests/hostile/) does the
same with real processes and real hostile peers.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import RemoteKit

from logsync.client import PeerClient
from logsync.daemon import Daemon, DaemonConfig, _PeerTask
from logsync.engine import Extensions, PullSchedule
from logsync.errors import StoreError
from logsync.peerloop import CLAIM_TTL_S, MAX_NOTIFIED
from logsync.peers import Peer
from logsync.report import OriginProgress, RoundReport

PEER = Peer(url="http://user:secret@127.0.0.1:9/", name=None)


@pytest.fixture
def daemon(tmp_path: Path) -> Any:
    d = Daemon(DaemonConfig(palace=tmp_path / "p", port=0, interval=10.0),
               rng=random.Random(1))
    yield d
    d.store.close()


def one_round(daemon: Daemon, raise_: BaseException, monkeypatch: Any) -> PullSchedule:
    async def boom(self: PeerClient, store: Any, **options: Any) -> Any:
        raise raise_

    monkeypatch.setattr(PeerClient, "run_round", boom)

    async def go() -> PullSchedule:
        task = _PeerTask(peer=PEER, scope=anyio.CancelScope(), loop=daemon._new_loop())
        task.loop.start(anyio.current_time())
        async with PeerClient(PEER.url, name=task.label) as client:
            await daemon._one_round(client, task)
        return task.loop.schedule

    return anyio.run(go)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (RuntimeError("a bug of ours"), "internal"),
        (OverflowError("getsockaddrarg: port must be 0-65535."), "internal"),
        (ExceptionGroup("a task group", [ValueError("x")]), "internal"),
        (RecursionError("maximum recursion depth exceeded"), "internal"),
        (StoreError("cannot write to logstream.sqlite3: database or disk is full"), "store"),
    ],
)
def test_any_exception_in_a_round_is_recorded_and_backs_off_only_that_peer(
    daemon: Daemon, monkeypatch: Any, caplog: Any, error: BaseException, kind: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="logsync.daemon")
    schedule = one_round(daemon, error, monkeypatch)
    (state,) = daemon.book.peers.values()
    assert (state.reachable, state.last_error_kind, state.consecutive_failures) == (
        False, kind, 1)
    assert schedule.failures == 1 and schedule.next_due is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                or r.levelno == logging.ERROR]
    assert warnings and all("\n" not in r.getMessage() for r in warnings)
    assert all("secret" not in r.getMessage() and "user:" not in r.getMessage()
               for r in caplog.records)
    if kind == "internal":
        assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)


def test_a_store_fault_pauses_pulls_answers_503_and_clears_by_itself(
    daemon: Daemon, monkeypatch: Any
) -> None:
    one_round(daemon, StoreError("cannot write: database or disk is full"), monkeypatch)
    assert daemon.store_fault is not None

    async def ask() -> httpx.Response:
        transport = httpx.ASGITransport(app=daemon.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.get("/sync/version_vector")

    answer = anyio.run(ask)
    assert answer.status_code == 503 and "disk is full" in answer.json()["error"]

    async def check() -> None:
        daemon._store_healthy = anyio.Event()
        daemon._next_store_check = 0.0
        await daemon._check_store()
        assert daemon._store_healthy.is_set()

    anyio.run(check)
    assert daemon.store_fault is None
    assert anyio.run(ask).status_code == 200


def test_claims_expire_and_notifications_stay_bounded(daemon: Daemon) -> None:
    """Finding 10: a frame naming an origin at 2**62 held it 'in flight' for good."""
    origin = "rep_" + "a" * 32
    daemon.claims.entries[origin] = (2**62, 100.0 + CLAIM_TTL_S)
    assert daemon.claims.active(100.0) == {origin: 2**62}
    assert daemon.claims.active(100.0 + CLAIM_TTL_S) == {}
    assert CLAIM_TTL_S <= 10

    async def go() -> None:
        task = _PeerTask(peer=PEER, scope=anyio.CancelScope(), loop=daemon._new_loop())
        task.loop.wants_full = False
        for n in range(MAX_NOTIFIED + 5):
            task.note(f"rep_{n:032x}", 1)
        assert len(task.loop.notified) <= MAX_NOTIFIED and task.loop.wants_full

    anyio.run(go)


def test_a_notification_held_back_by_a_claim_is_kept_for_when_the_claim_lapses(
    daemon: Daemon,
) -> None:
    """Finding 10: a claim at 2**62 (its pull dripping) swallowed an honest peer's frame."""
    origin = "rep_" + "b" * 32

    async def go() -> tuple[dict[str, int], float | None, float]:
        now = anyio.current_time()
        daemon.claims.entries[origin] = (2**62, now + CLAIM_TTL_S)
        task = _PeerTask(peer=PEER, scope=anyio.CancelScope(), loop=daemon._new_loop())
        loop = task.loop
        loop.extensions, loop.wants_full, loop.last_full = Extensions(), False, now
        loop.schedule.interval = 60.0
        loop.start(now)
        task.note(origin, 4)
        async with PeerClient(PEER.url, name=task.label) as client:
            await daemon._one_round(client, task)
        return loop.notified, loop.schedule.next_due, now

    notified, due, now = anyio.run(go)
    assert notified == {origin: 4}
    assert due is not None and due <= now + CLAIM_TTL_S + 0.5


def test_the_daemon_holds_back_an_origin_that_failed(daemon: Daemon, monkeypatch: Any) -> None:
    from logsync.engine import OriginProgress, RoundReport

    origin = "rep_" + "c" * 32
    seen: list[set[str]] = []

    async def fake(self: PeerClient, store: Any, *, held_back: Any = (),
                   report: RoundReport | None = None, **kw: Any) -> Any:
        seen.append(set(held_back))
        report = report if report is not None else RoundReport(peer="x")
        report.origins[origin] = OriginProgress(origin, 0, 5, 0, stop_reason="failed: 500",
                                                error_kind="transport")
        return report

    monkeypatch.setattr(PeerClient, "run_round", fake)

    async def go() -> None:
        task = _PeerTask(peer=PEER, scope=anyio.CancelScope(), loop=daemon._new_loop())
        async with PeerClient(PEER.url, name=task.label) as client:
            for _ in range(2):
                task.loop.start(anyio.current_time())
                await daemon._one_round(client, task)

    anyio.run(go)
    assert seen == [set(), {origin}]
    (state,) = daemon.book.peers.values()
    assert state.reachable and origin in state.failed_origins


def test_a_failed_round_makes_the_next_round_full_and_claims_are_released(
    daemon: Daemon, monkeypatch: Any
) -> None:
    """Kills two mutants that survived: "a failed round no longer forces a full round"
    (frames may have been missed, so only a full round knows what is owed) and "claims
    are never released" (the origin would be held from every other peer)."""
    from logsync.errors import PeerTransientError

    origin = "rep_" + "d" * 32
    calls: list[str] = []

    async def targeted(self: PeerClient, store: Any, targets: Any, ext: Any, *,
                       report: RoundReport | None = None, **kw: Any) -> Any:
        calls.append("targeted")
        assert daemon.claims.entries  # claimed while it runs
        raise PeerTransientError("peer x: GET /sync/ops answered 500", peer="x")

    async def full(self: PeerClient, store: Any, *, report: RoundReport | None = None,
                   **kw: Any) -> Any:
        calls.append("full")
        return report

    monkeypatch.setattr(PeerClient, "run_targeted", targeted)
    monkeypatch.setattr(PeerClient, "run_round", full)

    async def go() -> None:
        task = _PeerTask(peer=PEER, scope=anyio.CancelScope(), loop=daemon._new_loop())
        now = anyio.current_time()
        loop = task.loop
        loop.extensions, loop.wants_full, loop.last_full = Extensions(), False, now
        loop.schedule.interval = 60.0
        async with PeerClient(PEER.url, name=task.label) as client:
            task.note(origin, 3)
            loop.start(now)
            await daemon._one_round(client, task)  # targeted, fails
            assert daemon.claims.entries == {}  # released on failure
            task.note(origin, 4)
            loop.start(anyio.current_time())
            await daemon._one_round(client, task)  # owed a full round

    anyio.run(go)
    assert calls == ["targeted", "full"]


def test_a_fork_served_every_round_is_logged_once_and_a_new_one_again(
    daemon: Daemon, caplog: Any, remote: RemoteKit
) -> None:
    """The ledger bumps `times_seen` for a conflict seen again; the log line every 15 s
    for the same fork said nothing new, so a peer's line comes only when the ledgers
    gained a row since its last one, and two peers that both brought one both say so."""
    one, two = remote.origin(1), remote.origin(2)
    daemon.store.apply_remote([remote.op(one, 1), remote.op(one, 2), remote.op(two, 1),
                               remote.op(two, 2)])
    caplog.set_level(logging.WARNING, logger="logsync.daemon")
    peer_a, peer_b = PEER, Peer(url="http://127.0.0.1:10/", name="b")

    async def rounds() -> None:  # what `_one_round` records after each round
        def fork(peer: Peer, origin: str, seq: int) -> tuple[Any, ...]:
            result = daemon.store.apply_remote([dict(remote.op(origin, seq), body="other")])
            task = _PeerTask(peer=peer, scope=anyio.CancelScope(), loop=daemon._new_loop())
            report = RoundReport(peer=task.label)
            report.origins[origin] = OriginProgress(origin, 0, 2, 2,
                                                    conflicts=result.conflicts)
            return task, daemon.book.get(peer.key, peer.url), report

        for seq in (1, 1, 2):  # the same fork in two rounds of a, then another
            task, state, report = fork(peer_a, one, seq)
            daemon._record(task, state, report, full=True,
                           ledger_tops=daemon.store.ledger_tops())
        # a and b each bring a new fork, both applied before either round is recorded
        ended = [fork(peer_a, two, 1), fork(peer_b, two, 2)]
        tops = daemon.store.ledger_tops()
        for task, state, report in ended:
            daemon._record(task, state, report, full=True, ledger_tops=tops)

    anyio.run(rounds)
    logged = [r.getMessage() for r in caplog.records if "conflicts and" in r.getMessage()]
    a_label = "http://127.0.0.1:9/"  # the label of a peer without a name: its URL, redacted
    assert [m.split(": 1 conflicts and 0")[0] for m in logged] == \
        [f"peer {a_label}"] * 3 + ["peer b"], logged
    assert sorted(c["times_seen"] for c in daemon.store.list_conflicts()) == [1, 1, 1, 2]


def test_a_store_fault_reading_the_ledgers_after_a_round_stays_in_the_loop(
    daemon: Daemon, monkeypatch: Any
) -> None:
    """Invariant 9: the ledger read after a round that recorded conflicts is under the
    round's fault handling (it ran outside it and a StoreError left the daemon)."""
    origin = "rep_" + "c" * 32

    async def conflicting(self: PeerClient, store: Any, *, report: RoundReport,
                          **options: Any) -> RoundReport:
        report.origins[origin] = OriginProgress(origin, 0, 1, 1, conflicts=1)
        return report

    def fault() -> Any:
        raise StoreError("cannot read logstream.sqlite3: disk I/O error")

    monkeypatch.setattr(PeerClient, "run_round", conflicting)
    monkeypatch.setattr(daemon.store, "ledger_tops", fault)

    async def go() -> None:
        task = _PeerTask(peer=PEER, scope=anyio.CancelScope(), loop=daemon._new_loop())
        task.loop.start(anyio.current_time())
        async with PeerClient(PEER.url, name=task.label) as client:
            await daemon._one_round(client, task)

    anyio.run(go)
    assert daemon.store_fault is not None and "disk I/O error" in daemon.store_fault
