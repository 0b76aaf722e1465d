"""Event and artifact shapes, and every validation rule of RFC 003 §3.1.

Local appends and remote ops go through the same rules, so a peer cannot
store what a local client could not. Each violation raises one
`ValidationError` naming the field, the (shortened) value and what is
allowed. Nothing here touches SQL or the network.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from hashlib import sha256
from typing import Any

from logsync import hlc
from logsync.errors import ValidationError, shorten
from logsync.ids import is_replica_id

MAX_BODY_BYTES = 256 * 1024
MAX_ARTIFACT_BYTES = 4 * 1024 * 1024
MAX_METADATA_BYTES = 64 * 1024
MAX_ROUTING_CHARS = 256
MAX_ID_CHARS = 128
MAX_ARTIFACTS_PER_EVENT = 256

EVENT_STATUSES = frozenset(
    {"open", "claimed", "ready", "applied", "blocked", "failed", "superseded"}
)
TERMINAL_STATUSES = frozenset({"applied", "superseded", "failed", "blocked"})
ARTIFACT_KINDS = frozenset({"patch", "file", "log", "json", "note"})
ACK_EVENT_TYPE = "event.ack"

EVENT_KEYS = (
    "id", "seq", "origin_replica", "origin_seq", "hlc", "type", "stream", "room", "topic",
    "from_agent", "to_agent", "correlation_id", "branch", "base_commit", "status",
    "artifact_ids", "body", "created_at", "metadata",
)
ARTIFACT_KEYS = (
    "id", "kind", "sha256", "size_bytes", "content", "created_by", "created_at",
    "origin_replica", "metadata",
)
OPTIONAL_ROUTING = ("topic", "to_agent", "correlation_id", "branch", "base_commit")
# A validated op as the events table stores it, in its INSERT's column order.
ROW_COLUMNS = (
    "id", "type", "stream", "room", "topic", "from_agent", "to_agent", "correlation_id",
    "branch", "base_commit", "status", "body", "created_at", "metadata_json",
    "origin_replica", "origin_seq", "hlc",
)

# Patterns are whole-string (`fullmatch`) and ASCII-only: `$` would accept a final
# newline and `\d` any Unicode digit, and the fast and careful paths must agree.
TYPE_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
CREATED_AT_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
SHA256_RE = re.compile(r"[0-9a-f]{64}")
MAX_SEQ = 2**62  # origin_seq and vector entries: far below SQLite's 2**63 - 1
MAX_METADATA_DEPTH = 64  # nesting of objects and arrays inside metadata
# Upstream's encoding of stored metadata (sorted keys, non-ASCII kept), refusing NaN.
_canonical_json = json.JSONEncoder(ensure_ascii=False, sort_keys=True, allow_nan=False).encode
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_STATUS_LIST = ", ".join(sorted(EVENT_STATUSES))
_KIND_LIST = ", ".join(sorted(ARTIFACT_KINDS))


def _fail(field: str, value: object, rule: str) -> ValidationError:
    return ValidationError(f"{field}={shorten(value)} is invalid: {rule}")


def event_type(value: object) -> str:
    if not isinstance(value, str) or not TYPE_RE.fullmatch(value):
        raise _fail(
            "type", value,
            "must be 1-64 chars of lowercase letters, digits, '.', '_', '-', "
            "starting with a letter or digit",
        )
    return value


def routing(field: str, value: object, *, required: bool) -> str | None:
    """A short routing label: non-empty, ≤256 chars, no control characters."""
    if value is None or value == "":
        if required:
            raise _fail(field, value, "is required and must be a non-empty string")
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(field, value, "must be a non-empty string")
    if len(value) > MAX_ROUTING_CHARS:
        raise _fail(field, value, f"must be at most {MAX_ROUTING_CHARS} characters")
    if _CONTROL_RE.search(value):
        raise _fail(field, value, "must not contain control characters")
    if _has_lone_surrogate(value):
        raise _fail(field, value, "must be valid Unicode (no lone surrogates)")
    return value


def status(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or value not in EVENT_STATUSES:
        raise _fail("status", value, f"must be one of: {_STATUS_LIST}")
    return value


def body(value: object, field: str = "body") -> str:
    """Verbatim text: empty allowed, ≤256 KiB of UTF-8, no NUL."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _fail(field, value, "must be a string")
    if "\x00" in value:
        raise _fail(field, value, "must not contain NUL bytes")
    size = _utf8_len(value, field)
    if size > MAX_BODY_BYTES:
        raise ValidationError(
            f"{field} is {size} bytes of UTF-8: the maximum is {MAX_BODY_BYTES} bytes"
        )
    return value


def metadata_json(value: object) -> str:
    """Canonical JSON of an object (sorted keys, no NaN), ≤64 KiB, ≤64 levels deep."""
    if value is None:
        return "{}"
    if not isinstance(value, Mapping):
        raise _fail("metadata", value, "must be a JSON object")
    problem = _json_shape_problem(value)
    if problem:
        raise _fail("metadata", value, problem)
    try:
        encoded = _canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise _fail("metadata", value, f"must be JSON-serialisable ({exc})") from None
    size = _utf8_len(encoded, "metadata")
    if size > MAX_METADATA_BYTES:
        raise ValidationError(
            f"metadata is {size} bytes as canonical JSON: the maximum is "
            f"{MAX_METADATA_BYTES} bytes"
        )
    return encoded


def _json_shape_problem(value: object) -> str | None:
    """Why a decoded value is not plain JSON within the depth limit (iterative: a hostile
    nesting must not reach the recursion limit), or None."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list):
            if depth > MAX_METADATA_DEPTH:
                return f"must nest at most {MAX_METADATA_DEPTH} objects or arrays deep"
            if isinstance(item, Mapping):
                if not all(type(k) is str for k in item):
                    return "object keys must be strings"
                children = item.values()
            else:
                children = item
            for child in children:
                if isinstance(child, Mapping | list):
                    stack.append((child, depth + 1))
                elif type(child) is float and not math.isfinite(child):
                    return "must not hold NaN or Infinity (not JSON)"
    return None


def artifact_ids(value: object) -> list[str]:
    """A list of ids, deduplicated, order kept (reads return them sorted)."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise _fail("artifact_ids", value, "must be a list of artifact id strings")
    ids = [identifier("artifact_ids[]", v) for v in value]
    if len(ids) > MAX_ARTIFACTS_PER_EVENT:
        raise _fail("artifact_ids", value, f"may name at most {MAX_ARTIFACTS_PER_EVENT}")
    return list(dict.fromkeys(ids))


def identifier(field: str, value: object) -> str:
    if not isinstance(value, str) or not ID_RE.fullmatch(value):
        raise _fail(
            field, value,
            "must be 1-128 chars of letters, digits, '_', '.', ':', '-' "
            "(like evt_20260702T032443_02ce0c31acdb)",
        )
    return value


def artifact_kind(value: object) -> str:
    if not isinstance(value, str) or value not in ARTIFACT_KINDS:
        raise _fail("kind", value, f"must be one of: {_KIND_LIST}")
    return value


def artifact_content(value: object) -> str:
    """Non-empty UTF-8 text, ≤4 MiB, no NUL."""
    if not isinstance(value, str) or not value:
        raise _fail("content", value, "must be a non-empty string")
    if "\x00" in value:
        raise _fail("content", value, "must not contain NUL bytes (v1 artifacts are text)")
    size = _utf8_len(value, "content")
    if size > MAX_ARTIFACT_BYTES:
        raise ValidationError(
            f"content is {size} bytes of UTF-8: the maximum is {MAX_ARTIFACT_BYTES} bytes"
        )
    return value


def created_at(value: object) -> str:
    if not isinstance(value, str) or not CREATED_AT_RE.fullmatch(value):
        raise _fail("created_at", value, "must look like 2026-07-02T03:24:43Z")
    try:
        datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise _fail("created_at", value, "must be a real UTC date and time") from None
    return value


def origin_replica(value: object) -> str:
    if not is_replica_id(value):
        raise _fail("origin_replica", value, "must be 'rep_' + 12 or 32 lowercase hex digits")
    return str(value)


def origin_seq(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail("origin_seq", value, "must be a positive integer")
    if value > MAX_SEQ:
        raise _fail("origin_seq", value, "must be at most 2**62")
    return value


def hlc_stamp(value: object, origin: str) -> str:
    parsed = hlc.parse(value)
    if parsed is None:
        raise _fail("hlc", value, "must be <13-digit unix ms>-<6 hex>-<replica id>")
    if parsed.replica_id != origin:
        raise _fail("hlc", value, f"must end with its origin replica id {origin}")
    return str(value)


def patch_warnings(kind: str, content: str) -> list[str]:
    """Advisory only: content is never altered (RFC 003 §3.4)."""
    if kind != "patch":
        return []
    warnings = []
    if not content.endswith("\n"):
        warnings.append(
            "patch content does not end with a trailing newline; git apply will reject "
            "the final hunk as corrupt: store the diff byte-exactly with its final newline"
        )
    if "\r" in content:
        warnings.append(
            "patch content contains carriage returns (CRLF line endings); git apply often "
            "rejects CRLF diffs: generate the diff with LF endings"
        )
    return warnings


def sha256_hex(content: str) -> str:
    return sha256(content.encode("utf-8")).hexdigest()


def utc_now_iso(now_ms: int) -> str:
    """The second of `now_ms` as `created_at` text (every apply stamps its rows with it:
    the text of the last few seconds is kept)."""
    return _iso_second(now_ms // 1000)


@lru_cache(maxsize=64)
def _iso_second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def strip_routing(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Local appends trim routing labels, as upstream does; remote ops stay verbatim."""
    names = ("stream", "room", "from_agent", "type", *OPTIONAL_ROUTING)
    return {k: (v.strip() if k in names and isinstance(v, str) else v) for k, v in fields.items()}


def validate_local_event(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Check the caller-supplied fields of an append; return them normalised."""
    out: dict[str, Any] = {
        "type": event_type(fields.get("type")),
        "stream": routing("stream", fields.get("stream"), required=True),
        "room": routing("room", fields.get("room"), required=True),
        "from_agent": routing("from_agent", fields.get("from_agent"), required=True),
        "status": status(fields.get("status")),
        "body": body(fields.get("body")),
        "metadata_json": metadata_json(fields.get("metadata")),
        "artifact_ids": artifact_ids(fields.get("artifact_ids")),
    }
    for name in OPTIONAL_ROUTING:
        out[name] = routing(name, fields.get(name), required=False)
    return out


def remote_values(event: object) -> tuple[tuple[Any, ...], list[str]]:
    """`validate_remote_event` as the events row's values in `ROW_COLUMNS` order and the
    sorted artifact ids: a page's ops go straight into an INSERT, no dict between."""
    found = _fast_values(event) if type(event) is dict else None
    if found is not None:
        return found
    row = _checked_remote_row(event)
    return tuple(row[name] for name in ROW_COLUMNS), row["artifact_ids"]


def validate_remote_event(event: object) -> dict[str, Any]:
    """A peer's op: every local rule plus the provenance fields.

    Returns a row dict ready for insert (metadata as canonical JSON,
    artifact_ids sorted). Raises ValidationError for the first violation.
    The fast path accepts a valid op in one pass (pages are tens of
    thousands of ops); anything it doubts goes to the field-by-field path,
    which names the exact violation.
    """
    row = _fast_remote_row(event) if type(event) is dict else None
    return row if row is not None else _checked_remote_row(event)


_ROUTE_OK = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]{1,256}")
_HLC_PREFIX = re.compile(r"[0-9]{13}-[0-9a-f]{6}-")


def _text_size_ok(value: str, limit: int) -> bool:
    if value.isascii():
        return len(value) <= limit
    try:
        return len(value.encode("utf-8")) <= limit
    except UnicodeEncodeError:
        return False


# Texts that passed a rule, per rule: a log repeats its few labels, origins, types and
# seconds, and a set lookup costs a tenth of the regex it skips (about a third of
# validating a small op). A value's verdict depends only on its text, and only exact
# `str` values are looked up; each set is emptied when full, so distinct values bound it.
_KNOWN_ENTRIES = 4096
_known_labels: set[str] = set()  # routing labels (`_ROUTE_OK`, not blank)
_known_types: set[str] = set()
_known_origins: set[str] = set()
_known_seconds: set[str] = set()  # created_at texts that are real UTC seconds


def _learn(known: set[str], value: str) -> bool:
    if len(known) >= _KNOWN_ENTRIES:
        known.clear()
    known.add(value)
    return True


def _label_ok(value: str) -> bool:
    return _route_match(value) is not None and not value.isspace() \
        and _learn(_known_labels, value)


def _type_ok(value: str) -> bool:
    return TYPE_RE.fullmatch(value) is not None and _learn(_known_types, value)


def _origin_ok(value: str) -> bool:
    return is_replica_id(value) and _learn(_known_origins, value)


def _created_at_ok(value: str) -> bool:
    try:
        created_at(value)
    except ValidationError:
        return False
    return _learn(_known_seconds, value)


_route_match = _ROUTE_OK.fullmatch
_FAST_FIELDS = ("id", "type", "stream", "room", "from_agent", "origin_replica", "origin_seq",
                "hlc", "body", "metadata", "artifact_ids", "status", "created_at",
                *OPTIONAL_ROUTING)
_id_match = ID_RE.fullmatch


def _fast_remote_row(ev: dict[str, Any]) -> dict[str, Any] | None:
    """The whole-op predicate; None means 'ask the careful path'."""
    found = _fast_values(ev)
    if found is None:
        return None
    row = dict(zip(ROW_COLUMNS, found[0], strict=True))
    row["artifact_ids"] = found[1]
    return row


def _fast_values(ev: dict[str, Any]) -> tuple[tuple[Any, ...], list[str]] | None:
    """`_fast_remote_row` as `remote_values` answers it; None: ask the careful path."""
    (ident, typ, stream, room, sender, origin, seq, stamp, text, meta, ids, stat, created,
     *optional) = map(ev.get, _FAST_FIELDS)
    labels = _known_labels
    ok = (
        type(ident) is str and _id_match(ident) is not None
        and type(typ) is str and (typ in _known_types or _type_ok(typ))
        and type(stream) is str and (stream in labels or _label_ok(stream))
        and type(room) is str and (room in labels or _label_ok(room))
        and type(sender) is str and (sender in labels or _label_ok(sender))
        and (stat is None or (type(stat) is str and stat in EVENT_STATUSES))
        and (text is None or (type(text) is str and "\x00" not in text
                              and _text_size_ok(text, MAX_BODY_BYTES)))
        and (meta is None or type(meta) is dict)
        and type(created) is str and (created in _known_seconds or _created_at_ok(created))
        and type(origin) is str and (origin in _known_origins or _origin_ok(origin))
        and type(seq) is int and 1 <= seq <= MAX_SEQ
        and type(stamp) is str and len(stamp) == 21 + len(origin) and stamp.endswith(origin)
        and _HLC_PREFIX.match(stamp) is not None
    )
    if not ok:
        return None
    for value in optional:
        if value is not None and (type(value) is not str
                                  or not (value in labels or _label_ok(value))):
            return None
    if ids:
        if type(ids) is not list or len(ids) > MAX_ARTIFACTS_PER_EVENT:
            return None
        for art in ids:
            if type(art) is not str or _id_match(art) is None:
                return None
        ids = sorted(set(ids))
    elif ids is not None and ids != []:
        return None
    if meta:
        meta_json = _fast_metadata(meta)
        if meta_json is None:
            return None
    else:
        meta_json = "{}"
    topic, to_agent, correlation_id, branch, base_commit = optional
    return (ident, typ, stream, room, topic, sender, to_agent, correlation_id, branch,
            base_commit, stat, text or "", created, meta_json, origin, seq, stamp), ids or []


# Flat metadata (a few keys, each value a string, an integer, a boolean or null) as its
# canonical JSON. A log repeats its few shapes, and the standard library's encoder costs
# ~4 µs and the shape check as much again per op: about half of validating a small op.
# Floats are never kept (0.0 and -0.0 are equal keys but encode apart), nor long texts;
# the map is emptied when full, so a peer sending only distinct shapes bounds it.
_FLAT_TYPES = frozenset((str, int, bool, type(None)))
_FLAT_KEYS = 8
_FLAT_CACHED_CHARS = 512
_FLAT_CACHE_ENTRIES = 4096
_flat_cache: dict[tuple[Any, ...], str] = {}


def _fast_metadata(meta: dict[str, Any]) -> str | None:
    """`meta` (a non-empty dict) as canonical JSON, or None when the careful path must
    decide (a shape problem, a value JSON cannot hold, too large)."""
    if len(meta) <= _FLAT_KEYS:
        types = tuple(map(type, meta.values()))
        if _FLAT_TYPES.issuperset(types):
            # every value hashable (all are scalars); the key types too: a str subclass
            # equals its text as a key, and only `str` keys pass the shape check
            key = (tuple(meta.items()), types, tuple(map(type, meta)))
            found = _flat_cache.get(key)
            if found is not None:
                return found
            encoded = _metadata_or_none(meta)
            if encoded is not None and len(encoded) <= _FLAT_CACHED_CHARS:
                if len(_flat_cache) >= _FLAT_CACHE_ENTRIES:
                    _flat_cache.clear()
                _flat_cache[key] = encoded
            return encoded
    return _metadata_or_none(meta)


def _metadata_or_none(meta: dict[str, Any]) -> str | None:
    if _json_shape_problem(meta) is not None:
        return None
    try:
        encoded = _canonical_json(meta)
    except (TypeError, ValueError):
        return None
    return encoded if _text_size_ok(encoded, MAX_METADATA_BYTES) else None


def _checked_remote_row(event: object) -> dict[str, Any]:
    if not isinstance(event, Mapping):
        raise _fail("event", event, "must be a JSON object")
    row = validate_local_event(event)
    row["id"] = identifier("id", event.get("id"))
    row["created_at"] = created_at(event.get("created_at"))
    row["origin_replica"] = origin_replica(event.get("origin_replica"))
    row["origin_seq"] = origin_seq(event.get("origin_seq"))
    row["hlc"] = hlc_stamp(event.get("hlc"), row["origin_replica"])
    row["artifact_ids"] = sorted(row["artifact_ids"])
    return row


def validate_remote_artifact(artifact: object) -> dict[str, Any]:
    """A peer's artifact: shape rules plus the sha256 of its bytes."""
    if not isinstance(artifact, Mapping):
        raise _fail("artifact", artifact, "must be a JSON object")
    content = artifact_content(artifact.get("content"))
    digest = sha256_hex(content)
    claimed = artifact.get("sha256")
    if not isinstance(claimed, str) or not SHA256_RE.fullmatch(claimed):
        raise _fail("sha256", claimed, "must be 64 lowercase hex digits")
    if claimed != digest:
        raise ValidationError(
            f"artifact {shorten(artifact.get('id'))} failed hash verification: claimed "
            f"sha256 {claimed[:16]}..., content hashes to {digest[:16]}..."
        )
    origin = artifact.get("origin_replica")
    return {
        "id": identifier("id", artifact.get("id")),
        "kind": artifact_kind(artifact.get("kind")),
        "sha256": digest,
        "size_bytes": len(content.encode("utf-8")),
        "content": content,
        "created_by": routing("created_by", artifact.get("created_by"), required=True),
        "created_at": created_at(artifact.get("created_at")),
        "metadata_json": metadata_json(artifact.get("metadata")),
        "origin_replica": None if origin is None else origin_replica(origin),
    }


def _utf8_len(value: str, field: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise _fail(field, value, "must be valid Unicode (no lone surrogates)") from None


def _has_lone_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


