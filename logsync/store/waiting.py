"""Waiting for events: a long poll over a store's `list_events` (`logsync wait`).

It reads only through `Store.list_events`, so it speaks no SQL of its own; it sleeps
between polls, backing off from `poll_s` to half a second, and gives up at the deadline.
"""

from __future__ import annotations

import time
from typing import Any

from logsync.errors import ValidationError, shorten
from logsync.store.core import Store
from logsync.store.reads import MAX_WAIT_TIMEOUT_MS


def wait_events(
    store: Store,
    timeout_ms: int = 60_000,
    *,
    poll_s: float = 0.05,
    **filters: Any,
) -> dict[str, Any]:
    """The first events matching `filters` (those of `list_events`), or
    `{timed_out: true, events: []}` after `timeout_ms` (at most MAX_WAIT_TIMEOUT_MS)."""
    if (
        isinstance(timeout_ms, bool)
        or not isinstance(timeout_ms, int | float)
        or timeout_ms < 0
    ):
        raise ValidationError(
            f"timeout_ms={shorten(timeout_ms)} is invalid: must be a non-negative number"
        )
    deadline = time.monotonic() + min(timeout_ms, MAX_WAIT_TIMEOUT_MS) / 1000
    delay = poll_s
    while True:
        events = store.list_events(**filters)
        remaining = deadline - time.monotonic()
        if events:
            return {"timed_out": False, "events": events}
        if remaining <= 0:
            return {"timed_out": True, "events": []}
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, 0.5)
