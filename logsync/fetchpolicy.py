"""How requests to one peer are made: attempts, waits, status -> error, concurrency, prefetch.

One copy of the request policy, sans-IO: the httpx client (`client.py`) and the
simulator's driver (`sim/driver.py`) both ask it, so what the simulator proves
about retries, `Retry-After`, the hub's connection cap and page prefetch is what
the daemon does. Randomness is the caller's `random.Random`.

Rules:

    connect error, timeout, 5xx, 429      -> PeerTransientError (retried, Retry-After honoured)
    401, 403                              -> PeerAuthError      (never retried)
    other 4xx (404 unless asked for)      -> PeerRequestError   (never retried)
    anything else not 2xx (a redirect)    -> PeerProtocolError  (never retried)
    an answer past the request deadline   -> PeerDeadlineError  (transient, never retried:
                                             a peer that dripped would only drip again)

A transient failure of attempt n (of `attempts`) waits `uniform(0, min(max_backoff,
backoff * 2**(n-1)))` ("full jitter") or the peer's
`Retry-After` if longer; a `Retry-After` beyond `max_retry_after` ends the request
at once (the round fails and the peer loop's schedule honours the hint).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from logsync.errors import (
    PeerAuthError,
    PeerError,
    PeerProtocolError,
    PeerRequestError,
    PeerTransientError,
)
from logsync.wire import Request

RETRYABLE_STATUSES = frozenset({429, 503})
UPSTREAM_CONCURRENCY = 4  # a MemPalace hub drops connections beyond its listen backlog
OPS_PATH = "/sync/ops"


class PeerDeadlineError(PeerTransientError):
    """An answer that did not finish within the request deadline (not retried)."""


@dataclass(frozen=True)
class FetchPolicy:
    """The request policy for one peer."""

    attempts: int = 4
    backoff: float = 0.5
    max_backoff: float = 10.0
    max_retry_after: float = 30.0
    concurrency: int = 8

    def error_for_status(self, status: int, said: str, where: str, peer: str,
                         retry_after: float | None = None) -> PeerError | None:
        """The error a non-2xx answer is, None for a 2xx."""
        if 200 <= status < 300:
            return None
        message = f"{where} answered {status}{': ' + said if said else ''}"
        if status in RETRYABLE_STATUSES or status >= 500:
            return PeerTransientError(message, peer=peer, retry_after=retry_after,
                                      status=status)
        if status in (401, 403):
            return PeerAuthError(f"{message} (check the token)", peer=peer, status=status)
        if 400 <= status < 500:
            return PeerRequestError(message, peer=peer, status=status)
        return PeerProtocolError(f"{message}; expected 2xx (redirects are not followed)",
                                 peer=peer, status=status)

    def retry_wait(self, attempt: int, error: BaseException, rng: random.Random) -> float | None:
        """Seconds to wait before trying again after `attempt` failed; None: give up."""
        if not isinstance(error, PeerTransientError) or isinstance(error, PeerDeadlineError):
            return None
        if attempt >= self.attempts:
            return None
        hint = error.retry_after
        if hint is not None and hint > self.max_retry_after:
            return None
        high = min(self.max_backoff, self.backoff * 2 ** min(attempt - 1, 62))
        return max(rng.uniform(0.0, high), hint or 0.0)

    def batch_concurrency(self, upstream: bool) -> int:
        """Requests of one batch in flight at once; a hub (no extensions) gets fewer."""
        return min(self.concurrency, UPSTREAM_CONCURRENCY) if upstream else self.concurrency

    def origins_in_flight(self, wanted: int, upstream: bool) -> int:
        """Origins a targeted round pulls side by side (each may prefetch: two requests)."""
        return max(1, min(wanted, UPSTREAM_CONCURRENCY // 2) if upstream else wanted)


def prefetch_guess(request: Request, answer: Any, *, past_short: bool = False
                   ) -> Request | None:
    """The page after a full `/sync/ops` page, fetched while this one is applied; None
    when the answer was not a full page. `past_short`: also after a page cut short of its
    limit (a byte budget) that ends below the request's `until` (without it a budgeted
    pull is strictly serial: fetch, decode, apply, fetch...). A driver optimisation only:
    the engine still asks for every page and gets exactly the answer a plain fetch would
    give; a guess it does not ask for is dropped."""
    if request.path != OPS_PATH:
        return None
    events = answer.get("events") if isinstance(answer, dict) else None
    limit = request.params.get("limit")
    if not isinstance(events, list) or not events:
        return None
    last = events[-1].get("origin_seq") if isinstance(events[-1], dict) else None
    if not isinstance(last, int) or isinstance(last, bool):
        return None
    more = past_short and request.until is not None and last < request.until
    if len(events) != limit and not more:
        return None
    return Request(request.path, {**request.params, "after": last},
                   accept_msgpack=request.accept_msgpack, until=request.until)


def request_key(request: Request) -> tuple[Any, ...]:
    """What makes two requests the same (a prefetched page is taken only by its twin)."""
    params: Mapping[str, Any] = request.params
    return (request.path, tuple(sorted(params.items())), request.accept_msgpack)
