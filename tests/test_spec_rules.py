"""RFC 004 rules a second implementation must get byte-exact, each test naming its
section: what the length and size limits count (§4.1, §4.2), the stored form an op is
normalised to (§4.2), and the order in which apply checks answer (§10.2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import RemoteKit

from logsync.chain import canonical_op
from logsync.errors import ValidationError
from logsync.store import Store

KIB = 1024
ASTRAL = "\U0001d11e"  # one code point, 4 UTF-8 bytes, 2 UTF-16 units


def kinds(store: Store) -> list[str]:
    return sorted(row["kind"] for row in store.list_conflicts())


# ── §4.1 characters are code points ──────────────────────────────────


@pytest.mark.parametrize("label", [ASTRAL * 256, "e\u0301" * 128, "é" * 256])
def test_a_routing_label_of_256_code_points_is_valid_whatever_its_bytes(
        store: Store, remote: RemoteKit, label: str) -> None:
    """RFC 004 §4.1: "characters" are code points: 256 of them are allowed, though
    `ASTRAL * 256` is 1024 UTF-8 bytes and 512 UTF-16 units."""
    assert len(label) == 256
    local = store.append_event("task.note", label, "general", "lead")
    assert local["stream"] == label
    op = remote.op(remote.origin(1), 1, room=label, from_agent=label)
    assert store.apply_remote([op]).applied == 1


@pytest.mark.parametrize("label", [ASTRAL * 257, "e\u0301" * 128 + "e", "a" * 257])
def test_a_routing_label_of_257_code_points_is_refused_on_both_paths(
        store: Store, remote: RemoteKit, label: str) -> None:
    """RFC 004 §4.1: 257 code points are refused by a local append and by apply."""
    with pytest.raises(ValidationError, match="256"):
        store.append_event("task.note", label, "general", "lead")
    result = store.apply_remote([remote.op(remote.origin(1), 1, stream=label)])
    assert (result.applied, result.quarantined) == (0, 1)


# ── §4.2 the stored metadata text is what the limit measures ─────────


def _spaced_size(metadata: dict[str, Any]) -> int:
    return len(json.dumps(metadata, ensure_ascii=False, sort_keys=True).encode())


def test_the_metadata_limit_counts_the_stored_text_with_its_spaces(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §4.2: 65 536 bytes of the stored metadata text (separators ", " and
    ": "), not of a compact encoding: many small keys fit compactly but not spaced."""
    metadata = {f"k{i:05d}": 0 for i in range(5500)}
    compact = len(json.dumps(metadata, separators=(",", ":"), sort_keys=True).encode())
    assert compact <= 64 * KIB < _spaced_size(metadata)
    with pytest.raises(ValidationError, match="metadata is"):
        store.append_event("task.note", "proj", "general", "lead", metadata=metadata)
    result = store.apply_remote([remote.op(remote.origin(1), 1, metadata=metadata)])
    assert (result.applied, result.quarantined) == (0, 1)


def test_the_metadata_limit_counts_non_ascii_as_utf8_not_as_escapes(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §4.2: non-ASCII is stored as itself, so "é" costs 2 bytes, not the 6 of
    `\\u00e9`: text that would be over the limit escaped is accepted."""
    metadata = {"k": "é" * 30_000}
    escaped = len(json.dumps(metadata, sort_keys=True).encode())
    assert _spaced_size(metadata) <= 64 * KIB < escaped
    assert store.append_event("task.note", "proj", "general", "lead",
                              metadata=metadata)["metadata"] == metadata
    assert store.apply_remote([remote.op(remote.origin(1), 1, metadata=metadata)]).applied == 1


# ── §4.2 the stored form ─────────────────────────────────────────────


def test_an_op_is_stored_served_and_hashed_in_its_normalised_form(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §4.2: `status` "" -> null, an optional label "" -> null, `body` null ->
    "", `metadata` null -> {}; the op is served so, and its canonical bytes are those of
    the normalised op (two peers that author either form hold one chain)."""
    origin = remote.origin(1)
    authored = remote.op(origin, 1, status="", topic="", body=None, metadata=None)
    assert store.apply_remote([authored]).applied == 1
    (served,) = store.list_ops(origin, 0, 10)
    assert (served["status"], served["topic"], served["body"], served["metadata"]) == (
        None, None, "", {})
    normal = remote.op(origin, 1, status=None, topic=None, body="", metadata={})
    assert canonical_op(served, []) == canonical_op(normal, []) == canonical_op(authored, [])
    again = store.apply_remote([normal])  # the normalised op is the same op
    assert (again.applied, again.duplicates, again.conflicts) == (0, 1, 0)


# ── §10.2 the first check that answers decides ──────────────────────


def test_an_invalid_op_is_quarantined_before_its_key_is_compared(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §10.2 8b before 8d: an op that breaks §4.1 and reuses a held key is
    quarantined, not recorded as a fork."""
    origin = remote.origin(1)
    store.apply_remote([remote.op(origin, 1)])
    result = store.apply_remote([remote.op(origin, 1, body="other", type="BAD TYPE")])
    assert (result.quarantined, result.conflicts) == (1, 0)
    assert kinds(store) == []


def test_a_fork_is_named_before_an_id_collision(store: Store, remote: RemoteKit) -> None:
    """RFC 004 §10.2 8d before 8f: a held key with other content whose id is also held
    under another key is a fork."""
    one, two = remote.origin(1), remote.origin(2)
    store.apply_remote([remote.op(one, 1), remote.op(two, 1)])
    clash = remote.op(two, 1, id=remote.op(one, 1)["id"], body="rewritten")
    result = store.apply_remote([clash])
    assert (result.applied, result.conflicts) == (0, 1)
    assert kinds(store) == ["fork"]


def test_an_id_collision_is_named_before_a_history_rewrite(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §10.2 8f before 8g: an op below the high-water mark, never held, whose id
    is held under another key is an id collision."""
    one, two = remote.origin(1), remote.origin(2)
    store.apply_remote([remote.op(one, 1), remote.op(two, 1), remote.op(two, 3)])
    late = remote.op(two, 2, id=remote.op(one, 1)["id"])
    result = store.apply_remote([late])
    assert (result.applied, result.conflicts) == (0, 1)
    assert kinds(store) == ["id_collision"]


def test_a_history_rewrite_is_named_before_a_missing_artifact(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §10.2 8g before 8h: an op below the high-water mark naming an artifact
    nobody sent is a history rewrite, not held in quarantine."""
    origin = remote.origin(1)
    store.apply_remote([remote.op(origin, 1), remote.op(origin, 3)])
    late = remote.op(origin, 2, artifact_ids=["art_nowhere"])
    result = store.apply_remote([late])
    assert (result.conflicts, result.quarantined) == (1, 0)
    assert kinds(store) == ["history_rewrite"]


def test_an_id_collision_is_named_before_a_missing_artifact(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §10.2 8f before 8h."""
    one, two = remote.origin(1), remote.origin(2)
    store.apply_remote([remote.op(one, 1)])
    clash = remote.op(two, 1, id=remote.op(one, 1)["id"], artifact_ids=["art_nowhere"])
    result = store.apply_remote([clash])
    assert (result.conflicts, result.quarantined) == (1, 0)
    assert kinds(store) == ["id_collision"]


def test_a_duplicate_is_skipped_before_its_missing_artifact_is_asked_for(
        store: Store, remote: RemoteKit) -> None:
    """RFC 004 §10.2 8c before 8h: an op held with the same content is a duplicate even
    when the page does not bring the artifact it names (it was stored with the op)."""
    origin = remote.origin(1)
    art = remote.artifact("diff\n", art_id="art_once")
    op = remote.op(origin, 1, artifact_ids=["art_once"])
    store.apply_remote([op], [art])
    result = store.apply_remote([op])
    assert (result.duplicates, result.quarantined, result.conflicts) == (1, 0, 0)


# ── §7.2 integers on the wire ────────────────────────────────────────


@pytest.mark.parametrize("raw", ["+5", " 5", "5 ", "1_0", "\uff11\uff10", "0x10", "1e3", "٣",
                                 "-0", "--1"])
def test_after_and_limit_are_ascii_decimal_digits_only(store: Store, raw: str) -> None:
    """RFC 004 §7.2: `after` and `limit` are ASCII decimal digits (a leading `-` is read
    only to say the value must not be negative); what Python's `int` also takes is 400."""
    from logsync.responder import LOGSYNC_SERVER, answer
    for name in ("after", "limit"):
        status, body = answer(store, "/sync/ops", {"origin": store.replica_id, name: raw},
                              profile=LOGSYNC_SERVER)
        assert status == 400 and body["reason"].endswith("is not an integer"), (name, body)
    assert answer(store, "/sync/ops", {"origin": store.replica_id, "after": "05"},
                  profile=LOGSYNC_SERVER)[0] == 200
    status, body = answer(store, "/sync/ops", {"origin": store.replica_id, "after": "-1"},
                          profile=LOGSYNC_SERVER)
    assert status == 400 and "must be a non-negative integer" in body["reason"]
