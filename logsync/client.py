"""The httpx driver of the sans-IO engine: performs a round's requests against one peer.

Answers from a peer are untrusted input. Every foreign failure is translated
into the project's own types where it enters (STYLE.md §6):

    status codes, retries, Retry-After    -> `fetchpolicy.FetchPolicy` (shared with the simulator)
    connect error, read timeout           -> PeerTransientError (retried)
    bad JSON/msgpack                      -> PeerProtocolError  (never retried)
    past the byte cap or a decode bound   -> PeerTooLargeError  (the engine asks for less)

Everything a peer sends is bounded (invariant 10): the body by `max_response_bytes`,
the time of one request by `request_deadline` (httpx's timeouts are per read, so a
peer dripping a byte at a time would hold it forever), and decoding by
`MAX_CONTAINERS` arrays/objects per answer (a 60 MB body of empty arrays decodes to
gigabytes) and msgpack's own length limits. Decoding runs in a worker thread, so a
large answer never stalls the event loop (and with it `/healthz`).

The round advances on the event loop; its store effects (synchronous SQLite) run in
a worker thread, so the event loop never blocks on the database.
"""

from __future__ import annotations

import contextlib
import logging
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Generator, Mapping
from typing import Any

import anyio
import anyio.to_thread
import httpx

from logsync import __version__
from logsync.answers import (
    ACCEPT_ENCODING,
    ASK_ZSTD,
    MSGPACK_TYPE,
    InFlight,
    decode_answer,
    encoding_problem,
    error_text,
    parse_retry_after,
    translate_transport,
)
from logsync.effects import STORE_EFFECTS, ApplyPage, StoreLike, perform
from logsync.engine import RoundReport, pull_round, targeted_origin
from logsync.errorcodes import ERRORS_CODED, ERRORS_HEADER
from logsync.errors import (
    ConfigError,
    LogsyncError,
    PeerError,
    PeerProtocolError,
    PeerTooLargeError,
    ValidationError,
)
from logsync.fetchpolicy import (
    OPS_PATH,
    FetchPolicy,
    PeerDeadlineError,
)
from logsync.peers import check_url, redact_url
from logsync.prefetch import Prefetcher
from logsync.push import PushReport, push_round
from logsync.wire import Batch, Extensions, Request, Step
from logsync.zstdcoding import ZSTD

__all__ = ["MAX_RESPONSE_BYTES", "PeerClient", "PeerDeadlineError", "sync_once", "tls_context"]

logger = logging.getLogger("logsync.client")

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
REQUEST_DEADLINE_S = 60.0
ROUND_DEADLINE_S = 600.0  # a round is capped at MAX_OPS_PER_ROUND ops: minutes at most
# Bytes all of one client's answers in flight may hold together (a batch of first pages,
# a prefetch): one answer may reach the cap, several big ones are refused as too large
# (the engine then asks for smaller pages), so memory never scales with concurrency.
MAX_BUFFERED_BYTES = 96 * 1024 * 1024

Sleep = Callable[[float], Awaitable[None]]


class PeerClient:
    """One peer, one `httpx.AsyncClient` (connection reuse); use as an async context manager."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        name: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        verify: bool = True,
        ca_file: str | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        attempts: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        max_retry_after: float = 30.0,
        concurrency: int = 8,
        request_deadline: float = REQUEST_DEADLINE_S,
        round_deadline: float = ROUND_DEADLINE_S,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.url = _check_url(url)
        self.name = name or redact_url(self.url)
        self.max_response_bytes = max_response_bytes
        self.policy = FetchPolicy(attempts=attempts, backoff=backoff, max_backoff=max_backoff,
                                  max_retry_after=max_retry_after, concurrency=concurrency)
        self.request_deadline = request_deadline
        self.round_deadline = round_deadline
        # bytes held by answers being read, or decoded from zstd, right now
        self._in_flight = InFlight(max(max_response_bytes, MAX_BUFFERED_BYTES))
        self._limiter = anyio.CapacityLimiter(self.policy.batch_concurrency(upstream=False))
        self._upstream_limiter = anyio.CapacityLimiter(self.policy.batch_concurrency(upstream=True))
        self._sleep = sleep or anyio.sleep
        self._rng = rng or random.Random()
        headers = {"User-Agent": f"logsync/{__version__}", "Accept": "application/json",
                   ERRORS_HEADER: ERRORS_CODED, **ACCEPT_ENCODING}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=concurrency,
                                max_keepalive_connections=concurrency),
            # Plain http never uses TLS: skip loading the CA bundle (~0.1 s per client).
            verify=(tls_context(verify, ca_file)
                    if ca_file or self.url.startswith("https:") else False),
            transport=transport,
            follow_redirects=False,
        )

    async def __aenter__(self) -> PeerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ── one round ─────────────────────────────────────────────────────

    async def run_round(
        self,
        store: StoreLike,
        *,
        page_limit: int | None = None,
        use_extensions: bool = True,
        report: RoundReport | None = None,
        held_back: Collection[str] = (),
    ) -> RoundReport:
        """Drive one engine pull round against this peer; raises a PeerError on failure
        (pages applied before it stay applied; `report` shows how far it got). The round
        ends at `round_deadline` whatever the peer does."""
        report = report if report is not None else RoundReport(peer=self.name)
        async with self._round_deadline():
            return await self._full_round(store, report, page_limit, use_extensions,
                                          held_back)

    async def _full_round(self, store: StoreLike, report: RoundReport,
                          page_limit: int | None, use_extensions: bool,
                          held_back: Collection[str]) -> RoundReport:
        gen = pull_round(store.replica_id, self.name, page_limit=page_limit,
                         use_extensions=use_extensions, held_back=held_back,
                         batch_artifacts=True, report=report)
        outcome: RoundReport | LogsyncError
        async with anyio.create_task_group() as prefetches:
            try:
                ahead = Prefetcher(self.fetch, self.name, prefetches, report, store)
                with ahead.overlapping():
                    outcome = await self._drive(gen, store, report, ahead)
            except LogsyncError as exc:  # returned, so the task group does not wrap it
                outcome = exc
            finally:
                gen.close()
                prefetches.cancel_scope.cancel()
        if isinstance(outcome, LogsyncError):
            raise outcome
        return outcome

    async def run_targeted(
        self,
        store: StoreLike,
        targets: Mapping[str, int],
        ext: Extensions,
        *,
        origins_in_flight: int = 8,
        report: RoundReport | None = None,
    ) -> RoundReport:
        """A round started by change notifications: just the named origins, side by side
        (`schedule.choose_targets` picks them, `engine.targeted_origin` pulls each)."""
        report = report if report is not None else RoundReport(peer=self.name)
        async with self._round_deadline():
            return await self._targeted(store, targets, ext, origins_in_flight, report)

    async def run_push(self, store: StoreLike, *, report: PushReport | None = None
                       ) -> PushReport:
        """One push round (`push.push_round`): what the peer's vector lacks of ours, POSTed
        page by page. Raises a PeerError when the round fails (pages the peer took stay
        taken; `report` shows how far it got); bounded by `round_deadline` too."""
        report = report if report is not None else PushReport(peer=self.name)
        scratch = RoundReport(peer=self.name)  # the driver's byte and page counters
        gen = push_round(store.replica_id, self.name, report=report)
        async with self._round_deadline():
            try:
                return await self._drive(gen, store, scratch, None)
            finally:
                gen.close()

    @contextlib.asynccontextmanager
    async def _round_deadline(self) -> AsyncIterator[None]:
        """A total deadline per round (invariant 10), for the daemon and `sync` alike."""
        try:
            with anyio.fail_after(self.round_deadline):
                yield
        except TimeoutError:
            raise PeerDeadlineError(
                f"peer {self.name}: the round did not finish within {self.round_deadline:g} s",
                peer=self.name) from None

    async def _targeted(self, store: StoreLike, targets: Mapping[str, int], ext: Extensions,
                        origins_in_flight: int, report: RoundReport) -> RoundReport:
        report.extensions = ext.names()
        limiter = anyio.CapacityLimiter(
            self.policy.origins_in_flight(origins_in_flight, upstream=not ext.names()))
        failures: list[LogsyncError] = []
        local = await anyio.to_thread.run_sync(store.version_vector)

        async def one(origin: str, top: int) -> None:
            gen = targeted_origin(self.name, origin, top, ext, report,
                                  batch_artifacts=True, held=local.get(origin, 0))
            async with limiter, anyio.create_task_group() as prefetches:
                try:
                    ahead = Prefetcher(self.fetch, self.name, prefetches, report, store)
                    with ahead.overlapping():
                        await self._drive(gen, store, report, ahead)
                except LogsyncError as exc:  # a store failure too: kept, never wrapped
                    failures.append(exc)
                    group.cancel_scope.cancel()
                finally:
                    gen.close()
                    prefetches.cancel_scope.cancel()

        async with anyio.create_task_group() as group:
            for origin, top in sorted(targets.items()):
                group.start_soon(one, origin, top)
        if failures:
            raise failures[0]
        report.local_vector_after = dict(await anyio.to_thread.run_sync(store.version_vector))
        return report

    async def _drive(
        self, gen: Generator[Any, Any, Any], store: StoreLike, report: RoundReport,
        prefetcher: Prefetcher | None,
    ) -> Any:
        """Advance the round on the event loop; its store effects run in a worker thread
        (SQLite blocks), its requests here. What either raises is thrown back in."""
        done, value = _advance(gen, "send", None)
        page_began: float | None = None  # when the page now being applied was asked for
        while not done:
            try:
                if isinstance(value, STORE_EFFECTS):
                    prepared = None
                    if isinstance(value, ApplyPage) and prefetcher is not None:
                        prepared = await prefetcher.prepared_for(value)
                    answer = await _apply(store, value, prepared)
                    if isinstance(value, ApplyPage) and page_began is not None:
                        report.time_page(time.monotonic() - page_began)
                        page_began = None
                else:
                    if page_began is None and _asks_a_page(value):
                        page_began = time.monotonic()
                    answer = await self._perform(value, report, prefetcher)
            except Exception as exc:  # noqa: BLE001 - the round decides what it means
                done, value = _advance(gen, "throw", exc)
                continue
            done, value = _advance(gen, "send", answer)
        return value

    async def _perform(self, step: Step, report: RoundReport,
                       prefetcher: Prefetcher | None = None) -> Any:
        if isinstance(step, Batch):
            answers = await self._perform_batch(step.requests, report)
            if prefetcher is not None:
                prefetcher.prepare_batch(step.requests, answers)
            return answers
        if prefetcher is not None and step.path == OPS_PATH:
            answer, size = await prefetcher.take(step)
            prefetcher.after(step, answer)
        else:
            answer, size = await self.fetch(step)
        report.bytes_received += size
        return answer

    async def _perform_batch(self, requests: tuple[Request, ...], report: RoundReport) -> list:
        """Independent requests side by side (bounded); a failed request is answered by its
        PeerError, so one origin's slow or failing page never costs the others theirs.

        A peer without logsync extensions (a MemPalace hub) closes every connection and
        listens with a backlog of 5, so it gets fewer requests in flight.
        """
        answers: list[Any] = [None] * len(requests)
        limiter = self._limiter if report.extensions else self._upstream_limiter

        async def one(index: int, request: Request) -> None:
            async with limiter:
                try:
                    answers[index], size = await self.fetch(request)
                    report.bytes_received += size
                except PeerError as exc:
                    answers[index] = exc

        async with anyio.create_task_group() as group:
            for index, request in enumerate(requests):
                group.start_soon(one, index, request)
        return answers

    # ── one request ───────────────────────────────────────────────────

    async def fetch(self, request: Request) -> tuple[Any, int]:
        """Perform one request, retried as `FetchPolicy.retry_wait` says: (answer, bytes)."""
        attempt = 1
        while True:
            try:
                return await self._fetch_once(request)
            except PeerError as exc:
                wait = self.policy.retry_wait(attempt, exc, self._rng)
                if wait is None:
                    raise
                logger.info("peer %s: attempt %d failed (%s); retrying", self.name, attempt, exc)
            await self._sleep(wait)
            attempt += 1

    async def _fetch_once(self, request: Request) -> tuple[Any, int]:
        method = "GET" if request.body is None else "POST"
        where = f"peer {self.name}: {method} {request.path}"
        headers = {"Accept": MSGPACK_TYPE} if request.accept_msgpack else {}
        coded = request.path == OPS_PATH and request.body is None  # pages: zstd if it may
        if coded:
            headers["Accept-Encoding"] = ASK_ZSTD
        if request.body is not None:
            headers["Content-Type"] = "application/json"
        try:
            with anyio.fail_after(self.request_deadline):
                async with self._http.stream(method, request.path, params=request.params,
                                             headers=headers,
                                             content=request.body) as response:
                    body = await self._read_capped(response, where, (ZSTD,) if coded else ())
        except TimeoutError:
            raise PeerDeadlineError(
                f"{where} did not finish within {self.request_deadline:g} s", peer=self.name
            ) from None
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise translate_transport(exc, where, self.name) from None
        size = len(body)
        try:
            if response.status_code == 404 and request.missing_ok:
                return None, size
            self._check_status(response, body, where)
            ctype = response.headers.get("content-type", "")
            coding = response.headers.get("content-encoding", "").strip().lower()
            with self._in_flight.lease(where, self.name) as take:  # what zstd decodes to
                answer = await anyio.to_thread.run_sync(decode_answer, ctype, body, where,
                                                        self.name, coding,
                                                        self.max_response_bytes, take)
        finally:
            # Free the bytes now: a refused answer's traceback keeps this frame (and the
            # buffer) alive until the cyclic collector runs, 60 MB at a time.
            body.clear()
        return answer, size

    async def _read_capped(self, response: httpx.Response, where: str,
                           asked: tuple[str, ...] = ()) -> bytearray:
        """The body as sent, refusing it as soon as it passes the cap (announced or
        streamed); a content coding other than those `asked` for is refused."""
        cap = self.max_response_bytes
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise PeerTooLargeError(
                f"{where} announced a {declared}-byte answer; the cap is {cap} bytes",
                peer=self.name,
            )
        problem = encoding_problem(response.headers, asked)
        if problem:
            raise PeerProtocolError(f"{where} {problem}", peer=self.name)
        body = bytearray()  # grown in place: no second copy at the end
        with self._in_flight.lease(where, self.name) as take:
            try:
                async for chunk in _raw_chunks(response):  # as sent: never expanded unbounded
                    if len(body) + len(chunk) > cap:
                        raise PeerTooLargeError(
                            f"{where} sent an answer larger than the {cap}-byte cap",
                            peer=self.name)
                    take(len(chunk))
                    body += chunk
            except BaseException:
                body.clear()
                raise
        return body

    def _check_status(self, response: httpx.Response, body: bytes, where: str) -> None:
        """Raise the error a non-2xx answer is; a 2xx body is never read for a sentence
        (a coded page would be decoded on the event loop for nothing)."""
        if 200 <= response.status_code < 300:
            return
        coding = response.headers.get("content-encoding", "")
        error = self.policy.error_for_status(response.status_code, error_text(body, coding),
                                             where, self.name,
                                             parse_retry_after(response.headers))
        if error is not None:
            raise error


async def _raw_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """The body as sent; a response a transport handed over already read (tests' mock
    transports) is its content."""
    if response.is_stream_consumed:
        yield response.content
        return
    async for chunk in response.aiter_raw():
        yield chunk


async def _apply(store: StoreLike, effect: Any, prepared: Any) -> Any:
    """Perform a store effect; an `ApplyPage` with the page the store prepared ahead."""
    if prepared is None:
        return await anyio.to_thread.run_sync(perform, store, effect)
    return await anyio.to_thread.run_sync(
        lambda: store.apply_chained(effect.events, effect.artifacts, effect.origin,  # type: ignore[call-arg]
                                    effect.after, effect.prev, effect.signatures,
                                    prepared=prepared))


def _asks_a_page(step: Step) -> bool:
    if isinstance(step, Batch):
        return any(r.path == OPS_PATH for r in step.requests)
    return step.path == OPS_PATH


def _advance(gen: Generator[Any, Any, Any], how: str, value: Any) -> tuple[bool, Any]:
    """Step the round: (True, its result) once it returns, else (False, its next step)."""
    try:
        step = gen.throw(value) if how == "throw" else gen.send(value)
    except StopIteration as stop:
        return True, stop.value
    return False, step


def _check_url(url: object) -> str:
    """`peers.check_url`'s rule, as the client's `ConfigError`; the URL as httpx
    normalises it."""
    try:
        return str(httpx.URL(check_url(url))).rstrip("/")
    except ValidationError as exc:
        raise ConfigError(str(exc)) from None


def tls_context(verify: bool, ca_file: str | None) -> ssl.SSLContext | bool:
    if not verify:
        return False
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"CA file {ca_file!r} cannot be loaded: {exc}") from None


def sync_once(
    store: StoreLike, url: str, token: str | None = None, **options: Any
) -> RoundReport:
    """One round against one peer, for the CLI (blocking). `options`: PeerClient and
    run_round keywords (`name`, `timeout`, `page_limit`, `use_extensions`, ...)."""
    round_keys = {"page_limit", "use_extensions", "report"}
    round_opts = {k: v for k, v in options.items() if k in round_keys}
    client_opts = {k: v for k, v in options.items() if k not in round_keys}

    async def one() -> RoundReport:
        async with PeerClient(url, token, **client_opts) as client:
            return await client.run_round(store, **round_opts)

    return anyio.run(one)
