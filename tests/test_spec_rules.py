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


# ── §7 the common rules' order and methods, §7.2 and §8 edge values ──


def _app_get(store: Store, method: str, path: str, headers: dict[str, str] | None = None,
             **app: Any) -> Any:
    import anyio
    import httpx

    from logsync.server import create_app

    async def go() -> Any:
        transport = httpx.ASGITransport(app=create_app(store, **app))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.request(method, path, headers=headers or {})
    return anyio.run(go)


def test_common_rules_answer_in_their_order(store: Store) -> None:
    """RFC 004 §7: 403 (Host) before 401 (token) before 413 (body) before 503 (store)
    before 404/405; `/healthz` never asks for the token and answers other methods 405."""
    auth = {"Authorization": "Bearer t"}
    assert _app_get(store, "GET", "/nope", {"Host": "evil.example"}, token="t").status_code == 403
    assert _app_get(store, "GET", "/nope", token="t").status_code == 401
    big = {**auth, "Content-Length": str(70 * 1024)}
    assert _app_get(store, "POST", "/nope", big, token="t").status_code == 413
    sick = _app_get(store, "GET", "/sync/nope", auth, token="t", health=lambda: "disk gone")
    assert sick.status_code == 503
    assert _app_get(store, "GET", "/nope", auth, token="t").status_code == 404
    assert _app_get(store, "POST", "/sync/ops", auth, token="t").status_code == 405
    assert _app_get(store, "POST", "/healthz", token="t").status_code == 405


def test_every_get_route_answers_head_without_a_body(store: Store) -> None:
    """RFC 004 §7 rule 5: HEAD is GET without the body."""
    store.append_event("task.note", "proj", "general", "lead")
    for path in ("/sync/version_vector", f"/sync/ops?origin={store.replica_id}", "/healthz"):
        got, head = _app_get(store, "GET", path), _app_get(store, "HEAD", path)
        assert head.status_code == got.status_code == 200, path
        assert head.content == b"" and head.headers["content-length"] == str(len(got.content))


def test_after_beyond_2_62_is_an_empty_page_and_a_repeated_parameter_takes_the_last(
        store: Store) -> None:
    """RFC 004 §7.2: an `after` up to 2**63 - 1 above the tip is an empty page; a repeated
    parameter other than `ext` takes its last value."""
    store.append_event("task.note", "proj", "general", "lead")
    page = _app_get(store, "GET", f"/sync/ops?origin={store.replica_id}&after={2**63 - 1}")
    assert page.status_code == 200 and page.json()["events"] == []
    twice = _app_get(store, "GET", f"/sync/ops?origin=rep_nope&origin={store.replica_id}")
    assert twice.status_code == 200 and twice.json()["count"] == 1


def test_prev_is_the_chain_at_after_on_an_empty_page_and_null_above_the_top(
        store: Store) -> None:
    """RFC 004 §8 item 6: `chain.prev` is D(after) whenever `after` is at most the top,
    an empty page too (d_0 for an origin not held); null above the top."""
    from logsync.chain import chain_start
    from logsync.responder import LOGSYNC_SERVER, answer
    store.append_event("task.note", "proj", "general", "lead")
    ask = {"ext": "large_pages,chain"}
    at_top = answer(store, "/sync/ops", {"origin": store.replica_id, "after": "1", **ask},
                    profile=LOGSYNC_SERVER)[1]
    assert at_top["events"] == [] and at_top["chain"]["prev"] == \
        store.chain_digests_at(store.replica_id, [1])[0].hex()
    above = answer(store, "/sync/ops", {"origin": store.replica_id, "after": "2", **ask},
                   profile=LOGSYNC_SERVER)[1]
    assert above["chain"]["prev"] is None
    other = "rep_" + "ab" * 16
    unheld = answer(store, "/sync/ops", {"origin": other, "after": "0", **ask},
                    profile=LOGSYNC_SERVER)[1]
    assert unheld["chain"]["prev"] == chain_start(other).hex()
