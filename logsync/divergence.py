"""Finding where a peer's history of an origin parts from ours, sans-IO (issue 10).

Both replicas keep each origin's hash chain (`logsync/chain.py`); ``D(s)`` is the chain
at seq ``s`` (`logsync/store/chainreads.py`). A pull round learns the peer's ``D`` at
one seq — a tip in the vector answer, or ``prev`` of a page — and compares it with its
own. Equal: the two hold the same ops up to there (the hash binds every op and every
artifact it names). Different: somewhere at or below that seq the histories differ, and
`locate` finds the first such seq with `/sync/digests`, asking up to
`PROBES_PER_REQUEST` evenly spaced seqs per request, so an origin of ``n`` ops costs
``ceil(log_(PROBES+1) n)`` requests (4 for a million), within ``log2(n) + 2`` always.
`investigate` then fetches one page of the peer's ops from that seq and has the store
record the divergence with both versions (`RecordDivergence`): never an overwrite.

Like `engine.py`, this yields `Request`s and store effects and touches nothing itself.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from logsync.effects import ReadDigests, RecordDivergence
from logsync.errors import PeerProtocolError
from logsync.report import STOP_DIVERGED, OriginProgress
from logsync.wire import (
    DIGESTS_PATH,
    MAX_DIGESTS_PER_REQUEST,
    UPSTREAM_PAGE_LIMIT,
    Extensions,
    Request,
    parse_digests_answer,
    parse_page,
)

PROBES_PER_REQUEST = 32
assert PROBES_PER_REQUEST <= MAX_DIGESTS_PER_REQUEST
# Divergent origins searched per round (each costs a few requests); the rest are found
# by the next round, so a peer diverging on every origin cannot hold a round open.
MAX_SEARCHES_PER_ROUND = 4
# Ops of the peer fetched from the first divergent seq, to record both versions of each
# differing op; beyond that, the next search (after the ledger's rows) finds the rest.
OPS_RECORDED = UPSTREAM_PAGE_LIMIT


def probes(lo: int, hi: int, count: int = PROBES_PER_REQUEST) -> list[int]:
    """Up to `count` seqs strictly between `lo` and `hi`, evenly spaced, increasing."""
    span = hi - lo
    n = min(count, span - 1)
    return sorted({lo + (i + 1) * span // (n + 1) for i in range(n)} - {lo, hi})


def locate(
    peer: str, origin: str, lo: int, hi: int, ours_hi: bytes | None, theirs_hi: bytes | None,
    ext: Extensions, progress: OriginProgress,
) -> Generator[Any, Any, tuple[int, bytes | None, bytes | None]]:
    """The first seq in `(lo, hi]` where the chains differ, with our and their digest
    there. Requires ``D_ours(lo) == D_theirs(lo)`` (true at 0) and that they differ at
    `hi`. A peer answering inconsistently only moves where the search ends."""
    while hi - lo > 1:
        points = probes(lo, hi)
        progress.digest_requests += 1
        answer = yield Request(DIGESTS_PATH, {"origin": origin, "at": ",".join(map(str, points))},
                               accept_msgpack=ext.msgpack)
        theirs = parse_digests_answer(answer, peer, origin, tuple(points))
        ours = yield ReadDigests(tuple((origin, p) for p in points))
        for point, mine, their in zip(points, ours, theirs, strict=True):
            if mine != their:
                hi, ours_hi, theirs_hi = point, mine, their
                break
            lo = point
    return hi, ours_hi, theirs_hi


def investigate(
    peer: str, peer_replica: str, origin: str, hi: int, ours_hi: bytes | None,
    theirs_hi: bytes | None, ext: Extensions, progress: OriginProgress,
) -> Generator[Any, Any, int]:
    """Locate the divergence below `hi`, fetch the peer's ops from there, record it;
    returns the conflicts recorded. The origin stops for this round either way."""
    progress.stop_reason = STOP_DIVERGED
    if hi < 1:  # every chain starts at d_0: a peer whose chain at 0 differs is lying
        raise PeerProtocolError(f"peer {peer}: its chain of origin {origin} at origin_seq 0 "
                                "is not that origin's d_0", peer=peer)
    if ours_hi is None:
        ours_hi = (yield ReadDigests(((origin, hi),)))[0]
    seq, mine, their = yield from locate(peer, origin, 0, hi, ours_hi, theirs_hi, ext, progress)
    progress.diverged_at = seq
    answer = yield Request("/sync/ops", {"origin": origin, "after": seq - 1,
                                         "limit": OPS_RECORDED}, accept_msgpack=ext.msgpack)
    page = parse_page(answer, peer, origin, seq - 1, OPS_RECORDED)
    recorded = yield RecordDivergence(origin, seq, peer_replica, mine, their, page.events)
    progress.conflicts += recorded
    progress.stop_reason = f"{STOP_DIVERGED} from origin_seq {seq}: recorded, nothing overwritten"
    return int(recorded)
