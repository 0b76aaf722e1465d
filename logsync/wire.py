"""The wire of `/sync/*` as the puller reads it: constants, request steps, and the
checks of every answer a peer sends (vector, ops page, artifact), parsed once at the
edge. Pure: no I/O. The serving side (`logsync/server/`) shares the constants.

Extensions are additive and negotiated: a peer advertises them under
`ADVERTISEMENT_KEY` in its version_vector answer, `"logsync": {"version": ...,
"extensions": ["msgpack", "large_pages", "inline_artifacts", ...], "max_page":
5000, "max_page_bytes": ...}`; a puller asks for them on `/sync/ops` with
`ext=large_pages,inline_artifacts` and for msgpack with `Accept`. A peer that
advertises nothing (a MemPalace hub) gets exactly the upstream requests.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logsync.errors import PeerProtocolError, shorten
from logsync.ids import is_replica_id
from logsync.model import MAX_SEQ

UPSTREAM_PAGE_LIMIT = 500
LARGE_PAGE_CEILING = 5000
ADVERTISEMENT_KEY = "logsync"
EXT_MSGPACK = "msgpack"
EXT_INLINE_ARTIFACTS = "inline_artifacts"
EXT_LARGE_PAGES = "large_pages"
# Per-origin hash chains (`logsync/chain.py`): the vector answer's advertisement carries
# `"tips": {origin: [seq, digest hex]}`, a page asked with `ext=chain` carries
# `"chain": {"prev": digest hex}` (the chain at `after`), and `/sync/digests` answers
# the chain at given seqs (the divergence search, `logsync/divergence.py`).
EXT_CHAIN = "chain"
ADVERTISED_TIPS = "tips"
# ... and `"tip_sigs": {origin: signature hex}`, the origin's signature of its tip where
# the server holds one: a replica holding the same chain without it (ops that came
# through a MemPalace hub, which cannot carry signatures) adopts it, so it can serve
# the origin on to peers that verify (`Store.adopt_tip_signatures`).
ADVERTISED_TIP_SIGS = "tip_sigs"
# A subscriber names its replica id on `/logstream/stream`, so a logsync server sends it no
# frame for an op it is known to hold (`logsync.holders`); others ignore the header.
REPLICA_HEADER = "X-Logsync-Replica"
# ... and `"keys": {origin: public key hex}`, every origin key the server knows (its own
# and those it pinned), so keys spread with the ops they sign (`logsync/pagechain.py`).
ADVERTISED_KEYS = "keys"
DIGESTS_PATH = "/sync/digests"
MAX_DIGESTS_PER_REQUEST = 64
# Two-way reconcile (`logsync/push.py`, `logsync/pushed.py`): a replica advertising
# `push` accepts `POST /sync/push`, a `/sync/ops` page with `chain` and every artifact
# it names inline, from an authenticated peer, applied as a pulled page would be.
EXT_PUSH = "push"
PUSH_PATH = "/sync/push"
ADVERTISED_MAX_PUSH_BYTES = "max_push_bytes"
# Snapshot join (`logsync/snapshot/`, RFC 004 §7.6): `GET /sync/snapshot` streams a
# consistent copy of the whole store to a replica whose store is empty.
EXT_SNAPSHOT = "snapshot"
ADVERTISED_MAX_PAGE = "max_page"
ADVERTISED_MAX_PAGE_BYTES = "max_page_bytes"
# `/sync/ops?...&ext=a,b` asks for extensions; `inline_artifacts` adds
# `"artifacts": [<artifact>...]` to the page: artifacts its events name (the
# server may leave some out, which we then fetch one by one).
EXTENSIONS_PARAM = "ext"


@dataclass(frozen=True)
class Request:
    """One GET to the peer (a POST of `body`, an object sent as JSON, when it has one).
    `accept_msgpack` maps to `Accept: application/msgpack`; `missing_ok` means a 404 is
    an answer (None), not an error. `until` (a page request's hint, not sent): the
    origin_seq the round pulls the origin up to, so a driver may fetch on past a page the
    peer cut short of `limit` (its byte budget) while the origin has more."""

    path: str
    params: dict[str, Any] = field(default_factory=dict)
    accept_msgpack: bool = False
    missing_ok: bool = False
    body: Any = None
    until: int | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Batch:
    """Independent requests the driver may perform concurrently; answered by a list in
    order, a failed request by its `PeerError` instance."""

    requests: tuple[Request, ...]


Step = Request | Batch


@dataclass(frozen=True)
class Extensions:
    """What we will use with one peer: only what it advertised and we allow."""

    msgpack: bool = False
    inline_artifacts: bool = False
    max_page_limit: int = UPSTREAM_PAGE_LIMIT
    # The peer stops a large page at a byte budget (`max_page_bytes`): a page shorter than
    # asked then means "the rest in the next page", not "nothing more".
    page_budget: bool = False
    chain: bool = False
    push: bool = False  # the peer takes `POST /sync/push` (never used by a pull)
    max_push_bytes: int = 0
    snapshot: bool = False  # the peer serves `GET /sync/snapshot` (used only to join)

    def names(self) -> list[str]:
        used = [EXT_MSGPACK] if self.msgpack else []
        used += [EXT_INLINE_ARTIFACTS] if self.inline_artifacts else []
        used += [EXT_LARGE_PAGES] if self.max_page_limit > UPSTREAM_PAGE_LIMIT else []
        used += [EXT_CHAIN] if self.chain else []
        used += [EXT_PUSH] if self.push else []
        return used


def parse_extensions(answer: Mapping[str, Any]) -> Extensions:
    """Read a peer's advertisement; anything malformed means 'no extensions'."""
    advert = answer.get(ADVERTISEMENT_KEY)
    if not isinstance(advert, dict) or not isinstance(advert.get("extensions"), list):
        return Extensions()
    names = {name for name in advert["extensions"] if isinstance(name, str)}
    limit = advert.get(ADVERTISED_MAX_PAGE)
    large = EXT_LARGE_PAGES in names and _is_count(limit) and limit > UPSTREAM_PAGE_LIMIT
    budget = advert.get(ADVERTISED_MAX_PAGE_BYTES)
    push_bytes = advert.get(ADVERTISED_MAX_PUSH_BYTES)
    push = EXT_PUSH in names and EXT_CHAIN in names and _is_count(push_bytes) and push_bytes > 0
    return Extensions(
        msgpack=EXT_MSGPACK in names,
        inline_artifacts=EXT_INLINE_ARTIFACTS in names,
        max_page_limit=min(limit, LARGE_PAGE_CEILING) if large else UPSTREAM_PAGE_LIMIT,
        page_budget=large and _is_count(budget) and budget > 0,
        chain=EXT_CHAIN in names,
        push=push,
        max_push_bytes=push_bytes if push else 0,
        snapshot=EXT_SNAPSHOT in names,
    )


def parse_tips(answer: Mapping[str, Any]) -> dict[str, tuple[int, bytes]]:
    """The advertised chain tips, origin -> (seq, 32-byte digest); entries that are not a
    replica id with `[seq in 1..MAX_SEQ, 64 hex]` are left out (a tip is a hint to
    compare, never a reason to refuse the vector)."""
    advert = answer.get(ADVERTISEMENT_KEY)
    raw = advert.get(ADVERTISED_TIPS) if isinstance(advert, dict) else None
    if not isinstance(raw, dict):
        return {}
    tips: dict[str, tuple[int, bytes]] = {}
    for origin, tip in raw.items():
        if not is_replica_id(origin) or not isinstance(tip, list) or len(tip) != 2:
            continue
        seq, digest = tip[0], parse_digest(tip[1])
        if _is_count(seq) and 1 <= seq <= MAX_SEQ and digest is not None:
            tips[origin] = (seq, digest)
    return tips


def parse_tip_signatures(answer: Mapping[str, Any]) -> dict[str, bytes]:
    """The advertised tip signatures (64 bytes each); malformed entries are left out."""
    advert = answer.get(ADVERTISEMENT_KEY)
    raw = advert.get(ADVERTISED_TIP_SIGS) if isinstance(advert, dict) else None
    if not isinstance(raw, dict):
        return {}
    sigs = {o: parse_digest(sig, 64) for o, sig in raw.items() if is_replica_id(o)}
    return {origin: sig for origin, sig in sigs.items() if sig is not None}


def parse_keys(answer: Mapping[str, Any]) -> dict[str, bytes]:
    """The advertised origin keys (32 bytes each); malformed entries are left out."""
    advert = answer.get(ADVERTISEMENT_KEY)
    raw = advert.get(ADVERTISED_KEYS) if isinstance(advert, dict) else None
    if not isinstance(raw, dict):
        return {}
    keys = {origin: parse_digest(key) for origin, key in raw.items() if is_replica_id(origin)}
    return {origin: key for origin, key in keys.items() if key is not None}


def parse_digest(value: object, size: int = 32) -> bytes | None:
    """A digest, key (32 bytes) or signature (`size` 64) as the wire writes it, lowercase
    hex; None for anything else."""
    if not isinstance(value, str) or len(value) != 2 * size:
        return None
    try:
        digest = bytes.fromhex(value)
    except ValueError:
        return None
    return digest if digest.hex() == value else None


def parse_digests_answer(
    answer: object, peer: str, origin: str, seqs: tuple[int, ...]
) -> list[bytes | None]:
    """The peer's chain digests at `seqs` from a `/sync/digests` answer
    (`{"origin": O, "digests": [[seq, hex or null], ...]}` in the order asked; null: the
    peer's chain does not reach that seq), else PeerProtocolError."""
    where = f"peer {peer}: {DIGESTS_PATH} for origin {origin}"
    rows = answer.get("digests") if isinstance(answer, dict) else None
    if not isinstance(rows, list) or len(rows) != len(seqs):
        raise PeerProtocolError(f"{where} answered {shorten(answer)}; expected "
                                f"{len(seqs)} [seq, digest] pairs", peer=peer)
    out: list[bytes | None] = []
    for seq, row in zip(seqs, rows, strict=True):
        digest = parse_digest(row[1]) if isinstance(row, list) and len(row) == 2 else None
        if not isinstance(row, list) or len(row) != 2 or row[0] != seq or (
                digest is None and row[1] is not None):
            raise PeerProtocolError(f"{where} has {shorten(row)} where [{seq}, <64 hex or "
                                    "null>] belongs", peer=peer)
        out.append(digest)
    return out


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class PeerVector:
    """A validated `/sync/version_vector` answer."""

    replica_id: str
    vector: dict[str, int]
    profile: dict[str, Any] | None
    profiles: dict[str, Any]
    extensions: Extensions
    skipped_origins: dict[str, str]
    tips: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    keys: dict[str, bytes] = field(default_factory=dict)
    tip_sigs: dict[str, bytes] = field(default_factory=dict)


def skipped_sentence(skipped: Mapping[str, str]) -> str | None:
    """One sentence on a peer's vector entries this replica cannot pull (an origin that is
    not a replica id, a count out of range), naming the first: None when there are none.
    One line however many: a hostile vector must not flood a log."""
    named = {o: r for o, r in skipped.items() if o != SKIPPED_MORE}
    if not named:
        return None
    origin, reason = min(named.items())
    over = SKIPPED_MORE in skipped  # more than were named
    count = f"more than {len(named)}" if over else str(len(named))
    rest = " and the rest" if over else f" and {len(named) - 1} more" if len(named) > 1 \
        else ""
    return (f"its vector lists {count} origin{'s' if count != '1' else ''} this "
            f"replica cannot pull, skipped: {shorten(origin)} ({reason}){rest}")


def parse_vector_answer(answer: object, peer: str) -> PeerVector:
    """Validate the peer's vector answer or raise PeerProtocolError naming the problem."""
    where = f"peer {peer}: /sync/version_vector"
    if not isinstance(answer, dict):
        raise PeerProtocolError(
            f"{where} answered {type(answer).__name__}, not an object", peer=peer
        )
    replica_id = answer.get("replica_id")
    if not is_replica_id(replica_id):
        raise PeerProtocolError(
            f"{where} has replica_id={shorten(replica_id)}; expected 'rep_' and 12 or 32 hex",
            peer=peer,
        )
    raw = answer.get("version_vector")
    if not isinstance(raw, dict):
        raise PeerProtocolError(
            f"{where} has version_vector={shorten(raw)}; expected an object of origin -> count",
            peer=peer,
        )
    vector, skipped = _split_vector(raw, where, peer)
    profile = answer.get("profile")
    profiles = answer.get("profiles")
    return PeerVector(
        replica_id=replica_id,
        vector=vector,
        profile=profile if isinstance(profile, dict) else None,
        profiles=profiles if isinstance(profiles, dict) else {},
        extensions=parse_extensions(answer),
        skipped_origins=skipped,
        tips=parse_tips(answer),
        keys=parse_keys(answer),
        tip_sigs=parse_tip_signatures(answer),
    )


# At most this many skipped vector entries are named; the rest are one count under
# SKIPPED_MORE (a key no replica id can be).
MAX_SKIPPED_LISTED = 100
SKIPPED_MORE = "(more)"


def _split_vector(
    raw: dict[str, Any], where: str, peer: str
) -> tuple[dict[str, int], dict[str, str]]:
    vector: dict[str, int] = {}
    skipped: dict[str, str] = {}
    unlisted = 0
    for origin, top in raw.items():
        bad = not is_replica_id(origin) or not _is_count(top) or top > MAX_SEQ
        if not bad:
            vector[origin] = top
        elif len(skipped) >= MAX_SKIPPED_LISTED:
            unlisted += 1  # a hostile vector's junk is counted, not kept (reports, state)
        elif not is_replica_id(origin):
            skipped[str(origin)[:80]] = "origin is not a replica id ('rep_' and 12 or 32 hex)"
        else:
            skipped[origin] = (f"version_vector entry {shorten(top)} is not an integer "
                               f"in 0..2**62")
    if unlisted:
        skipped[SKIPPED_MORE] = f"{unlisted} more entries this replica cannot pull"
    return vector, skipped


@dataclass(frozen=True)
class OpsPage:
    """A validated `/sync/ops` answer: at most `limit` ops, all of `origin`, origin_seq
    strictly increasing above `after`; `inline` holds the artifacts served with it (by
    id) when they were asked for."""

    origin: str
    after: int
    events: list[dict]
    inline: dict[str, dict]
    prev: bytes | None = None  # the peer's chain digest at `after` (`ext=chain`)
    signatures: dict[int, bytes] = field(default_factory=dict)  # seq -> the origin's signature

    @property
    def last_seq(self) -> int:
        return self.events[-1]["origin_seq"] if self.events else self.after


def parse_page(
    answer: object, peer: str, origin: str, after: int, limit: int, *, inline_asked: bool = False,
    chain_asked: bool = False,
) -> OpsPage:
    """Validate one `/sync/ops` answer or raise PeerProtocolError naming the problem.
    An `artifacts` key we did not ask for is not ours to interpret and is ignored."""
    where = f"peer {peer}: /sync/ops page for origin {origin} after {after}"

    def fail(problem: str) -> PeerProtocolError:
        return PeerProtocolError(f"{where} {problem}; nothing of it was stored", peer=peer)

    if not isinstance(answer, dict) or not isinstance(answer.get("events"), list):
        raise fail("is not an object with a list 'events'")
    events = answer["events"]
    if len(events) > limit:
        raise fail(f"holds {len(events)} ops but at most {limit} were asked for")
    previous = after
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise fail(f"has events[{index}]={shorten(event)}, not an object")
        if event.get("origin_replica") != origin:
            raise fail(f"has events[{index}] of origin {shorten(event.get('origin_replica'))}")
        seq = event.get("origin_seq")
        if not _is_count(seq) or seq <= previous:
            raise fail(
                f"has events[{index}].origin_seq={shorten(seq)}; origin_seq must be an "
                f"integer above {previous} (strictly increasing, above 'after')"
            )
        previous = seq
    inline = _inline_artifacts(answer.get("artifacts") if inline_asked else None, fail)
    prev = None
    if chain_asked:
        chain = answer.get("chain")
        prev = parse_digest(chain.get("prev")) if isinstance(chain, dict) else None
        if prev is None and events:
            raise fail(f"has chain={shorten(chain)}; expected {{'prev': <64 hex>}}")
        signatures = _signatures(chain.get("sigs") if isinstance(chain, dict) else None,
                                 events, fail)
        return OpsPage(origin, after, events, inline, prev, signatures)
    return OpsPage(origin, after, events, inline, prev)


def _signatures(
    raw: object, events: list[dict], fail: Callable[[str], PeerProtocolError]
) -> dict[int, bytes]:
    """A page's `sigs`: `[[seq, <128 hex>], ...]`, each seq one of the page's ops
    (`events`, checked strictly increasing: found by bisection, as a page usually
    carries one signature and a set of its thousands of seqs cost more than the rest)."""
    if raw is None:
        return {}
    if not isinstance(raw, list) or len(raw) > len(events):
        raise fail(f"has chain.sigs={shorten(raw)}, not a list of at most one per op")
    out: dict[int, bytes] = {}
    for entry in raw:
        signature = parse_digest(entry[1], 64) if isinstance(entry, list) and len(entry) == 2 \
            else None
        if signature is None or type(entry[0]) is not int or not _holds_seq(events, entry[0]):
            raise fail(f"has chain.sigs entry {shorten(entry)}; expected [seq of the page, "
                       "<128 hex>]")
        out[entry[0]] = signature
    return out


def _holds_seq(events: list[dict], seq: int) -> bool:
    """Whether one of `events` (strictly increasing `origin_seq`) has this seq."""
    at = bisect_left(events, seq, key=_seq_of)
    return at < len(events) and events[at]["origin_seq"] == seq


def _seq_of(event: dict) -> int:
    return event["origin_seq"]


def _inline_artifacts(
    raw: object, fail: Callable[[str], PeerProtocolError]
) -> dict[str, dict]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise fail(f"has artifacts={shorten(raw)}, not a list")
    inline: dict[str, dict] = {}
    for index, artifact in enumerate(raw):
        if not isinstance(artifact, dict) or not isinstance(artifact.get("id"), str):
            raise fail(f"has artifacts[{index}]={shorten(artifact)}, not an object with an id")
        inline[artifact["id"]] = artifact
    return inline


def parse_artifact_answer(answer: object, peer: str, artifact_id: str) -> dict | None:
    """The artifact in a `/sync/artifact` answer, None for a 404, else PeerProtocolError."""
    if answer is None:
        return None
    artifact = answer.get("artifact") if isinstance(answer, dict) else None
    if not isinstance(artifact, dict) or artifact.get("id") != artifact_id:
        raise PeerProtocolError(
            f"peer {peer}: /sync/artifact?id={artifact_id} answered {shorten(answer)}; "
            "expected {'artifact': {...}} with that id",
            peer=peer,
        )
    return artifact


@dataclass(frozen=True)
class ChangeFrame:
    """What one change-stream frame names: an op's (origin, origin_seq). A frame is a
    hint, never trusted: it only makes a puller ask sooner."""

    origin: str
    seq: int

    @classmethod
    def parse(cls, data: str | bytes) -> ChangeFrame | None:
        """The frame's event position; None if it has none, or if they are not a
        replica id and a seq in 1..MAX_SEQ."""
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if not isinstance(event, dict):
            return None
        origin, seq = event.get("origin_replica"), event.get("origin_seq")
        if is_replica_id(origin) and _is_count(seq) and 1 <= seq <= MAX_SEQ:
            return cls(origin, seq)
        return None
