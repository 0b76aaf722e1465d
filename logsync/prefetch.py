"""The client's look-ahead (a driver optimisation, never a decision): fetch the page after
a full `/sync/ops` page while the engine applies this one, and prepare it for the store's
fast path (`Store.prepare_chained`: validation, chain digests, signature checks) in a
worker thread while the page before it is being written.

Why the second step: applying a page is the pull's bottleneck, and half of it is Python
work that does not need the write transaction. SQLite releases the GIL while it writes a
chunk of rows (the fast path's multi-row INSERTs) and while it commits, so that work
overlaps the page before's write. The engine still asks for every page, gets exactly the
answer a plain fetch would give and yields every `ApplyPage` itself; a prepared page is
only ever handed to the store with the very events it was prepared from, and the store
checks again, inside its transaction, everything the preparation assumed.
From the first page it prepares ahead to the end of its round, the interpreter runs with
`overlap.bulk_settings` (a pull from a peer without chains prepares none and changes
none); from the first page it fetches ahead (or prepares), the store is in bulk mode
(`Store.bulk_writes`: its log copied into the database by another thread, not by the
commits).
Bounds: what is prepared is the first pages of one `Batch` and pages fetched ahead of the
origin being pulled, and at most one page of an origin the round has left.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from logsync.effects import ApplyPage, StoreLike
from logsync.errors import PeerError
from logsync.fetchpolicy import OPS_PATH, prefetch_guess, request_key
from logsync.overlap import bulk_settings
from logsync.report import RoundReport
from logsync.wire import EXT_CHAIN, EXT_INLINE_ARTIFACTS, EXTENSIONS_PARAM, Request, parse_page

Fetch = Callable[[Request], Awaitable[tuple[Any, int]]]
CORES = os.cpu_count() or 1


class _Prefetch:
    """One speculative page fetch: its outcome, once it has one."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.answer: Any = None
        self.size = 0
        self.error: PeerError | None = None
        self.wanted = True  # until the round asks for another page: a wrong guess


class _Preparing:
    """One page being prepared in a worker thread: the store's `Prepared`, once done."""

    def __init__(self, origin: str, after: int, events: list[Any], ahead: bool) -> None:
        self.origin, self.after = origin, after
        self.events = events  # held, so its id() is not re-used while we wait
        self.ahead = ahead  # a page fetched ahead (else a first page a `Batch` brought)
        self.done = anyio.Event()
        self.prepared: Any = None


class Prefetcher:
    """Fetch the page after a full `/sync/ops` page while the engine applies this one
    (`fetch` is the client's retried fetch), and prepare it when `store` can
    (`prepare_chained`)."""

    def __init__(self, fetch: Fetch, peer: str, group: TaskGroup, report: RoundReport,
                 store: StoreLike | None = None) -> None:
        self._fetch = fetch
        self._peer = peer
        self._group = group
        self._report = report
        self._pending: dict[tuple[Any, ...], _Prefetch] = {}
        # One core: nothing to overlap with, only the handing over of the GIL to pay.
        self._prepare = getattr(store, "prepare_chained", None) if CORES > 1 else None
        self._bulk_writes = getattr(store, "bulk_writes", None)
        self._bulk_entered = False  # `bulk_writes` entered on the round's settings
        self._preparing: dict[int, _Preparing] = {}
        self._settings: ExitStack | None = None  # the round's, while `overlapping`
        self._bulk = False  # `bulk_settings` entered on it

    @contextmanager
    def overlapping(self) -> Iterator[None]:
        """The extent of the round: `overlap.bulk_settings` hold from the first page
        prepared ahead (`_prepare_soon`) to its end."""
        with ExitStack() as settings:
            self._settings = settings
            try:
                yield
            finally:
                self._settings = None

    async def take(self, request: Request) -> tuple[Any, int]:
        """The answer to `request`: the page fetched ahead for it, else fetched now. Pages
        prepared ahead for other origins go: the round has left them."""
        pending = self._pending.pop(request_key(request), None)
        for wrong in self._pending.values():  # any other guess was wrong: its page, when
            wrong.wanted = False  # it comes, is not prepared (the round has left it)
        self._pending.clear()
        self._drop(lambda other: other.ahead and other.origin != request.params.get("origin"))
        if pending is None:
            return await self._fetch(request)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.answer, pending.size

    def after(self, request: Request, answer: Any) -> None:
        """Fetch the next page now when this one came back full, or cut short by the
        peer's byte budget below the origin's target (`prefetch_guess`)."""
        guess = prefetch_guess(request, answer, past_short=True)
        if guess is None:
            return
        slot = self._pending[request_key(guess)] = _Prefetch()
        self._group.start_soon(self._fill, guess, slot)
        self._writing_in_bulk()

    def _writing_in_bulk(self) -> None:
        """More pages come than one: the store in bulk mode to the round's end (once)."""
        if self._settings is not None and not self._bulk_entered \
                and self._bulk_writes is not None:
            self._settings.enter_context(self._bulk_writes())
            self._bulk_entered = True

    def prepare_batch(self, requests: Sequence[Request], answers: Sequence[Any]) -> None:
        """Prepare the first pages a `Batch` brought (several origins' at once) while the
        origins before each are pulled."""
        self._drop(lambda other: True)  # the origins pulled before this group are done
        for request, answer in zip(requests, answers, strict=True):
            if request.path == OPS_PATH and not isinstance(answer, BaseException):
                self._prepare_soon(request, answer, ahead=False)

    async def prepared_for(self, effect: ApplyPage) -> Any:
        """The store's preparation of this very page, if one was started (waited for),
        else None. Other preparations of its origin at or below this page (wrong guesses)
        are dropped; the next page's, ready before this one is applied, is kept."""
        preparing = self._preparing.pop(id(effect.events), None)
        for key, other in list(self._preparing.items()):
            if other.origin == effect.origin and other.after <= effect.after:
                del self._preparing[key]  # a wrong guess; one ahead of this page stays
        if preparing is None or preparing.events is not effect.events:
            return None
        await preparing.done.wait()
        return preparing.prepared

    async def _fill(self, request: Request, slot: _Prefetch) -> None:
        try:
            slot.answer, slot.size = await self._fetch(request)
        except PeerError as exc:
            slot.error = exc
        finally:
            slot.done.set()
        if slot.error is None and slot.wanted:
            self._prepare_soon(request, slot.answer, ahead=True)

    def _drop(self, stale: Callable[[_Preparing], bool]) -> None:
        """Forget the preparations of pages the round will not apply: a round pulls its
        origins one after another, so a page prepared for an origin it left (the store
        or the peer stopped it) would be held, decoded, to the round's end."""
        for key, other in list(self._preparing.items()):
            if stale(other):
                del self._preparing[key]

    def _prepare_soon(self, request: Request, answer: Any, *, ahead: bool) -> None:
        """Parse the page as the engine will (a page it refuses is not prepared), note it
        at once (so an apply of it waits for it rather than doing the work twice) and run
        the store's preparation in a worker thread."""
        params = request.params
        asked = str(params.get(EXTENSIONS_PARAM, "")).split(",")
        if self._prepare is None or EXT_CHAIN not in asked:
            return
        try:
            page = parse_page(answer, self._peer, params["origin"], params["after"],
                              params["limit"], inline_asked=EXT_INLINE_ARTIFACTS in asked,
                              chain_asked=True)
        except PeerError:
            return
        if not page.events or page.prev is None:
            return
        if self._settings is not None and not self._bulk:
            self._settings.enter_context(bulk_settings())
            self._bulk = True
        self._writing_in_bulk()
        preparing = self._preparing[id(page.events)] = _Preparing(page.origin, page.after,
                                                                 page.events, ahead)
        self._group.start_soon(self._run, preparing, page)

    async def _run(self, preparing: _Preparing, page: Any) -> None:
        try:
            preparing.prepared = await anyio.to_thread.run_sync(
                self._prepare, page.events, list(page.inline.values()), page.origin,
                page.after, page.prev, page.signatures)
        except Exception:  # noqa: BLE001 - only a head start: the apply judges the page
            preparing.prepared = None
        finally:
            preparing.done.set()
