"""What the client's look-ahead (`logsync/prefetch.py`) holds while a round goes on: a
page prepared ahead for an origin whose pull then stopped (the store stopped it, or the
peer failed it) is never applied, and must not be held until the round ends: a round
pulls its origins one after another, so each would add a page (up to the peer's page
byte budget, decoded, with its prepared rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import anyio

from logsync import prefetch
from logsync.fetchpolicy import OPS_PATH
from logsync.report import RoundReport
from logsync.responder import LOGSYNC_SERVER, answer
from logsync.store import Store
from logsync.store.apply import ApplyResult
from logsync.wire import EXT_CHAIN, EXTENSIONS_PARAM, Request
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


def test_a_page_fetched_ahead_that_comes_after_the_round_left_its_origin_is_not_prepared(
        tmp_path: Path) -> None:
    """The page after origin A's full page is fetched ahead; the round asks for a page of
    origin B before that fetch answers (A stopped). When A's page comes, it is not
    prepared (held decoded until some later page is asked for)."""
    source = Store.open(tmp_path / "source")
    for i in range(3 * PAGE):
        source.append_event("task.ask", "s", "r", "alice", body=f"a {i}")
    origin = source.replica_id
    target = Store.open(tmp_path / "target")

    def ops(after: int, of: str = origin) -> Request:
        return Request(OPS_PATH, {"origin": of, "after": after, "limit": PAGE,
                                  EXTENSIONS_PARAM: EXT_CHAIN})

    def served(request: Request) -> Any:
        return answer(source, request.path, request.params, profile=LOGSYNC_SERVER)[1]

    release, asked = anyio.Event(), []

    async def fetch(request: Request) -> tuple[Any, int]:
        asked.append(request.params["after"])
        if request.params["origin"] == origin:
            await release.wait()  # A's page ahead answers only after the round moved on
        return served(request), 1

    async def go() -> int:
        async with anyio.create_task_group() as group:
            ahead = prefetch.Prefetcher(fetch, "peer", group, RoundReport("peer"), target)
            first = ops(0)
            ahead.after(first, served(first))  # a full page: the next is fetched ahead
            await anyio.sleep(0.01)
            await ahead.take(ops(0, of="b" * 32))  # the round has left A
            release.set()
            await anyio.sleep(0.05)
            return len(ahead._preparing)

    with mock.patch.object(prefetch, "CORES", 2):
        held = anyio.run(go)
    assert asked == [PAGE, 0]
    assert held == 0
