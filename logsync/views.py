"""Derived views over a replica's events: the owed set, partition claims, presence.

Pure functions over event dicts (the store's read shape); no I/O. They are
what an agent's mailbox, a claim arbiter and a fleet dashboard compute, and
they must come out identical on every replica that holds the same events, so
they order events by HLC, never by `seq` (local arrival order, RFC 003 §7.3),
except where the RFC says `seq` is the fallback.

**Order** (`happened_after`): B is after A when both carry an HLC and
`B.hlc > A.hlc` (fixed-width stamps: string order is the merge order, the
replica id breaks ties); if either lacks an HLC (a row from a server that
predates the field), `B.seq > A.seq`.

**Owed** (RFC 003 §3.3, §7.3, §7.4, §7.12): an event E is still owed by agent X when
1. E is an ask: `status == "open"` (the mailbox draws candidates with status open);
2. E is directed at X: `to_agent == X` exactly (a `*` broadcast owes nobody);
3. E was not written by X;
4. no event C of X's clears it, where C clears E when C is written by X, carries a
   terminal status (applied, superseded, failed, blocked), joins E
   (`C.metadata.ack_of == E.id`, or E has a correlation id and
   `C.correlation_id == E.correlation_id`), and happened after E.

**Claims** (R3, partition claims): the claims on a correlation id C are the events with
`correlation_id == C` and `status == "claimed"`. The winner is the earliest claim in
HLC order; claims without an HLC rank after every claim with one, among themselves
by `created_at`, then by `id`. Claims by the same agent count once, at its earliest.
The winner is a function of the set of claims alone, so every replica that holds
the same claims names the same winner, however they arrived.

**Yielding** (R3's loser step): a losing claimant L of C still has to yield until it
writes an event with `correlation_id == C` and `status == "superseded"` that happened
after its claim; `claims` lists those who have not (`must_yield`).

**Expiry** (R2): an ask may carry `metadata.expires_at`, a UTC time as `created_at`
spells it (`YYYY-MM-DDTHH:MM:SSZ`). `split_expired` separates the owed asks whose time is
at or before `now` from those still to act on; any other value never expires. Expiry
depends on the reader's clock, so it is kept out of `owed` itself, which every replica
must compute alike.

**Presence** (R5): per `from_agent`, the newest event it wrote: greatest HLC; an
agent's events without an HLC count only when it has none with one, then by
`created_at`, then by `id`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from logsync.errors import ValidationError
from logsync.model import TERMINAL_STATUSES, created_at

Event = Mapping[str, Any]


def happened_after(later: Event, earlier: Event) -> bool:
    """True when `later` comes after `earlier`: by HLC, or by seq if either has no HLC."""
    a, b = later.get("hlc"), earlier.get("hlc")
    if a and b:
        return a > b
    return _seq(later) > _seq(earlier)


def _seq(event: Event) -> int:
    seq = event.get("seq")
    return seq if isinstance(seq, int) else 0


def _ack_of(event: Event) -> str | None:
    meta = event.get("metadata")
    value = meta.get("ack_of") if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else None


class _Latest:
    """The latest clearing event per join key, kept in both orders the rule may need."""

    __slots__ = ("hlc", "seq_without_hlc", "seq_any")

    def __init__(self) -> None:
        self.hlc = ""
        self.seq_without_hlc = 0
        self.seq_any = 0

    def add(self, event: Event) -> None:
        stamp, seq = event.get("hlc"), _seq(event)
        self.seq_any = max(self.seq_any, seq)
        if stamp:
            self.hlc = max(self.hlc, stamp)
        else:
            self.seq_without_hlc = max(self.seq_without_hlc, seq)

    def after(self, event: Event) -> bool:
        stamp, seq = event.get("hlc"), _seq(event)
        if not stamp:
            return self.seq_any > seq
        return self.hlc > stamp or self.seq_without_hlc > seq


def owed(events: Iterable[Event], agent: str) -> list[dict[str, Any]]:
    """The asks `agent` still owes a reply to, in HLC order (see the module rules)."""
    return owed_by_agent(events, agents={agent}).get(agent, [])


def owed_by_agent(
    events: Iterable[Event], agents: set[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every agent's owed set in one pass (only `agents` when given), by agent name."""
    candidates: list[Event] = []
    by_ack: dict[tuple[str, str], _Latest] = {}
    by_corr: dict[tuple[str, str], _Latest] = {}
    for event in events:
        sender, target = event.get("from_agent"), event.get("to_agent")
        status = event.get("status")
        if status == "open" and isinstance(target, str) and target != "*" and sender != target \
                and (agents is None or target in agents):
            candidates.append(event)
        if status in TERMINAL_STATUSES and isinstance(sender, str):
            ack_of = _ack_of(event)
            if ack_of:
                by_ack.setdefault((sender, ack_of), _Latest()).add(event)
            corr = event.get("correlation_id")
            if corr:
                by_corr.setdefault((sender, corr), _Latest()).add(event)
    still: dict[str, list[dict[str, Any]]] = {}
    for event in candidates:
        agent = str(event.get("to_agent"))
        cleared = by_ack.get((agent, str(event.get("id"))))
        if cleared is not None and cleared.after(event):
            continue
        corr = event.get("correlation_id")
        joined = by_corr.get((agent, corr)) if corr else None
        if joined is not None and joined.after(event):
            continue
        still.setdefault(agent, []).append(dict(event))
    return {agent: sorted(items, key=_merge_key) for agent, items in sorted(still.items())}


def _merge_key(event: Event) -> tuple[Any, ...]:
    """HLC order; events without an HLC after, by created_at then id."""
    stamp = event.get("hlc")
    if stamp:
        return (0, stamp, "", str(event.get("id")))
    return (1, "", str(event.get("created_at") or ""), str(event.get("id")))


def claims(events: Iterable[Event], correlation_id: str) -> dict[str, Any]:
    """Every claim on one correlation id, its winner, and the losers that have not yet
    yielded with a `superseded` event (R3)."""
    found: list[dict[str, Any]] = []
    yielded: list[Event] = []
    for event in events:
        if event.get("correlation_id") != correlation_id:
            continue
        if event.get("status") == "claimed":
            found.append(dict(event))
        elif event.get("status") == "superseded":
            yielded.append(event)
    ordered = _first_per_agent(sorted(found, key=_merge_key))
    must_yield = [claim for claim in ordered[1:] if not any(
        y.get("from_agent") == claim.get("from_agent") and happened_after(y, claim)
        for y in yielded)]
    return {
        "correlation_id": correlation_id,
        "winner": ordered[0] if ordered else None,
        "claims": ordered,
        "must_yield": must_yield,
    }


def split_expired(asks: Iterable[Event], now: str) -> tuple[list[dict[str, Any]],
                                                              list[dict[str, Any]]]:
    """(still to act on, expired) from owed asks, against `now` (R2, the module rules)."""
    live: list[dict[str, Any]] = []
    gone: list[dict[str, Any]] = []
    for ask in asks:
        meta = ask.get("metadata")
        when = meta.get("expires_at") if isinstance(meta, Mapping) else None
        expired = is_utc_stamp(when) and when <= now
        (gone if expired else live).append(dict(ask))
    return live, gone


def is_utc_stamp(value: object) -> bool:
    """Whether `value` is a real UTC time spelled as `created_at` is (`2026-13-45T…Z`
    is not: compared as text it would pass for a time)."""
    try:
        created_at(value)
    except ValidationError:
        return False
    return True


def unreadable_expiry(asks: Iterable[Event]) -> int:
    """How many asks carry an `expires_at` that is not such a time: they never expire
    (R2), which the operator should be told (`2020-01-01T00:00:00.000Z` is one)."""
    return sum(1 for ask in asks if isinstance(ask.get("metadata"), Mapping)
               and ask["metadata"].get("expires_at") is not None
               and not is_utc_stamp(ask["metadata"]["expires_at"]))


def _first_per_agent(ordered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[Any] = set()
    out = []
    for event in ordered:
        if event.get("from_agent") not in seen:
            seen.add(event.get("from_agent"))
            out.append(event)
    return out


def claim_winners(events: Iterable[Event]) -> dict[str, dict[str, Any]]:
    """The winning claim for every correlation id that has claims, by correlation id."""
    best: dict[str, dict[str, Any]] = {}
    for event in events:
        corr = event.get("correlation_id")
        if not corr or event.get("status") != "claimed":
            continue
        held = best.get(corr)
        if held is None or _merge_key(event) < _merge_key(held):
            best[corr] = dict(event)
    return dict(sorted(best.items()))


def presence(events: Iterable[Event]) -> dict[str, dict[str, Any]]:
    """Per agent: the newest event it wrote (R5), sorted by agent name."""
    latest: dict[str, tuple[tuple[Any, ...], Event]] = {}
    counts: dict[str, int] = {}
    for event in events:
        agent = event.get("from_agent")
        if not isinstance(agent, str):
            continue
        counts[agent] = counts.get(agent, 0) + 1
        key = _recency_key(event)
        held = latest.get(agent)
        if held is None or key > held[0]:
            latest[agent] = (key, event)
    return {
        agent: {
            "agent": agent,
            "last_seen_hlc": event.get("hlc"),
            "last_seen_at": event.get("created_at"),
            "event_id": event.get("id"),
            "type": event.get("type"),
            "origin_replica": event.get("origin_replica"),
            "events": counts[agent],
        }
        for agent, (_, event) in sorted(latest.items())
    }


def _recency_key(event: Event) -> tuple[Any, ...]:
    stamp = event.get("hlc")
    if stamp:
        return (1, stamp, "", str(event.get("id")))
    return (0, "", str(event.get("created_at") or ""), str(event.get("id")))
