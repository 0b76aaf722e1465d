"""A peer's op, validated: the whole-op fast path and the careful rules it defers to.

A page carries tens of thousands of ops, so a valid one is accepted in one pass
(`_fast_values`), with bounded caches of verdicts a log repeats (its labels, types,
origins, seconds and flat metadata). Anything the fast path doubts goes to
`model.checked_remote_row`, which names the exact violation; both accept exactly the
same ops (`tests/test_model.py`, `tests/test_validator_hardening.py`).
"""

from __future__ import annotations

import re
from typing import Any

from logsync.errors import ValidationError
from logsync.ids import is_replica_id
from logsync.model import (
    EVENT_STATUSES,
    ID_RE,
    MAX_ARTIFACTS_PER_EVENT,
    MAX_BODY_BYTES,
    MAX_METADATA_BYTES,
    MAX_SEQ,
    OPTIONAL_ROUTING,
    ROW_COLUMNS,
    TYPE_RE,
    canonical_json,
    checked_remote_row,
    created_at,
    json_shape_problem,
)


def remote_values(event: object) -> tuple[tuple[Any, ...], list[str]]:
    """`validate_remote_event` as the events row's values in `ROW_COLUMNS` order and the
    sorted artifact ids: a page's ops go straight into an INSERT, no dict between."""
    found = _fast_values(event) if type(event) is dict else None
    if found is not None:
        return found
    row = checked_remote_row(event)
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
    return row if row is not None else checked_remote_row(event)


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
    if json_shape_problem(meta) is not None:
        return None
    try:
        encoded = canonical_json(meta)
    except (TypeError, ValueError):
        return None
    return encoded if _text_size_ok(encoded, MAX_METADATA_BYTES) else None
