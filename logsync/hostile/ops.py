"""Valid ops as real stores write them, and the op and page mutations (shared with the
simulator)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from logsync.model import EVENT_KEYS

# 2026-07-02T03:24:43Z, the RFC's example instant (the past: never beyond the drift bound).
T0_MS = 1_782_962_683_000
FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01
MAX_SEQ = 2**62  # the largest origin_seq a store may hold

PEER_ID = "rep_" + "e" * 32
GOOD_ORIGIN = "rep_" + "f" * 32  # sorts after every bad origin
BAD_ORIGIN = "rep_" + "0" * 31 + "b"  # sorts before the good origin
GOOD_COUNT = 12

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
JSON = (("content-type", "application/json"),)
MSGPACK = (("content-type", "application/msgpack"),)
SSE = (("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"))

ADVERTISEMENT = {  # the honest peer's profile (modes.PROFILE) and its page caps
    "extensions": ["msgpack", "large_pages", "inline_artifacts", "notify"],
    "max_page": 5000,
}
UPSTREAM_PAGE = 500


# ── valid ops, as real stores write them ─────────────────────────────


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_event(origin: str, seq: int, *, ms: int | None = None, counter: int = 0,
               body: str | None = None, metadata: Mapping[str, Any] | None = None,
               **over: Any) -> dict[str, Any]:
    """One valid op of `origin` at `origin_seq` = `seq`, keys in EVENT_KEYS order."""
    stamp_ms = T0_MS + min(seq, 10**6) * 1000 if ms is None else ms
    when = datetime.fromtimestamp(stamp_ms / 1000, UTC)
    tag = hashlib.sha256(f"{origin}:{seq}:{stamp_ms}".encode()).hexdigest()[:12]
    event: dict[str, Any] = {
        "id": f"evt_{when:%Y%m%dT%H%M%S}_{tag}",
        "seq": seq,
        "origin_replica": origin,
        "origin_seq": seq,
        "hlc": f"{stamp_ms:013d}-{counter:06x}-{origin}",
        "type": "task.note",
        "stream": "hostile",
        "room": "general",
        "topic": None,
        "from_agent": f"agent@{origin[-6:]}",
        "to_agent": None,
        "correlation_id": None,
        "branch": None,
        "base_commit": None,
        "status": None,
        "artifact_ids": [],
        "body": f"op {seq} of {origin}" if body is None else body,
        "created_at": iso(stamp_ms),
        "metadata": {"n": seq} if metadata is None else dict(metadata),
    }
    event.update(over)
    return {k: event[k] for k in EVENT_KEYS} | {k: v for k, v in event.items()
                                                 if k not in EVENT_KEYS}


def chain(origin: str, count: int, start: int = 1, **over: Any) -> list[dict[str, Any]]:
    return [make_event(origin, s, **over) for s in range(start, start + count)]


def bad_origin(index: int) -> str:
    """A distinct bad origin per index, sorting before GOOD_ORIGIN."""
    return f"rep_{index + 1:032x}"


def nested(depth: int) -> dict[str, Any]:
    """{"a": {"a": ... {}}} nested `depth` objects deep (built without recursion)."""
    inner: dict[str, Any] = {}
    for _ in range(depth - 1):
        inner = {"a": inner}
    return inner


# ── op and page mutations (shared with the simulator) ────────────────


def overflow_seq(op: dict[str, Any], seq: int = 2**63) -> dict[str, Any]:
    """Finding 1: origin_seq >= 2**63 (beyond SQLite's INTEGER)."""
    return dict(op, origin_seq=seq)


def deep_metadata(op: dict[str, Any], depth: int = 990) -> dict[str, Any]:
    """Finding 2: metadata nested ~990 deep (RecursionError in encoders)."""
    return dict(op, metadata=nested(depth))


def newline_type(op: dict[str, Any]) -> dict[str, Any]:
    """Finding 6: a type ending in a newline (`$` matches before a final `\\n`)."""
    return dict(op, type=op["type"] + "\n")


def newline_id(op: dict[str, Any]) -> dict[str, Any]:
    return dict(op, id=op["id"] + "\n")


def arabic_hlc(op: dict[str, Any]) -> dict[str, Any]:
    """Finding 6: an HLC whose ms digits are Arabic-Indic (`\\d` matches them)."""
    ms, rest = op["hlc"].split("-", 1)
    return dict(op, hlc=ms.translate(ARABIC_INDIC) + "-" + rest)


def arabic_created_at(op: dict[str, Any]) -> dict[str, Any]:
    return dict(op, created_at=op["created_at"].translate(ARABIC_INDIC))


def numeric_twin(value: Any) -> Any:
    """The same decoded value, other bytes: 1 -> true, 0 -> -0.0, n -> n.0 (finding 13)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if value == 1:
            return True
        if value == 0:
            return -0.0
        return float(value)
    if isinstance(value, dict):
        return {k: numeric_twin(v) for k, v in value.items()}
    if isinstance(value, list):
        return [numeric_twin(v) for v in value]
    return value


def has_number(value: Any) -> bool:
    if isinstance(value, int | float):
        return True
    if isinstance(value, dict):
        return any(has_number(v) for v in value.values())
    if isinstance(value, list):
        return any(has_number(v) for v in value)
    return False


def forged_own(origin: str, seq: int, *, ms: int = FAR_FUTURE_MS) -> dict[str, Any]:
    """Finding 12/14: an op under the victim's own origin, far-future HLC."""
    return make_event(origin, seq, ms=ms, body=f"forged op {seq} under {origin}")


OP_MUTATIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "deep_metadata": deep_metadata,
    "newline_type": newline_type,
    "newline_id": newline_id,
    "arabic_hlc": arabic_hlc,
    "arabic_created_at": arabic_created_at,
}

BAD_PAGE_SEQ_VARIANTS = ("seq_zero", "seq_negative", "seq_float", "seq_bool", "seq_string",
                         "backwards", "status_500", "reset")
PAGE_SEQ_VALUES: dict[str, Any] = {
    "seq_zero": 0, "seq_negative": -1, "seq_float": 1.5, "seq_bool": True, "seq_string": "1",
}


def bad_page(variant: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finding 8, page level: a page no receiver may apply (seq 0/neg/float/bool/str,
    backwards). `events` is an honest page (not altered)."""
    out = [dict(e) for e in events]
    if variant == "backwards":
        if len(out) < 2:
            out.append(dict(out[0], origin_seq=max(0, out[0]["origin_seq"] - 1)))
        return list(reversed(out)) if len(out) > 1 else out
    out[0]["origin_seq"] = PAGE_SEQ_VALUES[variant]
    return out
