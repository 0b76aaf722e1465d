"""Mutants of logsync/store/apply.py (and the clock rule apply_remote relies on) that
tests/test_apply_remote.py and tests/test_store.py let live (issue 9,
scripts/mutation.py).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from conftest import T0_MS, CountingIds, FakeClock, RemoteKit, held_seqs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import hlc, model
from logsync.store import Store
from logsync.store.apply import ApplyResult

KIT = RemoteKit()
DRIFT_MS = 60_000  # the RFC's future-drift bound


# ── invariant 7: applied stamps are absorbed by the next local tick ────


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(st.integers(1, 3), st.integers(-120_000, 120_000), st.integers(0, 50)),
        min_size=1,
        max_size=8,
    ),
    later=st.sampled_from([0, 1, 30_000, 90_000]),
)
def test_the_next_local_append_is_above_every_applied_in_bound_stamp(
    ops: list[tuple[int, int, int]], later: int
) -> None:
    """apply_remote stores remote stamps; the next local append must sort after every
    one of them within the drift bound at that moment (else the merged timeline puts
    our later event first) and after none beyond it (a broken peer clock must not drag
    ours along): its millisecond is max(now, newest in-bound remote millisecond)."""
    clock = FakeClock()
    seqs: dict[int, int] = {}
    page = []
    for n, offset, counter in ops:
        seqs[n] = seqs.get(n, 0) + 1
        page.append(KIT.op(KIT.origin(n), seqs[n], ms=T0_MS + offset, counter=counter))
    with tempfile.TemporaryDirectory() as tmp, Store.open(
        Path(tmp) / "p", wall_ms=clock, new_id=CountingIds("m")
    ) as store:
        result = store.apply_remote(page)
        assert result.applied == len(page)
        clock.advance(later)
        mine = store.append_event("task.note", "proj", "general", "lead")["hlc"]
    in_bound = [op["hlc"] for op in page if int(op["hlc"][:13]) <= clock.ms + DRIFT_MS]
    assert all(mine > stamp for stamp in in_bound)
    parsed = hlc.parse(mine)
    assert parsed is not None
    assert parsed.ms == max([clock.ms] + [int(s[:13]) for s in in_bound])


def test_a_remote_stamp_within_the_drift_bound_lifts_the_next_local_stamp(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    """The named mutant of issue 9 ("apply_remote no longer observes applied stamps"):
    a remote op 59 s ahead of our wall clock, then a local append at the same wall time."""
    ahead = hlc.render(clock.ms + 59_000, 7, remote.origin(4))
    store.apply_remote([remote.op(remote.origin(4), 1, ms=clock.ms + 59_000, counter=7)])
    mine = store.append_event("task.note", "proj", "general", "lead")
    assert mine["hlc"] == hlc.render(clock.ms + 59_000, 8, store.replica_id)
    assert mine["hlc"] > ahead


# ── the result ────────────────────────────────────────────────────────


def test_an_empty_page_does_nothing_and_the_result_is_a_value(store: Store) -> None:
    """`ApplyResult()` is "nothing done" (what an empty page returns), and a result is
    frozen: a caller folding it into a report cannot change what the store did."""
    result = store.apply_remote([])
    assert result == ApplyResult()
    assert (result.applied, result.duplicates, result.conflicts, result.quarantined,
            result.artifacts_applied) == (0, 0, 0, 0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.applied = 5  # type: ignore[misc]


# ── only our own origin can be forged ─────────────────────────────────

MIDDLE = "rep_" + "8" * 32
BELOW = "rep_" + "0" * 31 + "1"
ABOVE = "rep_" + "f" * 32


@pytest.mark.parametrize("origin", [BELOW, ABOVE])
def test_a_far_future_op_of_another_origin_is_stored_whatever_its_id_order(
    tmp_path: Path, remote: RemoteKit, clock: FakeClock, origin: str
) -> None:
    """Another origin's far-future op is stored (its stamp is just not absorbed); only an
    op claiming *our* origin is judged as possibly forged, whether the other id sorts
    before or after ours."""
    with Store.open(tmp_path / "p", wall_ms=clock, new_id=CountingIds("m"),
                    replica_id=MIDDLE) as store:
        result = store.apply_remote([remote.op(origin, 1, ms=clock.ms + 3_600_000)])
        assert (result.applied, result.conflicts) == (1, 0)
        assert store.list_conflicts() == []
        mine = store.append_event("task.note", "proj", "general", "lead")
    assert mine["hlc"].startswith(f"{clock.ms:013d}-")


# ── a refused slot of ours, sent again ────────────────────────────────


@pytest.mark.parametrize("later_ms", [3_600_000, 0])
def test_a_refused_own_slot_below_our_top_stays_forged_when_sent_again(
    store: Store, remote: RemoteKit, clock: FakeClock, later_ms: int
) -> None:
    """Slot 1 of ours, stamped an hour ahead, is refused as forged and skipped by our next
    op (seq 2). Sent again (far ahead, or now in bound) it is at or below our top and
    never ours: forged_origin again (the same row seen twice, or a second one), never a
    history rewrite of our own origin."""
    me = store.replica_id
    store.apply_remote([remote.op(me, 1, ms=clock.ms + 3_600_000)])
    assert store.append_event("task.note", "proj", "general", "lead")["origin_seq"] == 2
    again = store.apply_remote([remote.op(me, 1, ms=clock.ms + later_ms)])
    assert (again.applied, again.conflicts) == (0, 1)
    assert {c["kind"] for c in store.list_conflicts()} == {"forged_origin"}
    assert held_seqs(store, me) == [2]


# ── how far a refused slot may push our counter ───────────────────────


@pytest.mark.parametrize(
    ("held", "refused", "expected"),
    [
        (0, 1_000_000, 1_000_001),  # a million past our top: skipped
        (0, 1_000_001, 1),  # one more: a forgery burning the counter, ignored
        (64, 64 + 1_000_000, 64 + 1_000_001),  # measured from our top, not from zero
    ],
)
def test_a_refused_own_slot_is_skipped_up_to_a_million_past_our_top(
    store: Store, remote: RemoteKit, clock: FakeClock, held: int, refused: int, expected: int
) -> None:
    me = store.replica_id
    for _ in range(held):
        store.append_event("task.note", "proj", "general", "lead")
    store.apply_remote([remote.op(me, refused, ms=clock.ms + 3_600_000)])
    assert store.list_conflicts()[0]["kind"] == "forged_origin"
    assert store.append_event("task.note", "proj", "general", "lead")["origin_seq"] == expected


def test_a_refused_slot_at_the_largest_seq_never_pushes_our_counter_past_it(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    """We hold our own op at MAX_SEQ - 5 (recovered from a peer) and a peer holds slot
    MAX_SEQ for us (refused, far-future): our next op is MAX_SEQ - 4, not MAX_SEQ + 1,
    which no peer would take."""
    store.signing_key = None  # an unsigned origin: the recovery rule alone
    me = store.replica_id
    recovered = remote.op(me, model.MAX_SEQ - 5, ms=clock.ms + 1000)
    refused = remote.op(me, model.MAX_SEQ, ms=clock.ms + 3_600_000)
    result = store.apply_remote([recovered, refused])
    assert (result.applied, result.conflicts) == (1, 2)
    assert {c["kind"] for c in store.list_conflicts()} == {"restored_replica", "forged_origin"}
    nxt = store.append_event("task.note", "proj", "general", "lead")
    assert nxt["origin_seq"] == model.MAX_SEQ - 4


# ── origin_seq bounds and page order ──────────────────────────────────


def test_an_op_at_the_largest_seq_is_an_ordinary_op(store: Store, remote: RemoteKit) -> None:
    origin = remote.origin(1)
    op = remote.op(origin, model.MAX_SEQ, ms=T0_MS)
    assert store.apply_remote([op]).applied == 1
    again = store.apply_remote([op])
    assert (again.applied, again.duplicates, again.conflicts, again.stopped) == (0, 1, 0, {})
    assert store.version_vector()[origin] == model.MAX_SEQ


def test_an_op_at_the_largest_seq_is_applied_before_an_op_without_a_usable_seq(
    store: Store, remote: RemoteKit
) -> None:
    origin = remote.origin(1)
    bad = remote.op(origin, 1, origin_seq="one")
    result = store.apply_remote([bad, remote.op(origin, model.MAX_SEQ, ms=T0_MS)])
    assert (result.applied, result.quarantined) == (1, 1)
    assert held_seqs(store, origin) == [model.MAX_SEQ]


@pytest.mark.parametrize("seq", [model.MAX_SEQ + 1, 2**63, 0, -1])
def test_an_op_with_an_unusable_seq_is_quarantined_after_the_usable_ones(
    store: Store, remote: RemoteKit, seq: int
) -> None:
    """An origin_seq beyond what we accept (or below 1) sorts last in its origin (the
    valid ops before it are kept), is quarantined with no origin_seq, and never reaches
    SQL as a number."""
    origin = remote.origin(1)
    result = store.apply_remote([remote.op(origin, 1, origin_seq=seq), remote.op(origin, 1)])
    assert (result.applied, result.quarantined) == (1, 1)
    assert held_seqs(store, origin) == [1]
    (row,) = store.list_quarantine()
    assert row["origin_seq"] is None and row["origin_replica"] == origin


def test_two_ops_for_one_key_in_a_page_keep_page_order(store: Store, remote: RemoteKit) -> None:
    """The same (origin, origin_seq) twice in one page: the first as sent is stored, the
    second is a fork of it."""
    origin = remote.origin(1)
    first = remote.op(origin, 1, body="first")
    second = remote.op(origin, 1, body="second", id="evt_other_00000001")
    result = store.apply_remote([first, second])
    assert (result.applied, result.conflicts) == (1, 1)
    assert store.get_event(first["id"])["body"] == "first"  # type: ignore[index]
    assert store.list_conflicts()[0]["kind"] == "fork"


# ── missing artifacts ─────────────────────────────────────────────────


def test_an_artifact_missing_for_one_origin_is_missing_for_the_next(
    store: Store, remote: RemoteKit
) -> None:
    """A lookup that found nothing is not remembered as found: two origins naming the
    same absent artifact are both quarantined."""
    page = [remote.op(remote.origin(n), 1, artifact_ids=["art_20260702T032443_absent000001"])
            for n in (1, 2)]
    result = store.apply_remote(page)
    assert (result.applied, result.quarantined) == (0, 2)
    assert store.counts()["events"] == 0


def test_the_quarantine_reason_names_the_first_missing_artifact(
    store: Store, remote: RemoteKit
) -> None:
    present = remote.artifact("here\n")
    names = ["art_20260702T032443_absent000001", present["id"],
             "art_20260702T032443_absent000002"]
    result = store.apply_remote([remote.op(remote.origin(1), 1, artifact_ids=names)],
                                [present])
    assert (result.applied, result.quarantined) == (0, 1)
    (row,) = store.list_quarantine()
    assert row["reason"] == (
        "names artifact 'art_20260702T032443_absent000001', which is not present"
    )


# ── what the ledgers keep of a bad op ─────────────────────────────────


def test_the_same_bad_op_with_its_keys_in_another_order_is_one_quarantine_row(
    store: Store, remote: RemoteKit
) -> None:
    """Quarantine rows are deduplicated by content, not by how a peer ordered the keys."""
    bad = remote.op(remote.origin(1), 1, type=42)
    store.apply_remote([bad])
    store.apply_remote([dict(reversed(list(bad.items())))])
    (row,) = store.list_quarantine()
    assert row["times_seen"] == 2
    assert row["payload"] == bad


def test_an_op_json_cannot_encode_is_quarantined_as_its_repr(
    store: Store, remote: RemoteKit
) -> None:
    """An int too long for str() fails json.dumps with ValueError: the op is still
    quarantined, recorded as what repr() can show, and the page goes on."""
    origin = remote.origin(1)
    huge = remote.op(origin, 2, metadata={"n": 10**5000})
    result = store.apply_remote([remote.op(origin, 1), huge])
    assert (result.applied, result.quarantined) == (1, 1)
    (row,) = store.list_quarantine()
    assert set(row["payload"]) == {"unencodable"}


def test_an_unencodable_op_keeps_the_first_4096_characters_of_its_repr(
    store: Store, remote: RemoteKit
) -> None:
    """Mixed key types cannot be sorted for JSON (TypeError): the ledger keeps 4 KiB of
    the op's repr, cut with an ellipsis."""
    bad = remote.op(remote.origin(1), 1, body={1: "one", "two": "x" * 10_000})
    assert store.apply_remote([bad]).quarantined == 1
    (row,) = store.list_quarantine()
    kept = row["payload"]["unencodable"]
    assert len(kept) == 4096
    assert kept == repr(bad)[:4093] + "..."


# ── found by the second run (apply.py after the APPLY_CHECKS table) ───


def test_an_invalid_artifact_does_not_stop_the_artifacts_after_it(
    store: Store, remote: RemoteKit
) -> None:
    good = remote.artifact("good\n")
    bad = {**remote.artifact("bad\n"), "sha256": "0" * 64}  # content does not match
    op = remote.op(remote.origin(1), 1, artifact_ids=[good["id"]])
    result = store.apply_remote([op], [bad, good])
    assert (result.artifacts_applied, result.applied, result.quarantined) == (1, 1, 1)
    assert store.list_quarantine()[0]["kind"] == "artifact"


def wire(op: dict) -> dict:
    """An op as it arrives from a peer: decoded from JSON, so its strings are new
    objects (equal to ours, never the same object)."""
    return json.loads(json.dumps(op))


def test_an_op_claiming_our_origin_off_the_wire_is_judged_as_ours(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    store.signing_key = None  # an unsigned origin: the recovery rule alone
    me = store.replica_id
    forged = wire(remote.op(me, 1, ms=clock.ms + 3_600_000))
    lost = wire(remote.op(me, 1, ms=clock.ms + 1000))
    assert store.apply_remote([forged]).applied == 0
    assert store.list_conflicts()[0]["kind"] == "forged_origin"
    assert store.apply_remote([lost]).applied == 1
    assert store.list_conflicts()[0]["kind"] == "restored_replica"


@pytest.mark.parametrize(("ahead", "recovered"), [(60_000, True), (60_001, False)])
def test_our_lost_op_is_recovered_up_to_exactly_the_drift_bound(
    store: Store, remote: RemoteKit, clock: FakeClock, ahead: int, recovered: bool
) -> None:
    store.signing_key = None  # an unsigned origin: the recovery rule alone
    me = store.replica_id
    result = store.apply_remote([remote.op(me, 1, ms=clock.ms + ahead)])
    assert result.applied == (1 if recovered else 0)
    kind = store.list_conflicts()[0]["kind"]
    assert kind == ("restored_replica" if recovered else "forged_origin")


def test_a_refused_slot_just_below_the_largest_seq_is_skipped(
    store: Store, remote: RemoteKit, clock: FakeClock
) -> None:
    """Slot MAX_SEQ - 1 refused: our next op takes MAX_SEQ, the last slot there is."""
    store.signing_key = None  # an unsigned origin: the recovery rule alone
    me = store.replica_id
    store.apply_remote([remote.op(me, model.MAX_SEQ - 5, ms=clock.ms + 1000),
                        remote.op(me, model.MAX_SEQ - 1, ms=clock.ms + 3_600_000)])
    nxt = store.append_event("task.note", "proj", "general", "lead")
    assert nxt["origin_seq"] == model.MAX_SEQ


def test_the_quarantine_keeps_non_ascii_text_verbatim(
    store: Store, remote: RemoteKit, palace: Path
) -> None:
    """The ledger holds what the peer sent, as UTF-8 text, not \\u escapes."""
    store.apply_remote([remote.op(remote.origin(1), 1, type=42, body="café ☕")])
    with sqlite3.connect(palace / "logstream.sqlite3") as db:
        (raw,) = db.execute("SELECT payload_json FROM logsync_quarantine").fetchone()
    assert "café ☕" in raw


def test_a_bad_op_with_a_lone_surrogate_is_one_row_whatever_its_key_order(
    store: Store, remote: RemoteKit
) -> None:
    bad = remote.op(remote.origin(1), 1, body="half a pair \ud800")
    store.apply_remote([bad])
    store.apply_remote([dict(reversed(list(bad.items())))])
    (row,) = store.list_quarantine()
    assert row["times_seen"] == 2


def test_an_origin_whose_first_op_is_quarantined_reports_a_high_water_of_zero(
    store: Store, remote: RemoteKit
) -> None:
    """Nothing of it is held: its high-water mark is 0 (a round takes it as how far the
    origin got), not 1."""
    origin = remote.origin(1)
    result = store.apply_remote([remote.op(origin, 1, type=42)])
    assert (result.applied, result.quarantined) == (0, 1)
    assert result.high_water == {origin: 0}
    assert origin in result.stopped
    assert store.version_vector().get(origin, 0) == 0
