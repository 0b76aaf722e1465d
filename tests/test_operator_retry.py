"""`Store.retry_quarantine` (issue 11, item 6): held ops judged again by the apply rules.

An op whose cause is gone is applied when it is the next of its origin, and a pull then
resumes that origin; one further on waits; one still invalid stays with its (new) reason;
a signed page's refusal is never overridden; hostile rows never raise. Property: whatever
the quarantine holds, a retry keeps every origin a gap-free prefix, applies nothing that
fails validation or lacks its artifact, applies every op it can, and a second retry
changes nothing.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import T0_MS, CountingIds, FakeClock, RemoteKit, held_seqs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync.store import DB_FILENAME, Store
from logsync.store import retry as retry_mod
from logsync.store.ledgers import quarantine_row, record_quarantine
from tests.test_engine import FakePeer, append
from tests.test_engine import pull as pull_hub

KIT = RemoteKit()
MISSING = "names artifact 'art_needed', which is not present"


def hold(store: Store, op: Any, reason: str, kind: str = "event") -> None:
    """Put a row in the quarantine as apply would have (another peer, another round)."""
    with store._atomic(durable=True) as conn:
        record_quarantine(conn, [quarantine_row("2026-07-02T03:24:43Z", kind, op, reason)])


def ledger(store: Store) -> list[tuple[Any, ...]]:
    """The quarantine table, every column (what a retry that changes nothing keeps)."""
    return [tuple(r) for r in store._read("SELECT * FROM logsync_quarantine ORDER BY id")]


def raw_insert(palace: Path, rows: list[tuple[Any, ...]]) -> None:
    """Rows another program wrote, as they are (kind, origin, seq, reason, payload)."""
    conn = sqlite3.connect(palace / DB_FILENAME)
    with conn:
        conn.executemany(
            "INSERT INTO logsync_quarantine (received_at, kind, origin_replica, origin_seq, "
            "item_id, reason, payload_json, digest) VALUES ('t', ?, ?, ?, NULL, ?, ?, "
            "hex(randomblob(16)))", rows)
    conn.close()


# ── the cause is gone ─────────────────────────────────────────────────


def test_an_op_whose_artifact_arrived_is_applied_and_the_next_page_follows(
        store: Store) -> None:
    origin = KIT.origin(1)
    art = KIT.artifact("diff --git a/f b/f\n", art_id="art_needed")
    ops = [KIT.op(origin, 1), KIT.op(origin, 2, artifact_ids=["art_needed"]),
           KIT.op(origin, 3), KIT.op(origin, 4)]
    first = store.apply_remote(ops[:3])
    assert (first.applied, first.quarantined) == (1, 1)
    store.apply_remote([], [art])                       # the artifact, by another path
    report = store.retry_quarantine()
    (entry,) = report.origins
    assert (entry.origin, entry.retried, entry.applied, entry.held) == (origin, 1, 1, [])
    assert held_seqs(store, origin) == [1, 2]
    assert store.get_event(ops[1]["id"])["artifact_ids"] == ["art_needed"]  # type: ignore[index]
    assert store.list_quarantine() == [] and store.counts()["quarantined"] == 0
    after = store.apply_remote(ops[2:])                 # the page after `top` = 2
    assert (after.applied, after.quarantined, after.stopped) == (2, 0, {})
    assert held_seqs(store, origin) == [1, 2, 3, 4]


def test_a_pull_resumes_the_origin_after_a_retry(tmp_path: Path) -> None:
    """Through the engine: the peer never serves the artifact; after the retry the next
    round asks from the retried op on (not from before it) and takes the rest of the
    origin, with nothing held."""
    a = Store.open(tmp_path / "a", wall_ms=FakeClock(), new_id=CountingIds("a"))
    b = Store.open(tmp_path / "b", wall_ms=FakeClock(), new_id=CountingIds("b"))
    art = a.put_artifact("note", "lost\n", "alice")
    append(a, 1)
    append(a, 1, artifact_ids=[art["id"]])
    append(a, 1)
    peer = FakePeer(a)
    peer.missing.add(art["id"])
    report = pull_hub(b, peer)
    assert a.replica_id in report.stopped_origins()
    assert b.version_vector()[a.replica_id] == 1
    again = pull_hub(b, peer)                           # still stopped at the same op
    assert a.replica_id in again.stopped_origins()
    b.apply_remote([], [a.get_artifact(art["id"])])     # the artifact comes from elsewhere
    assert b.retry_quarantine().total("applied") == 1
    append(a, 2)
    peer.log.clear()
    resumed = pull_hub(b, peer)
    assert resumed.stopped_origins() == {}
    asked = [int(r.params["after"]) for r in peer.ops_requests()
             if r.params.get("origin") == a.replica_id]
    assert asked[0] == 1  # our top 2, less the one op a hub's page overlaps (RFC 004 §9.5)
    assert held_seqs(b, a.replica_id) == [1, 2, 3, 4, 5]
    assert b.counts()["quarantined"] == 0
    a.close()
    b.close()


def test_an_op_a_fixed_validator_would_take_is_applied(store: Store) -> None:
    """A row an older validator refused: the op is valid now and next, so it goes in."""
    origin = KIT.origin(2)
    store.apply_remote([KIT.op(origin, 1)])
    hold(store, KIT.op(origin, 2), "an older validator said no")
    assert store.retry_quarantine().total("applied") == 1
    assert held_seqs(store, origin) == [1, 2]


def test_artifacts_are_retried_first_and_free_the_op_that_names_them(store: Store) -> None:
    origin = KIT.origin(3)
    art = KIT.artifact("content\n", art_id="art_needed")
    hold(store, KIT.op(origin, 1, artifact_ids=["art_needed"]), MISSING)
    hold(store, art, "an older validator refused this artifact", kind="artifact")
    report = store.retry_quarantine()
    assert report.total("applied") == 2 and report.total("still_held") == 0
    assert store.get_artifact("art_needed") is not None
    assert held_seqs(store, origin) == [1]


# ── what stays held ───────────────────────────────────────────────────


def test_an_op_still_missing_its_artifact_stays_and_a_second_retry_changes_nothing(
        store: Store) -> None:
    origin = KIT.origin(1)
    store.apply_remote([KIT.op(origin, 1), KIT.op(origin, 2, artifact_ids=["art_needed"])])
    before = ledger(store)
    report = store.retry_quarantine()
    (entry,) = report.origins
    assert (entry.applied, [h.reason for h in entry.held]) == (0, [MISSING])
    assert ledger(store) == before                     # times_seen not bumped either
    assert store.retry_quarantine().to_json() == report.to_json()
    assert ledger(store) == before


def test_an_op_past_a_gap_waits_for_its_predecessor(store: Store) -> None:
    origin = KIT.origin(4)
    store.apply_remote([KIT.op(origin, 1)])
    hold(store, KIT.op(origin, 3), "an older validator said no")
    (entry,) = store.retry_quarantine().origins
    assert entry.applied == 0
    assert [(h.origin_seq, h.waits_for) for h in entry.held] == [(3, 2)]
    assert held_seqs(store, origin) == [1]            # never a gap
    store.apply_remote([KIT.op(origin, 2)])
    assert store.retry_quarantine().total("applied") == 1
    assert held_seqs(store, origin) == [1, 2, 3]


def test_a_run_of_held_ops_is_applied_in_order_and_stops_at_the_first_bad_one(
        store: Store) -> None:
    origin = KIT.origin(5)
    for seq in (3, 1, 2):
        hold(store, KIT.op(origin, seq), "an older validator said no")
    hold(store, KIT.op(origin, 4, body="nul\x00"), "an older validator said no")
    hold(store, KIT.op(origin, 5), "an older validator said no")
    (entry,) = store.retry_quarantine().origins
    assert (entry.retried, entry.applied) == (5, 3)
    assert held_seqs(store, origin) == [1, 2, 3]
    held = {h.origin_seq: h for h in entry.held}
    assert "body" in held[4].reason and held[4].waits_for is None
    assert held[5].waits_for == 4
    rows = {r["origin_seq"]: r for r in store.list_quarantine()}
    assert rows[4]["reason"] == held[4].reason        # the new reason is written
    assert rows[5]["reason"] == "an older validator said no"


def test_a_new_reason_gets_its_digest_so_the_same_op_again_is_counted(store: Store) -> None:
    origin = KIT.origin(6)
    needy = KIT.op(origin, 1, artifact_ids=["art_needed"])
    hold(store, needy, "an older reason")
    store.retry_quarantine()
    store.apply_remote([needy])                        # pulled again: the same finding
    (row,) = store.list_quarantine()
    assert (row["reason"], row["times_seen"]) == (MISSING, 2)


def test_a_rewritten_reason_merges_into_a_row_that_already_says_it(store: Store) -> None:
    origin = KIT.origin(6)
    needy = KIT.op(origin, 1, artifact_ids=["art_needed"])
    store.apply_remote([needy])
    hold(store, needy, "an older reason")
    (entry,) = store.retry_quarantine().origins
    (row,) = store.list_quarantine()
    assert (row["reason"], row["times_seen"]) == (MISSING, 2)
    assert {h.row_id for h in entry.held} == {row["id"]}


def test_an_op_a_signed_page_refused_is_never_applied_here(store: Store) -> None:
    origin = KIT.origin(7)
    op = KIT.op(origin, 1)
    for reason in ("bad_signature: the signature at 1 does not verify",
                   "missing_artifact: names artifact 'x', not brought"):
        hold(store, op, reason)
    report = store.retry_quarantine()
    assert report.total("applied") == 0 and report.total("still_held") == 2
    assert held_seqs(store, origin) == []
    store.apply_remote([op])                           # the op arrives proven elsewhere
    assert store.retry_quarantine().total("already_held") == 2
    assert store.list_quarantine() == []


def test_an_op_now_held_leaves_and_one_held_otherwise_becomes_a_fork(store: Store) -> None:
    origin = KIT.origin(8)
    store.apply_remote([KIT.op(origin, 1), KIT.op(origin, 2)])
    hold(store, KIT.op(origin, 1), "an older reason")
    hold(store, KIT.op(origin, 2, body="another history"), "an older reason")
    (entry,) = store.retry_quarantine().origins
    assert (entry.already_held, entry.conflicts, entry.held) == (1, 1, [])
    (fork,) = store.list_conflicts()
    assert (fork["kind"], fork["origin_seq"], fork["remote"]["body"]) == (
        "fork", 2, "another history")
    assert store.get_event(KIT.op(origin, 2)["id"])["body"] == f"op 2 of {origin}"  # type: ignore[index]


def test_only_the_named_origin_is_retried(store: Store) -> None:
    one, two = KIT.origin(1), KIT.origin(2)
    hold(store, KIT.op(one, 1), "an older reason")
    hold(store, KIT.op(two, 1), "an older reason")
    report = store.retry_quarantine(two)
    assert [o.origin for o in report.origins] == [two]
    assert held_seqs(store, one) == [] and held_seqs(store, two) == [1]


# ── hostile rows ──────────────────────────────────────────────────────


def test_hostile_rows_stay_held_with_a_reason_and_nothing_raises(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    origin, other = KIT.origin(9), KIT.origin(10)
    good = KIT.op(origin, 1)
    monkeypatch.setattr(retry_mod, "MAX_PAYLOAD_CHARS", 50_000)
    rows = [
        ("event", origin, 1, "r", "not json {"),
        ("event", origin, 1, "r", "[1, 2]"),
        ("event", origin, 1, "r", "[" * 20_000 + "]" * 20_000),
        ("event", origin, 1, "r", "x" * 60_000),
        ("event", other, 1, "r", json.dumps(good)),        # row says another origin
        ("event", origin, 2, "r", json.dumps(good)),        # row says another seq
        ("event", None, None, "r", json.dumps({"id": "\udc80", "origin_replica": "\udc80"},
                                              ensure_ascii=True)),
        ("weird", origin, 1, "r", json.dumps(good)),
        ("artifact", None, None, "r", "7"),
    ]
    raw_insert(store.palace, rows)
    conn = sqlite3.connect(store.palace / DB_FILENAME)
    with conn:
        conn.execute("INSERT INTO logsync_quarantine (received_at, kind, origin_replica, "
                     "origin_seq, reason, payload_json, digest) VALUES "
                     "('t', 'event', ?, 1, 'r', ?, 'blob')", (origin, b"\x00\xff"))
    conn.close()
    report = store.retry_quarantine()
    assert report.total("applied") == 0
    assert report.total("still_held") == len(rows) + 1
    reasons = [h.reason for o in report.origins for h in o.held]
    assert all(isinstance(r, str) and r for r in reasons)
    assert held_seqs(store, origin) == [] and store.counts()["events"] == 0


def test_more_rows_than_one_retry_reads_are_left_for_the_next(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry_mod, "MAX_ROWS", 2)
    for n in (1, 2, 3):
        hold(store, KIT.op(KIT.origin(n), 1), "an older reason")
    first = store.retry_quarantine()
    assert first.truncated and first.total("applied") == 2
    second = store.retry_quarantine()
    assert not second.truncated and second.total("applied") == 1


# ── the property ──────────────────────────────────────────────────────


@st.composite
def quarantines(draw: st.DrawFn) -> dict[str, Any]:
    """Gap-free origins, a prefix of each already held, some ops invalid for good, some
    naming an artifact that may or may not have arrived, and the quarantine holding any
    subset of the ops (some twice, under different reasons), in any order."""
    chains: dict[str, list[dict[str, Any]]] = {}
    needs: dict[str, str] = {}
    arrived: list[dict[str, Any]] = []
    held: list[tuple[dict[str, Any], str]] = []
    for n in range(1, draw(st.integers(1, 3)) + 1):
        origin = KIT.origin(n)
        ops = []
        for seq in range(1, draw(st.integers(1, 8)) + 1):
            kind = draw(st.sampled_from(["ok", "ok", "ok", "bad", "art", "art"]))
            op = KIT.op(origin, seq, ms=T0_MS + seq)
            if kind == "bad":
                op["body"] = "nul\x00"
            if kind == "art":
                art = KIT.artifact(f"{origin} {seq}\n", art_id=f"art_{n}_{seq}")
                op["artifact_ids"] = [art["id"]]
                needs[op["id"]] = art["id"]
                if draw(st.booleans()):
                    arrived.append(art)
            ops.append(op)
        chains[origin] = ops
        for op in draw(st.lists(st.sampled_from(ops), max_size=10)):
            held.append((op, draw(st.sampled_from(["an older reason", MISSING]))))
    prefix = {o: draw(st.integers(0, len(ops))) for o, ops in chains.items()}
    return {"chains": chains, "needs": needs, "arrived": arrived, "held": held,
            "prefix": prefix}


def expected_top(chain: list[dict[str, Any]], top: int, held_ids: set[str],
                 present: set[str]) -> int:
    """The model: from `top`, every next op that is held, valid and has its artifact."""
    while top < len(chain):
        op = chain[top]
        ok = "\x00" not in op["body"] and all(a in present for a in op["artifact_ids"])
        if op["id"] not in held_ids or not ok:
            break
        top += 1
    return top


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=quarantines())
def test_retry_keeps_prefixes_applies_only_valid_ops_and_all_it_can(
        tmp_path_factory: pytest.TempPathFactory, case: dict[str, Any]) -> None:
    palace = tmp_path_factory.mktemp("retry")
    with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds("r")) as store:
        all_arts = {a["id"]: a for a in case["arrived"]}
        for origin, chain in case["chains"].items():
            page = chain[:case["prefix"][origin]]
            arts = [all_arts[a] for op in page for a in op["artifact_ids"] if a in all_arts]
            store.apply_remote(page, arts)
        tops = {o: store.version_vector().get(o, 0) for o in case["chains"]}
        for op, reason in case["held"]:
            hold(store, op, reason)
        store.apply_remote([], case["arrived"])
        present = {a["id"] for a in store.iter_artifacts()}
        held_ids = {op["id"] for op, _ in case["held"]} | {
            r["item_id"] for r in store.list_quarantine(500)}
        report = store.retry_quarantine()
        for origin, chain in case["chains"].items():
            top = expected_top(chain, tops[origin], held_ids, present)
            assert held_seqs(store, origin) == list(range(1, top + 1))
            for event in store.list_ops(origin, 0, 500):
                assert "\x00" not in event["body"]
                assert all(a in present for a in event["artifact_ids"])
                assert event["id"] == chain[event["origin_seq"] - 1]["id"]
            left = {r["origin_seq"] for r in store.list_quarantine(500)
                    if r["origin_replica"] == origin}
            assert all(seq > top for seq in left)
        assert report.total("applied") == sum(
            store.version_vector().get(o, 0) - tops[o] for o in case["chains"])
        before = ledger(store)
        again = store.retry_quarantine()
        assert again.total("applied") == 0 and ledger(store) == before


def test_a_row_that_reuses_the_id_retry_freed_moves_the_ledger_tops(store: Store) -> None:
    """SQLite gives a new row the id of a deleted newest one; the daemon logs its ledger
    line when `ledger_tops` moves, so a row quarantined after a retry freed the newest id
    must move it (the tops compared ids and did not)."""
    origin, other = KIT.origin(7), KIT.origin(8)
    art = KIT.artifact("content\n", art_id="art_needed")
    store.apply_remote([KIT.op(origin, 1, artifact_ids=["art_needed"])])
    (held,) = store.list_quarantine()
    before = store.ledger_tops()
    store.apply_remote([], [art])
    assert store.retry_quarantine().total("applied") == 1
    store.apply_remote([KIT.op(other, 1, artifact_ids=["art_other"])])
    (again,) = store.list_quarantine()
    assert again["id"] == held["id"]  # the id is re-used: the id alone cannot tell
    assert store.ledger_tops() != before
    assert store.ledger_tops()[0] == before[0]  # the conflicts ledger did not move
