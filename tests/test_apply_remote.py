"""`apply_remote`, the replication primitive (DESIGN invariants 1-6, 8).

Property: any interleaving and duplication of pages from several origins
(each origin's pages in order) leaves the same store, always a per-origin
prefix. Then conflicts, quarantine, artifacts, the clock, the result
counts, and SIGKILL in the middle of applying or appending.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import T0_MS, CountingIds, FakeClock, RemoteKit, held_seqs, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import hlc
from logsync.store import Store

KIT = RemoteKit()


def open_fresh(root: Path, name: str, clock: FakeClock | None = None) -> Store:
    return Store.open(root / name, wall_ms=clock or FakeClock(), new_id=CountingIds(name[:1]))


def assert_prefix(store: Store, chains: dict[str, list[int]]) -> None:
    """Invariant 1: each origin holds exactly its ops up to the vector entry."""
    vector = store.version_vector()
    for origin, seqs in chains.items():
        top = vector.get(origin, 0)
        assert held_seqs(store, origin) == [s for s in seqs if s <= top]


# ── the property: any schedule converges ──────────────────────────────


@st.composite
def histories(draw: st.DrawFn) -> dict[str, Any]:
    """Origins with gappy chains, artifacts on some ops, and a delivery schedule."""
    n_origins = draw(st.integers(1, 3))
    chains: dict[str, list[dict[str, Any]]] = {}
    artifacts: dict[str, dict[str, Any]] = {}
    for n in range(1, n_origins + 1):
        origin = KIT.origin(n)
        seq, ops = 0, []
        for i in range(draw(st.integers(1, 10))):
            seq += draw(st.sampled_from([1, 1, 1, 2, 5]))  # upstream origins may have gaps
            ms = T0_MS + draw(st.integers(-5_000, 5_000))
            op = KIT.op(origin, seq, ms=ms, counter=i)
            if draw(st.integers(0, 3)) == 0:
                art = KIT.artifact(f"patch {origin} {seq}\n", art_id=f"art_{n}_{seq}")
                artifacts[art["id"]] = art
                op["artifact_ids"] = [art["id"]]
            ops.append(op)
        chains[origin] = ops
    pages: dict[str, list[list[dict[str, Any]]]] = {}
    for origin, ops in chains.items():
        size = draw(st.integers(1, 4))
        pages[origin] = KIT.pages(ops, size)
    # Interleave: at each step pick an origin and deliver its next page, or
    # re-deliver a page already delivered (a duplicate from another peer).
    cursors = {o: 0 for o in pages}
    delivered: list[list[dict[str, Any]]] = []
    schedule: list[list[dict[str, Any]]] = []
    while any(cursors[o] < len(pages[o]) for o in pages):
        if delivered and draw(st.integers(0, 4)) == 0:
            schedule.append(delivered[draw(st.integers(0, len(delivered) - 1))])
            continue
        live = sorted(o for o in pages if cursors[o] < len(pages[o]))
        origin = draw(st.sampled_from(live))
        page = pages[origin][cursors[origin]]
        cursors[origin] += 1
        delivered.append(page)
        schedule.append(page)
    # Merge some neighbouring pages into one call, and shuffle ops within a call.
    calls: list[list[dict[str, Any]]] = []
    for page in schedule:
        if calls and draw(st.booleans()):
            calls[-1] = calls[-1] + page
        else:
            calls.append(list(page))
    calls = [draw(st.permutations(call)) for call in calls]
    return {"chains": chains, "artifacts": artifacts, "calls": calls}


def _artifacts_for(ops: list[dict[str, Any]], artifacts: dict[str, Any]) -> list[dict]:
    return [artifacts[a] for op in ops for a in op["artifact_ids"]]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(history=histories())
def test_any_interleaving_and_duplication_converges(
    tmp_path_factory: pytest.TempPathFactory, history: dict[str, Any]
) -> None:
    root = tmp_path_factory.mktemp("prop")
    chains, artifacts = history["chains"], history["artifacts"]
    seqs = {o: [op["origin_seq"] for op in ops] for o, ops in chains.items()}
    all_ops = [op for ops in chains.values() for op in ops]
    with open_fresh(root, "reference") as ref, open_fresh(root, "replica") as rep:
        once = ref.apply_remote(all_ops, list(artifacts.values()))
        assert (once.applied, once.conflicts, once.quarantined) == (len(all_ops), 0, 0)
        applied = duplicates = 0
        for call in history["calls"]:
            result = rep.apply_remote(call, _artifacts_for(call, artifacts))
            assert (result.conflicts, result.quarantined, result.stopped) == (0, 0, {})
            applied += result.applied
            duplicates += result.duplicates
            assert_prefix(rep, seqs)
            for origin, top in result.high_water.items():
                assert top == rep.version_vector()[origin]
        assert applied == len(all_ops)
        assert duplicates == sum(len(c) for c in history["calls"]) - len(all_ops)
        assert snapshot(rep) == snapshot(ref)
        assert rep.version_vector() == {o: s[-1] for o, s in seqs.items()}
        # invariant 3: each op is stored as authored; only seq is ours
        for op in all_ops:
            stored = rep.get_event(op["id"])
            assert stored is not None
            assert {k: v for k, v in stored.items() if k != "seq"} == {
                k: v for k, v in op.items() if k != "seq"
            }
        # invariant 7: the next local tick is past every applied stamp
        top_stamp = max(op["hlc"] for op in all_ops)
        assert rep.append_event("task.note", "p", "r", "a")["hlc"] > top_stamp


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), cut=st.integers(0, 20))
def test_a_call_stopped_partway_is_a_prefix_and_resumes(
    tmp_path_factory: pytest.TempPathFactory, history: dict[str, Any], cut: int
) -> None:
    """Invariant 1 under missing artifacts: an origin stops at the op whose
    artifact did not come, holds a prefix, and resumes once it arrives."""
    root = tmp_path_factory.mktemp("cut")
    chains, artifacts = history["chains"], history["artifacts"]
    seqs = {o: [op["origin_seq"] for op in ops] for o, ops in chains.items()}
    all_ops = [op for ops in chains.values() for op in ops]
    withheld = sorted(artifacts)[: cut % (len(artifacts) + 1)]
    with open_fresh(root, "replica") as rep:
        first = rep.apply_remote(all_ops, [a for k, a in artifacts.items() if k not in withheld])
        assert_prefix(rep, seqs)
        assert first.quarantined == len(set(first.stopped))
        vector = rep.version_vector()
        for origin, ops in chains.items():
            top = vector.get(origin, 0)
            waiting = [op for op in ops if op["origin_seq"] > top]
            if origin not in first.stopped:
                assert waiting == []
                continue
            assert first.stopped[origin] == (
                f"names artifact {waiting[0]['artifact_ids'][0]!r}, which is not present"
            )
            assert waiting[0]["artifact_ids"][0] in withheld
        second = rep.apply_remote(all_ops, list(artifacts.values()))
        assert second.applied == len(all_ops) - first.applied
        assert second.stopped == {}
        assert rep.version_vector() == {o: s[-1] for o, s in seqs.items()}


# ── idempotence and verbatim storage ──────────────────────────────────


def test_reapplying_a_page_is_a_no_op(store: Store, remote: RemoteKit) -> None:
    origin = remote.origin(1)
    page = remote.chain(origin, 5)
    first = store.apply_remote(page)
    before = snapshot(store)
    again = store.apply_remote(page + page)
    assert (first.applied, first.duplicates) == (5, 0)
    assert (again.applied, again.duplicates, again.conflicts) == (0, 10, 0)
    assert snapshot(store) == before
    assert [e["seq"] for e in store.list_events()] == [1, 2, 3, 4, 5]


def test_ops_are_applied_in_origin_seq_order_whatever_the_page_order(
    store: Store, remote: RemoteKit
) -> None:
    origin = remote.origin(1)
    store.apply_remote(list(reversed(remote.chain(origin, 4))))
    assert [e["origin_seq"] for e in store.list_events()] == [1, 2, 3, 4]


def test_remote_ops_are_stored_verbatim(store: Store, remote: RemoteKit) -> None:
    origin = remote.origin(1)
    op = remote.op(origin, 1, body="  exact\r\n\tbody  ", stream=" padded ", to_agent="*",
                   topic="t", status="open", metadata={"z": [1, {"y": None}], "a": "é"},
                   created_at="2020-01-01T00:00:00Z")
    store.apply_remote([op])
    stored = store.get_event(op["id"])
    assert stored is not None
    assert stored["stream"] == " padded "  # a peer's labels are not trimmed
    assert {k: v for k, v in stored.items() if k != "seq"} == {
        k: v for k, v in op.items() if k != "seq"
    }
    assert stored["seq"] == 1 != op["seq"]


# ── conflicts: divergence is recorded, never overwrites ───────────────


def test_same_origin_seq_with_different_content_is_a_conflict(store: Store,
                                                              remote: RemoteKit) -> None:
    origin = remote.origin(1)
    original = remote.op(origin, 1, body="first")
    store.apply_remote([original, remote.op(origin, 2)])
    forked = remote.op(origin, 1, body="rewritten")
    result = store.apply_remote([forked, remote.op(origin, 3)])
    # 3 descends from the other copy of 1: not spliced onto ours, the origin stops
    assert (result.applied, result.conflicts, result.quarantined) == (0, 1, 0)
    assert result.stopped == {origin: "fork"}
    assert store.get_event(original["id"])["body"] == "first"  # type: ignore[index]
    (conflict,) = store.list_conflicts()
    assert conflict["kind"] == "fork"
    assert (conflict["origin_replica"], conflict["origin_seq"]) == (origin, 1)
    assert conflict["reason"] == (
        "the same (origin_replica, origin_seq) arrived with different content"
    )
    assert conflict["local"]["body"] == "first"
    assert conflict["remote"] == forked
    # seen again: still one record, counted
    store.apply_remote([forked])
    (again,) = store.list_conflicts()
    assert again["times_seen"] == 2
    assert store.counts()["conflicts"] == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("metadata", {"n": 99}), ("hlc", None), ("created_at", "2020-01-01T00:00:00Z"),
     ("artifact_ids", ["art_x"]), ("to_agent", "someone"), ("id", "evt_other_id")],
)
def test_any_differing_field_is_a_fork(store: Store, remote: RemoteKit, field: str,
                                       value: Any) -> None:
    origin = remote.origin(1)
    original = remote.op(origin, 1)
    art = remote.artifact("x\n", art_id="art_x")
    store.apply_remote([original], [art])
    changed = dict(original)
    changed[field] = value if field != "hlc" else f"{T0_MS + 1:013d}-000000-{origin}"
    result = store.apply_remote([changed])
    assert (result.applied, result.duplicates, result.conflicts) == (0, 0, 1)
    assert store.list_conflicts()[0]["kind"] == "fork"
    stored = store.get_event(original["id"])
    assert stored is not None and stored[field] == original[field]


def test_same_id_under_another_key_is_a_conflict_and_stops_that_origin(
    store: Store, remote: RemoteKit
) -> None:
    one, two, three = remote.origin(1), remote.origin(2), remote.origin(3)
    original = remote.op(one, 1)
    store.apply_remote([original])
    clash = remote.op(two, 1, id=original["id"])
    result = store.apply_remote([clash, remote.op(two, 2), *remote.chain(three, 2)])
    assert result.conflicts == 1
    assert result.applied == 2  # origin three only
    assert "id collision" in result.stopped[two]
    (conflict,) = store.list_conflicts()
    assert conflict["kind"] == "id_collision"
    assert conflict["item_id"] == original["id"]
    assert conflict["local"]["origin_replica"] == one
    assert conflict["remote"] == clash
    assert store.get_event(original["id"])["origin_replica"] == one  # type: ignore[index]
    assert store.version_vector() == {one: 1, three: 2}


def test_same_id_twice_in_one_page_is_a_conflict(store: Store, remote: RemoteKit) -> None:
    one, two = remote.origin(1), remote.origin(2)
    first = remote.op(one, 1)
    result = store.apply_remote([first, remote.op(two, 1, id=first["id"])])
    assert (result.applied, result.conflicts) == (1, 1)
    assert store.counts()["events"] == 1


def test_our_own_op_above_our_top_is_recovered_and_recorded(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    """A peer holding our own op 2 while we stop at 1 means we were restored from an older
    copy: the op comes back (never a fork of seq 2 later), and the event is recorded."""
    store.signing_key = None  # an unsigned origin: the recovery rule alone
    me = store.replica_id
    own = store.append_event("task.note", "proj", "general", "lead", body="mine")
    echoed = {k: v for k, v in own.items()}
    lost = remote.op(me, 2, ms=clock.ms + 1000, body="written before the restore")
    result = store.apply_remote([echoed, lost])
    assert (result.applied, result.duplicates, result.conflicts) == (1, 1, 1)
    (conflict,) = store.list_conflicts()
    assert conflict["kind"] == "restored_replica"
    assert "restored from an older copy or cloned" in conflict["reason"]
    assert conflict["local"] is None and conflict["remote"] == lost
    assert store.version_vector() == {me: 2}
    nxt = store.append_event("task.note", "proj", "general", "lead")
    assert nxt["origin_seq"] == 3 and nxt["hlc"] > lost["hlc"]


def test_an_op_claiming_our_origin_with_a_stamp_beyond_the_drift_bound_is_a_conflict(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    """Taking it back would drag our own clock an hour ahead: refused, recorded."""
    me = store.replica_id
    store.append_event("task.note", "proj", "general", "lead", body="mine")
    forged = remote.op(me, 2, ms=clock.ms + 3_600_000, body="not mine")
    result = store.apply_remote([forged])
    assert (result.applied, result.conflicts) == (0, 1)
    (conflict,) = store.list_conflicts()
    assert conflict["kind"] == "forged_origin"
    assert conflict["reason"] == (
        "an op claims this replica as its origin but this replica never wrote it"
    )
    assert conflict["local"] is None and conflict["remote"] == forged
    assert store.version_vector() == {me: 1}
    # Finding 14: the peer holds slot 2 for us, so our next op must not re-use it (it
    # would reach no one); and the refused slot does not restart recovery every round.
    assert store.own_seen_top() == 2
    assert store.append_event("task.note", "proj", "general", "lead")["origin_seq"] == 3


def test_a_refused_slot_far_beyond_our_top_does_not_burn_the_counter(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    me = store.replica_id
    store.append_event("task.note", "proj", "general", "lead")
    store.apply_remote([remote.op(me, 2**62, ms=clock.ms + 3_600_000)])
    assert store.list_conflicts()[0]["kind"] == "forged_origin"
    assert store.append_event("task.note", "proj", "general", "lead")["origin_seq"] == 2


def test_our_own_op_rewritten_by_a_peer_is_a_fork(store: Store) -> None:
    own = store.append_event("task.note", "proj", "general", "lead", body="mine")
    tampered = {**own, "body": "tampered"}
    result = store.apply_remote([tampered])
    assert result.conflicts == 1
    assert store.list_conflicts()[0]["local"]["body"] == "mine"
    assert store.get_event(own["id"])["body"] == "mine"  # type: ignore[index]


def test_a_late_op_below_the_high_water_mark_is_a_conflict(store: Store,
                                                          remote: RemoteKit) -> None:
    origin = remote.origin(1)
    store.apply_remote([remote.op(origin, 1), remote.op(origin, 3)])
    late = remote.op(origin, 2)
    result = store.apply_remote([late])
    assert (result.applied, result.conflicts) == (0, 1)
    assert store.list_conflicts()[0]["kind"] == "history_rewrite"
    assert held_seqs(store, origin) == [1, 3]


def test_an_artifact_with_the_same_id_and_other_content_is_a_conflict(
    store: Store, remote: RemoteKit
) -> None:
    art = remote.artifact("original\n", art_id="art_same")
    store.apply_remote([], [art])
    other = remote.artifact("other\n", art_id="art_same")
    result = store.apply_remote([], [other])
    assert (result.artifacts_applied, result.conflicts) == (0, 1)
    assert store.get_artifact("art_same")["content"] == "original\n"  # type: ignore[index]
    (conflict,) = store.list_conflicts()
    assert conflict["kind"] == "artifact"
    assert conflict["local"]["content"] == "original\n"
    assert conflict["remote"]["content"] == "other\n"


# ── quarantine: a bad op never enters and never wedges the others ─────


def test_an_invalid_op_stops_only_its_origin(store: Store, remote: RemoteKit) -> None:
    bad_origin, good_origin = remote.origin(1), remote.origin(2)
    bad = remote.op(bad_origin, 3, type="NOT VALID")
    page = [*remote.chain(bad_origin, 2), bad, *remote.chain(bad_origin, 2, start=4),
            *remote.chain(good_origin, 3)]
    result = store.apply_remote(page)
    assert (result.applied, result.quarantined) == (5, 1)
    assert result.high_water[good_origin] == 3
    assert result.stopped == {bad_origin: result.stopped[bad_origin]}
    assert result.stopped[bad_origin].startswith("type='NOT VALID' is invalid")
    assert store.version_vector() == {bad_origin: 2, good_origin: 3}
    (row,) = store.list_quarantine()
    assert row["kind"] == "event"
    assert (row["origin_replica"], row["origin_seq"], row["item_id"]) == (bad_origin, 3,
                                                                           bad["id"])
    assert row["payload"] == bad  # kept verbatim
    assert row["reason"].startswith("type='NOT VALID' is invalid: must be 1-64 chars")


def test_high_water_reports_what_a_stopped_origin_did_apply(store: Store,
                                                           remote: RemoteKit) -> None:
    origin = remote.origin(1)
    page = [*remote.chain(origin, 2), remote.op(origin, 3, status="done")]
    result = store.apply_remote(page)
    assert result.applied == 2
    assert result.high_water.get(origin) == 2


def test_an_op_naming_a_missing_artifact_is_kept_until_the_artifact_comes(
    store: Store, remote: RemoteKit
) -> None:
    origin, other = remote.origin(1), remote.origin(2)
    art = remote.artifact("diff --git a/f b/f\n", art_id="art_needed")
    needy = remote.op(origin, 2, artifact_ids=["art_needed"])
    page = [remote.op(origin, 1), needy, remote.op(origin, 3), *remote.chain(other, 2)]
    first = store.apply_remote(page)
    assert (first.applied, first.quarantined) == (3, 1)
    assert first.stopped[origin] == "names artifact 'art_needed', which is not present"
    assert store.get_event(needy["id"]) is None
    assert held_seqs(store, origin) == [1]
    (row,) = store.list_quarantine()
    assert row["payload"] == needy
    # pulled again later, with its artifact: applied
    second = store.apply_remote(page, [art])
    assert (second.applied, second.duplicates, second.quarantined) == (2, 3, 0)
    assert second.artifacts_applied == 1
    assert held_seqs(store, origin) == [1, 2, 3]
    assert store.get_event(needy["id"])["artifact_ids"] == ["art_needed"]  # type: ignore[index]


def test_an_artifact_with_a_wrong_sha256_is_never_stored(store: Store,
                                                        remote: RemoteKit) -> None:
    origin = remote.origin(1)
    art = remote.artifact("real content\n", art_id="art_lie")
    art["content"] = "swapped content\n"
    op = remote.op(origin, 1, artifact_ids=["art_lie"])
    result = store.apply_remote([op], [art])
    assert (result.applied, result.artifacts_applied, result.quarantined) == (0, 0, 2)
    assert store.get_artifact("art_lie") is None
    reasons = sorted(r["reason"] for r in store.list_quarantine())
    assert reasons[0].startswith("artifact 'art_lie' failed hash verification")
    assert reasons[1] == "names artifact 'art_lie', which is not present"


def test_the_same_bad_op_again_is_counted_not_duplicated(store: Store,
                                                        remote: RemoteKit) -> None:
    bad = remote.op(remote.origin(1), 1, body="nul\x00")
    store.apply_remote([bad])
    store.apply_remote([bad])
    (row,) = store.list_quarantine()
    assert row["times_seen"] == 2
    assert store.counts()["quarantined"] == 1


@pytest.mark.parametrize(
    "poison",
    [
        {"status": []}, {"status": {"x": 1}}, {"to_agent": "\ud800"}, {"id": "evt_\udc80"},
        {"body": "\ud83d"}, {"metadata": {"k": "\udfff"}}, {"created_at": 5},
        {"artifact_ids": "art_1"}, {"hlc": ["x"]}, {"metadata": {"k": object()}},
    ],
)
def test_poison_ops_are_quarantined_and_other_origins_go_on(
    store: Store, remote: RemoteKit, poison: dict[str, Any]
) -> None:
    bad_origin, good_origin = remote.origin(1), remote.origin(2)
    bad = remote.op(bad_origin, 1, **poison)
    result = store.apply_remote([bad, remote.op(bad_origin, 2), *remote.chain(good_origin, 2)])
    assert result.stopped.keys() == {bad_origin}
    assert result.quarantined == 1
    assert result.applied == 2
    assert store.version_vector() == {good_origin: 2}
    assert len(store.list_quarantine()) == 1


def test_a_forged_origin_with_a_lone_surrogate_is_quarantined(store: Store,
                                                               remote: RemoteKit) -> None:
    bad = remote.op(remote.origin(1), 1)
    bad["origin_replica"] = "rep_\ud800"
    result = store.apply_remote([bad, *remote.chain(remote.origin(2), 2)])
    assert (result.applied, result.quarantined) == (2, 1)
    assert store.list_quarantine()[0]["reason"].startswith("origin_replica='rep_\\ud800'")


def test_entries_without_an_origin_are_each_quarantined(store: Store, remote: RemoteKit) -> None:
    """Nothing is dropped silently: every unusable entry is kept with its reason."""
    result = store.apply_remote([None, 17, "x", *remote.chain(remote.origin(2), 2)])
    assert (result.applied, result.quarantined) == (2, 3)
    assert sorted(str(r["payload"]) for r in store.list_quarantine()) == ["17", "None", "x"]


# ── the clock and the result ──────────────────────────────────────────


def test_applied_stamps_are_observed(store: Store, clock: FakeClock, remote: RemoteKit) -> None:
    origin = remote.origin(1)
    ahead = remote.op(origin, 1, ms=clock.ms + 45_000, counter=9)
    store.apply_remote([ahead])
    mine = store.append_event("task.note", "p", "r", "a")
    assert mine["hlc"] > ahead["hlc"]
    assert hlc.parse(mine["hlc"]) == hlc.Stamp(clock.ms + 45_000, 10, store.replica_id)


def test_a_stamp_beyond_the_drift_bound_is_stored_but_not_absorbed(
    store: Store, clock: FakeClock, remote: RemoteKit
) -> None:
    origin = remote.origin(1)
    far = remote.op(origin, 1, ms=clock.ms + 3_600_000)
    store.apply_remote([far])
    assert store.get_event(far["id"])["hlc"] == far["hlc"]  # type: ignore[index]
    mine = store.append_event("task.note", "p", "r", "a")
    assert mine["hlc"] == hlc.render(clock.ms, 0, store.replica_id)


def test_apply_result_counts_and_high_water(store: Store, remote: RemoteKit) -> None:
    one, two = remote.origin(1), remote.origin(2)
    art = remote.artifact("a\n", art_id="art_a")
    store.apply_remote(remote.chain(one, 2))
    page = [*remote.chain(one, 4), remote.op(two, 1, artifact_ids=["art_a"]),
            remote.op(two, 2), remote.op(two, 3, body="\x00")]
    result = store.apply_remote(page, [art, art])
    assert result.applied == 4
    assert result.duplicates == 2
    assert result.conflicts == 0
    assert result.quarantined == 1
    assert result.artifacts_applied == 1
    assert result.high_water == {one: 4, two: 2}
    assert result.applied_per_origin == {one: 2, two: 2}
    assert set(result.stopped) == {two}
    assert store.counts() == {"events": 6, "artifacts": 1, "conflicts": 0, "quarantined": 1}
    empty = store.apply_remote([])
    assert (empty.applied, empty.high_water, empty.stopped) == (0, {}, {})


# ── crash safety: SIGKILL in the middle of writes ─────────────────────

CHILD = textwrap.dedent(
    """
    import json, random, sys
    from logsync.store import Store
    palace, plan_path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    plan = json.load(open(plan_path))
    rng = random.Random(plan["seed"])
    with Store.open(palace) as store:
        print("open", flush=True)
        if mode == "append":
            while True:
                event = store.append_event("task.note", "proj", "general", "lead", body="x")
                print("appended", event["origin_seq"], flush=True)
        calls = plan["calls"]
        while True:
            for i, call in enumerate(calls):
                print("start", i, flush=True)
                store.apply_remote(call["events"], call["artifacts"])
                print("applied", i, flush=True)
                if rng.random() < 0.3:
                    store.append_event("task.note", "proj", "general", "lead")
    """
)


def _crash_plan(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    chains = {KIT.origin(n): KIT.chain(KIT.origin(n), 900, body="b" * 2000) for n in (1, 2, 3)}
    artifacts = {}
    for ops in chains.values():
        for op in ops[::25]:
            art = KIT.artifact(f"content for {op['id']}\n" * 50, art_id=f"art_{op['id'][4:]}")
            artifacts[art["id"]] = art
            op["artifact_ids"] = [art["id"]]
    calls = []
    cursors = dict.fromkeys(chains, 0)
    while any(cursors[o] < len(chains[o]) for o in chains):
        origin = rng.choice(sorted(o for o in chains if cursors[o] < len(chains[o])))
        size = rng.choice([300, 450])
        page = chains[origin][cursors[origin] : cursors[origin] + size]
        cursors[origin] += size
        arts = [artifacts[a] for op in page for a in op["artifact_ids"]]
        calls.append({"events": page, "artifacts": arts})
    return {"seed": seed, "calls": calls, "chains": chains, "artifacts": artifacts}


def _run_and_kill(palace: Path, plan_path: Path, mode: str, after_lines: int,
                  extra_delay: float) -> list[str]:
    """Start the child, wait for `after_lines` progress lines, then SIGKILL it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(palace), str(plan_path), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        while len(lines) < after_lines:
            line = proc.stdout.readline()  # the child prints steadily; EOF if it died
            if not line:
                break
            lines.append(line.strip())
        time.sleep(extra_delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    complete = out if out.endswith("\n") else out[: out.rfind("\n") + 1]
    lines.extend(complete.splitlines())  # a line cut by the kill is dropped
    assert proc.returncode == -signal.SIGKILL, err
    assert len(lines) >= after_lines, err
    return lines


def _integrity(palace: Path) -> str:
    conn = sqlite3.connect(palace / "logstream.sqlite3")
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_sigkill_during_apply_leaves_a_consistent_prefix_that_converges(tmp_path: Path) -> None:
    plan = _crash_plan(seed=7)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    palace = tmp_path / "palace"
    seqs = {o: [op["origin_seq"] for op in ops] for o, ops in plan["chains"].items()}
    killed_inside_apply = 0
    # (progress lines to wait for, delay before the kill): a page takes ~20 ms
    for round_no, (after, delay) in enumerate([(2, 0.004), (4, 0.008), (6, 0.002),
                                               (3, 0.012)]):
        lines = _run_and_kill(palace, plan_path, "apply", after, delay)
        killed_inside_apply += lines[-1].startswith("start")
        assert _integrity(palace) == "ok", f"round {round_no}"
        with Store.open(palace) as store:
            assert_prefix(store, seqs)
            own = store.version_vector().get(store.replica_id, 0)
            assert held_seqs(store, store.replica_id) == list(range(1, own + 1))
            for event in store.iter_events():
                assert store.missing_artifacts(event["artifact_ids"]) == []
    assert killed_inside_apply >= 1, "no kill landed inside apply_remote"
    with Store.open(palace) as store, Store.open(tmp_path / "ref") as ref:
        everything = [op for ops in plan["chains"].values() for op in ops]
        arts = list(plan["artifacts"].values())
        store.apply_remote(everything, arts)
        ref.apply_remote(everything, arts)
        got, want = snapshot(store), snapshot(ref)
        own = store.replica_id
        got["events"] = {k: v for k, v in got["events"].items() if v["origin_replica"] != own}
        got["vector"].pop(own, None)
        assert got == want
        assert store.counts()["conflicts"] == 0 and store.counts()["quarantined"] == 0


def test_sigkill_during_appends_loses_nothing_that_was_acknowledged(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps({"seed": 1, "calls": []}))
    palace = tmp_path / "palace"
    acknowledged = 0
    for after in (40, 25):
        lines = _run_and_kill(palace, plan_path, "append", after, 0.02)
        seqs = [int(line.split()[1]) for line in lines if line.startswith("appended")]
        assert seqs == list(range(acknowledged + 1, acknowledged + 1 + len(seqs)))
        acknowledged = max(seqs, default=acknowledged)
        assert _integrity(palace) == "ok"
        with Store.open(palace) as store:
            top = store.version_vector().get(store.replica_id, 0)
            assert top >= acknowledged  # durable once append_event returned
            assert held_seqs(store, store.replica_id) == list(range(1, top + 1))
            acknowledged = top


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rep_a", "rep_b", None]),
                          st.one_of(st.none(), st.integers(-2, 8), st.text(max_size=1))),
                max_size=12))
def test_ops_are_grouped_by_origin_in_seq_then_arrival_order(
        picks: list[tuple[str | None, Any]]) -> None:
    """`group_by_origin` returns an in-order page as it came (no sort) and sorts any other:
    both are the (seq, arrival) order, ops without a usable seq last."""
    from logsync.store.ledgers import raw_seq
    from logsync.store.rows import group_by_origin

    ops = [{"origin_replica": o, "origin_seq": s, "n": n} for n, (o, s) in enumerate(picks)]
    groups = group_by_origin(ops)
    for key, got in groups.items():
        members = [op for op in ops if op["origin_replica"] == key] or got
        expected = sorted(members, key=lambda op: (
            float("inf") if raw_seq(op) is None else raw_seq(op), op["n"]))
        assert got == expected
    assert sorted(op["n"] for group in groups.values() for op in group) == list(range(len(ops)))
