"""The sync algorithm, sans-IO: one pull round against one peer, and when to pull.

A pull round is a generator (STYLE.md §1-2). It yields a `Request` ("GET this
path with these params") or a `Batch` of them, and receives the decoded answer
through `send()`: a dict, or None for a 404 on a request marked `missing_ok`
(a `Batch` receives a list of answers in order, where a request that failed is
answered by its `PeerError`, so one slow or failing origin does not cost the others
their answers). The driver translates transport failures into `errors.PeerError`s
and `throw()`s them in. What the round needs of the local store it yields too, as
`effects` (`ReadVector`, `ReadOwnSeen`, `MissingArtifacts`, `ApplyPage`), performed
by the driver with `effects.perform`. The round returns a `RoundReport`; it never
touches a store, socket, clock, thread or sleep, so the httpx client and the
simulator run the same code.

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
4. One `ApplyPage` effect per page (one transaction).
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
   origins after its own. A page naming more than `MAX_ARTIFACTS_PER_PAGE` distinct
   artifacts is too large (the origin asks for fewer ops), and artifact requests go
   out `ARTIFACTS_PER_BATCH` at a time.
8. Divergence is never silent (`logsync/divergence.py`). With a peer that speaks
   `chain`, its tip of each origin it is not ahead on is compared with our chain at that
   seq, and each page applies only if its `prev` is our chain at `after`; a difference
   is searched out and recorded, never applied. Where the tips are equal and the peer
   holds the origin's signature of it, we take that signature if we lack it (verified).
   Without chains, an origin's first page overlaps our top by one op, which the store
   compares byte for byte.

The wire (request steps, answer checks, extension names) is `logsync/wire.py`;
when to pull is `logsync/schedule.py`. Both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Mapping
from typing import Any

from logsync.divergence import MAX_SEARCHES_PER_ROUND, investigate
from logsync.effects import (
    AdoptTipSignatures,
    ApplyPage,
    PinKeys,
    ReadDigests,
    ReadOwnSeen,
    ReadVector,
    StoreLike,
)
from logsync.errors import (
    PeerAuthError,
    PeerError,
    PeerProtocolError,
    PeerTooLargeError,
    PeerTransientError,
    StoreError,
    ValidationError,
)
from logsync.pageartifacts import (
    ARTIFACTS_PER_BATCH,
    MAX_ARTIFACTS_PER_PAGE,
    obtain_artifacts,
    referenced_artifacts,
)
from logsync.report import (
    MAX_OPS_PER_ROUND,
    STOP_CAPPED,
    STOP_CAUGHT_UP,
    STOP_DIVERGED,
    STOP_EMPTY,
    STOP_FAILED,
    STOP_SHORT,
    STOP_STORE,
    OriginProgress,
    RoundReport,
)
from logsync.schedule import OriginBackoff, PullSchedule, choose_targets
from logsync.wire import (
    ADVERTISED_MAX_PAGE,
    ADVERTISEMENT_KEY,
    EXT_CHAIN,
    EXT_INLINE_ARTIFACTS,
    EXT_LARGE_PAGES,
    EXT_MSGPACK,
    EXTENSIONS_PARAM,
    LARGE_PAGE_CEILING,
    UPSTREAM_PAGE_LIMIT,
    Batch,
    Extensions,
    OpsPage,
    PeerVector,
    Request,
    Step,
    parse_artifact_answer,
    parse_extensions,
    parse_page,
    parse_vector_answer,
)

__all__ = [  # the round, and what it re-exports from wire and schedule
    "ADVERTISED_MAX_PAGE", "ADVERTISEMENT_KEY", "ARTIFACTS_PER_BATCH", "EXT_INLINE_ARTIFACTS",
    "EXT_LARGE_PAGES", "EXT_MSGPACK", "EXTENSIONS_PARAM", "FIRST_PAGES_AT_ONCE",
    "LARGE_PAGE_CEILING", "MAX_ARTIFACTS_PER_PAGE", "MAX_OPS_PER_ORIGIN", "MAX_OPS_PER_ROUND",
    "STOP_CAPPED", "STOP_CAUGHT_UP", "STOP_EMPTY", "STOP_FAILED", "STOP_SHORT", "STOP_STORE",
    "TRANSIENT_ORIGINS_TO_GIVE_UP", "UPSTREAM_PAGE_LIMIT", "Batch", "Extensions",
    "OpsPage", "OriginBackoff", "OriginProgress", "PeerVector", "PullSchedule", "Request",
    "RoundReport", "Step", "StoreLike", "choose_targets", "error_kind", "missing_ranges",
    "obtain_artifacts", "parse_artifact_answer", "parse_extensions", "parse_page",
    "parse_vector_answer", "pull_origin", "pull_round", "referenced_artifacts",
    "targeted_origin",
]

# A full round fetches the first pages of this many origins side by side (memory stays
# bounded by this many pages, not by the backlog).
FIRST_PAGES_AT_ONCE = 4
MAX_OPS_PER_ORIGIN = 50_000  # one origin's share of a round, so an endless one starves none
TRANSIENT_ORIGINS_TO_GIVE_UP = 3


def missing_ranges(
    local: Mapping[str, int], remote: Mapping[str, int], own: str, own_seen: int = 0
) -> list[tuple[str, int, int]]:
    """(origin, after, top) for every origin the peer holds more of.

    That includes our own origin when the peer holds more of it than we do: this
    palace was restored from an older copy (or cloned). When the peer shows more than
    we have ever seen (`own_seen`: held, or refused as forged), the whole of our own
    origin is compared from the start, once: ops we lost come back (the store records
    them as `restored_replica`), and any slot we re-used since the restore is found as
    a recorded `fork` rather than staying silently different. A slot already seen and
    refused does not start that comparison again: only what lies above what we hold is
    asked for.
    """
    ranges = []
    for origin in sorted(remote):
        held = int(local.get(origin, 0))
        if remote[origin] <= held:
            continue
        # Our own origin from the start only when the peer shows more than we have ever
        # seen; otherwise just what lies above what we hold (ops lost in a restore that a
        # forged slot far above would hide), at the cost of one small page.
        whole = origin == own and remote[origin] > max(held, own_seen)
        ranges.append((origin, 0 if whole else held, remote[origin]))
    return ranges


RoundGen = Generator[Step, Any, RoundReport]


def pull_round(
    own: str,
    peer: str,
    *,
    page_limit: int | None = None,
    use_extensions: bool = True,
    batch_artifacts: bool = False,
    report: RoundReport | None = None,
    held_back: Collection[str] = (),
) -> RoundGen:
    """One anti-entropy round of replica `own` against `peer` (a name or URL used in
    messages). Origins in `held_back` (backing off after failures, see `OriginBackoff`) are
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
    report.local_vector_before = dict((yield ReadVector()))
    own_seen = yield ReadOwnSeen()
    limit = _effective_limit(page_limit, ext)
    ranges = [r for r in missing_ranges(report.local_vector_before, remote.vector, own,
                                        own_seen)
              if r[0] not in held_back]
    if ext.chain:
        published = {o: k for o, k in remote.keys.items() if remote.vector.get(o, 0) > 0}
        if published:  # keys of origins the peer holds ops of, nothing else
            pinned = yield PinKeys(published, remote.replica_id)
            report.key_changes = sorted(o for o, outcome in pinned.items()
                                        if outcome in ("changed", "replaced"))
        pulled = {origin for origin, _, _ in ranges} | set(held_back)
        yield from _compare_tips(peer, remote, ext, report, pulled)
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
            yield from pull_origin(peer, progress, ext, limit, batch_artifacts, report,
                                   first=first)
    report.local_vector_after = dict((yield ReadVector()))
    return report


def _compare_tips(
    peer: str, remote: PeerVector, ext: Extensions, report: RoundReport, pulled: set[str],
) -> Generator[Any, Any, None]:
    """Rule 8: compare the peer's chain tip of every origin it is not ahead on with our
    chain at that seq; search out and record each that differs (bounded per round)."""
    local = report.local_vector_before
    points = tuple((o, tip[0]) for o, tip in sorted(remote.tips.items())
                   if o not in pulled and tip[0] <= local.get(o, 0))
    ours = (yield ReadDigests(points)) if points else []
    adopt = tuple((origin, seq, mine, remote.tip_sigs[origin])
                  for (origin, seq), mine in zip(points, ours, strict=True)
                  if mine == remote.tips[origin][1] and origin in remote.tip_sigs)
    if adopt:  # the same chain, signed there: a relay that got it unsigned can serve it on
        report.tip_signatures += yield AdoptTipSignatures(adopt)
    for (origin, seq), mine in zip(points, ours, strict=True):
        if mine == remote.tips[origin][1]:
            continue
        progress = OriginProgress(origin=origin, start=local[origin], target=local[origin],
                                  reached=local[origin])
        report.origins[origin] = progress
        yield from _search(peer, progress, ext, report, seq, mine, remote.tips[origin][1])


def _search(
    peer: str, progress: OriginProgress, ext: Extensions, report: RoundReport, seq: int,
    mine: bytes | None, theirs: bytes | None,
) -> Generator[Any, Any, None]:
    """One divergence search (`divergence.investigate`) as a fault of its origin alone."""
    progress.stop_reason = STOP_DIVERGED
    if report.searches >= MAX_SEARCHES_PER_ROUND:
        return  # found again next round
    report.searches += 1
    try:
        yield from investigate(peer, report.peer_replica or peer, progress.origin, seq, mine,
                               theirs, ext, progress)
    except ORIGIN_SCOPED_ERRORS as exc:
        _origin_failed(progress, report, exc)


def _page_after(progress: OriginProgress, ext: Extensions) -> int:
    """Where an origin's next page starts. Without chains (a MemPalace hub), an origin's
    first page overlaps ours by one op: the op at our top comes again and the store
    compares it byte for byte, so a peer that re-minted our tip is seen (a `fork`)."""
    overlap = not ext.chain and progress.pages == 0 and progress.reached == progress.start
    return progress.reached - 1 if overlap and progress.reached > 0 else progress.reached


def _page_request(progress: OriginProgress, ext: Extensions, limit: int) -> Request:
    """The `/sync/ops` request for an origin's next page (extensions only if advertised)."""
    params: dict[str, Any] = {"origin": progress.origin, "after": _page_after(progress, ext),
                              "limit": limit}
    asked = [EXT_LARGE_PAGES] if limit > UPSTREAM_PAGE_LIMIT else []
    asked += [EXT_INLINE_ARTIFACTS] if ext.inline_artifacts else []
    asked += [EXT_CHAIN] if ext.chain else []
    if asked:
        params[EXTENSIONS_PARAM] = ",".join(asked)
    return Request("/sync/ops", params, accept_msgpack=ext.msgpack, until=progress.target)


def targeted_origin(
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
    our vector entry for the origin if the caller has it (saves a vector read)."""
    if held is None:
        held = int((yield ReadVector()).get(origin, 0))
    progress = OriginProgress(origin=origin, start=held, target=top, reached=held)
    report.origins[origin] = progress
    if top <= held:
        progress.stop_reason = STOP_CAUGHT_UP
        return progress
    limit = _effective_limit(page_limit, ext)
    return (yield from pull_origin(peer, progress, ext, limit, batch_artifacts, report))


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


def pull_origin(
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
    `first` is the answer to the first page when the caller already fetched it (or
    its `OpsPage`, when the caller parsed it as this pull would).
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
            page = answer if isinstance(answer, OpsPage) else parse_page(
                answer, peer, progress.origin, _page_after(progress, ext), asked,
                inline_asked=ext.inline_artifacts, chain_asked=ext.chain)
            progress.pages += 1
            if not page.events:
                progress.stop_reason = _stop_reason_for_empty(progress)
                break
            artifacts = yield from obtain_artifacts(peer, page, ext, progress,
                                                    batch_artifacts, report)
            if (yield from _apply_page(peer, page, artifacts, progress)):
                yield from _search(peer, progress, ext, report, page.after, None, page.prev)
                break
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
        report.ops_budget -= len(page.events)
        if not progress.stop_reason:
            progress.stop_reason = _stop_reason_after_page(progress, len(page.events), asked,
                                                           ext.page_budget)
    return progress


# A peer's fault on one origin's request or page; `_origin_failed` sends auth (and a
# run of transient failures) on to the round. Local store faults are not peer errors.
ORIGIN_SCOPED_ERRORS = (PeerError,)


def _origin_failed(progress: OriginProgress, report: RoundReport, exc: PeerError) -> None:
    """Rule 6: record the origin's failure (also when it ends the round: the caller's
    per-origin backoff then holds these origins back, so the same ones cannot end every
    round); re-raise what belongs to the whole round."""
    progress.error_kind = error_kind(exc)
    progress.stop_reason = f"{STOP_FAILED}: {exc}"
    if isinstance(exc, PeerAuthError):
        raise exc
    if isinstance(exc, PeerTransientError):
        report.transient_streak += 1
        if report.transient_streak >= TRANSIENT_ORIGINS_TO_GIVE_UP:
            raise exc


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


def _stop_reason_after_page(progress: OriginProgress, served: int, limit: int,
                            budgeted: bool = False) -> str:
    """After a non-empty page: caught up, a short page (the peer has no more now, unless
    it keeps a byte budget: then the rest comes in the next page), or go on. Every page
    advances origin_seq, and the round's op caps bound the pages either way."""
    if progress.reached >= progress.target:
        return STOP_CAUGHT_UP
    return STOP_SHORT if served < limit and not budgeted else ""


def _apply_page(
    peer: str, page: OpsPage, artifacts: list[dict], progress: OriginProgress,
) -> Generator[ApplyPage, Any, bool]:
    """One transaction for the page; fold the ApplyResult into the progress. True when
    the page's chain does not continue ours (nothing applied: a divergence to search)."""
    try:
        result = yield ApplyPage(page.events, artifacts, page.origin, page.after, page.prev,
                                 page.signatures)
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
    if progress.origin in result.diverged:
        return True
    if progress.origin in result.stopped:
        progress.reached = max(progress.reached, result.high_water.get(progress.origin, 0))
        progress.stop_reason = f"{STOP_STORE}: {result.stopped[progress.origin]}"
    else:
        progress.reached = max(progress.reached, page.last_seq)
    return False
