"""The simulator's byzantine kinds: alter an honest answer in place, say what was done."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from logsync.hostile.ops import (
    BAD_PAGE_SEQ_VARIANTS,
    OP_MUTATIONS,
    PAGE_SEQ_VALUES,
    bad_page,
    deep_metadata,
    forged_own,
    has_number,
    numeric_twin,
    overflow_seq,
)

# ── the simulator's byzantine kinds ──────────────────────────────────

# Each alters an honest 200 answer in place and says what it did (None: not applicable).
SIM_KINDS = ("seq_overflow", "deep_metadata", "newline_fields", "arabic_digits",
             "bad_page_seq", "numeric_fork", "forged_own_far_future", "vector_overflow")
# Kinds that (also) alter `/sync/version_vector` answers (`tamper_vector`).
VECTOR_KINDS = ("forged_own_far_future", "vector_overflow")


def tamper_page(kind: str, body: dict[str, Any], params: Mapping[str, Any],
                rng: random.Random, requester: str) -> str | None:
    """One hostile alteration of an honest `/sync/ops` page (the simulator's byzantine
    fault). Never one a receiver cannot catch, except `numeric_fork`, which is only
    served to the op's own origin (who holds it and must record the conflict)."""
    events: list[dict[str, Any]] = body.get("events") or []
    origin = str(params.get("origin") or "")
    if kind == "forged_own_far_future":
        if origin != requester:
            return None
        top = max([e["origin_seq"] for e in events] or [0])
        events.append(forged_own(requester, top + 1))
        events.append(forged_own(requester, top + 2**40))
        body["count"] = len(events)
        return f"forged_own_far_future {requester} seq={top + 1},{top + 2**40}"
    if not events:
        return None
    if kind == "seq_overflow":
        events[-1] = overflow_seq(events[-1], rng.choice([2**63, 2**64 - 1, 2**62 + 1]))
        return f"seq_overflow {events[-1]['id']} origin_seq={events[-1]['origin_seq']}"
    if kind == "bad_page_seq":
        variant = rng.choice([v for v in BAD_PAGE_SEQ_VARIANTS if v in PAGE_SEQ_VALUES
                              or v == "backwards"])
        if variant == "backwards" and len(events) < 2:
            variant = "seq_zero"
        body["events"] = bad_page(variant, events)
        return f"bad_page_seq {variant} origin={origin}"
    if kind == "numeric_fork":
        if origin != requester:
            return None
        for index, event in enumerate(events):
            if has_number(event.get("metadata")):
                events[index] = dict(event, metadata=numeric_twin(event["metadata"]))
                return f"numeric_fork {event['id']} metadata={event['metadata']!r}"
        return None
    index = rng.randrange(len(events))
    if kind == "deep_metadata":
        events[index] = deep_metadata(events[index])
        return f"deep_metadata {events[index]['id']}"
    if kind == "newline_fields":
        name = rng.choice(["newline_type", "newline_id"])
        events[index] = OP_MUTATIONS[name](events[index])
        return f"{name} {events[index]['id']!r}"
    if kind == "arabic_digits":
        name = rng.choice(["arabic_hlc", "arabic_created_at"])
        events[index] = OP_MUTATIONS[name](events[index])
        return f"{name} {events[index]['id']}"
    return None


def tamper_vector(kind: str, body: dict[str, Any], rng: random.Random,
                  requester: str) -> str | None:
    """One hostile alteration of an honest `/sync/version_vector` answer."""
    vector = body.get("version_vector")
    if not isinstance(vector, dict):
        return None
    if kind == "vector_overflow" and vector:
        origin = rng.choice(sorted(vector))
        vector[origin] = rng.choice([2**64 - 1, 2**63, 2**62])
        return f"vector_overflow {origin}={vector[origin]}"
    if kind == "forged_own_far_future":
        vector[requester] = max(int(vector.get(requester, 0)), 0) + 2**40
        return f"forged_own_far_future vector[{requester}]={vector[requester]}"
    return None
