"""The sync algorithm, sans-IO: one pull round against one peer, and when to pull.

A pull round is a generator (STYLE.md §1-2). It yields a `Request` ("GET this
path with these params") or a `Batch` of them, and receives the decoded answer
through `send()`: a dict, or None for a 404 on a request marked `missing_ok`
(a `Batch` receives a list of answers in order, where a request that failed is
answered by its `PeerError`, so one slow or failing origin does not cost the others
their answers; a driver may instead throw the first failure in). The driver
translates transport failures into `errors.PeerError`s and `throw()`s them in. The
round returns a `RoundReport`. It calls the store itself (`version_vector`,
`missing_artifacts`, `apply_remote`); it never touches sockets, clocks,
threads or sleeps, so the httpx client and the simulator run the same code.

Rules of a round:

1. Fetch `/sync/version_vector`; anything but `{replica_id, version_vector:
   {origin: int >= 0}}` is a `PeerProtocolError`. Origins whose id is not
   replica-id shaped are skipped and reported, so one bad origin a hub holds
   cannot wedge every other origin (invariant 6).
2. Per origin the peer holds more of, pull `(ours, theirs]` in origin_seq order
   (our own origin too: see `missing_ranges`),
   one `/sync/ops` page at a time. A page must be an object with a list
   `events`, every op of the requested origin, origin_seq strictly increasing
   and above `after`, no longer than asked; otherwise nothing of it is stored.
3. Before applying a page, obtain the artifacts it names that we lack: from
   the page itself when the peer returned them inline, else one
   `/sync/artifact` request each. A 404 is not fatal: the store quarantines
   the op that names it, and other origins go on.
4. One `store.apply_remote` call per page (one transaction).
5. An origin stops when it is caught up, when a page is empty or shorter than
   asked (the peer has no more right now, whatever its vector promised), or
   when the store stops it (quarantine, id collision). A full valid page
   advances origin_seq by at least `limit`, so an origin takes at most
   ceil((theirs - ours) / limit) + 1 pages: a lying vector cannot loop us.
6. A fault stays with its origin (invariant 9): a page-level error for one
   origin (a malformed or lying page, a 4xx/5xx or a reset on its request)
   stops that origin for this round with the reason in its `OriginProgress`
   (`failed`), and the round goes on with the others. An answer too large to
   take (`PeerTooLargeError`) halves that origin's page size and asks again,
   down to one op. A 401/403 or a local store fault ends the round, and so do
   `TRANSIENT_ORIGINS_TO_GIVE_UP` transient failures in a row (the peer is gone).
7. Everything is bounded: vector entries above `MAX_SEQ` skip their origin, and
   a round applies at most `MAX_OPS_PER_ROUND` ops, one origin at most
   `MAX_OPS_PER_ORIGIN` (`capped`: the rest next round, at once), so a peer
   serving valid pages forever can neither hold a round open nor starve the
   origins after its own.

Extensions are additive and negotiated (wire owned by `logsync/server.py`): a
peer advertises them under `ADVERTISEMENT_KEY` in its version_vector answer,
`"logsync": {"version": ..., "extensions": ["msgpack", "large_pages",
"inline_artifacts", ...], "max_page": 5000}`; we ask for them on `/sync/ops`
with `ext=large_pages,inline_artifacts` and for msgpack with `Accept`. A peer
that advertises nothing (a MemPalace hub) gets exactly the upstream requests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from logsync.errors import (
    PeerAuthError,
    PeerError,
    PeerProtocolError,
    PeerTooLargeError,
    PeerTransientError,
    StoreError,
    ValidationError,
    shorten,
)
from logsync.model import MAX_SEQ
from logsync.replica import is_replica_id

UPSTREAM_PAGE_LIMIT = 500
# A full round fetches the first pages of this many origins side by side (memory stays
# bounded by this many pages, not by the backlog).
FIRST_PAGES_AT_ONCE = 4
LARGE_PAGE_CEILING = 5000
MAX_OPS_PER_ROUND = 250_000  # a round ends after this many ops; the next round goes on
MAX_OPS_PER_ORIGIN = 50_000  # one origin's share of a round, so an endless one starves none
TRANSIENT_ORIGINS_TO_GIVE_UP = 3

ADVERTISEMENT_KEY = "logsync"
EXT_MSGPACK = "msgpack"
EXT_INLINE_ARTIFACTS = "inline_artifacts"
EXT_LARGE_PAGES = "large_pages"
ADVERTISED_MAX_PAGE = "max_page"
# `/sync/ops?...&ext=a,b` asks for extensions; `inline_artifacts` adds
# `"artifacts": [<artifact>...]` to the page: artifacts its events name (the
# server may leave some out, which we then fetch one by one).
EXTENSIONS_PARAM = "ext"

STOP_CAUGHT_UP = "caught up"
STOP_EMPTY = "peer served no ops although its vector promised more"
STOP_SHORT = "peer served a short page before reaching its promised vector entry"
STOP_STORE = "store stopped this origin"
STOP_FAILED = "failed"
STOP_CAPPED = "round op cap reached; the rest next round"


class StoreLike(Protocol):
    """What a round needs from `logsync.store.Store`."""

    @property
    def replica_id(self) -> str: ...

    def version_vector(self) -> dict[str, int]: ...

    def own_seen_top(self) -> int: ...

    def missing_artifacts(self, ids: Iterable[str]) -> list[str]: ...

    def apply_remote(self, events: list[dict], artifacts: list[dict]) -> Any: ...


@dataclass(frozen=True)
class Request:
    """One GET to the peer. `accept_msgpack` maps to `Accept: application/msgpack`;
    `missing_ok` means a 404 is an answer (None), not an error."""

    path: str
    params: dict[str, Any] = field(default_factory=dict)
    accept_msgpack: bool = False
    missing_ok: bool = False


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

    def names(self) -> list[str]:
        used = [EXT_MSGPACK] if self.msgpack else []
        used += [EXT_INLINE_ARTIFACTS] if self.inline_artifacts else []
        used += [EXT_LARGE_PAGES] if self.max_page_limit > UPSTREAM_PAGE_LIMIT else []
        return used


def parse_extensions(answer: Mapping[str, Any]) -> Extensions:
    """Read a peer's advertisement; anything malformed means 'no extensions'."""
    advert = answer.get(ADVERTISEMENT_KEY)
    if not isinstance(advert, dict) or not isinstance(advert.get("extensions"), list):
        return Extensions()
    names = {name for name in advert["extensions"] if isinstance(name, str)}
    limit = advert.get(ADVERTISED_MAX_PAGE)
    large = EXT_LARGE_PAGES in names and _is_count(limit) and limit > UPSTREAM_PAGE_LIMIT
    return Extensions(
        msgpack=EXT_MSGPACK in names,
        inline_artifacts=EXT_INLINE_ARTIFACTS in names,
        max_page_limit=min(limit, LARGE_PAGE_CEILING) if large else UPSTREAM_PAGE_LIMIT,
    )


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
    )


def _split_vector(
    raw: dict[str, Any], where: str, peer: str
) -> tuple[dict[str, int], dict[str, str]]:
    vector: dict[str, int] = {}
    skipped: dict[str, str] = {}
    for origin, top in raw.items():
        if not is_replica_id(origin):
            skipped[str(origin)[:80]] = "origin is not a replica id ('rep_' and 12 or 32 hex)"
        elif not _is_count(top) or top > MAX_SEQ:
            skipped[origin] = (f"version_vector entry {shorten(top)} is not an integer "
                               f"in 0..2**62")
        else:
            vector[origin] = top
    return vector, skipped


def missing_ranges(
    local: Mapping[str, int], remote: Mapping[str, int], own: str, own_seen: int = 0
) -> list[tuple[str, int, int]]:
    """(origin, after, top) for every origin the peer holds more of.

    That includes our own origin only when the peer holds more of it than we have
    ever seen (`own_seen`: held, or refused as forged): this palace was restored
    from an older copy (or cloned). Then the whole of our own origin is compared
    from the start, once: ops we lost come back (the store records them as
    `restored_replica`), and any slot we re-used since the restore is found as a
    recorded `fork` rather than staying silently different. A slot already seen
    and refused does not start that comparison again on every round.
    """
    ranges = []
    for origin in sorted(remote):
        held = int(local.get(origin, 0))
        seen = max(held, own_seen) if origin == own else held
        if remote[origin] > seen:
            ranges.append((origin, 0 if origin == own else held, remote[origin]))
    return ranges


@dataclass
class OriginProgress:
    """What one round did for one origin."""

    origin: str
    start: int
    target: int
    reached: int
    pages: int = 0
    applied: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    artifacts: int = 0
    artifacts_missing: int = 0
    stop_reason: str = ""
    error_kind: str | None = None  # set when the origin failed this round (rule 6)

    @property
    def failed(self) -> bool:
        return self.error_kind is not None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RoundReport:
    """One round against one peer. The driver may pass one in to watch progress
    (it stays meaningful if the round fails midway) and adds `bytes_received`."""

    peer: str
    peer_replica: str | None = None
    remote_vector: dict[str, int] = field(default_factory=dict)
    remote_profile: dict[str, Any] | None = None
    remote_profiles: dict[str, Any] = field(default_factory=dict)
    extensions: list[str] = field(default_factory=list)
    negotiated: Extensions | None = None
    skipped_origins: dict[str, str] = field(default_factory=dict)
    origins: dict[str, OriginProgress] = field(default_factory=dict)
    local_vector_before: dict[str, int] = field(default_factory=dict)
    local_vector_after: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    bytes_received: int = 0
    ops_budget: int = MAX_OPS_PER_ROUND
    transient_streak: int = 0

    @property
    def capped(self) -> bool:
        """The round stopped at its op cap: more is owed right away."""
        return any(p.stop_reason == STOP_CAPPED for p in self.origins.values())

    def failed_origins(self) -> dict[str, str]:
        """Origins that failed this round (rule 6), with the reason."""
        return {o: p.stop_reason for o, p in self.origins.items() if p.failed}

    def total(self, name: str) -> int:
        """Sum of one OriginProgress counter over all origins."""
        return sum(getattr(progress, name) for progress in self.origins.values())

    @property
    def applied(self) -> int:
        return self.total("applied")

    @property
    def artifacts(self) -> int:
        return self.total("artifacts")

    @property
    def conflicts(self) -> int:
        return self.total("conflicts")

    @property
    def quarantined(self) -> int:
        return self.total("quarantined")

    def stopped_origins(self) -> dict[str, str]:
        """Origins the store stopped this round, with the reason."""
        return {
            origin: p.stop_reason
            for origin, p in self.origins.items()
            if p.stop_reason.startswith(STOP_STORE)
        }

    def as_upstream_stats(self, url: str) -> dict[str, Any]:
        """The per-peer stats dict upstream's `sync_with_peer` returns."""
        return {
            "peer_url": url,
            "peer_replica": self.peer_replica or "?",
            "pulled_events": self.applied,
            "pulled_artifacts": self.artifacts,
            "per_origin": {o: p.applied for o, p in self.origins.items() if p.applied},
            "remote_version_vector": dict(self.remote_vector),
            "remote_profile": self.remote_profile,
            "remote_profiles": dict(self.remote_profiles),
        }

    def as_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready (the upstream stats keys plus ours)."""
        totals = {k: self.total(k) for k in ("applied", "duplicates", "conflicts")}
        totals |= {k: self.total(k) for k in ("quarantined", "artifacts", "artifacts_missing")}
        return self.as_upstream_stats(self.peer) | {
            "extensions": list(self.extensions),
            "skipped_origins": dict(self.skipped_origins),
            "origins": {o: p.as_dict() for o, p in self.origins.items()},
            "totals": totals,
            "requests": self.requests,
            "bytes_received": self.bytes_received,
            "failed_origins": self.failed_origins(),
        }


RoundGen = Generator[Step, Any, RoundReport]


def pull_round(
    store: StoreLike,
    peer: str,
    *,
    page_limit: int | None = None,
    use_extensions: bool = True,
    batch_artifacts: bool = False,
    report: RoundReport | None = None,
    held_back: Collection[str] = (),
) -> RoundGen:
    """One anti-entropy round against `peer` (a name or URL used in messages).
    Origins in `held_back` (backing off after failures, see `OriginBackoff`) are
    left for a later round.

    `page_limit` None means as large as the peer allows (500 for upstream);
    `batch_artifacts` means the driver takes `Batch` steps: a page's artifact
    fetches go out as one, and so do the first pages of up to `FIRST_PAGES_AT_ONCE`
    origins, so origins are fetched side by side (applied one page at a time).
    """
    report = report if report is not None else RoundReport(peer=peer)
    report.requests += 1
    answer = yield Request("/sync/version_vector")
    remote = parse_vector_answer(answer, peer)
    ext = remote.extensions if use_extensions else Extensions()
    _fill_header(report, remote, ext)
    report.local_vector_before = dict(store.version_vector())
    limit = _effective_limit(page_limit, ext)
    ranges = [r for r in missing_ranges(report.local_vector_before, remote.vector,
                                        store.replica_id, store.own_seen_top())
              if r[0] not in held_back]
    group = FIRST_PAGES_AT_ONCE if batch_artifacts else 1
    for start in range(0, len(ranges), group):
        chunk = [OriginProgress(origin=o, start=a, target=t, reached=a)
                 for o, a, t in ranges[start : start + group]]
        report.origins.update((p.origin, p) for p in chunk)
        firsts: list[Any] = [None] * len(chunk)
        if len(chunk) > 1 and report.ops_budget > 0:
            report.requests += len(chunk)
            try:
                firsts = yield Batch(tuple(_page_request(p, ext, limit) for p in chunk))
            except ORIGIN_SCOPED_ERRORS:
                # One origin's first page failed: ask each on its own, so the failure
                # stays with that origin (rule 6).
                firsts = [None] * len(chunk)
        for progress, first in zip(chunk, firsts, strict=True):
            yield from pull_origin(store, peer, progress, ext, limit, batch_artifacts, report,
                                   first=first)
    report.local_vector_after = dict(store.version_vector())
    return report


def _page_request(progress: OriginProgress, ext: Extensions, limit: int) -> Request:
    """The `/sync/ops` request for an origin's next page (extensions only if advertised)."""
    params: dict[str, Any] = {"origin": progress.origin, "after": progress.reached, "limit": limit}
    asked = [EXT_LARGE_PAGES] if limit > UPSTREAM_PAGE_LIMIT else []
    asked += [EXT_INLINE_ARTIFACTS] if ext.inline_artifacts else []
    if asked:
        params[EXTENSIONS_PARAM] = ",".join(asked)
    return Request("/sync/ops", params, accept_msgpack=ext.msgpack)


def choose_targets(
    notified: Mapping[str, int],
    local: Mapping[str, int],
    own: str,
    inflight: Mapping[str, int],
    *,
    extensions_known: bool,
    since_full: float,
    interval: float,
) -> dict[str, int] | None:
    """What a round started by change notifications should pull.

    A notification names (origin, origin_seq) pairs -- the events in the peer's
    stream frames. Returns the origins (and how far) to pull without fetching the
    vector first, or None for a full anti-entropy round: when nothing was notified
    (the timer is due: anti-entropy), when we do not know the peer's extensions yet
    (no full round so far) or the last full round is two intervals old. Our own
    origin and origins already being pulled that far (from another peer) are left
    out; an empty dict means the notifications named nothing we lack.
    """
    if not notified or not extensions_known or since_full >= 2 * interval:
        return None
    return {
        origin: top
        for origin, top in sorted(notified.items())
        if origin != own and top > local.get(origin, 0) and top > inflight.get(origin, 0)
    }


def targeted_origin(
    store: StoreLike,
    peer: str,
    origin: str,
    top: int,
    ext: Extensions,
    report: RoundReport,
    *,
    page_limit: int | None = None,
    batch_artifacts: bool = False,
    held: int | None = None,
) -> Generator[Step, Any, OriginProgress]:
    """Pull one notified origin up to `top`, with no vector fetch: a targeted round
    runs one of these per origin chosen by `choose_targets`, side by side. `held` is
    our vector entry for the origin if the caller has it (saves a vector query)."""
    if held is None:
        held = int(store.version_vector().get(origin, 0))
    progress = OriginProgress(origin=origin, start=held, target=top, reached=held)
    report.origins[origin] = progress
    if top <= held:
        progress.stop_reason = STOP_CAUGHT_UP
        return progress
    limit = _effective_limit(page_limit, ext)
    return (yield from pull_origin(store, peer, progress, ext, limit, batch_artifacts, report))


def _fill_header(report: RoundReport, remote: PeerVector, ext: Extensions) -> None:
    report.peer_replica = remote.replica_id
    report.remote_vector = dict(remote.vector)
    report.remote_profile = remote.profile
    report.remote_profiles = dict(remote.profiles)
    report.extensions = ext.names()
    report.negotiated = ext
    report.skipped_origins = dict(remote.skipped_origins)


def _effective_limit(page_limit: int | None, ext: Extensions) -> int:
    if page_limit is None:
        return ext.max_page_limit
    if not isinstance(page_limit, int) or isinstance(page_limit, bool) or page_limit < 1:
        raise ValidationError(f"page_limit={page_limit!r} must be a positive integer")
    return min(page_limit, ext.max_page_limit)


def page_bound(after: int, top: int, limit: int) -> int:
    """Most `/sync/ops` pages one origin can take in a round (see rule 5)."""
    return math.ceil((top - after) / limit) + 1


def pull_origin(
    store: StoreLike,
    peer: str,
    progress: OriginProgress,
    ext: Extensions,
    limit: int,
    batch_artifacts: bool,
    report: RoundReport,
    *,
    first: Any = None,
) -> Generator[Step, Any, OriginProgress]:
    """Pull one origin from `progress.reached` up to `progress.target`, page by page.
    `first` is the answer to the first page when the caller already fetched it.
    A page-level fault stops only this origin (rule 6)."""
    while not progress.stop_reason:
        budget = min(report.ops_budget, MAX_OPS_PER_ORIGIN - (progress.reached - progress.start))
        if budget <= 0:
            progress.stop_reason = STOP_CAPPED
            break
        asked = min(limit, budget)
        try:
            if first is not None:
                answer, first = first, None
                asked = limit
                if isinstance(answer, PeerError):
                    raise answer
            else:
                report.requests += 1
                answer = yield _page_request(progress, ext, asked)
            events, inline = check_page(answer, peer, progress.origin, progress.reached,
                                        asked, inline_asked=ext.inline_artifacts)
            progress.pages += 1
            if not events:
                progress.stop_reason = _stop_reason_for_empty(progress)
                break
            artifacts = yield from obtain_artifacts(store, peer, events, inline, ext, progress,
                                                    batch_artifacts, report)
            _apply_page(store, peer, events, artifacts, progress)
        except PeerTooLargeError as exc:
            if limit > 1:
                limit = max(1, limit // 2)  # ask again for less
                continue
            _origin_failed(progress, report, exc)
            break
        except ORIGIN_SCOPED_ERRORS as exc:
            _origin_failed(progress, report, exc)
            break
        report.transient_streak = 0
        report.ops_budget -= len(events)
        if not progress.stop_reason:
            progress.stop_reason = _stop_reason_after_page(progress, len(events), asked)
    return progress


# A peer's fault on one origin's request or page; `_origin_failed` sends auth (and a
# run of transient failures) on to the round. Local store faults are not peer errors.
ORIGIN_SCOPED_ERRORS = (PeerError,)


def _origin_failed(progress: OriginProgress, report: RoundReport, exc: PeerError) -> None:
    """Rule 6: record the origin's failure; re-raise what belongs to the whole round."""
    if isinstance(exc, PeerAuthError):
        raise exc
    if isinstance(exc, PeerTransientError):
        report.transient_streak += 1
        if report.transient_streak >= TRANSIENT_ORIGINS_TO_GIVE_UP:
            raise exc
    progress.error_kind = error_kind(exc)
    progress.stop_reason = f"{STOP_FAILED}: {exc}"


def error_kind(error: BaseException) -> str:
    """The kind of a fault, one word for state, status and metrics: `auth`, `transport`,
    `protocol`, `store` or `internal` (a bug of ours)."""
    if isinstance(error, PeerAuthError):
        return "auth"
    if isinstance(error, PeerTransientError):
        return "transport"
    if isinstance(error, PeerError):
        return "protocol"
    if isinstance(error, StoreError):
        return "store"
    return "internal"


def _stop_reason_for_empty(progress: OriginProgress) -> str:
    return STOP_CAUGHT_UP if progress.reached >= progress.target else STOP_EMPTY


def _stop_reason_after_page(progress: OriginProgress, served: int, limit: int) -> str:
    if progress.reached >= progress.target:
        return STOP_CAUGHT_UP
    return STOP_SHORT if served < limit else ""



def check_page(
    answer: object, peer: str, origin: str, after: int, limit: int, *, inline_asked: bool = False
) -> tuple[list[dict], dict[str, dict]]:
    """Validate one `/sync/ops` answer: (events, inline artifacts by id) or PeerProtocolError.
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
    return events, _inline_artifacts(answer.get("artifacts") if inline_asked else None, fail)


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


def referenced_artifacts(events: list[dict]) -> list[str]:
    """Artifact ids the page names, first-seen order, no repeats; malformed lists are
    left to the store, which quarantines their op."""
    seen: dict[str, None] = {}
    for event in events:
        ids = event.get("artifact_ids")
        if isinstance(ids, list):
            seen.update((i, None) for i in ids if isinstance(i, str))
    return list(seen)


def obtain_artifacts(
    store: StoreLike,
    peer: str,
    events: list[dict],
    inline: dict[str, dict],
    ext: Extensions,
    progress: OriginProgress,
    batch: bool,
    report: RoundReport,
) -> Generator[Step, Any, list[dict]]:
    """The artifacts the page names that the store lacks: inline ones first, the
    rest one `/sync/artifact` request each (404 = absent, left to the store)."""
    wanted = referenced_artifacts(events)
    missing = list(store.missing_artifacts(wanted)) if wanted else []
    found = [inline[i] for i in missing if i in inline]
    to_fetch = [i for i in missing if i not in inline]
    requests = [
        Request("/sync/artifact", {"id": i}, accept_msgpack=ext.msgpack, missing_ok=True)
        for i in to_fetch
    ]
    report.requests += len(requests)
    if batch and requests:
        answers = yield Batch(tuple(requests))
        if not isinstance(answers, list) or len(answers) != len(requests):
            raise RuntimeError(f"the driver must answer a Batch of {len(requests)} with a list")
    else:
        answers = []
        for request in requests:
            answers.append((yield request))
    for artifact_id, answer in zip(to_fetch, answers, strict=True):
        if isinstance(answer, PeerError):
            raise answer
        artifact = check_artifact_answer(answer, peer, artifact_id)
        if artifact is None:
            progress.artifacts_missing += 1
        else:
            found.append(artifact)
    return found


def check_artifact_answer(answer: object, peer: str, artifact_id: str) -> dict | None:
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


def _apply_page(
    store: StoreLike, peer: str, events: list[dict], artifacts: list[dict],
    progress: OriginProgress,
) -> None:
    """One transaction for the page; fold the ApplyResult into the progress."""
    try:
        result = store.apply_remote(events, artifacts)
    except ValidationError as exc:
        raise PeerProtocolError(
            f"peer {peer}: page for origin {progress.origin} was refused by the store: {exc}",
            peer=peer,
        ) from None
    progress.applied += result.applied
    progress.duplicates += result.duplicates
    progress.conflicts += result.conflicts
    progress.quarantined += result.quarantined
    progress.artifacts += result.artifacts_applied
    if progress.origin in result.stopped:
        progress.reached = max(progress.reached, result.high_water.get(progress.origin, 0))
        progress.stop_reason = f"{STOP_STORE}: {result.stopped[progress.origin]}"
    else:
        progress.reached = max(progress.reached, events[-1]["origin_seq"])


def drive(round_gen: Generator[Step, Any, Any], perform: Callable[[Request], Any]) -> Any:
    """Run a round with a synchronous `perform(Request) -> answer`; a PeerError it
    raises is thrown into the round. For tests and simple callers."""
    try:
        step = next(round_gen)
        while True:
            try:
                if isinstance(step, Batch):
                    answer: Any = [_outcome(perform, r) for r in step.requests]
                else:
                    answer = perform(step)
            except PeerError as exc:
                step = round_gen.throw(exc)
                continue
            step = round_gen.send(answer)
    except StopIteration as stop:
        return stop.value


def _outcome(perform: Callable[[Request], Any], request: Request) -> Any:
    try:
        return perform(request)
    except PeerError as exc:
        return exc


@dataclass
class OriginBackoff:
    """Per-origin backoff of one peer (rule 6): an origin that failed is left out of that
    peer's rounds for `base * 2**(n-1)` seconds (capped, equal jitter) after its n-th
    failure in a row; a round in which it does not fail clears it. Times are the
    caller's seconds; nothing here reads a clock."""

    rng: random.Random
    base: float = 5.0
    cap: float = 300.0
    failures: dict[str, tuple[int, float]] = field(default_factory=dict)

    def held(self, now: float) -> set[str]:
        """Origins to leave out of a round starting at `now`."""
        return {origin for origin, (_, until) in self.failures.items() if until > now}

    def record(self, report: RoundReport, now: float) -> None:
        """Fold one finished round in: failed origins back off, pulled ones are cleared."""
        failed = report.failed_origins()
        for origin in report.origins:
            if origin not in failed:
                self.failures.pop(origin, None)
        for origin in failed:
            count = self.failures.get(origin, (0, 0.0))[0] + 1
            delay = min(self.cap, self.base * 2 ** min(count - 1, 32))
            self.failures[origin] = (count, now + delay / 2 + self.rng.uniform(0, delay / 2))


@dataclass
class PullSchedule:
    """When to pull one peer next. All times are caller-supplied seconds.

    Rules (one place, STYLE.md §4):
    - `start(now)`: the first round is due at once, not after one interval.
    - `begin(now)`: a round is running; nothing is due until it ends.
    - `succeeded(now)`: failures reset; next round after `interval` scaled by
      a factor in [1 - jitter, 1 + jitter]; if notified meanwhile, after `debounce`.
    - `failed(now, retry_after)`: exponential backoff `base * 2**(n-1)` capped at
      `backoff_cap`, with equal jitter (half fixed, half random), never before
      the peer's Retry-After hint.
    - `notified(now)`: due within `debounce` (bursts collapse into one pull), not
      before a Retry-After hold; during a round, remembered for its end.
    - `due_by(at)`: due no later than `at` (a held-back notification's claim lapses).
    """

    rng: random.Random
    interval: float = 15.0
    jitter: float = 0.1
    debounce: float = 0.05
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    next_due: float | None = None
    running: bool = False
    failures: int = 0
    hold_until: float = 0.0
    notify_pending: bool = False

    def __post_init__(self) -> None:
        for name in ("interval", "debounce", "backoff_base", "backoff_cap"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValidationError(f"{name}={value!r} must be a non-negative number of seconds")
        if not 0 <= self.jitter < 1:
            raise ValidationError(f"jitter={self.jitter!r} must be a fraction in [0, 1)")

    def start(self, now: float) -> float:
        self.next_due = now
        return now

    def is_due(self, now: float) -> bool:
        return not self.running and self.next_due is not None and now >= self.next_due

    def wait_time(self, now: float) -> float | None:
        """Seconds until due (0 if due), None while running or not started."""
        if self.running or self.next_due is None:
            return None
        return max(0.0, self.next_due - now)

    def begin(self, now: float) -> None:
        self.running = True
        self.notify_pending = False

    def succeeded(self, now: float) -> float:
        self.running = False
        self.failures = 0
        self.hold_until = 0.0
        if self.notify_pending:
            self.notify_pending = False
            return self._set(now + self.debounce)
        spread = self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        return self._set(now + self.interval * spread)

    def failed(self, now: float, retry_after: float | None = None) -> float:
        self.running = False
        self.notify_pending = False
        self.failures += 1
        delay = min(self.backoff_cap, self.backoff_base * 2 ** min(self.failures - 1, 62))
        delay = delay / 2 + self.rng.uniform(0, delay / 2)
        if retry_after is not None and retry_after > 0:
            self.hold_until = now + retry_after
            delay = max(delay, retry_after)
        return self._set(now + delay)

    def due_by(self, at: float) -> float | None:
        """Due no later than `at` (e.g. when a claim another peer holds lapses)."""
        if not self.running and (self.next_due is None or at < self.next_due):
            self.next_due = at
        return self.next_due

    def notified(self, now: float) -> float | None:
        if self.running:
            self.notify_pending = True
            return None
        soon = max(now + self.debounce, self.hold_until)
        if self.next_due is None or soon < self.next_due:
            return self._set(soon)
        return self.next_due

    def _set(self, due: float) -> float:
        self.next_due = due
        return due
