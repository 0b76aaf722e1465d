"""The serving half of a simulated node: what is simulation-specific about it.

The answers themselves come from `logsync.responder`, the same function the real
server calls: a logsync node answers with the server's profile (its `max_page` from
the scenario), a node marked `upstream` as a MemPalace 3.11 hub (no advertisement,
pages capped at 500, no extensions). What stays here: that choice, `Sizer` (bytes on
the simulated wire) and the byzantine `tamper`.

A byzantine node passes its answers through `tamper()`, which alters one item
in a way a receiver must catch (or, for `fork`, in the one way it cannot). Besides
its own kinds it draws from the corpus of hostile answers `logsync.hostile` shares
with `tests/hostile/` (`hostile.SIM_KINDS`), and `corrupt` picks among the corpus's
must-refuse page mutations too, so every byzantine run throws them at the real
engine and store.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from logsync import hostile
from logsync.responder import UPSTREAM_HUB, Profile, answer, int_param


def serve(store: Any, path: str, params: dict[str, Any], *, logsync: bool,
          max_page: int, vector: Callable[[], dict[str, int]] | None = None) -> tuple[int, Any]:
    """(status, body) for one GET, as a logsync server (or an upstream hub) answers it.
    `vector` reads the store's version vector (default `store.version_vector`)."""
    profile = Profile(max_page=max_page) if logsync else UPSTREAM_HUB
    return answer(store, path, params, profile=profile, vector=vector)


def _json_len(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except RecursionError:  # a hostile answer (deeply nested metadata): count without recursion
        return _deep_json_len(value)


def _deep_json_len(value: Any) -> int:
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            total += 2 + max(0, len(item) - 1) + sum(_json_len(str(k)) + 1 for k in item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            total += 2 + max(0, len(item) - 1)
            stack.extend(item)
        else:
            total += _json_len(item)
    return total


class Sizer:
    """Bytes on the wire for a compact JSON answer (what bytes-per-op counts).

    An op's encoding differs between replicas only in `seq`, so the size of each op
    without it is computed once per id and content; the total is exact.
    """

    def __init__(self) -> None:
        self._ops: dict[tuple[str, str], int] = {}

    def size(self, body: Any, *, exact: bool = False) -> int:
        """`exact` skips the cache (a tampered answer may differ in any field)."""
        if exact or not isinstance(body, dict) or not isinstance(body.get("events"), list):
            return _json_len(body)
        events = body["events"]
        rest = {k: v for k, v in body.items() if k != "events"}
        total = _json_len(rest) + len(',"events":[]') + max(0, len(events) - 1)
        for event in events:
            total += self._op(event)
        return total

    def _op(self, event: Any) -> int:
        if not isinstance(event, dict) or not isinstance(event.get("seq"), int):
            return _json_len(event)
        key = (str(event.get("id")), str(event.get("body")))
        base = self._ops.get(key)
        if base is None:
            base = _json_len(dict(event, seq=0)) - 1
            self._ops[key] = base
        return base + len(str(event["seq"]))


# ── a byzantine server ────────────────────────────────────────────────

# What `corrupt` draws from besides a bad type: hostile ops and pages every receiver must
# refuse (never store), from the corpus shared with tests/hostile/.
CORRUPT_FROM_CORPUS = ("seq_overflow", "deep_metadata", "newline_fields", "arabic_digits",
                       "bad_page_seq")


def tamper(
    store: Any, path: str, params: dict[str, Any], body: Any, kinds: tuple[str, ...],
    rng: random.Random, requester: str,
) -> str | None:
    """Alter one item of a 200 answer in place; return what was done (None = untouched)."""
    if path == "/sync/artifact" and isinstance(body, dict) and "artifact" in body:
        if "bad_artifact" in kinds:
            body["artifact"] = dict(body["artifact"], content=body["artifact"]["content"] + "X")
            return f"bad_artifact {body['artifact']['id']}"
        return None
    if path == "/sync/version_vector" and isinstance(body, dict):
        lies = [k for k in kinds if k in hostile.VECTOR_KINDS]
        return hostile.tamper_vector(rng.choice(lies), body, rng, requester) if lies else None
    if path != "/sync/ops" or not isinstance(body, dict) or not body.get("events"):
        return None
    kind = rng.choice(kinds)
    events: list[dict[str, Any]] = body["events"]
    index = rng.randrange(len(events))
    victim = dict(events[index])
    if kind == "corrupt":
        corpus = rng.choice(("type", *CORRUPT_FROM_CORPUS))
        if corpus != "type":
            done = hostile.tamper_page(corpus, body, params, rng, requester)
            if done:
                return f"corrupt {done}"
        victim["type"] = "Not A Valid Type!"
        events[index] = victim
        return f"corrupt {victim['id']} type"
    if kind in hostile.SIM_KINDS:
        return (hostile.tamper_page(kind, body, params, rng, requester)
                or _corrupt_fallback(events, index, victim))
    if kind == "fork":
        victim["body"] = f"{victim['body']} [forked by a byzantine peer]"
        events[index] = victim
        return f"fork {victim['id']} body"
    if kind == "wrong_origin":
        victim["origin_replica"] = requester
        events[index] = victim
        return f"wrong_origin {victim['id']} claims the requester's origin"
    if kind == "bad_artifact":
        return _bad_inline_artifact(body) or _corrupt_fallback(events, index, victim)
    if kind == "stale_fork":
        return _stale_fork(store, params, events) or _corrupt_fallback(events, index, victim)
    return _id_reuse(events)


def _corrupt_fallback(events: list[dict], index: int, victim: dict) -> str:
    victim["hlc"] = "not-an-hlc"
    events[index] = victim
    return f"corrupt {victim['id']} hlc"


def _bad_inline_artifact(body: dict[str, Any]) -> str | None:
    artifacts = body.get("artifacts") or []
    if not artifacts:
        return None
    first = dict(artifacts[0], content=artifacts[0]["content"] + "X")
    body["artifacts"] = [first, *artifacts[1:]]
    return f"bad_artifact {first['id']} inline"


def _stale_fork(store: Any, params: dict[str, Any], events: list[dict]) -> str | None:
    after = int_param(params, "after", 0)
    if after < 1:
        return None
    held = store.list_ops(params["origin"], after - 1, 1)
    if not held:
        return None
    forked = dict(held[0], body=held[0]["body"] + " [stale fork]")
    events.insert(0, forked)
    return f"stale_fork {forked['id']} seq={forked['origin_seq']} <= after={after}"


def _id_reuse(events: list[dict]) -> str:
    last = events[-1]
    fake = dict(last, origin_seq=last["origin_seq"] + 1, body="an op that reuses an id")
    fake["id"] = events[0]["id"]
    events.append(fake)
    return f"id_reuse seq={fake['origin_seq']} id={fake['id']}"
