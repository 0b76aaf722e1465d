"""Row shaping and content comparison: stored rows to wire dicts, and back.

Event and artifact dicts come out in upstream key order (`model.EVENT_KEYS`,
`model.ARTIFACT_KEYS`), so a peer that does not negotiate anything gets
MemPalace's shapes byte for byte.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from operator import itemgetter
from typing import Any

from logsync import model
from logsync.store.ledgers import raw_seq


def stored_metadata(text: Any) -> dict[str, Any]:
    """Metadata as stored; a row an older writer left unparseable reads as `{}`, as upstream."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


# The column each of `model.EVENT_KEYS` is read from (`artifact_ids` is filled in after,
# from `event_artifacts`; any column holds its place in the key order until then).
_EVENT_COLUMNS = tuple(
    {"seq": "rowid", "artifact_ids": "id", "metadata": "metadata_json"}.get(key, key)
    for key in model.EVENT_KEYS)


def event_dicts(rows: Sequence[sqlite3.Row]) -> list[dict[str, Any]]:
    """Event dicts in upstream key order, `artifact_ids` empty. The columns are picked by
    position (found once per batch) in C: by name, row by row, it cost twice the read."""
    if not rows:
        return []
    names = rows[0].keys()
    pick = itemgetter(*(names.index(column) for column in _EVENT_COLUMNS))
    keys = model.EVENT_KEYS
    out = []
    for row in rows:
        event = dict(zip(keys, pick(row), strict=True))
        event["artifact_ids"] = []
        text = event["metadata"]
        event["metadata"] = {} if text == "{}" else stored_metadata(text)
        out.append(event)
    return out


def event_dict(row: sqlite3.Row) -> dict[str, Any]:
    return event_dicts([row])[0]


def artifact_dict(row: sqlite3.Row) -> dict[str, Any]:
    metadata = stored_metadata(row["metadata_json"])
    return {
        "id": row["id"],
        "kind": row["kind"],
        "sha256": row["sha256"],
        "size_bytes": row["size_bytes"],
        "content": row["content"],
        "created_by": row["created_by"],
        "created_at": row["created_at"],
        "origin_replica": row["origin_replica"],
        "metadata": metadata,
    }


def artifact_wire(art: dict[str, Any]) -> dict[str, Any]:
    out = {k: art[k] for k in model.ARTIFACT_KEYS if k != "metadata"}
    out["metadata"] = json.loads(art["metadata_json"])
    return out


def row_wire(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k != "metadata_json"}
    out["metadata"] = json_or_raw(row.get("metadata_json"))
    return out


COMPARED = (
    "id",
    "type",
    "stream",
    "room",
    "topic",
    "from_agent",
    "to_agent",
    "correlation_id",
    "branch",
    "base_commit",
    "status",
    "body",
    "created_at",
    "origin_replica",
    "origin_seq",
    "hlc",
    "artifact_ids",
)


def same_event(stored: dict[str, Any], incoming: dict[str, Any]) -> bool:
    """Exact comparison: text fields as strings and metadata by its canonical bytes, never
    by decoded equality (in Python `1 == True == 1.0` and `0 == -0.0`)."""
    if any(_differs(stored.get(k), incoming.get(k)) for k in COMPARED):
        return False
    text, wanted = stored.get("metadata_json"), incoming["metadata_json"]
    return text == wanted or canonical_metadata(text) == wanted


def _differs(a: Any, b: Any) -> bool:
    return type(a) is not type(b) or a != b


def canonical_metadata(text: Any) -> Any:
    """Stored metadata text in the canonical encoding new ops are stored in (sorted keys,
    non-ASCII kept); an older writer's spelling of the same bytes compares equal."""
    if not isinstance(text, str):
        return text
    try:
        return model.metadata_json(json.loads(text))
    except (ValueError, RecursionError):
        return text


def same_artifact(stored: sqlite3.Row, incoming: dict[str, Any]) -> bool:
    return (
        stored["sha256"] == incoming["sha256"]
        and stored["content"] == incoming["content"]
        and stored["kind"] == incoming["kind"]
    )


def json_or_raw(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def ledger_dict(row: sqlite3.Row, json_columns: tuple[str, ...]) -> dict[str, Any]:
    out = {k: row[k] for k in row.keys() if k != "digest"}
    for column in json_columns:
        out[column.removesuffix("_json")] = json_or_raw(out.pop(column))
    return out


def chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def group_by_origin(events: Sequence[Any]) -> dict[str, list[Any]]:
    """Ops per origin in origin_seq order; ops without a usable seq sort last."""
    groups: dict[str, list[tuple[float, int, Any]]] = {}
    for index, op in enumerate(events):
        origin = op.get("origin_replica") if isinstance(op, Mapping) else None
        # An entry with no usable origin belongs to no history: it stands alone.
        key = origin if isinstance(origin, str) else f"<no origin: entry {index}>"
        seq = raw_seq(op)
        groups.setdefault(key, []).append((float("inf") if seq is None else seq, index, op))
    return {k: [op for _, _, op in _by_seq(v)] for k, v in groups.items()}


def _by_seq(entries: list[tuple[float, int, Any]]) -> list[tuple[float, int, Any]]:
    """By (seq, arrival). A page comes in order: then it is returned as it is, without
    a key tuple per op (the sort's allocations cost more than the sort itself)."""
    for before, after in zip(entries, islice(entries, 1, None), strict=False):
        if before[0] > after[0]:
            return sorted(entries, key=itemgetter(0, 1))
    return entries  # seqs never fall: arrival order is (seq, arrival) order
