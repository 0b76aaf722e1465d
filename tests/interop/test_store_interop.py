"""Store interop with a real MemPalace 3.11 (issue 2): one `logstream.sqlite3`,
two programs. What either writes, the other reads back identically — every
field, key order, exact artifact bytes — and an old store without the
provenance/topic columns is migrated by logsync exactly as upstream does it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from logsync.store import Store

from .hub import (
    FILE_CRLF,
    PATCH_NO_NEWLINE,
    PATCH_OK,
    MemPalaceCli,
    assert_no_diffs,
    bulk_specs,
    collection_diffs,
    record_diffs,
    sample_artifacts,
    sample_events,
)

if TYPE_CHECKING:
    from .conftest import Lab

pytestmark = pytest.mark.interop


# ── writers ──────────────────────────────────────────────────────────────


def write_with_mempalace(mp: MemPalaceCli, palace: Path, tag: str) -> list[str]:
    """Artifacts of every kind, events with every field, acks; returns artifact ids."""
    art_ids = [mp.put_artifact(palace, **spec)["id"] for spec in sample_artifacts(tag)]
    events = [mp.append(palace, **spec) for spec in sample_events(tag, art_ids)]
    mp.ack(palace, events[0]["id"], f"coder-{tag}", status="claimed", body="on it — ✓")
    mp.ack(palace, events[3]["id"], f"lead-{tag}", status="applied", topic="override-topic")
    mp.ack(palace, events[4]["id"], "b")
    return art_ids


def write_with_logsync(store: Store, tag: str) -> list[str]:
    """The same variety through the logsync Store API, plus submit_patch."""
    art_ids = [store.put_artifact(**spec)["id"] for spec in sample_artifacts(tag)]
    events = [store.append_event(**spec) for spec in sample_events(tag, art_ids)]
    store.ack_event(events[0]["id"], f"coder-{tag}", status="claimed", body="on it — ✓")
    store.ack_event(events[3]["id"], f"lead-{tag}", status="applied", topic="override-topic")
    store.ack_event(events[4]["id"], "b")
    patch = store.submit_patch(
        PATCH_OK, f"coder-{tag}", f"projekt/bücher-{tag}", to_agent=f"lead-{tag}",
        correlation_id=f"corr-{tag}-2", branch="fix/ß", base_commit="deadbeef",
        body="patch body ✓", metadata={"tests": "pass"}, topic="auth-v2 ✓",
    )  # fmt: skip
    return [*art_ids, patch["artifact"]["id"]]


def old_schema_store(palace: Path) -> None:
    """A logstream from before provenance/topic (pre-3.8), written with raw SQL."""
    palace.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(palace / "logstream.sqlite3")
    conn.executescript(
        """
        PRAGMA journal_mode=WAL;
        CREATE TABLE events (
            id TEXT PRIMARY KEY, type TEXT NOT NULL, stream TEXT NOT NULL, room TEXT NOT NULL,
            from_agent TEXT NOT NULL, to_agent TEXT, correlation_id TEXT, branch TEXT,
            base_commit TEXT, status TEXT, body TEXT NOT NULL DEFAULT '',
            created_at TEXT NOT NULL, metadata_json TEXT NOT NULL DEFAULT '{}');
        CREATE INDEX events_stream_created_idx ON events(stream, created_at);
        CREATE INDEX events_correlation_idx ON events(correlation_id, created_at);
        CREATE INDEX events_to_agent_idx ON events(to_agent, created_at);
        CREATE INDEX events_type_idx ON events(type, created_at);
        CREATE TABLE artifacts (
            id TEXT PRIMARY KEY, kind TEXT NOT NULL, sha256 TEXT NOT NULL,
            size_bytes INTEGER NOT NULL, content TEXT NOT NULL, created_by TEXT NOT NULL,
            created_at TEXT NOT NULL, metadata_json TEXT NOT NULL DEFAULT '{}');
        CREATE INDEX artifacts_sha256_idx ON artifacts(sha256);
        CREATE TABLE event_artifacts (
            event_id TEXT NOT NULL, artifact_id TEXT NOT NULL,
            PRIMARY KEY (event_id, artifact_id));
        """
    )
    content = PATCH_OK
    conn.execute(
        "INSERT INTO artifacts VALUES (?, 'patch', ?, ?, ?, 'coder', '2024-03-01T10:00:00Z', ?)",
        ("art_20240301T100000_aaaaaaaaaaaa", hashlib.sha256(content.encode()).hexdigest(),
         len(content.encode()), content, '{"files": ["notes.txt"]}'),
    )  # fmt: skip
    rows = [
        ("evt_20240301T100001_000000000001", "task.request", "projekt/bücher", "délégation",
         "lead", "coder", "corr-1", "main", "abc123", "open", "Fix it — ü 🚀\r\nline 2",
         "2024-03-01T10:00:01Z", '{"a": {"b": [1, 2]}, "z": "ä"}'),
        ("evt_20240301T100002_000000000002", "patch.ready", "projekt/bücher", "patches",
         "coder", "lead", "corr-1", None, None, "ready", "", "2024-03-01T10:00:02Z", "{}"),
        ("evt_20240301T100002_000000000003", "presence", "projekt/bücher", "general",
         "coder", "*", None, None, None, None, "here", "2024-03-01T10:00:02Z", "{}"),
    ]  # fmt: skip
    conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.execute(
        "INSERT INTO event_artifacts VALUES (?, ?)",
        ("evt_20240301T100002_000000000002", "art_20240301T100000_aaaaaaaaaaaa"),
    )
    conn.commit()
    conn.close()


# ── comparison helpers ───────────────────────────────────────────────────


def assert_same_listing(expected: list[dict], actual: list[dict], what: str) -> None:
    """Same events in the same order, identical field by field (seq included)."""
    assert [e["id"] for e in actual] == [e["id"] for e in expected], f"{what}: order differs"
    diffs = collection_diffs(
        {e["id"]: e for e in expected}, {e["id"]: e for e in actual}, label="event"
    )
    assert_no_diffs(diffs, what)


def assert_same_artifacts(mp: MemPalaceCli, palace: Path, store: Store, ids: list[str]) -> None:
    """`artifact get --json` equals `Store.get_artifact`; `artifact get` bytes equal content."""
    diffs: list[str] = []
    for artifact_id in ids:
        upstream = mp.get_artifact(palace, artifact_id)
        ours = store.get_artifact(artifact_id)
        if ours is None:
            diffs.append(f"artifact {artifact_id}: missing in logsync")
            continue
        diffs += record_diffs(upstream, ours, label=f"artifact[{artifact_id}]")
        if mp.artifact_bytes(palace, artifact_id) != ours["content"].encode("utf-8"):
            diffs.append(f"artifact {artifact_id}: `artifact get` bytes differ from content")
    assert_no_diffs(diffs, "artifacts")


def replica_json_id(palace: Path) -> str:
    return str(json.loads((palace / "replica.json").read_text(encoding="utf-8"))["replica_id"])


FILTER_CASES: list[tuple[dict[str, Any], list[str]]] = [
    ({"to_agent": "coder-x"}, ["--to-agent", "coder-x"]),
    ({"topic": "auth-v2 ✓"}, ["--topic", "auth-v2 ✓"]),
    ({"type": "event.ack"}, ["--type", "event.ack"]),
    ({"correlation_id": "corr-x-1"}, ["--correlation-id", "corr-x-1"]),
    ({"status": "claimed", "order": "desc"}, ["--status", "claimed", "--order", "desc"]),
    ({"stream": "projekt/bücher-x", "limit": 2}, ["--stream", "projekt/bücher-x", "--limit", "2"]),
]


# ── tests ────────────────────────────────────────────────────────────────


def test_store_written_by_mempalace_reads_back_identically_in_logsync(lab: Lab) -> None:
    palace = lab.palace("written-by-mempalace")
    art_ids = write_with_mempalace(lab.mp, palace, "x")
    upstream = lab.mp.list_events(palace)
    assert len(upstream) == 8 and len(art_ids) == 6

    with Store.open(palace) as store:
        assert store.replica_id == replica_json_id(palace)
        assert_same_listing(upstream, store.list_events(limit=500), "Store.list_events")
        assert_same_listing(upstream, list(store.iter_events()), "Store.iter_events")
        assert_same_artifacts(lab.mp, palace, store, art_ids)
        assert store.version_vector() == {store.replica_id: max(e["origin_seq"] for e in upstream)}
        assert store.counts() == {"events": 8, "artifacts": 6, "conflicts": 0, "quarantined": 0}
        assert store.missing_artifacts([*art_ids, "art_20240101T000000_000000000000"]) == [
            "art_20240101T000000_000000000000"
        ]
        for filters, flags in FILTER_CASES:
            want = lab.mp.run_json(palace, "logstream", "list", "--json", *flags)["events"]
            assert_same_listing(want, store.list_events(**filters), f"list_events({filters})")
        anchor = upstream[2]["id"]
        want = lab.mp.run_json(palace, "logstream", "list", "--json", "--since-event-id", anchor)
        assert_same_listing(want["events"], store.list_events(since_event_id=anchor), "since")

    # Opening in logsync left MemPalace's view untouched.
    assert_same_listing(upstream, lab.mp.list_events(palace), "mempalace after logsync opened")


def test_store_written_by_logsync_reads_back_identically_in_mempalace(lab: Lab) -> None:
    palace = lab.palace("written-by-logsync")
    with Store.open(palace) as store:
        art_ids = write_with_logsync(store, "x")
        ours = store.list_events(limit=500)
        assert len(ours) == 9 and len(art_ids) == 7
        assert_same_listing(ours, lab.mp.list_events(palace), "mempalace logstream list")
        assert_same_artifacts(lab.mp, palace, store, art_ids)
        for filters, flags in FILTER_CASES:
            want = store.list_events(**filters)
            got = lab.mp.run_json(palace, "logstream", "list", "--json", *flags)["events"]
            assert_same_listing(want, got, f"mempalace list {' '.join(flags)}")
    crlf = next(a for a in art_ids if lab.mp.get_artifact(palace, a)["kind"] == "file")
    assert lab.mp.artifact_bytes(palace, crlf) == FILE_CRLF.encode("utf-8")


def test_write_results_have_the_upstream_shapes(lab: Lab) -> None:
    """What append/put/ack return has upstream's keys, key order, types and warnings."""
    mp_palace, ls_palace = lab.palace("shape-mp"), lab.palace("shape-ls")
    spec = sample_events("s", [])[0]
    upstream_event = lab.mp.append(mp_palace, **spec)
    upstream_ack = lab.mp.ack(mp_palace, upstream_event["id"], "coder-s", status="claimed")
    with Store.open(ls_palace) as store:
        ours_event = store.append_event(**spec)
        ours_ack = store.ack_event(ours_event["id"], "coder-s", status="claimed")
        pairs = [(upstream_event, ours_event), (upstream_ack, ours_ack)]
        for kind, content in (("patch", PATCH_NO_NEWLINE), ("patch", "a\r\nb\r\n"),
                              ("note", "plain")):  # fmt: skip
            upstream_art = lab.mp.put_artifact(mp_palace, kind, content, "me")
            ours_art = store.put_artifact(kind, content, "me")
            pairs.append((upstream_art, ours_art))
    for upstream, ours in pairs:
        assert list(ours) == list(upstream)
        assert {k: type(v) for k, v in ours.items()} == {k: type(v) for k, v in upstream.items()}
        assert len(ours.get("warnings", [])) == len(upstream.get("warnings", []))
    same = ("type", "stream", "room", "topic", "from_agent", "to_agent", "correlation_id",
            "branch", "base_commit", "status", "artifact_ids", "body")  # fmt: skip
    for upstream, ours in pairs[:2]:
        assert {k: ours[k] for k in same} == {k: upstream[k] for k in same}
    assert ours_event["metadata"] == upstream_event["metadata"]
    assert ours_ack["metadata"] == {"ack_of": ours_event["id"]}
    assert upstream_ack["metadata"] == {"ack_of": upstream_event["id"]}


def test_both_programs_append_to_one_store_alternately(lab: Lab) -> None:
    """Interleaved writers keep unique origin_seq and an ever-growing HLC."""
    palace = lab.palace("shared")
    written = []
    for round_no in range(3):
        with Store.open(palace) as store:
            written.append(store.append_event("turn.logsync", "s", "r", f"ls-{round_no}"))
            art = store.put_artifact("note", f"from logsync {round_no} ✓", "ls")
        written.append(
            lab.mp.append(palace, type="turn.mempalace", stream="s", room="r",
                          from_agent=f"mp-{round_no}", artifact_ids=[art["id"]])
        )  # fmt: skip
    listed = lab.mp.list_events(palace)
    with Store.open(palace) as store:
        assert_same_listing(listed, store.list_events(limit=500), "interleaved store")
        assert store.counts()["events"] == 6
        vector = store.version_vector()
    seqs = [e["origin_seq"] for e in listed]
    assert len(set(seqs)) == len(seqs)
    assert vector == {listed[0]["origin_replica"]: max(seqs)}
    hlcs = [e["hlc"] for e in written]
    assert hlcs == sorted(hlcs) and len(set(hlcs)) == len(hlcs)


def test_old_schema_store_is_migrated_like_upstream(lab: Lab) -> None:
    """Pre-3.8 rows are backfilled as authored here, byte-identical to upstream's migration."""
    ours_dir, theirs_dir = lab.palace("old-ls"), lab.palace("old-mp")
    old_schema_store(ours_dir)
    old_schema_store(theirs_dir)

    with Store.open(ours_dir) as store:
        replica_id = store.replica_id
        migrated = store.list_events(limit=500)
        artifact = store.get_artifact("art_20240301T100000_aaaaaaaaaaaa")
    assert replica_json_id(ours_dir) == replica_id
    assert [(e["origin_replica"], e["origin_seq"]) for e in migrated] == [
        (replica_id, e["seq"]) for e in migrated
    ]
    assert artifact is not None and artifact["origin_replica"] == replica_id
    assert [e["topic"] for e in migrated] == [None, None, None]

    # Upstream migrates its own copy under the same identity: identical result.
    shutil.copy(ours_dir / "replica.json", theirs_dir / "replica.json")
    upstream = lab.mp.list_events(theirs_dir)
    assert_same_listing(upstream, migrated, "logsync migration vs upstream migration")
    upstream_artifact = lab.mp.get_artifact(theirs_dir, artifact["id"])
    assert record_diffs(upstream_artifact, artifact, label="artifact") == []

    # MemPalace opens the store logsync migrated, and both keep writing to it.
    assert_same_listing(migrated, lab.mp.list_events(ours_dir), "mempalace on migrated store")
    lab.mp.append(ours_dir, type="after.migration", stream="s", room="r", from_agent="mp")
    with Store.open(ours_dir) as store:
        store.append_event("after.migration", "s", "r", "ls")
        final = store.list_events(limit=500)
    assert_same_listing(final, lab.mp.list_events(ours_dir), "after both appended")
    assert [e["origin_seq"] for e in final] == [1, 2, 3, 4, 5]


def test_hub_serves_a_store_logsync_wrote(lab: Lab) -> None:
    """A hub on a logsync-written palace serves it over /sync/* exactly as the Store reads it."""
    palace = lab.palace("served")
    with Store.open(palace) as store:
        art_ids = write_with_logsync(store, "h")
        for spec in bulk_specs("h", 600):
            store.append_event(**spec)
        vector = store.version_vector()
        origin = store.replica_id
        pages = [store.list_ops(origin, after) for after in (0, 500)]
        artifacts = {a: store.get_artifact(a) for a in art_ids}
    hub = lab.hub("hub", palace=palace)
    answer = hub.get_json("/sync/version_vector")
    assert (answer["replica_id"], answer["version_vector"]) == (origin, vector)
    diffs: list[str] = []
    for after, page in zip((0, 500), pages, strict=True):
        served = hub.get_json("/sync/ops", {"origin": origin, "after": after, "limit": 500})
        assert served["count"] == len(page) == len(served["events"])
        diffs += collection_diffs(
            {e["id"]: e for e in page}, {e["id"]: e for e in served["events"]}, label="op"
        )
    for artifact_id, ours in artifacts.items():
        served = hub.get_json("/sync/artifact", {"id": artifact_id})["artifact"]
        diffs += record_diffs(ours, served, label=f"artifact[{artifact_id}]")
    assert_no_diffs(diffs, "hub serving a logsync store")
