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
from logsync.text import is_unicode

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
canonical_json = json.JSONEncoder(ensure_ascii=False, sort_keys=True, allow_nan=False).encode
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
    if not is_unicode(value):
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
    problem = json_shape_problem(value)
    if problem:
        raise _fail("metadata", value, problem)
    try:
        encoded = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise _fail("metadata", value, f"must be JSON-serialisable ({exc})") from None
    size = _utf8_len(encoded, "metadata")
    if size > MAX_METADATA_BYTES:
        raise ValidationError(
            f"metadata is {size} bytes as canonical JSON: the maximum is "
            f"{MAX_METADATA_BYTES} bytes"
        )
    return encoded


def json_shape_problem(value: object) -> str | None:
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


def checked_remote_row(event: object) -> dict[str, Any]:
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


