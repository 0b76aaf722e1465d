"""What a replica answers on `/sync/version_vector`, `/sync/ops` and `/sync/artifact`.

One copy of every rule of those routes (parameters, their error sentences, page caps,
the page byte budget, inline artifacts, the advertisement), so the server, the
simulator and the tests' fake peers cannot drift apart: each keeps only its transport
(auth, threads, msgpack or JSON bytes, a simulated network) and asks `answer` for the
`(status, body)`. Pure: it reads the store it is handed and does no other I/O, no clock.

A `Profile` says what is answering: a logsync server (advertises its extensions under
`wire.ADVERTISEMENT_KEY` and honours those asked for with `ext=`) or, with no
extensions, an upstream MemPalace 3.11 hub (no advertisement, pages of at most
`wire.UPSTREAM_PAGE_LIMIT`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from logsync import __version__
from logsync.errorcodes import error_body
from logsync.errors import ValidationError, shorten
from logsync.ids import is_replica_id
from logsync.model import MAX_SEQ
from logsync.pagechain import CHECKPOINT, carries_signature, signed_end
from logsync.wire import (
    ADVERTISED_KEYS,
    ADVERTISED_MAX_PAGE,
    ADVERTISED_MAX_PAGE_BYTES,
    ADVERTISED_MAX_PUSH_BYTES,
    ADVERTISED_TIP_SIGS,
    ADVERTISED_TIPS,
    ADVERTISEMENT_KEY,
    DIGESTS_PATH,
    EXT_CHAIN,
    EXT_INLINE_ARTIFACTS,
    EXT_LARGE_PAGES,
    EXT_MSGPACK,
    EXT_PUSH,
    EXTENSIONS_PARAM,
    LARGE_PAGE_CEILING,
    MAX_DIGESTS_PER_REQUEST,
    UPSTREAM_PAGE_LIMIT,
)

EXT_NOTIFY = "notify"
EXTENSIONS = (EXT_MSGPACK, EXT_LARGE_PAGES, EXT_INLINE_ARTIFACTS, EXT_NOTIFY, EXT_CHAIN)
DEFAULT_MAX_PAGE_BYTES = 8 * 1024 * 1024
# the most a server may advertise: half what a puller must take (`client.MAX_RESPONSE_BYTES`)
MAX_PAGE_BYTES_CEILING = 32 * 1024 * 1024
MIN_PAGE_BYTES = 1024  # an empty page with its envelope and chain `prev` always fits
DEFAULT_INLINE_ARTIFACT_BYTES = 32 * 1024 * 1024
EVENT_OVERHEAD_BYTES = 2  # ", " between events in the JSON array
# The page's JSON around its events and artifacts (keys, count, brackets, the origin id)
# and the most its `chain` can add per signature (`[seq, "<128 hex>"], `) and for `prev`.
PAGE_ENVELOPE_BYTES = 512
CHAIN_SIG_BYTES = 160
CHAIN_PREV_BYTES = 96
MIN_EVENT_BYTES = 200  # no valid event's JSON is shorter (19 keys, an id, hlc, origin...)
PUSH_KEY_BYTES = 256  # a pushed page's `logsync.keys` entry and its `after` and `from`
PAGE_READ_BATCH = 100  # a budgeted page is read in batches this size, so it stops early
SYNC_ROUTES = ("/sync/version_vector", "/sync/ops", "/sync/artifact", DIGESTS_PATH)

Answer = tuple[int, dict[str, Any]]
VectorRead = Callable[[], Mapping[str, int]]
VectorExtra = Callable[[str, Mapping[str, int]], Mapping[str, Any]]


@dataclass(frozen=True)
class Profile:
    """What answers: the extensions it advertises and honours (none: an upstream hub,
    which advertises nothing) and its limits. Its creator validates the numbers
    (`create_app`, the scenario parser)."""

    extensions: tuple[str, ...] = EXTENSIONS
    max_page: int = LARGE_PAGE_CEILING
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
    inline_artifact_bytes: int = DEFAULT_INLINE_ARTIFACT_BYTES
    max_push_bytes: int = 0  # the body cap of `POST /sync/push` (advertised with `push`)

    def advertisement(self) -> dict[str, Any] | None:
        """The `"logsync"` object of the vector answer (None for an upstream hub)."""
        if not self.extensions:
            return None
        advert = {
            "version": __version__,
            "extensions": list(self.extensions),
            ADVERTISED_MAX_PAGE: self.max_page,
            ADVERTISED_MAX_PAGE_BYTES: self.max_page_bytes,
        }
        if EXT_PUSH in self.extensions:
            advert[ADVERTISED_MAX_PUSH_BYTES] = self.max_push_bytes
        return advert


LOGSYNC_SERVER = Profile()
UPSTREAM_HUB = Profile(extensions=())


def answer(
    store: Any,
    path: str,
    params: Mapping[str, Any],
    *,
    profile: Profile,
    vector: VectorRead | None = None,
    extra: VectorExtra | None = None,
) -> Answer:
    """`(status, body)` for one GET of a `/sync/*` route; an error body is
    `{"error": CODE, "reason": "<one sentence>"}` (`logsync.errorcodes`). Query values
    are text, as on the wire (an int is taken as given, as the engine's `Request.params`
    carry them).

    `vector` reads the version vector (default `store.version_vector`); `extra(replica_id,
    vector)` returns keys the vector answer carries between the vector and the
    advertisement (the server's node profiles). Store faults (`StoreError`) propagate:
    they are the caller's to answer (503, a failed node)."""
    try:
        if path == "/sync/version_vector":
            return 200, _vector(store, profile, vector, extra)
        if path == "/sync/ops":
            return 200, _ops(store, params, profile)
        if path == "/sync/artifact":
            return _artifact(store, params)
        if path == DIGESTS_PATH and EXT_CHAIN in profile.extensions:
            return 200, _digests(store, params)
    except ValidationError as exc:
        return 400, error_body(400, str(exc))
    return 404, error_body(404, f"no route {shorten(path)}; routes are {', '.join(SYNC_ROUTES)}")


def _vector(
    store: Any, profile: Profile, vector: VectorRead | None, extra: VectorExtra | None
) -> dict[str, Any]:
    replica_id = store.replica_id
    held = (vector or store.version_vector)()
    body: dict[str, Any] = {"replica_id": replica_id, "version_vector": held}
    if extra is not None:
        body.update(extra(replica_id, held))
    advert = profile.advertisement()
    if advert is not None:
        if EXT_CHAIN in profile.extensions:
            tips = store.chain_tips(held)
            advert[ADVERTISED_TIPS] = {o: [seq, digest.hex()] for o, (seq, digest) in tips.items()}
            advert[ADVERTISED_TIP_SIGS] = {o: sig.hex() for o, sig in
                                           store.tip_signatures(tips).items()}
            advert[ADVERTISED_KEYS] = {o: key.hex() for o, key in store.public_keys().items()
                                       if held.get(o)}  # only origins we hold ops of
        body[ADVERTISEMENT_KEY] = advert
    return body


def _ops(store: Any, params: Mapping[str, Any], profile: Profile) -> dict[str, Any]:
    asked = extensions_asked(params, profile)
    after = int_param(params, "after", 0)
    limit = int_param(params, "limit", UPSTREAM_PAGE_LIMIT)
    origin = str(params.get("origin") or "")
    if not origin:
        raise ValidationError("origin must be a non-empty replica id")
    if after < 0:
        raise ValidationError(f"after={after} must be a non-negative integer")
    if limit < 1:
        raise ValidationError(f"limit={limit} must be a positive integer")
    large = EXT_LARGE_PAGES in asked
    cap = profile.max_page if large else UPSTREAM_PAGE_LIMIT
    limit = min(limit, cap)
    chained = EXT_CHAIN in asked
    # what the page may spend on events and artifacts: the whole answer stays within
    # `max_page_bytes` (RFC 004 §8.1), its envelope and chain counted at their bound
    usable = profile.max_page_bytes - PAGE_ENVELOPE_BYTES
    room = usable - (chain_bound(limit, usable) if chained else 0)
    if large:  # negotiated: the page stops at the byte budget (always at least one event)
        events, sizes = budget_page(store, origin, after, limit, cap, room)
    else:  # an upstream client gets exactly upstream's page
        events = store.list_ops(origin, after, limit, max_limit=cap)
        sizes = None
    artifacts = None
    if EXT_INLINE_ARTIFACTS in asked:
        events, artifacts = with_artifacts(
            store, events, sizes or [event_size(e) for e in events], room,
            profile.inline_artifact_bytes, cut=large)
    chain = _page_chain(store, origin, after, events) if chained else None
    body: dict[str, Any] = {"origin": origin, "events": events, "count": len(events)}
    if artifacts is not None:
        body["artifacts"] = named_by(artifacts, events)  # a chain may have cut the page
    if chain is not None:
        body["chain"] = chain
    return body


def chain_bound(limit: int, budget: int | None = None) -> int:
    """The most bytes a page of `limit` events (and, given a byte `budget`, of as many as
    fit in it) spends on its `chain`: `prev` and a signature at each checkpoint and at
    the last op."""
    if budget is not None:
        limit = min(limit, max(budget, 0) // MIN_EVENT_BYTES + 1)
    return CHAIN_PREV_BYTES + (limit // CHECKPOINT + 2) * CHAIN_SIG_BYTES


def _page_chain(store: Any, origin: str, after: int, events: list[dict[str, Any]]
                ) -> dict[str, Any]:
    """The page's `chain`: our chain at `after`, and the signatures we hold at its
    checkpoints and last op; a page with signatures is cut to end at a signed op
    (`logsync/pagechain.py`), in place."""
    prev = store.chain_digests_at(origin, [after])[0]
    seqs = [event["origin_seq"] for event in events]
    # the signatures a page can carry: at its checkpoints and last op; only when it holds
    # none of those (a short page between a relay's checkpoints), any in its range
    held = store.chain_signatures(origin, [q for q in seqs if carries_signature(q, seqs[-1])]
                                  ) if seqs else {}
    if seqs and not held:
        held = store.chain_signatures(origin, seqs)
    if held:
        del events[signed_end(seqs, set(held)):]
        seqs = seqs[:len(events)]
    last = seqs[-1] if seqs else 0
    return {"prev": prev.hex() if prev is not None else None,
            "sigs": [[seq, held[seq].hex()] for seq in seqs
                     if seq in held and carries_signature(seq, last)]}


def _digests(store: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """`/sync/digests?origin=O&at=s1,s2,...`: our chain at each seq (`D(s)`, see
    `logsync/store/chainreads.py`), null above the chain's tip."""
    origin = str(params.get("origin") or "")
    if not is_replica_id(origin):
        raise ValidationError(f"origin={shorten(origin)} is not a replica id")
    raw = str(params.get("at") or "")
    parts = raw.split(",") if raw else []
    if not 1 <= len(parts) <= MAX_DIGESTS_PER_REQUEST:
        raise ValidationError(f"at={shorten(raw)} must list 1 to {MAX_DIGESTS_PER_REQUEST} "
                              "seqs, comma-separated")
    seqs = [int_param({"at": part}, "at", -1) for part in parts]
    if any(not 0 <= seq <= MAX_SEQ for seq in seqs):
        raise ValidationError(f"at={shorten(raw)} must hold seqs in 0..{MAX_SEQ}")
    found = store.chain_digests_at(origin, seqs)
    return {"origin": origin, "digests": [[seq, d.hex() if d is not None else None]
                                          for seq, d in zip(seqs, found, strict=True)]}


def _artifact(store: Any, params: Mapping[str, Any]) -> Answer:
    artifact_id = str(params.get("id") or "")
    if not artifact_id:
        raise ValidationError("id must be a non-empty artifact id")
    artifact = store.get_artifact(artifact_id)
    if artifact is None:
        return 404, error_body(404, f"artifact {artifact_id!r} not found")  # upstream's sentence
    return 200, {"artifact": artifact}


# ── parameters ────────────────────────────────────────────────────────


def int_param(params: Mapping[str, Any], name: str, default: int) -> int:
    """An integer query value: ASCII decimal digits, optionally after `-` (so a negative
    value gets its own sentence); absent or empty means `default` (as upstream). Python's
    `int` would also take `+5`, ` 5`, `1_0` and non-ASCII digits: a second implementation
    must not have to guess that (RFC 004 §7.2)."""
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    text = str(raw)
    if not _DECIMAL.fullmatch(text):
        raise ValidationError(f"{name}={shorten(raw)} is not an integer")
    try:
        return int(text)
    except ValueError:  # a value beyond Python's int-from-text digit limit
        raise ValidationError(f"{name}={shorten(raw)} is not an integer") from None


_DECIMAL = re.compile(r"[0-9]+|-[1-9][0-9]*")  # `-0` is no integer of the wire either


def extensions_asked(params: Mapping[str, Any], profile: Profile) -> set[str]:
    """The extensions `ext=a,b` asks for that this profile honours (case-insensitive;
    unknown names are ignored so a newer peer never breaks us)."""
    raw = str(params.get(EXTENSIONS_PARAM) or "")
    names = {name.strip().lower() for name in raw.split(",")}
    return names & set(profile.extensions)


# ── the page and its artifacts ────────────────────────────────────────


# `json.dumps(payload, ensure_ascii=False)` builds an encoder on every call (only the
# all-defaults call shares one): half the cost of sizing a 2 KB op for the page budget.
_encode_json = json.JSONEncoder(ensure_ascii=False).encode


def json_bytes(payload: Any) -> bytes:
    """Upstream's encoding (default separators, non-ASCII kept, UTF-8): what the server
    sends and the page budget measures, `json.dumps(payload, ensure_ascii=False)`. Raises
    `ValueError` (never `RecursionError`) when the payload cannot be encoded."""
    try:
        return _encode_json(payload).encode("utf-8")
    except RecursionError:
        raise ValueError("the payload nests too deeply to encode as JSON") from None


def event_size(event: Mapping[str, Any]) -> int:
    """The event's JSON size in the page (an unencodable one counts as its body)."""
    try:
        return len(json_bytes(event)) + EVENT_OVERHEAD_BYTES
    except ValueError:
        return len(str(event.get("body", "")).encode("utf-8", "replace")) + EVENT_OVERHEAD_BYTES


def budget_page(
    store: Any, origin: str, after: int, limit: int, cap: int, budget: int
) -> tuple[list[dict[str, Any]], list[int]]:
    """Up to `limit` ops of `origin` above `after`, read in batches, stopping before the
    one that would push the page's encoded events past `budget` bytes (the first op is
    always included, so a page always advances), and the bytes each takes."""
    events: list[dict[str, Any]] = []
    sizes: list[int] = []
    spent = 0
    cursor = after
    while len(events) < limit:
        want = min(PAGE_READ_BATCH, limit - len(events))
        batch = store.list_ops(origin, cursor, want, max_limit=cap)
        for event in batch:
            size = event_size(event)
            if events and spent + size > budget:
                return events, sizes
            events.append(event)
            sizes.append(size)
            spent += size
        if len(batch) < want:
            return events, sizes
        cursor = batch[-1]["origin_seq"]
    return events, sizes


def with_artifacts(store: Any, events: list[dict[str, Any]], sizes: list[int], room: int,
                   most: int, *, cut: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The page's events and the artifacts inline with them (RFC 004 §8.1): in order, each
    event with the artifacts it names not inline yet, while events and artifacts stay
    within `room` bytes of JSON (artifacts within `most`). At the first event that does not
    fit with its artifacts a budgeted page (`cut`) ends - holding that event alone, without
    them, if it is the first - and any other page keeps its events and inlines no more.
    Artifacts are ordered by id; the puller fetches the ones left out one by one."""
    wanted = {a for event in events for a in event.get("artifact_ids") or []}
    held: dict[str, tuple[dict[str, Any], int]] = {}
    for artifact in store.get_artifacts(wanted) if wanted else []:
        try:
            held[artifact["id"]] = (artifact, len(json_bytes(artifact)) + EVENT_OVERHEAD_BYTES)
        except ValueError:
            continue  # left out: `/sync/artifact` answers it, or names why it cannot
    kept: list[dict[str, Any]] = []
    inline: dict[str, dict[str, Any]] = {}
    spent = inlined = 0
    for event, size in zip(events, sizes, strict=True):
        new = {a for a in event.get("artifact_ids") or [] if a in held and a not in inline}
        extra = sum(held[a][1] for a in new)
        if spent + size + inlined + extra > room or inlined + extra > most:
            if cut:
                if not kept:
                    kept.append(event)
                return kept, [inline[a] for a in sorted(inline)]
            kept.extend(events[len(kept):])
            break
        kept.append(event)
        spent += size
        inlined += extra
        inline.update((a, held[a][0]) for a in new)
    return kept, [inline[a] for a in sorted(inline)]


def named_by(artifacts: list[dict[str, Any]], events: list[dict[str, Any]]
             ) -> list[dict[str, Any]]:
    """The artifacts some event of the page names."""
    names = {a for event in events for a in event.get("artifact_ids") or []}
    return [a for a in artifacts if a["id"] in names]


@dataclass(frozen=True)
class PushPage:
    """A page to push (`push.py`): the encoded body, how many ops it holds, the last
    one's seq, and whether it fits (`complete`: every artifact its ops name that we hold
    is inline, and the body is within the receiver's cap)."""

    body: bytes
    count: int
    last_seq: int
    complete: bool


def push_page(store: Any, origin: str, after: int, limit: int, max_bytes: int,
              sender: str) -> PushPage:
    """Our page of `origin` above `after` as `/sync/ops` serves it with `chain` and
    inline artifacts (one rule for both directions), plus `after` and `from`, encoded."""
    cap = min(limit, LARGE_PAGE_CEILING)
    # room as `_ops` counts it, less the key the page carries (64 hex and its keys)
    usable = max_bytes - PAGE_ENVELOPE_BYTES - PUSH_KEY_BYTES
    room = usable - chain_bound(cap, usable)
    events, sizes = budget_page(store, origin, after, cap, LARGE_PAGE_CEILING, room)
    events, artifacts = with_artifacts(store, events, sizes, room, max_bytes, cut=True)
    chain = _page_chain(store, origin, after, events)  # may cut the page at a signed op
    artifacts = named_by(artifacts, events)
    named = {a for event in events for a in event.get("artifact_ids") or []}
    held = len(store.get_artifacts(named)) if named else 0
    key = store.origin_key(origin) if events else None
    page: dict[str, Any] = {"origin": origin, "after": after, "from": sender, "events": events,
                            "count": len(events), "artifacts": artifacts, "chain": chain}
    if key is not None:  # as the vector answer publishes it, so the receiver can verify
        page[ADVERTISEMENT_KEY] = {ADVERTISED_KEYS: {origin: key.hex()}}
    body = json_bytes(page)
    return PushPage(body, len(events), events[-1]["origin_seq"] if events else after,
                    len(artifacts) == held and len(body) <= max_bytes)
