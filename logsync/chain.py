"""The per-origin hash chain (issue 10, item 1): canonical bytes of an op, and digests.

Pure: no SQL, no files, no clock. The store (`logsync/store/chaining.py`) keeps one
digest per held op; later layers (tips in the vector answer, digest search, signatures)
compare and sign these digests.

Canonical bytes of an op, ``canonical_op(event, artifact_sha256s)`` (version 1)
--------------------------------------------------------------------------------

The *authored envelope*: what the origin wrote and every replica stores identically.
Local-only fields (``seq``, the local rowid) are never part of it. The bytes are the
UTF-8 encoding of one JSON object with exactly these 18 keys, always all present:

    artifacts, base_commit, body, branch, correlation_id, created_at, from_agent, hlc,
    id, metadata, origin_replica, origin_seq, room, status, stream, to_agent, topic, type

- ``id, type, stream, room, from_agent, created_at, origin_replica, hlc``: the stored
  strings, verbatim (no trimming, no Unicode normalisation).
- ``topic, to_agent, correlation_id, branch, base_commit, status``: the stored string,
  or ``null`` when absent, ``None`` or the empty string (the validator reads ``""`` as
  absent, so a replica may hold either spelling of "absent").
- ``body``: the stored string; ``None`` (absent) is written as ``""``.
- ``origin_seq``: a JSON integer in plain decimal (no sign, exponent, fraction or leading
  zero); bools and non-integers are refused.
- ``metadata``: the metadata object as a replica serves it, re-encoded by the same rules
  (a stored text that does not parse as a JSON object is served as, and written as,
  ``{}``; so is one holding NaN or an infinity, which no validated op holds). Integers
  in plain decimal, any size; floats as Python's ``repr(float)`` (the shortest digits
  that round-trip; exponent form when the decimal exponent is < -4 or >= 16, written
  ``e``, a sign, at least two digits: ``1e+16``, ``2.5e-05``; otherwise fixed with at
  least one fractional digit: ``1.0``, ``-0.0``, ``0.0001``);
  ``true``/``false``/``null``; an empty object is ``{}``.
- ``artifacts``: the artifacts the op names, as a JSON array of two-element arrays
  ``[artifact_id, sha256]``, sorted ascending by ``artifact_id`` (code-point order; ids
  are ASCII, so byte order), one per distinct id: the order every replica stores and
  serves ``artifact_ids`` in, whatever order the author passed them. ``sha256`` is the
  64 lowercase hex digits of the artifact's stored ``sha256`` (the hash of its UTF-8
  content, verified before any artifact is stored), or ``null`` when the replica does
  not hold that artifact (only possible in a store another program wrote). ``[]`` when
  the op names none.

The JSON text: keys sorted ascending by code point at every level (``sort_keys``),
no whitespace at all (separators ``","`` and ``":"``), non-ASCII characters written
as themselves in UTF-8 (``ensure_ascii=False``); in strings only ``"`` -> ``\\"``,
``\\`` -> ``\\\\``, ``\\b \\f \\n \\r \\t`` as those two-character escapes, every other code
point below U+0020 as ``\\u00XX`` (lowercase hex), everything else (U+007F, U+2028, ...)
raw (a lone surrogate, which validation refuses everywhere, would be written as its
three-byte form). This is exactly Python's ``json.dumps(value, sort_keys=True,
separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")``.

The chain
---------

Per origin ``O``, over the ops of ``O`` a replica holds in ``origin_seq`` order
(an origin may have gaps; the chain skips them, so ``d_prev`` is the digest of the
highest held seq below this one):

    d_0 = SHA-256(b"logsync-chain-v1\\x00" || UTF-8(O))
    d_n = SHA-256(d_prev || canonical_op(op_n))          (raw 32-byte digests)

Two origins never share a digest for equal bodies (``d_0`` differs, and ``origin_replica``
is inside the canonical bytes); one byte changed anywhere in an op, or in the content of
an artifact it names, changes its digest and every later one of that origin.
"""

from __future__ import annotations

import builtins
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from operator import itemgetter
from typing import Any

import msgspec

CHAIN_VERSION = 1
CHAIN_DOMAIN = b"logsync-chain-v1\x00"
DIGEST_BYTES = 32

REQUIRED_TEXT = ("id", "type", "stream", "room", "from_agent", "created_at", "origin_replica",
                 "hlc")
OPTIONAL_TEXT = ("topic", "to_agent", "correlation_id", "branch", "base_commit", "status")
CANONICAL_KEYS = tuple(sorted(
    (*REQUIRED_TEXT, *OPTIONAL_TEXT, "body", "origin_seq", "metadata", "artifacts")
))  # the 18 keys, in the order they are written

_encode = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode
_type_of = builtins.type  # `type` is also a parameter name below
_quote = encode_basestring  # the encoder's string escaping for ensure_ascii=False (C)


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The same encoder's C core, made once (`JSONEncoder.encode` builds it on every call):
# sorted keys, compact separators, NaN and infinities refused. No circular-reference
# check: it encodes decoded JSON, which has none.
if c_make_encoder is not None:
    _c_encode = c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", True, False,
                               False)
else:  # no C accelerator: the same output through the encoder's Python path
    def _c_encode(value: Any, _level: int) -> list[str]:
        return [_encode(value)]


def chain_start(origin: str) -> bytes:
    """``d_0`` of an origin's chain."""
    return hashlib.sha256(CHAIN_DOMAIN + origin.encode("utf-8")).digest()


def next_digest(prev: bytes, canonical: bytes) -> bytes:
    """``d_n = SHA-256(d_prev || canonical)``."""
    return hashlib.sha256(prev + canonical).digest()


def canonical_op(
    event: Mapping[str, Any], artifact_sha256s: Sequence[str | None], *, stored: bool = False
) -> bytes:
    """The canonical bytes of an op (the rule is the module docstring).

    ``event`` is an op as served (``metadata`` a mapping; a ``metadata_json`` key on it is
    not part of the op and is never read) or, with ``stored=True``, a stored/validated row
    (``metadata_json`` text); ``artifact_sha256s`` holds the sha256 hex (or None, not
    held) of each id of ``event["artifact_ids"]``, in that list's order. Raises
    ``ValueError`` for an op no validated store can hold.
    """
    ids = event.get("artifact_ids") or ()
    if len(ids) != len(artifact_sha256s):
        raise ValueError(
            f"artifact_sha256s has {len(artifact_sha256s)} entries for {len(ids)} artifact ids"
        )
    pairs = dict(zip(ids, artifact_sha256s, strict=True))  # one per distinct id
    seq = event.get("origin_seq")
    if type(seq) is not int:
        raise ValueError(f"origin_seq must be an integer, not {type(seq).__name__}")
    _check_text(event)
    if stored:  # a stored or validated row; an op off the wire has `metadata` only
        metadata = compact_metadata(event.get("metadata_json"))
    else:
        value = event.get("metadata")
        metadata = "".join(_c_encode(value, 0)) if isinstance(value, dict) and value else "{}"
    g = event.get
    return canonical_row(
        g("id"), g("type"), g("stream"), g("room"), g("topic"), g("from_agent"), g("to_agent"),
        g("correlation_id"), g("branch"), g("base_commit"), g("status"), g("body"),
        g("created_at"), metadata, g("origin_replica"), seq, g("hlc"), pairs,
    )


_required = itemgetter(*REQUIRED_TEXT)
_optional = itemgetter(*OPTIONAL_TEXT, "body")
_OPTIONAL_TYPES = {str, type(None)}


def _check_text(event: Mapping[str, Any]) -> None:
    """Every text field a string (the optional ones may be absent): in C where the event
    has all its keys (a served or stored op always does), else key by key."""
    try:
        if set(map(type, _required(event))) == {str} and \
                set(map(type, _optional(event))) <= _OPTIONAL_TYPES:
            return
    except KeyError:
        pass
    for key in REQUIRED_TEXT:
        if type(event.get(key)) is not str:
            raise ValueError(f"{key} must be a string, not {type(event.get(key)).__name__}")
    for key in (*OPTIONAL_TEXT, "body"):
        value = event.get(key)
        if value is not None and type(value) is not str:
            raise ValueError(f"{key} must be a string or absent, not {type(value).__name__}")


class _Canonical(msgspec.Struct, gc=False):
    """The canonical object: its fields are `CANONICAL_KEYS`, in that order, so msgspec
    writes them as sorted keys."""

    artifacts: Any
    base_commit: str | None
    body: str
    branch: str | None
    correlation_id: str | None
    created_at: str
    from_agent: str
    hlc: str
    id: str
    metadata: msgspec.Raw
    origin_replica: str
    origin_seq: int
    room: str
    status: str | None
    stream: str
    to_agent: str | None
    topic: str | None
    type: str


_encode_canonical = msgspec.json.Encoder().encode
_NO_ARTIFACTS = msgspec.Raw(b"[]")
_FAST = True  # until `_fast_writes_the_reference` (below) has looked


def canonical_row(
    id: str, type: str, stream: str, room: str, topic: str | None, from_agent: str,
    to_agent: str | None, correlation_id: str | None, branch: str | None,
    base_commit: str | None, status: str | None, body: str | None, created_at: str,
    metadata: str, origin_replica: str, origin_seq: int, hlc: str,
    artifacts: Mapping[str, str | None],
) -> bytes:
    """The canonical bytes from a stored row's fields (the store's hot path).
    ``metadata`` is already compact canonical JSON (``compact_metadata``); ``artifacts``
    maps each named id to its sha256 or None.

    msgspec writes the object in C, about a quarter of the time of the standard library.
    Its string escaping is `json.dumps`'s with ``ensure_ascii=False`` (tests check every
    code point; `_FAST` says whether the installed msgspec still writes the reference's
    bytes, checked at import); a value of another type than a validated row holds, or text
    with a lone surrogate (which msgspec refuses to encode), takes
    `canonical_row_reference`, and the artifacts (rare, and of any type in a file another
    program wrote) are written by the reference's own encoder, so every input gives
    exactly that function's bytes, or its error.
    """
    body = body or ""
    try:
        # joining them is the cheapest check that every text field holds text (a falsy
        # optional value is absent, whatever its type, as in the reference)
        "".join((id, type, stream, room, from_agent, created_at, origin_replica, hlc,
                 topic or "", to_agent or "", correlation_id or "", branch or "",
                 base_commit or "", status or ""))
        if _FAST and _type_of(origin_seq) is int and _type_of(body) is str and \
                _type_of(metadata) is str:
            return _encode_canonical(_Canonical(  # artifacts: the reference's own writer
                msgspec.Raw(_encode([[a, artifacts[a]] for a in sorted(artifacts)]))
                if artifacts else _NO_ARTIFACTS,
                base_commit or None, body, branch or None, correlation_id or None, created_at,
                from_agent, hlc, id, msgspec.Raw(metadata), origin_replica, origin_seq, room,
                status or None, stream, to_agent or None, topic or None, type))
    except (UnicodeEncodeError, TypeError):  # a lone surrogate; a number in a text field
        pass
    return canonical_row_reference(
        id, type, stream, room, topic, from_agent, to_agent, correlation_id, branch,
        base_commit, status, body, created_at, metadata, origin_replica, origin_seq, hlc,
        artifacts)


def canonical_row_reference(*fields: Any) -> bytes:
    """`canonical_row` (the same 18 arguments) by the standard library alone: the rule as
    written, and the answer for any value the fast path does not take (it raises
    TypeError for a number in a text field, as `json.dumps` would).

    The keys are fixed, so the object is written key by key in sorted order with the
    JSON encoder's own string escaping: the bytes ``json.dumps`` of the whole dict with
    the module's options produces, without building and sorting a dict per op.
    """
    (id, type, stream, room, topic, from_agent, to_agent, correlation_id, branch, base_commit,
     status, body, created_at, metadata, origin_replica, origin_seq, hlc, artifacts) = fields
    q = _quote
    return "".join((
        '{"artifacts":', _encode([[a, artifacts[a]] for a in sorted(artifacts)])
        if artifacts else "[]",
        ',"base_commit":', q(base_commit) if base_commit else "null",
        ',"body":', q(body) if body else '""',
        ',"branch":', q(branch) if branch else "null",
        ',"correlation_id":', q(correlation_id) if correlation_id else "null",
        ',"created_at":', q(created_at),
        ',"from_agent":', q(from_agent),
        ',"hlc":', q(hlc),
        ',"id":', q(id),
        ',"metadata":', metadata,
        ',"origin_replica":', q(origin_replica),
        ',"origin_seq":', int.__repr__(origin_seq),
        ',"room":', q(room),
        ',"status":', q(status) if status else "null",
        ',"stream":', q(stream),
        ',"to_agent":', q(to_agent) if to_agent else "null",
        ',"topic":', q(topic) if topic else "null",
        ',"type":', q(type),
        "}",
    )).encode("utf-8", "surrogatepass")


def _fast_writes_the_reference() -> bool:
    """Whether this msgspec writes what the reference does for every character class
    the rule names (every ASCII character, DEL, U+2028, multi-byte and astral text),
    empty and absent fields, artifacts and the largest seq. Checked once at import (while
    `_FAST` is still set), not assumed: a msgspec release that escaped otherwise would
    fork every chain, so the reference then writes every op."""
    text = "".join(map(chr, range(128))) + "\u00e9\u2028\u00a0\U0001f600\\\"/"
    cases = [(text, "", None, text, {"art_a": "0" * 64, "art_b": None}, 2**62),
             ("a", text, text, "", {}, 1)]
    for label, optional, absent, body, artifacts, seq in cases:
        args = (label, label, label, label, optional, label, absent, optional, absent,
                optional, absent, body, label, '{"k":[1,2.5,null]}', label, seq, label)
        try:
            if canonical_row(*args, artifacts) != canonical_row_reference(*args, artifacts):
                return False
        except (TypeError, ValueError):
            return False
    return True


_FAST = _fast_writes_the_reference()


CACHED_METADATA_CHARS = 1024  # only short texts are cached: 4096 of them hold tens of MiB at most


def compact_metadata(text: Any) -> str:
    """Stored metadata text as the canonical bytes write it (compact, sorted keys); a text
    that is not a JSON object is served, and written, as ``{}``. Short texts are cached
    (a log repeats its few metadata shapes); long ones are not, so a peer sending many
    distinct 64 KiB metadata objects cannot grow the cache with them."""
    if text == "{}" or not isinstance(text, str):
        return "{}"
    if len(text) <= CACHED_METADATA_CHARS:
        return _compact_cached(text)
    return _compact(text)


@lru_cache(maxsize=4096)
def _compact_cached(text: str) -> str:
    return _compact(text)


def _compact(text: str) -> str:
    try:
        value = json.loads(text)
        return "".join(_c_encode(value, 0)) if isinstance(value, dict) and value else "{}"
    except (ValueError, RecursionError):  # unparseable, or NaN/Infinity (not JSON)
        return "{}"


def chain_digests(
    origin: str, canonicals: Iterable[bytes], prev: bytes | None = None
) -> list[bytes]:
    """The digests of consecutive held ops of one origin, from ``prev`` (default ``d_0``)."""
    digest = chain_start(origin) if prev is None else prev
    out = []
    for canonical in canonicals:
        digest = next_digest(digest, canonical)
        out.append(digest)
    return out
