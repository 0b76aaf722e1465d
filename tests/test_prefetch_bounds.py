"""What the client's look-ahead (`logsync/prefetch.py`) holds while a round goes on: a
page prepared ahead for an origin whose pull then stopped (the store stopped it, or the
peer failed it) is never applied, and must not be held until the round ends: a round
pulls its origins one after another, so each would add a page (up to the peer's page
byte budget, decoded, with its prepared rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

from logsync import prefetch
from logsync.responder import LOGSYNC_SERVER
from logsync.store import Store
from logsync.store.apply import ApplyResult
from tests.test_client import StorePeer, run_round

ORIGINS = 6
PAGE = 8


def test_a_page_prepared_ahead_for_an_origin_left_behind_is_not_held(tmp_path: Path) -> None:
    """Six origins of 24 ops, pages of 8; the store stops each origin at its second page,
    while its third (prefetched, prepared) is ready. When the round applies a page of
    another origin, at most one such page of an origin left behind is still held."""
    relay = Store.open(tmp_path / "relay")
    for n in range(ORIGINS):
        with Store.open(tmp_path / f"author{n}") as author:
            for i in range(3 * PAGE):
                author.append_event("task.ask", "s", "r", "alice", body=f"{n} {i}")
            run_round(relay, StorePeer(author, profile=LOGSYNC_SERVER), page_limit=PAGE)
    stale: list[int] = []
    real_apply, real_prepared_for = Store.apply_chained, prefetch.Prefetcher.prepared_for

    def apply(self: Store, events: Any, artifacts: Any, origin: str, after: int,
              *args: Any, **kw: Any) -> Any:
        if after >= PAGE:  # the store stops the origin at its second page
            return ApplyResult(stopped={origin: "stopped here"})
        return real_apply(self, events, artifacts, origin, after, *args, **kw)

    async def prepared_for(self: prefetch.Prefetcher, effect: Any) -> Any:
        stale.append(sum(1 for p in self._preparing.values()
                         if p.origin != effect.origin and p.after >= PAGE))
        return await real_prepared_for(self, effect)

    target = Store.open(tmp_path / "target")
    with mock.patch.object(Store, "apply_chained", apply), \
            mock.patch.object(prefetch.Prefetcher, "prepared_for", prepared_for), \
            mock.patch.object(prefetch, "CORES", 2):  # as on a machine with a core to spare
        report = run_round(target, StorePeer(relay, profile=LOGSYNC_SERVER), page_limit=PAGE)
    assert report.applied == ORIGINS * PAGE
    assert len(stale) == 2 * ORIGINS
    assert max(stale) <= 1, stale
