"""The kit's one HTTP edge: a request to the peer under test, bounded in bytes, time and
count, answered as raw status, content type and bytes plus the decoded body.

A conformance kit talks to peers it does not trust: every answer's bytes are capped
(`client.MAX_RESPONSE_BYTES`), every request has a deadline (httpx's timeouts are per
read, so a peer dripping one byte at a time is stopped by the clock between chunks),
the run has a total deadline and a request budget, and decoding is `answers.decode_answer`
(the puller's own bounds) after §7's stricter rules (`decoded`). Unlike the client it never
retries and never raises for a status: the status is what a check looks at. The run's own
limits (deadline, budget) raise `OutOfBudget`: the run is then incomplete, not the peer
at fault.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from logsync import __version__
from logsync.answers import (
    ACCEPT_ENCODING,
    ASK_ZSTD,
    MSGPACK_TYPE,
    decode_answer,
    encoding_problem,
    translate_transport,
)
from logsync.client import MAX_RESPONSE_BYTES, tls_context
from logsync.conformance import DEFAULT_DEADLINE_S, DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT_S
from logsync.errorcodes import ERRORS_CODED, ERRORS_HEADER
from logsync.errors import LogsyncError, PeerError, shorten
from logsync.zstdcoding import ZSTD, inflate_capped

WATCHDOG_GRACE_S = 0.5  # past a request's budget before its client is closed
DEADLINE_SLACK_S = 0.05  # a timeout this close to the run's deadline is the deadline's
JSON_TYPE = "application/json"
PACKED_TYPES = (MSGPACK_TYPE, "application/x-msgpack")


class ProbeError(LogsyncError):
    """A request got no answer to judge (transport failure, past a cap or a deadline);
    the sentence names which."""


class OutOfBudget(ProbeError):
    """The run's deadline or request budget is spent (before or during a request): no
    further request is made, and the run is incomplete rather than the peer at fault."""


@dataclass(frozen=True)
class Reply:
    """One answer: status, content type, the raw body, and the decoded body (`data`,
    None when it did not decode: `problem` says why)."""

    status: int
    ctype: str
    body: bytes
    data: Any
    problem: str | None
    headers: httpx.Headers

    def is_json_object(self) -> bool:
        return isinstance(self.data, dict)

    def text(self, limit: int = 80) -> str:
        """The body's start as text for a sentence (not a bytes repr), one line."""
        return shorten(self.body[:4 * limit].decode("utf-8", errors="replace"), limit)


class Probe:
    """Requests to one peer; use as a context manager. `label` names it in sentences."""

    def __init__(self, url: str, token: str | None, *, timeout: float = DEFAULT_TIMEOUT_S,
                 deadline: float = DEFAULT_DEADLINE_S, max_requests: int = DEFAULT_MAX_REQUESTS,
                 max_bytes: int = MAX_RESPONSE_BYTES, ca_file: str | None = None,
                 label: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.label = label or self.url
        self.timeout = timeout
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.requests = 0
        self.started = time.monotonic()
        self.ends = self.started + deadline
        self._ca_file = ca_file
        self._http = self._client()

    def _client(self) -> httpx.Client:
        headers = {"User-Agent": f"logsync-conformance/{__version__}",
                   "Accept": "application/json", **ACCEPT_ENCODING}
        return httpx.Client(
            base_url=self.url, headers=headers, follow_redirects=False,
            # a fresh connection per request: no state carried between checks
            limits=httpx.Limits(max_keepalive_connections=0),
            verify=tls_context(True, self._ca_file) if self.url.startswith("https:") else False)

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def get(self, path: str, params: dict[str, Any] | None = None, *, auth: str | None = "",
            msgpack: bool = False, coded: bool = True, zstd: bool = False) -> Reply:
        """GET `path`; `auth` "" sends our token, None sends none, any other text is sent
        as the whole Authorization header. `coded` asks for coded error bodies
        (`Logsync-Errors: codes`, as every logsync client does). `zstd` accepts a
        zstd-coded answer (RFC 004 D5), decoded here within the kit's cap: the reply's
        `body` is then the decoded bytes and its headers say the coding."""
        return self._request("GET", path, params, auth, msgpack, None, coded=coded,
                             zstd=zstd)

    def post(self, path: str, body: bytes, *, auth: str | None = "") -> Reply:
        return self._request("POST", path, None, auth, False, body)

    def head_only(self, path: str, params: dict[str, Any] | None = None, *,
                  auth: str | None = "") -> Reply:
        """GET `path` but read no body (a stream that never ends): status and headers."""
        return self._request("GET", path, params, auth, False, None, read_body=False)

    def _request(self, method: str, path: str, params: dict[str, Any] | None,
                 auth: str | None, msgpack: bool, content: bytes | None,
                 read_body: bool = True, coded: bool = True, zstd: bool = False) -> Reply:
        where = f"{method} {path}"
        left = self.ends - time.monotonic()
        if left <= 0:
            raise OutOfBudget(f"the kit's deadline passed before {where}")
        if self.requests >= self.max_requests:
            raise OutOfBudget(f"the kit's budget of {self.max_requests} requests is spent "
                              f"before {where}")
        self.requests += 1
        headers = {"Accept": MSGPACK_TYPE} if msgpack else {}
        if zstd:
            headers["Accept-Encoding"] = ASK_ZSTD
        if coded:
            headers[ERRORS_HEADER] = ERRORS_CODED
        if auth == "" and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        elif auth:
            headers["Authorization"] = auth
        if content is not None:
            headers["Content-Type"] = "application/json"
        # when the run's deadline is nearer than --timeout, running out of time is the
        # kit's limit, not the peer's fault
        budget, capped = min(self.timeout, left), left < self.timeout
        ends = time.monotonic() + budget
        # httpx's timeouts are per read: a peer dripping its status line or headers a byte
        # at a time would never trip them. A watchdog closes the client at the deadline.
        http, cut = self._http, threading.Event()
        watchdog = threading.Timer(budget + WATCHDOG_GRACE_S, lambda: (cut.set(), http.close()))
        watchdog.daemon = True
        watchdog.start()
        try:
            with http.stream(method, path, params=params, headers=headers, content=content,
                             timeout=httpx.Timeout(budget, connect=min(5.0, budget))
                             ) as response:
                body = self._read(response, where, ends, capped, zstd) if read_body else b""
                status, ctype, got = (response.status_code,
                                      response.headers.get("content-type", ""), response.headers)
        except (httpx.HTTPError, httpx.StreamError, RuntimeError) as exc:
            if cut.is_set() or isinstance(exc, httpx.TimeoutException) and self._spent():
                raise self._late(where, budget, capped) from None
            if isinstance(exc, RuntimeError):
                raise
            error = translate_transport(exc, f"{self.label}: {where}", self.label)
            raise ProbeError(str(error)) from None
        finally:
            watchdog.cancel()
            if cut.is_set():
                self._http = self._client()  # the closed one takes no more requests
        data, problem = decoded(ctype, body, where, self.label, msgpack) if body else (None, None)
        return Reply(status, ctype.split(";")[0].strip().lower(), body, data, problem, got)

    def _late(self, where: str, budget: float, capped: bool) -> ProbeError:
        """A request out of time: the peer's fault past --timeout, the run's limit when
        the kit's deadline came first."""
        if capped and self._spent():
            return OutOfBudget(f"the kit's deadline passed during {where}")
        return ProbeError(f"{self.label}: {where} did not finish within {budget:g} s")

    def _spent(self) -> bool:
        """Whether the run's deadline has come (a connect timeout before it is the
        peer's, even on a request the deadline capped)."""
        return time.monotonic() >= self.ends - DEADLINE_SLACK_S

    def _read(self, response: httpx.Response, where: str, ends: float,
              capped: bool, zstd: bool = False) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise ProbeError(f"{self.label}: {where} announced a {declared}-byte answer; the "
                             f"kit's cap is {self.max_bytes} bytes")
        problem = encoding_problem(response.headers, (ZSTD,) if zstd else ())
        if problem:
            raise ProbeError(f"{self.label}: {where} {problem}")
        body = bytearray()
        for chunk in response.iter_raw():
            body += chunk
            if len(body) > self.max_bytes:
                raise ProbeError(f"{self.label}: {where} sent more than the kit's cap of "
                                 f"{self.max_bytes} bytes")
            if time.monotonic() > ends:
                raise self._late(where, self.timeout, capped)
        if response.headers.get("content-encoding", "").strip().lower() == ZSTD:
            try:
                body = inflate_capped(body, self.max_bytes, f"{self.label}: {where}",
                                      self.label)
            except PeerError as exc:
                raise ProbeError(str(exc)) from None
        return bytes(body)


def decoded(content_type: str, body: bytes, where: str, peer: str,
            msgpack_asked: bool) -> tuple[Any, str | None]:
    """The body decoded, or None and why not. Stricter than a puller (whose json.loads
    takes UTF-16, NaN and a missing type): §7's JSON answers are `application/json;
    charset=utf-8` in UTF-8, and msgpack only to a request that asked for it."""
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if media in PACKED_TYPES and not msgpack_asked:
        return None, (f"answered Content-Type {media} to a request that accepted only "
                      f"{JSON_TYPE}")
    if media not in (JSON_TYPE, *PACKED_TYPES):
        shown = f"Content-Type {shorten(media)}" if media else "with no Content-Type"
        return None, f"answered {shown}; JSON answers are {JSON_TYPE}; charset=utf-8 (§7)"
    problem = _encoding_problem(params, body) if media == JSON_TYPE else None
    if problem is not None:
        return None, problem
    try:
        data = decode_answer(content_type, body, where, peer)  # the bounds, then the parse
    except PeerError as exc:
        return None, str(exc).removeprefix(f"{where} ")
    if media == JSON_TYPE and (b"NaN" in body or b"Infinity" in body):
        constant = _constant(body.decode("utf-8"))
        if constant is not None:
            return None, f"sent {constant} in a JSON body; JSON has no such value"
    return data, None


def _encoding_problem(params: str, body: bytes) -> str | None:
    """Why a JSON body breaks §7's encoding (a charset other than utf-8, bytes that are
    not UTF-8, a byte order mark or NUL: UTF-16/32), or None."""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset != "utf-8":
            return f"answered charset={shorten(charset)}; JSON answers are UTF-8 (§7)"
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"sent a JSON body that is not UTF-8 ({exc.reason} at byte {exc.start})"
    if body.startswith(b"\xef\xbb\xbf") or b"\x00" in body:
        return ("sent a JSON body that is not UTF-8 (a byte order mark or a NUL byte: "
                "UTF-16 or UTF-32?)")
    return None


class _Constant(Exception):
    """Stops json's parse at the first NaN or Infinity (its `parse_constant` hook)."""


def _constant(text: str) -> str | None:
    """The first NaN, Infinity or -Infinity outside a string, or None (asked only of a
    body `decode_answer` took: within its bounds, and well-formed)."""
    def refuse(name: str) -> Any:
        raise _Constant(name)

    try:
        json.loads(text, parse_constant=refuse)
    except _Constant as exc:
        return str(exc)
    except (ValueError, RecursionError):
        return None
    return None
