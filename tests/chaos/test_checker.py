"""The checker on replicas built by hand (no processes): identical replicas pass, and each
planted defect -- a lost acknowledged op, a duplicated key or op, a changed byte, a wrong
key, a gap, an unexpected or a missing ledger row, a failed integrity check -- fails the
verdict with the item named. A hub's own origin may have gaps (RFC 004 §6.2); a logsync
author's may not."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from logsync.chaos.checker import (
    OP_TAG,
    Acked,
    Replica,
    check,
    converged,
    read_replica,
)
from logsync.store import Store

PATCH = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b ✓\n"


@pytest.fixture
def palaces(tmp_path: Path) -> tuple[list[Path], list[Acked]]:
    """Three replicas holding the same five events and a patch, authored on the first."""
    paths = [tmp_path / name for name in ("a", "b", "c")]
    with Store.open(paths[0]) as author:
        acked = []
        for n in range(5):
            event = author.append_event("note", "s", "r", "x", body=f"body {n} ü",
                                        metadata={OP_TAG: f"op{n}"})
            acked.append(Acked(event["id"], event["origin_replica"], event["origin_seq"], "a",
                               f"op{n}"))
        author.submit_patch(PATCH, "x", "s")
        ops = author.list_ops(author.replica_id)
        artifacts = [author.get_artifact(i) for e in ops for i in e["artifact_ids"]]
    for path in paths[1:]:
        with Store.open(path) as replica:
            replica.apply_remote(ops, artifacts)
    return paths, acked


def read(paths: list[Path]) -> list[Replica]:
    return [read_replica(p.name, "logsync", p) for p in paths]


def sql(path: Path, statement: str, *params: object) -> None:
    with contextlib.closing(sqlite3.connect(path / "logstream.sqlite3")) as conn, conn:
        conn.execute(statement, params)


def test_identical_replicas_pass(palaces) -> None:
    paths, acked = palaces
    replicas = read(paths)
    verdict = check(replicas, acked)
    assert verdict.ok, verdict.problems
    assert converged(replicas, acked)
    assert verdict.integrity == {"a": "ok", "b": "ok", "c": "ok"}
    assert all(len(r.artifacts) == 1 and r.links for r in replicas)


def test_a_lost_acknowledged_op_is_named_with_where_it_is_missing(palaces) -> None:
    paths, acked = palaces
    sql(paths[2], "DELETE FROM events WHERE id = ?", acked[2].id)
    replicas = read(paths)
    verdict = check(replicas, acked)
    assert not verdict.ok and not converged(replicas, acked)
    assert [(x["id"], x["missing_on"]) for x in verdict.lost] == [(acked[2].id, ["c"])]
    assert len(verdict.gaps) == 1 and "c:" in verdict.gaps[0]


def test_an_acknowledged_artifact_is_required_and_a_dangling_link_fails(palaces) -> None:
    paths, acked = palaces
    with Store.open(paths[0]) as author:
        patch = next(e for e in author.list_ops(author.replica_id) if e["artifact_ids"])
    key = (patch["id"], patch["origin_replica"], patch["origin_seq"], "a")
    acked_patch = Acked(*key, "patch", patch["artifact_ids"][0])
    assert check(read(paths), [*acked, acked_patch]).ok
    other = Acked(*key, "patch", "art_not_linked")  # acknowledged, never linked
    verdict = check(read(paths), [*acked, other])
    assert not verdict.ok and not converged(read(paths), [*acked, other])
    assert [x.get("artifact_missing_on") for x in verdict.lost] == [["a", "b", "c"]]
    sql(paths[1], "DELETE FROM artifacts")  # b keeps the link, not the artifact
    replicas = read(paths)
    verdict = check(replicas, acked)
    assert replicas[1].dangling and not converged(replicas, acked)
    assert any("name an artifact the replica does not hold" in p for p in verdict.problems)


def test_an_append_reported_failed_must_be_absent(palaces) -> None:
    paths, acked = palaces
    assert check(read(paths), acked, failed=["op-never-stored"]).ok
    verdict = check(read(paths), acked[:1], failed=["op1"])
    assert not verdict.ok and any("'op1': ['a', 'b', 'c']" in p for p in verdict.problems)


def test_a_duplicated_key_and_op_are_named(palaces) -> None:
    paths, acked = palaces
    sql(paths[1], "DROP INDEX events_origin_seq_idx")  # a hub's file has no such index
    sql(paths[1], "INSERT INTO events SELECT 'evt_twin', type, stream, room, topic, "
        "from_agent, to_agent, correlation_id, branch, base_commit, status, body, created_at, "
        "metadata_json, origin_replica, origin_seq, hlc FROM events WHERE id = ?", acked[1].id)
    verdict = check(read(paths), acked)
    assert not verdict.ok
    assert any("held twice" in d for d in verdict.duplicated)
    assert any("op1 stored 2 times" in d for d in verdict.duplicated)


def test_one_changed_byte_is_a_divergence(palaces) -> None:
    paths, acked = palaces
    sql(paths[1], "UPDATE events SET body = 'body 3 u' WHERE id = ?", acked[3].id)
    verdict = check(read(paths), acked)
    assert not verdict.ok and verdict.lost == []
    assert any(acked[3].id in d for d in verdict.divergent)


def test_a_changed_artifact_is_a_divergence(palaces) -> None:
    paths, acked = palaces
    sql(paths[0], "UPDATE artifacts SET created_by = 'y'")
    verdict = check(read(paths), acked)
    assert any(d.startswith("artifact ") for d in verdict.divergent)


def test_an_op_held_under_another_key_is_a_divergence(palaces) -> None:
    paths, acked = palaces
    wrong = Acked(acked[0].id, acked[0].origin, 99, "a")
    verdict = check(read(paths), [wrong])
    assert any("acknowledged as" in d for d in verdict.divergent) and not verdict.ok


def test_ledger_rows_fail_unless_expected_and_their_absence_fails_when_expected(
    palaces,
) -> None:
    paths, acked = palaces
    assert not check(read(paths), acked, expected_ledgers=True).ok
    sql(paths[1], "INSERT INTO logsync_quarantine (received_at, kind, origin_replica, "
        "origin_seq, reason, payload_json, digest) VALUES ('t', 'event', 'o', 1, 'planted', "
        "'{}', 'd')")
    verdict = check(read(paths), acked)
    assert not verdict.ok and "planted" in verdict.ledgers["b"][0]
    assert check(read(paths), acked, expected_ledgers=True).ok


def replica(name: str, kind: str, rid: str, seqs: dict[str, list[int]]) -> Replica:
    r = Replica(name=name, kind=kind, replica_id=rid, integrity="ok")
    r.seqs = seqs
    for origin, numbers in seqs.items():
        for n in numbers:
            r.events[f"{origin}-{n}"] = f"row {origin} {n}"
            r.keys[f"{origin}-{n}"] = (origin, n)
    return r


def test_a_hub_origin_may_have_gaps_a_logsync_origin_may_not() -> None:
    hub = replica("hub", "hub", "H", {"H": [1, 2, 9, 10], "L": [1, 2]})
    behind = replica("n1", "logsync", "L", {"H": [1, 2, 9], "L": [1, 2]})
    assert check([hub, behind], []).gaps == []
    holed = replica("n1", "logsync", "L", {"H": [1, 9], "L": [1, 2]})
    assert "not a prefix of the author's" in check([hub, holed], []).gaps[0]
    gappy = replica("n1", "logsync", "L", {"L": [1, 2, 4]})
    assert any("not gap-free" in g for g in check([gappy], []).gaps)


def test_a_failed_integrity_check_fails() -> None:
    bad = replica("n1", "logsync", "L", {"L": [1]})
    bad.integrity = "*** in database main *** Page 3 is never used"
    verdict = check([bad], [])
    assert not verdict.ok and "integrity_check" in verdict.problems[0]
