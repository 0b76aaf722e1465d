"""`logsync verify` (issue 10, item 5): the whole store re-checked, read-only.

A clean store verifies (exit 0, the JSON shape); each planted defect is detected and
named: an event's body changed under a complete chain (a mismatch at exactly that seq),
an artifact's content, size or stored hash changed (the artifact named; a changed stored
hash also breaks the chain of the op naming it), a chain row deleted (missing at that
seq, still missing afterwards: verify opens read-only and repairs nothing) or one added
(extra), across page boundaries; a bad --origin is one sentence, exit 1; and for random
stores over 1-3 origins with gaps, corrupting one op is reported at exactly its seq.
Signatures: a signed store verifies (the author's and a puller's: checkpoints and tip
checked), a flipped signature byte is named at its seq (exit 3), an origin without a key
is unsigned, and ops taken through a hub above the last signature are unproven.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from conftest import CountingIds, FakeClock, RemoteKit, origin_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync.cli import cli
from logsync.pagechain import CHECKPOINT
from logsync.store import DB_FILENAME, Store, audit, chaining
from tests.test_engine import FakePeer
from tests.test_signatures import Relay, append, pull

KIT = RemoteKit()
REMOTE = origin_id(7)


def build(palace: Path, local: int = 5, remote_seqs: tuple[int, ...] = (1, 2, 4, 5)) -> str:
    """A store with `local` own ops (the 2nd names two artifacts) and one remote origin
    with a gap; returns its own replica id."""
    clock = FakeClock()
    with Store.open(palace, wall_ms=clock, new_id=CountingIds()) as store:
        arts = [store.put_artifact("patch", f"+ line {i} ✓\n", "coder")["id"] for i in (1, 2)]
        for i in range(1, local + 1):
            clock.advance(1000)
            store.append_event("task.note", "proj", "general", "lead", body=f"op {i}",
                               artifact_ids=arts if i == 2 else None,
                               metadata={"n": i, "f": 0.5})
        if remote_seqs:
            assert store.apply_remote([KIT.op(REMOTE, s) for s in remote_seqs]).applied == len(
                remote_seqs)
        return store.replica_id


def raw(palace: Path, sql: str, params: tuple[Any, ...] = ()) -> int:
    """One statement with a plain sqlite3 connection, as another program would."""
    conn = sqlite3.connect(palace / DB_FILENAME)
    try:
        with conn:
            return conn.execute(sql, params).rowcount
    finally:
        conn.close()


def verify(palace: Path, *args: str) -> Result:
    result = CliRunner().invoke(cli, ["--palace", str(palace), "verify", *args])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception))
    return result


def verify_json(palace: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = verify(palace, "--json", *args)
    return result.exit_code, json.loads(result.stdout)


def by_origin(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["origin"]: o for o in payload["origins"]}


# ── a clean store ─────────────────────────────────────────────────────


def test_a_clean_store_verifies_with_exit_0_and_its_json_shape(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    own = build(palace)
    code, payload = verify_json(palace)
    assert code == 0
    assert set(payload) == {"ok", "origins", "artifacts"} and payload["ok"] is True
    assert [o["origin"] for o in payload["origins"]] == sorted([own, REMOTE])
    origins = by_origin(payload)
    assert origins[own] == {"origin": own, "ops": 5, "top": 5, "chain_entries": 5,
                            "chain_ok": True, "problem": None, "signature": {
                                "state": "signed", "signed_to": 5, "unproven": 0,
                                "checked": 1, "ok": True, "failed_at": None}}
    assert origins[REMOTE] == {"origin": REMOTE, "ops": 4, "top": 5, "chain_entries": 4,
                               "chain_ok": True, "problem": None, "signature": {
                                   "state": "unsigned", "signed_to": 0, "unproven": 4,
                                   "checked": 0, "ok": True, "failed_at": None}}
    assert payload["artifacts"] == {"checked": 2, "ok": True, "bad_count": 0, "bad": []}

    human = verify(palace)
    assert human.exit_code == 0
    assert human.stdout.splitlines() == sorted([
        f"{own}  ops 5  top 5  chain ok  signatures ok (1 checked, signed to 5, 0 unproven)",
        f"{REMOTE}  ops 4  top 5  chain ok  unsigned (4 unproven)",
    ]) + ["artifacts 2 ok"]
    code, one = verify_json(palace, "--origin", REMOTE)
    assert code == 0 and [o["origin"] for o in one["origins"]] == [REMOTE]


def test_an_empty_store_verifies_and_a_missing_one_is_not_created(tmp_path: Path) -> None:
    Store.open(tmp_path / "p").close()
    assert verify_json(tmp_path / "p") == (0, {
        "ok": True, "origins": [],
        "artifacts": {"checked": 0, "ok": True, "bad_count": 0, "bad": []},
    })
    absent = tmp_path / "absent"
    result = verify(absent)
    assert result.exit_code == 1 and result.stderr.startswith(f"Error: no palace at {absent}")
    assert not absent.exists()


def test_the_library_call_matches_the_command(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    build(palace)
    with Store.open(palace) as store:
        report = store.audit()
    assert report.ok and json.loads(json.dumps(report.to_json())) == verify_json(palace)[1]
    with pytest.raises(AttributeError):  # results are frozen values
        report.origins[0].ops = 0  # type: ignore[misc]


# ── planted defects ───────────────────────────────────────────────────


def test_a_body_changed_under_a_complete_chain_is_a_mismatch_at_that_seq(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    own = build(palace)
    with Store.open(palace, read_only=True) as store:
        stored = store.chain_digest(own, 3)
        assert stored is not None
    assert raw(palace, "UPDATE events SET body = 'op 3, edited' WHERE origin_replica = ? "
                       "AND origin_seq = 3", (own,)) == 1
    with Store.open(palace) as store:  # a writable open: the chain is complete, not repaired
        report = store.audit()
    assert not report.ok
    mine = next(o for o in report.origins if o.origin == own)
    assert mine.problem is not None
    assert (mine.problem.kind, mine.problem.seq, mine.problem.stored) == (
        "mismatch", 3, stored.hex())
    assert mine.problem.recomputed != stored.hex()
    assert all(o.ok for o in report.origins if o.origin != own) and report.artifacts.ok

    result = verify(palace)
    assert result.exit_code == 3
    line = next(x for x in result.stdout.splitlines() if x.startswith(own))
    assert f"chain MISMATCH at seq 3 (stored {stored.hex()}, recomputed " in line


def test_a_changed_artifact_content_is_named(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    own = build(palace)
    with Store.open(palace, read_only=True) as store:
        first, second = sorted(a["id"] for a in store.iter_artifacts())
    raw(palace, "UPDATE artifacts SET content = '+ line 1 ✗\n' WHERE id = ?", (first,))
    raw(palace, "UPDATE artifacts SET content = content || ' ' WHERE id = ?", (second,))
    code, payload = verify_json(palace)
    assert code == 3 and payload["ok"] is False
    arts = payload["artifacts"]
    assert (arts["checked"], arts["bad_count"]) == (2, 2)
    bad = {b["id"]: b for b in arts["bad"]}
    assert bad[first]["reason"] == "sha256 differs from the content's"  # same length
    assert bad[first]["stored_size"] == bad[first]["actual_size"]
    assert bad[second]["reason"] == ("sha256 differs from the content's and size_bytes "
                                     "differs from the content's")
    assert bad[second]["actual_size"] == bad[second]["stored_size"] + 1
    # the chain commits to the stored hash, which did not change: it still verifies
    assert by_origin(payload)[own]["chain_ok"] is True
    human = verify(palace)
    assert human.exit_code == 3
    assert "artifacts 2 checked, 2 BAD" in human.stdout
    assert any(x.strip().startswith(first) for x in human.stdout.splitlines())


def test_a_wrong_stored_size_alone_is_named(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    build(palace, local=2, remote_seqs=())
    raw(palace, "UPDATE artifacts SET size_bytes = size_bytes + 1 WHERE rowid = 1")
    code, payload = verify_json(palace)
    assert code == 3 and payload["artifacts"]["bad_count"] == 1
    assert payload["artifacts"]["bad"][0]["reason"] == "size_bytes differs from the content's"


def test_a_changed_stored_hash_breaks_the_artifact_and_the_chain_of_its_op(
    tmp_path: Path,
) -> None:
    palace = tmp_path / "p"
    own = build(palace)
    raw(palace, "UPDATE artifacts SET sha256 = ? WHERE rowid = 1", ("0" * 64,))
    code, payload = verify_json(palace)
    assert code == 3
    assert payload["artifacts"]["bad_count"] == 1
    assert payload["artifacts"]["bad"][0]["stored_sha256"] == "0" * 64
    assert by_origin(payload)[own]["problem"]["seq"] == 2  # the op naming the artifacts
    assert by_origin(payload)[own]["problem"]["kind"] == "mismatch"


def test_a_deleted_chain_row_is_missing_at_that_seq_and_verify_repairs_nothing(
    tmp_path: Path,
) -> None:
    palace = tmp_path / "p"
    build(palace)
    assert raw(palace, "DELETE FROM logsync_chain WHERE origin = ? AND origin_seq = 4",
               (REMOTE,)) == 1
    code, payload = verify_json(palace)
    assert code == 3
    remote = by_origin(payload)[REMOTE]
    assert (remote["ops"], remote["chain_entries"], remote["chain_ok"]) == (4, 3, False)
    assert remote["problem"]["kind"] == "missing" and remote["problem"]["seq"] == 4
    assert remote["problem"]["stored"] is None
    result = verify(palace)
    assert result.exit_code == 3
    assert f"{REMOTE}  ops 4  top 5  entries 3  chain MISSING at seq 4" in result.stdout
    assert raw(palace, "DELETE FROM logsync_chain WHERE origin = ? AND origin_seq = 4",
               (REMOTE,)) == 0  # still missing: read-only, nothing repaired


def test_an_entry_without_an_op_is_extra(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    build(palace)
    ghost = origin_id(9)
    raw(palace, "INSERT INTO logsync_chain (origin, origin_seq, digest) VALUES (?, 3, ?)",
        (REMOTE, b"\x01" * 32))
    raw(palace, "INSERT INTO logsync_chain (origin, origin_seq, digest) VALUES (?, 6, ?)",
        (ghost, b"\x02" * 32))
    code, payload = verify_json(palace)
    assert code == 3
    origins = by_origin(payload)
    assert origins[REMOTE]["problem"] == {"seq": 3, "kind": "extra",
                                          "stored": "01" * 32, "recomputed": None}
    assert (origins[ghost]["ops"], origins[ghost]["top"], origins[ghost]["chain_entries"]) == (
        0, None, 1)
    assert origins[ghost]["problem"]["kind"] == "extra"
    assert "chain EXTRA at seq 3" in verify(palace).stdout


def test_defects_past_a_page_boundary_are_found(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops and chain rows are read a page at a time (BACKFILL_BATCH): with pages of 3,
    a row deleted and a body changed on later pages are still found at their seq."""
    palace = tmp_path / "p"
    own = build(palace, local=10, remote_seqs=tuple(range(1, 12)))
    monkeypatch.setattr(chaining, "BACKFILL_BATCH", 3)
    monkeypatch.setattr(audit, "BACKFILL_BATCH", 3)
    assert verify_json(palace)[0] == 0
    raw(palace, "DELETE FROM logsync_chain WHERE origin = ? AND origin_seq = 7", (REMOTE,))
    raw(palace, "UPDATE events SET room = 'elsewhere' WHERE origin_replica = ? "
                "AND origin_seq = 10", (own,))
    code, payload = verify_json(palace)
    origins = by_origin(payload)
    assert code == 3
    assert (origins[REMOTE]["problem"]["kind"], origins[REMOTE]["problem"]["seq"]) == (
        "missing", 7)
    assert (origins[own]["problem"]["kind"], origins[own]["problem"]["seq"]) == ("mismatch", 10)


def test_bad_artifacts_are_counted_but_only_the_first_are_named(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds()) as store:
        ids = [store.put_artifact("note", f"text {i}", "coder")["id"] for i in range(25)]
    raw(palace, "UPDATE artifacts SET content = content || '!'")
    code, payload = verify_json(palace)
    arts = payload["artifacts"]
    assert code == 3 and (arts["checked"], arts["bad_count"]) == (25, 25)
    assert [b["id"] for b in arts["bad"]] == sorted(ids)[: audit.MAX_BAD_ARTIFACTS]
    assert "artifacts 25 checked, 25 BAD (first 20 named)" in verify(palace).stdout


@pytest.mark.parametrize("value", ["nope", "rep_XYZ", "rep_0123456789AB", "rep_0123456789a",
                                   " rep_0123456789ab", ""])
def test_a_bad_origin_is_one_sentence_and_exit_1(tmp_path: Path, value: str) -> None:
    palace = tmp_path / "p"
    build(palace, local=1, remote_seqs=())
    result = verify(palace, "--origin", value)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0] == (f"Error: --origin {value!r} is not a replica id: it must be rep_ "
                        "followed by 12 or 32 lowercase hex digits")
    as_json = verify(palace, "--origin", value, "--json")
    assert as_json.exit_code == 1 and "is not a replica id" in json.loads(as_json.stdout)["error"]


def test_an_origin_the_store_does_not_hold_is_one_sentence_and_exit_1(tmp_path: Path) -> None:
    """A well-formed id of no origin here (a typo) said 'ops 0 ... chain ok', exit 0."""
    palace = tmp_path / "p"
    build(palace, local=1, remote_seqs=())
    result = verify(palace, "--origin", "rep_" + "0" * 32)
    assert result.exit_code == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: --origin rep_{'0' * 32} has no ops in this store, so "
                           "there is nothing of it to verify (origins here: rep_"), line


def test_the_real_command_exits_3_on_a_defect(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    build(palace, local=2, remote_seqs=())
    raw(palace, "DELETE FROM logsync_chain WHERE origin_seq = 2")
    proc = subprocess.run([sys.executable, "-m", "logsync", "--palace", str(palace), "verify"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "chain MISSING at seq 2" in proc.stdout and "Traceback" not in proc.stderr


# ── signatures ────────────────────────────────────────────────────────

SIGNED_OPS = 2 * CHECKPOINT + 2  # signatures checked at 64, 128 and the tip, 130


def signature_of(payload: dict[str, Any], origin: str) -> dict[str, Any]:
    return by_origin(payload)[origin]["signature"]


def test_a_clean_signed_store_verifies_checkpoints_and_tip_and_so_does_a_relay(
    tmp_path: Path,
) -> None:
    """The author signs every op; a puller stores the page's checkpoint and end
    signatures. Both verify with exactly the checkpoints and the tip checked."""
    a, c = Store.open(tmp_path / "a"), Store.open(tmp_path / "c")
    append(a, SIGNED_OPS)
    pull(c, Relay(a))
    author = a.replica_id
    a.close()
    c.close()
    for palace in (tmp_path / "a", tmp_path / "c"):
        code, payload = verify_json(palace)
        assert code == 0 and payload["ok"] is True
        assert signature_of(payload, author) == {
            "state": "signed", "signed_to": SIGNED_OPS, "unproven": 0, "checked": 3,
            "ok": True, "failed_at": None}
        human = verify(palace)
        assert human.exit_code == 0
        assert f"{author}  ops {SIGNED_OPS}  top {SIGNED_OPS}  chain ok  signatures ok " \
               f"(3 checked, signed to {SIGNED_OPS}, 0 unproven)" in human.stdout.splitlines()


@pytest.mark.parametrize("seq", [CHECKPOINT, SIGNED_OPS])
def test_a_flipped_signature_byte_is_reported_at_its_seq_with_exit_3(
    tmp_path: Path, seq: int,
) -> None:
    palace = tmp_path / "a"
    with Store.open(palace) as store:
        append(store, SIGNED_OPS)
        own, signature = store.replica_id, store.chain_signature(store.replica_id, seq)
    assert signature is not None
    flipped = signature[:10] + bytes([signature[10] ^ 0x01]) + signature[11:]
    assert raw(palace, "UPDATE logsync_chain SET signature = ? WHERE origin = ? AND "
                       "origin_seq = ?", (flipped, own, seq)) == 1
    code, payload = verify_json(palace)
    assert code == 3 and payload["ok"] is False
    mine = by_origin(payload)[own]
    assert mine["chain_ok"] is True  # the digest is intact: only the signature is bad
    assert mine["signature"]["ok"] is False and mine["signature"]["failed_at"] == seq
    assert mine["signature"]["checked"] == [CHECKPOINT, 2 * CHECKPOINT, SIGNED_OPS].index(seq) + 1
    human = verify(palace)
    assert human.exit_code == 3
    assert f"{own}  ops {SIGNED_OPS}  top {SIGNED_OPS}  chain ok  signature BAD at seq {seq} " \
           "(signed origin)" in human.stdout.splitlines()
    assert verify(palace, "--origin", own).exit_code == 3


def test_a_chain_entry_at_an_infinite_seq_does_not_verify_in_one_sentence(
        tmp_path: Path) -> None:
    """-9e999 is kept as REAL -inf, and -inf % 64 = 0 puts it among the signatures
    checked; it once ended `verify` in an OverflowError ("unexpected")."""
    palace = tmp_path / "a"
    with Store.open(palace) as store:
        append(store, SIGNED_OPS)
        own = store.replica_id
    raw(palace, "INSERT INTO logsync_chain VALUES (?, -9e999, zeroblob(32), zeroblob(64))",
        (own,))
    code, payload = verify_json(palace)
    assert code == 3 and payload["ok"] is False
    assert payload["error"] == (f"the store does not verify: origin {own} holds a chain "
                                "entry at seq -inf, not an integer")
    human = verify(palace)
    assert human.exit_code == 3 and "unexpected" not in human.output
    assert human.output.strip().splitlines() == [payload["error"]]


def test_a_signature_that_is_not_a_signature_fails_and_the_first_is_named(
    tmp_path: Path,
) -> None:
    """Another program stored text and a short blob: both fail; the lower is named."""
    palace = tmp_path / "a"
    with Store.open(palace) as store:
        append(store, SIGNED_OPS)
        own = store.replica_id
    raw(palace, "UPDATE logsync_chain SET signature = X'00' WHERE origin_seq = ?",
        (2 * CHECKPOINT,))
    raw(palace, "UPDATE logsync_chain SET signature = 'sig' WHERE origin_seq = ?", (SIGNED_OPS,))
    code, payload = verify_json(palace)
    assert code == 3 and signature_of(payload, own)["failed_at"] == 2 * CHECKPOINT


def test_an_origin_without_a_key_is_unsigned_whichever_way_its_ops_came(tmp_path: Path) -> None:
    """Pulled from a peer that publishes no key and strips the signatures, or applied
    from another store's ops: unsigned, every held op unproven, and that verifies."""
    a, c, d = (Store.open(tmp_path / n) for n in ("a", "c", "d"))
    append(a, 3)

    def strip(request: Any, body: Any) -> Any:
        if request.path == "/sync/version_vector":
            body["logsync"]["keys"] = {}
        if request.path == "/sync/ops" and "chain" in body:
            body["chain"]["sigs"] = []
        return body
    pull(c, Relay(a, strip))
    assert d.apply_remote(a.list_ops(a.replica_id, 0, 10)).applied == 3
    author = a.replica_id
    for store in (a, c, d):
        store.close()
    for palace in (tmp_path / "c", tmp_path / "d"):
        code, payload = verify_json(palace)
        assert code == 0
        assert signature_of(payload, author) == {
            "state": "unsigned", "signed_to": 0, "unproven": 3, "checked": 0, "ok": True,
            "failed_at": None}
        assert f"{author}  ops 3  top 3  chain ok  unsigned (3 unproven)" in verify(
            palace).stdout.splitlines()


def test_ops_taken_through_a_hub_above_the_last_signature_are_unproven(tmp_path: Path) -> None:
    """A signed origin's ops 1-5 come from a logsync peer (signed to 5), 6-8 through a
    hub that cannot carry signatures: 3 unproven, and the store still verifies."""
    a, c = Store.open(tmp_path / "a"), Store.open(tmp_path / "c")
    append(a, 5)
    pull(c, Relay(a))
    append(a, 3, "late")
    pull(c, FakePeer(a))  # upstream-shaped: no extensions, no signatures
    assert c.version_vector()[a.replica_id] == 8
    author = a.replica_id
    a.close()
    c.close()
    code, payload = verify_json(tmp_path / "c")
    assert code == 0
    assert signature_of(payload, author) == {
        "state": "signed", "signed_to": 5, "unproven": 3, "checked": 1, "ok": True,
        "failed_at": None}
    assert "signatures ok (1 checked, signed to 5, 3 unproven)" in verify(tmp_path / "c").stdout


# ── property: one corrupted op is reported at its seq ─────────────────

CORRUPTIONS = (
    "body = body || 'x'", "room = room || 'x'", "metadata_json = '{\"n\": -1}'",
    "hlc = hlc || 'x'", "type = 'task.other'", "topic = 'new'",
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    held=st.lists(st.sets(st.integers(1, 40), min_size=1, max_size=25), min_size=1, max_size=3),
    data=st.data(),
)
def test_one_corrupted_op_is_reported_at_its_seq(held: list[set[int]],
                                                 data: st.DataObject) -> None:
    """Random stores of 1-3 origins (each with gaps); one op of one origin corrupted in
    one field: that origin's first bad seq is exactly the op's, every other origin and
    every artifact still verifies."""
    origins = [origin_id(n + 1) for n in range(len(held))]
    victim = data.draw(st.integers(0, len(held) - 1), label="origin")
    seq = data.draw(st.sampled_from(sorted(held[victim])), label="seq")
    change = data.draw(st.sampled_from(CORRUPTIONS), label="change")
    with tempfile.TemporaryDirectory() as tmp:
        palace = Path(tmp) / "p"
        with Store.open(palace, wall_ms=FakeClock(), new_id=CountingIds()) as store:
            for origin, seqs in zip(origins, held, strict=True):
                store.apply_remote([KIT.op(origin, s) for s in sorted(seqs)])
            assert store.audit().ok
        raw(palace, f"UPDATE events SET {change} WHERE origin_replica = ? AND origin_seq = ?",
            (origins[victim], seq))
        with Store.open(palace, read_only=True) as store:
            report = store.audit()
    assert not report.ok and report.artifacts.ok
    found = {o.origin: o for o in report.origins}
    assert set(found) == set(origins)
    for origin, seqs in zip(origins, held, strict=True):
        result = found[origin]
        assert (result.ops, result.top, result.entries) == (len(seqs), max(seqs), len(seqs))
        if origin == origins[victim]:
            assert result.problem is not None
            assert (result.problem.kind, result.problem.seq) == ("mismatch", seq)
        else:
            assert result.ok
