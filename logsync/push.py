"""Pushing what a peer lacks (two-way reconcile), sans-IO like the pull round.

A replica nobody can reach (a laptop behind NAT) cannot wait to be pulled. After its
pull, `logsync sync` (and a daemon, for peers marked `"push": true`) runs a push round:

1. Fetch the peer's `/sync/version_vector`. Without `push` in its advertisement (a
   MemPalace hub, or a logsync daemon without a token) nothing is pushed: the round
   says so (`unsupported`) and the peer has to pull from us.
2. Per origin we hold more of than the peer's vector shows (ours included, relayed ones
   too), in origin order: serve our page above the peer's top exactly as `/sync/ops`
   would (`responder.push_page`: `chain`, signatures, artifacts inline) and `POST` it to
   `/sync/push`. The peer applies it as a pulled page (`pushed.py`) and answers its new
   top for the origin; the next page starts there.
3. An origin stops when the peer has caught up with what we held, when the peer's answer
   says it stopped (quarantine, a fork, a diverged chain: its reason is reported), when
   the peer's top does not advance (a peer cannot hold us in a loop), or when a single op
   with its artifacts does not fit the peer's byte cap (`too_large`: it must pull). Its
   page size halves while a page does not fit, and when the peer (or a proxy before it)
   answers 413 or 408: too large, or too slow for the link. An answer whose top stops
   short of the page without a reason stops the origin too, as a short page stops a pull.
4. Bounded: at most `MAX_OPS_PER_ROUND` ops serialised per round (whatever the peer says
   it took), pages of at most our own `MAX_PUSH_BYTES` whatever the peer advertises.

A fault of one origin's page (a 4xx, a malformed answer) stops that origin; auth
failures and transport failures end the round, as in a pull.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from logsync.effects import ReadVector, ServePushPage
from logsync.errors import PeerAuthError, PeerError, PeerProtocolError, PeerTransientError, shorten
from logsync.model import MAX_SEQ
from logsync.peerstate import lack
from logsync.pushed import MAX_PUSH_BYTES
from logsync.report import MAX_OPS_PER_ROUND, OriginProgress
from logsync.responder import PushPage
from logsync.wire import PUSH_PATH, Request, parse_vector_answer

PUSH_PAGE_OPS = 5000  # a push page's first size; halved while it does not fit
SMALLER_PLEASE = (408, 413)  # the body was too slow or too large for the peer or a proxy


@dataclass
class PushReport:
    """One push round against one peer; meaningful also when it fails midway."""

    peer: str
    peer_replica: str | None = None
    supported: bool | None = None  # None: the vector was never read
    remote_vector: dict[str, int] = field(default_factory=dict)
    origins: dict[str, OriginProgress] = field(default_factory=dict)
    requests: int = 0
    bytes_sent: int = 0

    @property
    def pushed(self) -> int:
        """Ops the peer applied from our pages this round."""
        return sum(o.applied for o in self.origins.values())

    def they_lack(self) -> dict[str, int]:
        """What the peer still lacks of what we offered, per origin (non-zero only)."""
        return {o: p.target - p.reached for o, p in sorted(self.origins.items())
                if p.target > p.reached}

    def stopped(self) -> dict[str, str]:
        """Origins that stopped short of what we hold, with the reason."""
        return {o: p.stop_reason for o, p in sorted(self.origins.items())
                if p.target > p.reached and p.stop_reason}

    def as_dict(self) -> dict[str, Any]:
        return {"peer": self.peer, "peer_replica": self.peer_replica,
                "supported": self.supported, "pushed_events": self.pushed,
                "they_lack": sum(self.they_lack().values()), "requests": self.requests,
                "bytes_sent": self.bytes_sent, "stopped": self.stopped(),
                "per_origin": {o: _push_fields(p) for o, p in sorted(self.origins.items())}}


def _push_fields(progress: OriginProgress) -> dict[str, Any]:
    """What a push says of one origin (the pull's other counters stay zero here)."""
    return {k: getattr(progress, k) for k in ("start", "target", "reached", "pages", "applied",
                                              "duplicates", "quarantined", "conflicts",
                                              "stop_reason")}


PushGen = Generator[Any, Any, PushReport]


def push_round(own: str, peer: str, *, report: PushReport | None = None) -> PushGen:
    """One push round of replica `own` to `peer` (a name or URL used in messages)."""
    report = report if report is not None else PushReport(peer=peer)
    report.requests += 1
    remote = parse_vector_answer((yield Request("/sync/version_vector")), peer)
    report.peer_replica = remote.replica_id
    report.remote_vector = dict(remote.vector)
    report.supported = remote.extensions.push
    if not report.supported:
        return report
    local: Mapping[str, int] = yield ReadVector()
    budget = MAX_OPS_PER_ROUND
    for origin, gap in lack(local, remote.vector).items():
        top = int(remote.vector.get(origin, 0))
        progress = OriginProgress(origin=origin, start=top, target=top + gap, reached=top)
        report.origins[origin] = progress
        if budget <= 0:
            progress.stop_reason = "capped: the rest next round"
            continue
        max_bytes = min(remote.extensions.max_push_bytes, MAX_PUSH_BYTES)  # ours bounds theirs
        budget -= yield from _push_origin(own, peer, progress, max_bytes, budget, report)
    return report


def _push_origin(own: str, peer: str, progress: OriginProgress, max_bytes: int, budget: int,
                 report: PushReport) -> Generator[Any, Any, int]:
    """Push one origin page by page; returns the ops sent (towards the round's budget:
    what we serialise, not what the peer claims it took)."""
    limit = PUSH_PAGE_OPS
    sent, restarted = 0, False
    while progress.reached < progress.target and sent < budget:
        page: PushPage = yield ServePushPage(progress.origin, progress.reached,
                                             min(limit, budget - sent), max_bytes, own)
        if page.count == 0:
            progress.stop_reason = f"we hold nothing of {progress.origin} above {progress.reached}"
            break
        if not page.complete:
            if limit > 1:
                limit = max(1, min(limit, page.count) // 2)
                continue
            progress.stop_reason = (f"too_large: op {page.last_seq} of {progress.origin} with "
                                    f"its artifacts exceeds the peer's {max_bytes}-byte push "
                                    "cap; the peer must pull it")
            break
        report.requests += 1
        report.bytes_sent += len(page.body)
        sent += page.count
        try:
            answer = yield Request(PUSH_PATH, body=page.body)
            outcome = _parse_push_answer(answer, peer, progress.origin, progress.reached)
        except PeerError as exc:
            if exc.status in SMALLER_PLEASE and page.count > 1:
                limit = max(1, page.count // 2)  # too big, or too slow, for the link
                continue
            if isinstance(exc, (PeerAuthError, PeerTransientError)):
                raise  # the whole round's, as in a pull
            progress.stop_reason = f"failed: {exc}"
            break
        progress.pages += 1
        if outcome["top"] < progress.reached and not restarted:
            # the peer holds less than its vector said (restored meanwhile): start there
            restarted, progress.reached = True, outcome["top"]
            continue
        for key in ("applied", "duplicates", "quarantined", "conflicts"):
            setattr(progress, key, getattr(progress, key) + outcome[key])
        if outcome["top"] <= progress.reached:
            progress.stop_reason = outcome["stopped"] or (
                f"the peer's top of {progress.origin} stayed at {outcome['top']}")
            break
        progress.reached = min(outcome["top"], progress.target)
        if outcome["stopped"] or outcome["diverged"]:
            progress.stop_reason = outcome["stopped"] or "diverged"
            break
        if outcome["top"] < page.last_seq:  # short of the page, with no reason: as a pull
            progress.stop_reason = (f"the peer took {progress.origin} only up to "
                                    f"{outcome['top']} of a page up to {page.last_seq}")
            break
    if progress.reached >= progress.target:
        progress.stop_reason = ""
    return sent


def _parse_push_answer(answer: object, peer: str, origin: str, after: int) -> dict[str, Any]:
    """The peer's answer to a pushed page, checked (a lying top cannot loop us: the caller
    needs it to advance)."""
    where = f"peer {peer}: {PUSH_PATH} answer for origin {origin} after {after}"
    if not isinstance(answer, dict) or answer.get("origin") != origin:
        raise PeerProtocolError(f"{where} is {shorten(answer)}, not an answer for {origin}",
                                peer=peer)
    out: dict[str, Any] = {}
    for key in ("top", "applied", "duplicates", "quarantined", "conflicts"):
        value = answer.get(key)
        if type(value) is not int or not 0 <= value <= MAX_SEQ:
            raise PeerProtocolError(f"{where} has {key}={shorten(value)}; expected an "
                                    f"integer in 0..{MAX_SEQ}", peer=peer)
        out[key] = value
    stopped = answer.get("stopped")
    out["stopped"] = "".join(c if c.isprintable() else "?" for c in stopped[:300]) \
        if isinstance(stopped, str) and stopped else None
    out["diverged"] = answer.get("diverged") is True
    return out
