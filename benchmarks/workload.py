"""A reproducible RFC 003-sized workload: events with bodies of a few KB and
patch artifacts of a few to tens of KB, authored by one origin."""

from __future__ import annotations

import random
from pathlib import Path

from logsync.store import Store

STREAMS = ("project/mempalace", "project/logsync", "shared_agent_brain")
ROOMS = ("delegation", "patches", "reviews", "status")
AGENTS = ("pi@laptop", "codex@build-box", "opencode@desk", "pi@windows")


def fake_patch(rng: random.Random, lines: int) -> str:
    body = "".join(f"+    value_{rng.randrange(10**6)} = compute({i})\n" for i in range(lines))
    return f"diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,{lines} +1,{lines} @@\n{body}"


def build_origin(palace: Path, events: int, patches: int, seed: int = 7) -> Store:
    """Author `events` events, `patches` of them patch.ready with an artifact."""
    rng = random.Random(seed)
    counter = iter(range(10**9))
    store = Store.open(
        palace, wall_ms=lambda: 1_790_000_000_000 + next(counter),
        new_id=lambda prefix: f"{prefix}_20260901T000000_{rng.getrandbits(48):012x}",
    )
    patch_every = max(1, events // max(patches, 1))
    with store._atomic(durable=False) as conn:  # bulk authoring for the fixture only
        for i in range(events):
            fields = _event_fields(rng, i)
            if patches and i % patch_every == 0 and i // patch_every < patches:
                fields["artifact_ids"] = [_put_patch(store, conn, rng)]
            store._insert_local_event(conn, fields)
    return store


def _event_fields(rng: random.Random, i: int) -> dict:
    return {
        "type": rng.choice(("task.request", "task.reply", "event.ack", "patch.ready")),
        "stream": rng.choice(STREAMS), "room": rng.choice(ROOMS), "topic": None,
        "from_agent": rng.choice(AGENTS), "to_agent": rng.choice(AGENTS),
        "correlation_id": f"task_{i // 4}", "branch": None, "base_commit": None,
        "status": rng.choice(("open", "ready", "applied", None)),
        "body": "Please look at the flaky test in search ranking. " * rng.randint(2, 60),
        "metadata_json": '{"attempt": 1}', "artifact_ids": [],
    }


def _put_patch(store: Store, conn, rng: random.Random) -> str:  # type: ignore[no-untyped-def]
    from logsync import model

    content = fake_patch(rng, rng.randint(20, 400))
    art_id = store._new_id("art")
    conn.execute(
        "INSERT INTO artifacts (id, kind, sha256, size_bytes, content, created_by, created_at, "
        "metadata_json, origin_replica) VALUES (?, 'patch', ?, ?, ?, 'pi@laptop', "
        "'2026-09-01T00:00:00Z', '{}', ?)",
        (art_id, model.sha256_hex(content), len(content.encode()), content, store.replica_id),
    )
    return art_id
