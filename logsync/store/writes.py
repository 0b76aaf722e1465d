"""Local writes of a `Store` (a mixin): appends, artifacts, acks, patch handoffs.

Locally authored events get a gap-free `origin_seq` (above every slot of ours a peer
holds, see `apply.next_own_seq`) and an HLC later than everything stored, committed
with `synchronous=FULL`: they are the only copy that exists. Each one's chain digest is
signed with the palace's key (`logsync/keys.py`) in the same transaction, when the store
has one, so peers can later check that we wrote it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from logsync import model
from logsync.errors import (
    StoreError,
    ValidationError,
)
from logsync.keys import sign_digest
from logsync.store.apply import next_own_seq
from logsync.store.chaining import Signer, extend_chains
from logsync.store.schema import INSERT_ARTIFACT, INSERT_EVENT


def _event_fields(
    type: str,
    stream: str,
    room: str,
    from_agent: str,
    *,
    to_agent: str | None = None,
    correlation_id: str | None = None,
    branch: str | None = None,
    base_commit: str | None = None,
    status: str | None = None,
    body: str | None = "",
    metadata: Mapping[str, Any] | None = None,
    artifact_ids: Sequence[str] | None = None,
    topic: str | None = None,
) -> dict[str, Any]:
    """The caller's fields of a local event, routing labels trimmed, checked and normalised
    (`model.validate_local_event`); a bad one raises one `ValidationError` sentence."""
    return model.validate_local_event(
        model.strip_routing(
            {
                "type": type,
                "stream": stream,
                "room": room,
                "from_agent": from_agent,
                "to_agent": to_agent,
                "correlation_id": correlation_id,
                "branch": branch,
                "base_commit": base_commit,
                "status": status,
                "body": body,
                "metadata": metadata,
                "artifact_ids": artifact_ids,
                "topic": topic,
            }
        )
    )


class LocalWrites:
    """Methods `Store` inherits; they use its `_atomic`, `_read`, clock and ids."""

    def append_event(
        self,
        type: str,
        stream: str,
        room: str,
        from_agent: str,
        *,
        to_agent: str | None = None,
        correlation_id: str | None = None,
        branch: str | None = None,
        base_commit: str | None = None,
        status: str | None = None,
        body: str | None = "",
        metadata: Mapping[str, Any] | None = None,
        artifact_ids: Sequence[str] | None = None,
        topic: str | None = None,
    ) -> dict[str, Any]:
        """Append one immutable event authored by this replica."""
        fields = _event_fields(
            type,
            stream,
            room,
            from_agent,
            to_agent=to_agent,
            correlation_id=correlation_id,
            branch=branch,
            base_commit=base_commit,
            status=status,
            body=body,
            metadata=metadata,
            artifact_ids=artifact_ids,
            topic=topic,
        )
        with self._atomic(durable=True) as conn:
            for artifact_id in fields["artifact_ids"]:
                if not conn.execute(
                    "SELECT 1 FROM artifacts WHERE id = ?", (artifact_id,)
                ).fetchone():
                    raise ValidationError(
                        f"artifact_ids names {artifact_id!r}, which is not stored here: "
                        "put the artifact first"
                    )
            event_id = self._insert_local_event(conn, fields)
        return self._event_by_id(event_id)

    def _insert_local_event(self, conn: sqlite3.Connection, fields: dict[str, Any]) -> str:
        seq = next_own_seq(conn, self.replica_id, self._catch_up_clock(conn))
        event_id = self._new_id("evt")
        row = (
            event_id,
            fields["type"],
            fields["stream"],
            fields["room"],
            fields["topic"],
            fields["from_agent"],
            fields["to_agent"],
            fields["correlation_id"],
            fields["branch"],
            fields["base_commit"],
            fields["status"],
            fields["body"],
            model.utc_now_iso(self._wall_ms()),
            fields["metadata_json"],
            self.replica_id,
            seq,
            self.clock.tick(),
        )
        try:
            conn.execute(INSERT_EVENT, row)
        except sqlite3.IntegrityError:
            raise StoreError(
                f"event id {event_id!r} already exists; the id factory repeated"
            ) from None
        links = [(event_id, a) for a in fields["artifact_ids"]]
        conn.executemany("INSERT INTO event_artifacts (event_id, artifact_id) VALUES (?, ?)", links)
        # The op's chain entry and its signature, in the same transaction.
        extend_chains(conn, [row], links, sign=self._signer())
        return event_id

    def _signer(self) -> Signer | None:
        """How our own ops are signed: with the store's key, None when it has none."""
        key = self.signing_key
        return None if key is None else (self.replica_id, partial(sign_digest, key))

    def put_artifact(
        self,
        kind: str,
        content: str,
        created_by: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Store exact content; the record returned omits the content itself."""
        kind = model.artifact_kind(kind)
        content = model.artifact_content(content)
        created_by_clean = model.routing(
            "created_by",
            created_by.strip() if isinstance(created_by, str) else created_by,
            required=True,
        )
        meta = model.metadata_json(metadata)
        raw_len = len(content.encode("utf-8"))
        record = {
            "id": self._new_id("art"),
            "kind": kind,
            "sha256": model.sha256_hex(content),
            "size_bytes": raw_len,
            "created_by": created_by_clean,
            "created_at": model.utc_now_iso(self._wall_ms()),
            "origin_replica": self.replica_id,
        }
        with self._atomic(durable=True) as conn:
            conn.execute(
                INSERT_ARTIFACT,
                (
                    record["id"],
                    kind,
                    record["sha256"],
                    raw_len,
                    content,
                    created_by_clean,
                    record["created_at"],
                    meta,
                    self.replica_id,
                ),
            )
        warnings = model.patch_warnings(kind, content)
        if warnings:
            record["warnings"] = warnings
        return record

    def ack_event(
        self,
        event_id: str,
        from_agent: str,
        status: str | None = None,
        body: str | None = "",
        topic: str | None = None,
    ) -> dict[str, Any]:
        """Append `event.ack` routed back to the target's author; the target is untouched."""
        target = self._event_by_id(model.identifier("event_id", event_id))
        return self.append_event(
            model.ACK_EVENT_TYPE,
            target["stream"],
            target["room"],
            from_agent,
            to_agent=target["from_agent"],
            correlation_id=target["correlation_id"] or target["id"],
            status=status,
            body=body,
            metadata={"ack_of": target["id"]},
            topic=topic if topic is not None else target["topic"],
        )

    def submit_patch(
        self,
        content: str,
        from_agent: str,
        stream: str,
        room: str = "patches",
        *,
        to_agent: str | None = None,
        correlation_id: str | None = None,
        branch: str | None = None,
        base_commit: str | None = None,
        body: str | None = "",
        metadata: Mapping[str, Any] | None = None,
        topic: str | None = None,
    ) -> dict[str, Any]:
        """Store a patch artifact and its `patch.ready` event."""
        # The event's fields are checked before the artifact is stored, so a bad one
        # leaves no orphan artifact behind.
        _event_fields(
            "patch.ready",
            stream,
            room,
            from_agent,
            to_agent=to_agent,
            correlation_id=correlation_id,
            branch=branch,
            base_commit=base_commit,
            body=body,
            metadata=metadata,
            topic=topic,
        )
        artifact = self.put_artifact("patch", content, from_agent, metadata)
        event = self.append_event(
            "patch.ready",
            stream,
            room,
            from_agent,
            to_agent=to_agent,
            correlation_id=correlation_id,
            branch=branch,
            base_commit=base_commit,
            status="ready",
            body=body,
            metadata=metadata,
            artifact_ids=[artifact["id"]],
            topic=topic,
        )
        return {"artifact": artifact, "event": event}
