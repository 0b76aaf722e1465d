"""Every validation rule of RFC 003 §3.1, through the local writes
(`append_event`, `put_artifact`) and through `apply_remote`, which must refuse
whatever a local client could not store. Each error is one sentence naming
the field, the (shortened) value and the rule; the tests check that text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import model, remoteops
from logsync.errors import ValidationError, shorten
from logsync.store import Store

KIB = 1024
TYPE_RULE = "must be 1-64 chars of lowercase letters, digits, '.', '_', '-', starting with"
ID_RULE = "must be 1-128 chars of letters, digits, '_', '.', ':', '-'"
STATUS_RULE = "must be one of: applied, blocked, claimed, failed, open, ready, superseded"
KIND_RULE = "must be one of: file, json, log, note, patch"

BASE_EVENT = {"type": "task.note", "stream": "proj", "room": "general", "from_agent": "lead"}

# (field, bad value, the sentence fragment naming the rule). Each one must be
# refused both locally and from a peer.
EVENT_CASES: list[tuple[str, Any, str]] = [
    ("type", "Task.Note", f"type='Task.Note' is invalid: {TYPE_RULE}"),
    ("type", "-lead", f"type='-lead' is invalid: {TYPE_RULE}"),
    ("type", "a" * 65, TYPE_RULE),
    ("type", "task note", f"type='task note' is invalid: {TYPE_RULE}"),
    ("type", "", f"type='' is invalid: {TYPE_RULE}"),
    ("type", None, f"type=None is invalid: {TYPE_RULE}"),
    ("type", "tâche", TYPE_RULE),
    ("stream", "", "stream='' is invalid: is required and must be a non-empty string"),
    ("stream", None, "stream=None is invalid: is required and must be a non-empty string"),
    ("stream", "   ", "must be a non-empty string"),
    ("stream", 7, "stream=7 is invalid: must be a non-empty string"),
    ("stream", "s" * 257, "stream='sssss"),
    ("stream", "s" * 257, "is invalid: must be at most 256 characters"),
    ("stream", "a\nb", "stream='a\\nb' is invalid: must not contain control characters"),
    ("stream", "a\x7fb", "stream='a\\x7fb' is invalid: must not contain control characters"),
    ("room", "", "room='' is invalid: is required and must be a non-empty string"),
    ("room", "r\tx", "room='r\\tx' is invalid: must not contain control characters"),
    ("room", "r" * 300, "room='rrrr"),
    ("from_agent", "", "from_agent='' is invalid: is required and must be a non-empty string"),
    ("from_agent", "a\x00b", "from_agent='a\\x00b' is invalid: must not contain control"),
    ("from_agent", "x" * 257, "must be at most 256 characters"),
    ("to_agent", "a\x1bb", "to_agent='a\\x1bb' is invalid: must not contain control characters"),
    ("to_agent", "t" * 257, "must be at most 256 characters"),
    ("to_agent", 3, "to_agent=3 is invalid: must be a non-empty string"),
    ("to_agent", "\ud800", "to_agent='\\ud800' is invalid: must be valid Unicode"),
    ("topic", "t\x01", "topic='t\\x01' is invalid: must not contain control characters"),
    ("topic", "t" * 257, "must be at most 256 characters"),
    ("correlation_id", "c\rd", "correlation_id='c\\rd' is invalid: must not contain control"),
    ("branch", "b" * 257, "must be at most 256 characters"),
    ("base_commit", "c\nd", "base_commit='c\\nd' is invalid: must not contain control"),
    ("status", "done", f"status='done' is invalid: {STATUS_RULE}"),
    ("status", "OPEN", f"status='OPEN' is invalid: {STATUS_RULE}"),
    ("status", 1, f"status=1 is invalid: {STATUS_RULE}"),
    ("body", "a\x00b", "body='a\\x00b' is invalid: must not contain NUL bytes"),
    ("body", 5, "body=5 is invalid: must be a string"),
    ("body", "x" * (256 * KIB + 1), "body is 262145 bytes of UTF-8: the maximum is 262144 bytes"),
    ("body", "é" * (128 * KIB + 1), "body is 262146 bytes of UTF-8: the maximum is 262144 bytes"),
    ("body", "\udc80", "body='\\udc80' is invalid: must be valid Unicode"),
    ("metadata", [1, 2], "metadata=[1, 2] is invalid: must be a JSON object"),
    ("metadata", "{}", "metadata='{}' is invalid: must be a JSON object"),
    ("metadata", {"k": "v" * (64 * KIB)},
     "metadata is 65545 bytes as canonical JSON: the maximum is 65536 bytes"),
    ("artifact_ids", ["bad id"], f"artifact_ids[]='bad id' is invalid: {ID_RULE}"),
    ("artifact_ids", [""], f"artifact_ids[]='' is invalid: {ID_RULE}"),
    ("artifact_ids", [f"art_{i}" for i in range(257)],
     "is invalid: may name at most 256"),
]

# Rules only a remote op can break: the provenance fields.
PROVENANCE_CASES: list[tuple[str, Any, str]] = [
    ("id", "bad id", f"id='bad id' is invalid: {ID_RULE}"),
    ("id", "", f"id='' is invalid: {ID_RULE}"),
    ("id", None, f"id=None is invalid: {ID_RULE}"),
    ("id", "e" * 129, ID_RULE),
    ("id", "_leading", f"id='_leading' is invalid: {ID_RULE}"),
    ("created_at", "2026-07-02 03:24:43", "created_at='2026-07-02 03:24:43' is invalid: must look "
     "like 2026-07-02T03:24:43Z"),
    ("created_at", "2026-07-02T03:24:43.123Z", "must look like 2026-07-02T03:24:43Z"),
    ("created_at", "2026-07-02T03:24:43+00:00", "must look like 2026-07-02T03:24:43Z"),
    ("created_at", None, "created_at=None is invalid: must look like 2026-07-02T03:24:43Z"),
    ("created_at", "2026-02-30T00:00:00Z",
     "created_at='2026-02-30T00:00:00Z' is invalid: must be a real UTC date and time"),
    ("created_at", "2026-07-02T25:00:00Z", "must be a real UTC date and time"),
    ("origin_seq", 0, "origin_seq=0 is invalid: must be a positive integer"),
    ("origin_seq", -4, "origin_seq=-4 is invalid: must be a positive integer"),
    ("origin_seq", "3", "origin_seq='3' is invalid: must be a positive integer"),
    ("origin_seq", 1.0, "origin_seq=1.0 is invalid: must be a positive integer"),
    ("origin_seq", True, "origin_seq=True is invalid: must be a positive integer"),
    ("origin_seq", None, "origin_seq=None is invalid: must be a positive integer"),
    ("origin_seq", 2**62 + 1, "is invalid: must be at most 2**62"),
    ("hlc", "yesterday", "hlc='yesterday' is invalid: must be <13-digit unix ms>-<6 hex>-"
     "<replica id>"),
    ("hlc", None, "hlc=None is invalid: must be <13-digit unix ms>-<6 hex>-<replica id>"),
    ("hlc", "1782962684000-000000", "must be <13-digit unix ms>-<6 hex>-<replica id>"),
    ("hlc", "1782962684000-00000g-rep_" + "1" * 32, "must be <13-digit unix ms>"),
]


def _local_kwargs(field: str, value: Any) -> dict[str, Any]:
    kwargs = dict(BASE_EVENT)
    kwargs[field] = value
    return kwargs


def _append(store: Store, kwargs: dict[str, Any]) -> dict[str, Any]:
    fields = dict(kwargs)
    positional = [fields.pop(k) for k in ("type", "stream", "room", "from_agent")]
    return store.append_event(*positional, **fields)


def _quarantine_reason(store: Store) -> str:
    rows = store.list_quarantine()
    assert len(rows) == 1, rows
    return rows[0]["reason"]


# ── local writes ──────────────────────────────────────────────────────


@pytest.mark.parametrize(("field", "value", "fragment"), EVENT_CASES)
def test_append_event_refuses(store: Store, field: str, value: Any, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        _append(store, _local_kwargs(field, value))
    message = str(info.value)
    assert fragment in message
    assert message.startswith(field) or message.startswith(f"{field}[]")
    assert "\n" not in message and len(message) < 400
    assert store.counts()["events"] == 0


def test_append_event_refuses_a_string_as_artifact_ids(store: Store) -> None:
    """A bare string is not a list of ids; it must not be split into characters."""
    store.put_artifact("note", "x", "lead")
    with pytest.raises(ValidationError, match="artifact_ids='art_1' is invalid: must be a list"):
        store.append_event("task.note", "proj", "general", "lead", artifact_ids="art_1")


def test_append_event_refuses_an_artifact_that_is_not_stored(store: Store) -> None:
    with pytest.raises(ValidationError) as info:
        store.append_event("patch.ready", "proj", "general", "lead",
                           artifact_ids=["art_20260702T032443_000000000009"])
    assert str(info.value) == (
        "artifact_ids names 'art_20260702T032443_000000000009', which is not stored here: "
        "put the artifact first"
    )
    assert store.counts()["events"] == 0


def test_metadata_that_is_not_json_serialisable_is_refused(store: Store) -> None:
    with pytest.raises(ValidationError, match=r"^metadata=\{'k': .* is invalid: must be "
                       "JSON-serialisable"):
        store.append_event("task.note", "proj", "general", "lead", metadata={"k": object()})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("type", "a" * 64), ("type", "0.x_y-z"), ("stream", "s" * 256), ("room", "r" * 256),
        ("from_agent", "f" * 256), ("to_agent", "t" * 256), ("stream", "projekt/bücher ✓"),
        ("body", ""), ("body", "x" * (256 * KIB)), ("body", "é" * (128 * KIB)),
        ("metadata", {}), ("status", "superseded"), ("topic", None), ("to_agent", ""),
    ],
)
def test_boundary_values_are_accepted(store: Store, field: str, value: Any) -> None:
    event = _append(store, _local_kwargs(field, value))
    stored = store.get_event(event["id"])
    assert stored is not None
    expected = None if value == "" and field != "body" else value
    assert stored[field] == expected


def test_metadata_of_exactly_64_kib_canonical_json_is_accepted(store: Store) -> None:
    pad = 64 * KIB - len(json.dumps({"k": ""}))
    metadata = {"k": "v" * pad}
    assert len(json.dumps(metadata, sort_keys=True, ensure_ascii=False).encode()) == 64 * KIB
    event = store.append_event("task.note", "proj", "general", "lead", metadata=metadata)
    assert event["metadata"] == metadata
    with pytest.raises(ValidationError, match="metadata is 65537 bytes as canonical JSON"):
        store.append_event("task.note", "proj", "general", "lead", metadata={"k": "v" * (pad + 1)})


def test_metadata_size_counts_utf8_bytes_not_characters(store: Store) -> None:
    pad = (64 * KIB - len(json.dumps({"k": ""}))) // 2 + 1
    size = len(json.dumps({"k": ""})) + 2 * pad
    assert pad * 2 < 64 * KIB < size  # few enough characters, too many bytes
    with pytest.raises(ValidationError, match=f"metadata is {size} bytes as canonical JSON"):
        store.append_event("task.note", "proj", "general", "lead", metadata={"k": "é" * pad})


def test_every_status_in_the_set_is_accepted(store: Store) -> None:
    for value in sorted(model.EVENT_STATUSES):
        assert store.append_event("task.note", "p", "r", "a", status=value)["status"] == value
    assert model.EVENT_STATUSES == {
        "open", "claimed", "ready", "applied", "blocked", "failed", "superseded"
    }


def test_local_routing_labels_are_trimmed_and_body_is_verbatim(store: Store) -> None:
    event = store.append_event(" task.note ", " proj ", " general ", " lead ",
                               to_agent=" coder ", body="  keep\r\n me  ")
    assert (event["type"], event["stream"], event["room"], event["from_agent"],
            event["to_agent"]) == ("task.note", "proj", "general", "lead", "coder")
    assert event["body"] == "  keep\r\n me  "


# ── artifacts, locally ────────────────────────────────────────────────

ARTIFACT_CASES: list[tuple[dict[str, Any], str]] = [
    ({"kind": "diff"}, f"kind='diff' is invalid: {KIND_RULE}"),
    ({"kind": "Patch"}, f"kind='Patch' is invalid: {KIND_RULE}"),
    ({"kind": None}, f"kind=None is invalid: {KIND_RULE}"),
    ({"content": ""}, "content='' is invalid: must be a non-empty string"),
    ({"content": b"diff"}, "content=b'diff' is invalid: must be a non-empty string"),
    ({"content": None}, "content=None is invalid: must be a non-empty string"),
    ({"content": "a\x00b"}, "content='a\\x00b' is invalid: must not contain NUL bytes"),
    ({"content": "x" * (4 * KIB * KIB + 1)},
     "content is 4194305 bytes of UTF-8: the maximum is 4194304 bytes"),
    ({"content": "\ud800"}, "content='\\ud800' is invalid: must be valid Unicode"),
    ({"created_by": ""}, "created_by='' is invalid: is required and must be a non-empty string"),
    ({"created_by": "a\nb"}, "created_by='a\\nb' is invalid: must not contain control"),
    ({"created_by": "c" * 257}, "must be at most 256 characters"),
    ({"metadata": ["x"]}, "metadata=['x'] is invalid: must be a JSON object"),
]


@pytest.mark.parametrize(("override", "fragment"), ARTIFACT_CASES)
def test_put_artifact_refuses(store: Store, override: dict[str, Any], fragment: str) -> None:
    args = {"kind": "patch", "content": "diff --git a/x b/x\n", "created_by": "coder"}
    args.update(override)
    with pytest.raises(ValidationError) as info:
        store.put_artifact(**args)
    assert fragment in str(info.value)
    assert store.counts()["artifacts"] == 0


@pytest.mark.parametrize("kind", sorted(model.ARTIFACT_KINDS))
def test_every_artifact_kind_is_accepted(store: Store, kind: str) -> None:
    record = store.put_artifact(kind, "content\n", "coder")
    assert store.get_artifact(record["id"])["kind"] == kind  # type: ignore[index]


def test_artifact_of_exactly_4_mib_is_accepted_with_its_sha256(store: Store) -> None:
    content = "y" * (4 * KIB * KIB)
    record = store.put_artifact("log", content, "coder")
    assert record["size_bytes"] == 4 * KIB * KIB
    assert record["sha256"] == model.sha256_hex(content)
    assert store.get_artifact(record["id"])["content"] == content  # type: ignore[index]


# ── the same rules from a peer ────────────────────────────────────────


@pytest.mark.parametrize(("field", "value", "fragment"), EVENT_CASES + PROVENANCE_CASES)
def test_apply_remote_quarantines(store: Store, remote: Any, field: str, value: Any,
                                  fragment: str) -> None:
    origin = remote.origin(1)
    op = remote.op(origin, 1)
    op[field] = value
    result = store.apply_remote([op])
    assert (result.applied, result.quarantined) == (0, 1)
    assert store.counts()["events"] == 0
    reason = _quarantine_reason(store)
    assert fragment in reason
    assert reason.startswith(field)
    assert origin in result.stopped


@pytest.mark.parametrize(
    "value", ["rep_XYZ", "rep_0123456789AB", "node-1", "rep_" + "a" * 20, None, 12],
)
def test_apply_remote_quarantines_a_malformed_origin(store: Store, remote: Any,
                                                     value: Any) -> None:
    op = remote.op(remote.origin(1), 1)
    op["origin_replica"] = value
    result = store.apply_remote([op])
    assert (result.applied, result.quarantined) == (0, 1)
    reason = _quarantine_reason(store)
    assert reason.startswith(f"origin_replica={value!r} is invalid")
    assert "must be 'rep_' + 12 or 32 lowercase hex digits" in reason


def test_apply_remote_quarantines_an_hlc_stamped_by_another_replica(store: Store,
                                                                    remote: Any) -> None:
    origin, other = remote.origin(1), remote.origin(2)
    op = remote.op(origin, 1, hlc=f"1782962684000-000000-{other}")
    result = store.apply_remote([op])
    assert result.quarantined == 1
    assert _quarantine_reason(store) == (
        f"hlc={shorten(op['hlc'])} is invalid: must end with its origin replica id {origin}"
    )


def test_apply_remote_quarantines_a_non_object_op(store: Store) -> None:
    result = store.apply_remote(["not an op"])
    assert result.quarantined == 1
    assert _quarantine_reason(store) == "event='not an op' is invalid: must be a JSON object"


def test_apply_remote_accepts_twelve_hex_origins_and_boundary_values(store: Store,
                                                                    remote: Any) -> None:
    origin = "rep_0123456789ab"
    op = remote.op(origin, 2**62, ms=1_782_962_684_000, type="a" * 64, stream="s" * 256,
                   body="é" * (128 * KIB), created_at="2024-02-29T23:59:59Z", status="open")
    result = store.apply_remote([op])
    assert (result.applied, result.quarantined) == (1, 0)
    assert store.version_vector() == {origin: 2**62}


REMOTE_ARTIFACT_CASES: list[tuple[dict[str, Any], str]] = [
    ({"kind": "diff"}, f"kind='diff' is invalid: {KIND_RULE}"),
    ({"content": ""}, "content='' is invalid: must be a non-empty string"),
    ({"content": "a\x00b", "sha256": model.sha256_hex("a\x00b")},
     "content='a\\x00b' is invalid: must not contain NUL bytes"),
    ({"sha256": "XYZ"}, "sha256='XYZ' is invalid: must be 64 lowercase hex digits"),
    ({"sha256": None}, "sha256=None is invalid: must be 64 lowercase hex digits"),
    ({"sha256": "A" * 64}, "is invalid: must be 64 lowercase hex digits"),
    ({"sha256": "0" * 64}, "failed hash verification: claimed sha256 0000000000000000..., "
     "content hashes to "),
    ({"id": "bad id"}, f"id='bad id' is invalid: {ID_RULE}"),
    ({"created_by": ""}, "created_by='' is invalid: is required and must be a non-empty string"),
    ({"created_at": "yesterday"}, "created_at='yesterday' is invalid: must look like"),
    ({"metadata": "x"}, "metadata='x' is invalid: must be a JSON object"),
    ({"origin_replica": "rep_nope"}, "origin_replica='rep_nope' is invalid"),
]


@pytest.mark.parametrize(("override", "fragment"), REMOTE_ARTIFACT_CASES)
def test_apply_remote_refuses_bad_artifacts(store: Store, remote: Any, override: dict[str, Any],
                                            fragment: str) -> None:
    art = remote.artifact("diff --git a/x b/x\n")
    art.update(override)
    result = store.apply_remote([], [art])
    assert (result.artifacts_applied, result.quarantined) == (0, 1)
    assert store.counts()["artifacts"] == 0
    row = store.list_quarantine()[0]
    assert row["kind"] == "artifact"
    assert fragment in row["reason"]
    assert row["payload"] == json.loads(json.dumps(art))


def test_apply_remote_artifact_hash_is_of_the_utf8_bytes(store: Store, remote: Any) -> None:
    content = "ünïcödé ✓\r\n"
    art = remote.artifact(content, kind="file")
    assert art["sha256"] == model.sha256_hex(content)
    result = store.apply_remote([], [art])
    assert result.artifacts_applied == 1
    stored = store.get_artifact(art["id"])
    assert stored is not None
    assert stored["content"] == content
    assert stored["size_bytes"] == len(content.encode("utf-8"))


# ── the fast path and the careful path agree ──────────────────────────

_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.just(2**62 + 1), st.floats(0, 2),
    st.sampled_from(["", " ", "x", "a\nb", "\x7f", "\ud800", "OPEN", "open", "Task", "t.x",
                     "rep_0123456789ab", "rep_" + "1" * 32, "2026-02-30T00:00:00Z",
                     "2026-07-02T03:24:43Z", "bad id", "s" * 257, "a\x00"]),
    st.lists(st.sampled_from(["art_1", "art_2", "bad id", ""]), max_size=3),
    st.dictionaries(st.sampled_from(["k", "é"]), st.integers(), max_size=2),
    st.text(max_size=5),
)
_fields = st.sampled_from(
    ["id", "type", "stream", "room", "topic", "from_agent", "to_agent", "correlation_id",
     "branch", "base_commit", "status", "artifact_ids", "body", "created_at", "metadata",
     "origin_replica", "origin_seq", "hlc"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.dictionaries(_fields, _values, max_size=3))
def test_fast_remote_validation_agrees_with_the_field_by_field_rules(
    remote: Any, changes: dict[str, Any]
) -> None:
    """The one-pass fast path must accept exactly what the careful path accepts.

    Private functions on purpose: a page of tens of thousands of ops goes
    through the fast path, and a disagreement would let a peer store what a
    local client could not (or quarantine a valid op).
    """
    op = remote.op(remote.origin(1), 3)
    op.update(changes)
    try:
        careful: dict[str, Any] | None = model.checked_remote_row(op)
    except ValidationError:
        careful = None
    fast = remoteops._fast_remote_row(op)
    if fast is not None:
        assert careful is not None, f"fast path accepted what the rules refuse: {changes}"
        assert fast == careful
    if careful is None:
        with pytest.raises(ValidationError):
            remoteops.validate_remote_event(op)
        with pytest.raises(ValidationError):
            remoteops.remote_values(op)
    else:
        assert remoteops.validate_remote_event(op) == careful
        # what the fast page path inserts: the same row, in the INSERT's column order
        assert remoteops.remote_values(op) == (
            tuple(careful[name] for name in model.ROW_COLUMNS), careful["artifact_ids"])
        assert set(model.ROW_COLUMNS) == set(careful) - {"artifact_ids"}


# Values equal as keys of a dict but written apart (1 / True / 1.0, 0.0 / -0.0), texts
# long and short, and what no flat shape holds: the cache must never answer for another.
_meta_values = st.one_of(
    st.sampled_from([0, 1, True, False, 1.0, 0.0, -0.0, None, "", "1", "true", "\ud800",
                     "é", "x" * 600, 2**64, -(2**63), float("nan"), float("inf")]),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 2), max_size=2),
)
_metadata = st.dictionaries(st.sampled_from(["a", "b", "attempt", "é", "ключ", "k" * 20]),
                            _meta_values, min_size=1, max_size=10)


@settings(max_examples=400, deadline=None)
@given(metas=st.lists(_metadata, min_size=1, max_size=12))
def test_cached_flat_metadata_is_what_the_encoder_writes(metas: list[dict[str, Any]]) -> None:
    """Each answer of the fast path's metadata cache is what the shape check and the
    encoder give for that very dict (asked twice: once to fill, once from the cache)."""
    remoteops._flat_cache.clear()
    for meta in metas * 2:
        assert remoteops._fast_metadata(meta) == remoteops._metadata_or_none(meta), meta


def test_metadata_equal_as_keys_but_written_apart_is_never_confused() -> None:
    values = [1, True, 1.0, 0, False, 0.0, -0.0, None, "1", 2**64, 2**64 + 0.0]
    remoteops._flat_cache.clear()
    for value in values * 2:
        meta = {"a": value, "b": 1}
        assert remoteops._fast_metadata(meta) == remoteops._metadata_or_none(meta), meta


def test_a_key_equal_to_a_text_but_not_a_str_is_never_answered_from_the_cache() -> None:
    class Text(str):
        pass

    remoteops._flat_cache.clear()
    for meta in ({"a": 1}, {Text("a"): 1}, {"a": 1}):
        assert remoteops._fast_metadata(meta) == remoteops._metadata_or_none(meta), meta


def test_the_metadata_cache_stays_bounded() -> None:
    remoteops._flat_cache.clear()
    for n in range(remoteops._FLAT_CACHE_ENTRIES * 3):
        assert remoteops._fast_metadata({"attempt": n}) == f'{{"attempt": {n}}}'
        assert len(remoteops._flat_cache) <= remoteops._FLAT_CACHE_ENTRIES
    assert remoteops._fast_metadata({"x": "y" * 600}) == f'{{"x": "{"y" * 600}"}}'
    assert not any(key[0] == (("x", "y" * 600),) for key in remoteops._flat_cache)  # too long


_KNOWN_SETS = (remoteops._known_labels, remoteops._known_types, remoteops._known_origins,
               remoteops._known_seconds)
_label_texts = st.one_of(
    st.sampled_from(["proj", " ", "\t", "a\x00b", "\ud800", "é", "x" * 256, "x" * 257,
                     "\u3000", "ok\n"]),
    st.text(max_size=6))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.lists(st.tuples(
    st.sampled_from(["stream", "room", "from_agent", "to_agent", "topic", "type",
                     "origin_replica", "created_at"]),
    st.one_of(_label_texts, st.sampled_from(
        ["task.note", "Task", "rep_0123456789ab", "rep_0123456789AB", "2026-02-29T00:00:00Z",
         "2028-02-29T00:00:00Z", "2026-07-02T03:24:43Z"])),
), min_size=1, max_size=6))
def test_texts_known_good_are_judged_as_the_rules_judge_them(
    remote: Any, fields: list[tuple[str, str]]
) -> None:
    """The fast path's sets of texts that passed a rule answer, on a second asking, what
    the rule answered on the first: each op is validated twice, the sets filled between."""
    for known in _KNOWN_SETS:
        known.clear()
    for name, value in fields:
        op = remote.op(remote.origin(1), 3)
        op[name] = value
        if name == "origin_replica":
            op["hlc"] = op["hlc"][:21] + value
        try:
            careful: dict[str, Any] | None = model.checked_remote_row(op)
        except ValidationError:
            careful = None
        for _ in range(2):
            fast = remoteops._fast_remote_row(op)
            assert fast is None or fast == careful, (name, value)
            if careful is None:
                with pytest.raises(ValidationError):
                    remoteops.validate_remote_event(op)


def test_the_known_good_texts_stay_bounded(remote: Any) -> None:
    for known in _KNOWN_SETS:
        known.clear()
    origin = remote.origin(1)
    for n in range(remoteops._KNOWN_ENTRIES * 2 + 7):
        op = remote.op(origin, 3, stream=f"s{n}", room=f"r{n}", type=f"t{n}")
        assert remoteops._fast_remote_row(op) is not None
        assert all(len(known) <= remoteops._KNOWN_ENTRIES for known in _KNOWN_SETS)
    assert "s0" not in remoteops._known_labels and f"s{remoteops._KNOWN_ENTRIES * 2 + 6}" in \
        remoteops._known_labels


@settings(max_examples=300, deadline=None)
@given(now_ms=st.integers(-(10**13), 253402300799999))
def test_utc_now_iso_is_the_second_of_the_instant(now_ms: int) -> None:
    """Cached by second; the text is the floor of the instant, before 1970 too."""
    from datetime import UTC, datetime, timedelta

    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=now_ms)
    assert model.utc_now_iso(now_ms) == moment.strftime("%Y-%m-%dT%H:%M:%SZ")
