"""Taking a pushed page (`POST /sync/push`): the receiving side of two-way reconcile.

A pushed page is a `/sync/ops` answer the pusher's own responder made (`push.py`), with
`chain` and the artifacts its ops name inline. It is taken through the pull path itself:
`engine.pull_origin` runs over it as over a first page already fetched, with the page's
own `after` as where the origin stands, so the same wire checks (`wire.parse_page`), the
same artifact rule (a named artifact neither inline nor held is absent: the store
quarantines its op), the same `ApplyPage` effect (`Store.apply_chained`: `prev` must be
our chain at `after`, signatures verified, quarantine, conflicts, forks, own-origin
recovery) and the same limits apply; the origin's key the page publishes is pinned as a
vector answer's would be (`Store.pin_keys`, under the pusher's claimed id, which a pull
trusts no more).
Nothing here decides what a pulled page would not.

What a push cannot do is ask back: a request the round would make of the pusher (an
artifact, a divergence search) is answered "absent". A page whose `prev` differs from
our chain is not applied and is answered `diverged`; the pusher's own pull of this
replica finds and records the divergence.

The answer is always an object: `{"origin", "after", "top" (our contiguous top of the
origin after the apply), "applied", "duplicates", "conflicts", "quarantined",
"artifacts", "stopped" (why the origin went no further, or null), "diverged"}`.
A page starting above our top (`gap`) applies nothing and says where to start.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any

from logsync.divergence import MAX_SEARCHES_PER_ROUND
from logsync.effects import STORE_EFFECTS, PinKeys, StoreLike
from logsync.effects import perform as effects_perform
from logsync.engine import pull_origin
from logsync.errors import PeerError, ValidationError, shorten
from logsync.ids import is_replica_id
from logsync.model import MAX_SEQ
from logsync.report import STOP_CAUGHT_UP, STOP_DIVERGED, OriginProgress, RoundReport
from logsync.wire import (
    LARGE_PAGE_CEILING,
    Batch,
    Extensions,
    Request,
    parse_keys,
    parse_page,
)

# What one pushed request may carry: as many ops as a large page, and this many bytes
# (the body's cap, checked before it is read; the pusher cuts its pages to fit).
MAX_PUSH_OPS = LARGE_PAGE_CEILING
MAX_PUSH_BYTES = 32 * 1024 * 1024
PUSHES_AT_ONCE = 2  # pushed bodies decoded and applied side by side, per server


def accept_push(store: StoreLike, body: object, pusher: str,
                perform: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Apply one pushed page (blocking: SQLite); the answer above. A malformed page is a
    `ValidationError` naming the value and the rule (400), and nothing of it is stored.
    `perform` carries out the round's store effects (the simulator's bookkeeping wraps
    it); by default `effects.perform` on `store`."""
    if not isinstance(body, dict):
        raise ValidationError(f"a pushed page must be a JSON object, not {shorten(body)}")
    origin, after = body.get("origin"), body.get("after")
    if not isinstance(origin, str) or not is_replica_id(origin):
        raise ValidationError(f"origin={shorten(origin)} of a pushed page must be a replica id")
    if type(after) is not int or not 0 <= after <= MAX_SEQ:
        raise ValidationError(f"after={shorten(after)} of a pushed page must be an integer "
                              f"from 0 to {MAX_SEQ}")
    if not isinstance(body.get("chain"), dict):
        raise ValidationError("a pushed page must carry 'chain' ({'prev': <64 hex>}): pushes "
                              "are taken only against our own chain at 'after'")
    top = store.origin_top(origin)
    answer: dict[str, Any] = {"origin": origin, "after": after, "top": top, "applied": 0,
                              "duplicates": 0, "conflicts": 0, "quarantined": 0,
                              "artifacts": 0, "stopped": None, "diverged": False}
    if after > top:
        answer["stopped"] = f"gap: this replica holds origin {origin} up to {top}"
        return answer
    if origin == store.replica_id and after < top:
        # our own origin below our top: recovered only by our own pull (once a round),
        # never re-judged at a pusher's pace
        answer["stopped"] = (f"own origin below our top {top}: this replica recovers its "
                             "own ops only by pulling")
        return answer
    try:  # the wire checks first: a refused page pins no key and stores nothing
        page = parse_page(body, pusher, origin, after, MAX_PUSH_OPS, inline_asked=True,
                          chain_asked=True)
    except PeerError as exc:
        raise ValidationError(str(exc)) from None
    sender = body.get("from")
    keys = parse_keys(body)  # the origin's key, published as a vector answer does
    if page.events and origin in keys and isinstance(sender, str) and is_replica_id(sender):
        _perform(store, perform, PinKeys({origin: keys[origin]}, sender))
    events = body.get("events")
    last = events[-1].get("origin_seq") if isinstance(events, list) and events and \
        isinstance(events[-1], dict) else None
    target = last if type(last) is int and last > after else after
    report = RoundReport(peer=pusher)
    report.searches = MAX_SEARCHES_PER_ROUND  # a push cannot search the pusher's chain
    progress = OriginProgress(origin=origin, start=after, target=target, reached=after)
    report.origins[origin] = progress
    ext = Extensions(inline_artifacts=True, max_page_limit=MAX_PUSH_OPS, chain=True)
    try:
        _drive(store, pull_origin(pusher, progress, ext, MAX_PUSH_OPS, False, report,
                                  first=page), perform)
    except PeerError as exc:  # the engine raises only what ends a round; a push has one page
        raise ValidationError(str(exc)) from None
    if progress.failed:
        raise ValidationError(progress.stop_reason.removeprefix("failed: "))
    answer.update(applied=progress.applied, duplicates=progress.duplicates,
                  conflicts=progress.conflicts, quarantined=progress.quarantined,
                  artifacts=progress.artifacts,
                  top=max(top, progress.reached),  # what the apply reached, unread
                  diverged=progress.stop_reason == STOP_DIVERGED)
    if progress.stop_reason not in ("", STOP_CAUGHT_UP):
        answer["stopped"] = progress.stop_reason
    return answer


def _perform(store: StoreLike, perform: Callable[[Any], Any] | None, effect: Any) -> Any:
    return perform(effect) if perform is not None else effects_perform(store, effect)


def _drive(store: StoreLike, gen: Generator[Any, Any, Any],
           perform: Callable[[Any], Any] | None = None) -> None:
    """Run the origin's pull over the pushed page: store effects performed here, every
    request to the pusher answered 'absent' (a 404, as a pull reads a missing artifact);
    a store's refusal is thrown back in, as the client's driver does."""
    throw, value = False, None
    while True:
        try:
            step = gen.throw(value) if throw else gen.send(value)
        except StopIteration:
            return
        throw = False
        if isinstance(step, STORE_EFFECTS):
            try:
                value = _perform(store, perform, step)
            except ValidationError as exc:
                throw, value = True, exc
        elif isinstance(step, Batch):
            value = [None] * len(step.requests)
        elif isinstance(step, Request):
            value = None
        else:
            raise TypeError(f"a pull step that is not an effect or a request: {step!r}")


def push_answer_summary(answer: Mapping[str, Any]) -> str:
    """One line for logs: what a pushed page did."""
    return (f"origin {answer.get('origin')} after {answer.get('after')}: +{answer.get('applied')}"
            f" applied, {answer.get('quarantined')} quarantined, top {answer.get('top')}")
