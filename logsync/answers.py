"""What a peer's HTTP answer becomes, at the edge where it enters (STYLE.md §6): a
decoded body within bounds, one sentence from an error body, a `Retry-After` in
seconds, and httpx's exceptions translated into ours. Pure functions of bytes and
headers; the client calls them (decoding in a worker thread).
"""

from __future__ import annotations

import email.utils
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import msgpack
import msgspec

from logsync.errorcodes import reason_from_bytes
from logsync.errors import (
    PeerError,
    PeerProtocolError,
    PeerRequestError,
    PeerTooLargeError,
    PeerTransientError,
    shorten,
)
from logsync.zstdcoding import ZSTD, inflate, inflate_capped

MSGPACK_TYPE = "application/msgpack"
# We ask for answers as sent and read the raw bytes: a compressed answer would expand
# past every byte bound before a check could see it (64 KiB of gzip holds 64 MB). Pages
# alone are asked for as zstd too, decoded here in bounded steps (`zstdcoding`).
ACCEPT_ENCODING = {"Accept-Encoding": "identity"}
ASK_ZSTD = "zstd, identity"


def encoding_problem(headers: httpx.Headers, asked: tuple[str, ...] = ()) -> str | None:
    """Why an answer's Content-Encoding cannot be taken, or None: identity always may be,
    and so may the codings the request `asked` for (the snapshot asks for zstd)."""
    coding = headers.get("content-encoding", "").strip().lower()
    if coding in ("", "identity", *asked):
        return None
    wanted = " or ".join((*asked, "identity"))
    return f"sent a {coding[:30]!r}-encoded answer although {wanted} was asked for"
# Arrays and objects one answer may hold. A page of 5000 ops with their metadata and
# artifact lists needs a few tens of thousands; the count is taken over raw bytes (it
# also counts brackets inside strings), so a page that passes it only in halves is
# refused as too large and the engine asks for fewer ops.
MAX_CONTAINERS = 1_000_000


# msgspec decodes msgpack in about half the time of msgpack-python. It checks every
# declared length against the bytes left before allocating, and refuses nesting past its
# recursion limit and trailing bytes. Keys other than text (which msgpack allows) are
# kept: the readers of an answer look keys up by name and refuse metadata holding them.
# An extension value decodes to msgpack-python's `ExtType` (code and bytes): msgspec's own
# `Ext` shows its address in its repr, so a refused op's quarantine payload would differ
# every round, and its row would never be found again to count.
_unpack = msgspec.msgpack.Decoder(
    ext_hook=lambda code, data: msgpack.ExtType(code, bytes(data))).decode


def decode_answer(content_type: str, body: bytes | bytearray, where: str, peer: str,
                  coding: str = "", most: int = 0,
                  take: Callable[[int], None] | None = None) -> Any:
    """JSON or msgpack by content type, within bounds; anything undecodable is the peer's
    fault. A zstd-coded body (`coding`, asked for) is decoded first, refused past `most`
    bytes and, through `take`, past what all answers in flight may hold together. Runs in
    a worker thread."""
    if coding == ZSTD:
        body = inflate_capped(body, most, where, peer, take)
    ctype = content_type.split(";")[0].strip().lower()
    packed = ctype in (MSGPACK_TYPE, "application/x-msgpack")
    if ctype in ("application/json", "") or packed:
        containers = count_containers(body, packed)
        if containers > MAX_CONTAINERS:
            raise PeerTooLargeError(
                f"{where} sent an answer with up to {containers} arrays or objects; "
                f"the bound is {MAX_CONTAINERS}", peer=peer)
    try:
        if packed:
            return _unpack(body)
        if ctype in ("application/json", ""):
            return json.loads(body)
    except (ValueError, RecursionError, TypeError) as exc:  # msgspec.DecodeError: a ValueError
        kind = "DecodeError" if isinstance(exc, msgspec.MsgspecError) else type(exc).__name__
        raise PeerProtocolError(
            f"{where} sent a malformed {ctype or 'JSON'} body ({kind}): "
            f"{shorten(body[:80])}",
            peer=peer,
        ) from None
    raise PeerProtocolError(
        f"{where} answered Content-Type {shorten(ctype)}; expected application/json or "
        f"{MSGPACK_TYPE}",
        peer=peer,
    )


_MSGPACK_CONTAINER_BYTES = frozenset((*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF))
# every other byte value: `translate` deletes these and keeps the markers, one pass in C
_NOT_MSGPACK_CONTAINER = bytes(b for b in range(256) if b not in _MSGPACK_CONTAINER_BYTES)
_COUNT_CHUNK = 1 << 20  # the kept markers of one chunk are the only copy: at most 1 MiB


class InFlight:
    """Bytes one client's answers hold right now, read off the wire or decoded from zstd,
    within `most` together: shared by the event loop (reading) and worker threads
    (decoding), so memory never scales with how many answers are in flight."""

    def __init__(self, most: int) -> None:
        self.most, self.held = most, 0
        self._lock = threading.Lock()

    @contextmanager
    def lease(self, where: str, peer: str) -> Iterator[Callable[[int], None]]:
        """A `take(n)` that holds `n` more bytes or raises `PeerTooLargeError` (the engine
        then asks for a smaller page); all it took is given back when the block ends."""
        taken = 0

        def take(n: int) -> None:
            nonlocal taken
            with self._lock:
                if self.held + n > self.most:
                    raise PeerTooLargeError(
                        f"{where}: answers in flight passed {self.most} bytes together",
                        peer=peer)
                self.held += n
                taken += n

        try:
            yield take
        finally:
            with self._lock:
                self.held -= taken


def count_containers(body: bytes | bytearray, packed: bool) -> int:
    """An upper bound on the arrays and objects a body decodes to, at C speed: `[` and `{`
    in JSON; in msgpack, every byte that could start an array or a map (counted in one
    pass per chunk, not one pass per marker: 36 passes cost a quarter of a pull)."""
    if not packed:
        return body.count(b"[") + body.count(b"{")
    view = memoryview(body)
    return sum(len(bytes(view[i:i + _COUNT_CHUNK]).translate(None, _NOT_MSGPACK_CONTAINER))
               for i in range(0, len(body), _COUNT_CHUNK))


ERROR_TEXT_BYTES = 64 * 1024  # of an error body decoded for its sentence, at most


def error_text(body: bytes | bytearray, coding: str = "") -> str:
    """The peer's error sentence if it sent one (`{"error": CODE, "reason": ...}` or a
    hub's `{"error": ...}`), cut to one line. A zstd-coded body (`coding`, the answer's
    Content-Encoding; a page's error may come coded as its page would) is decoded first,
    at most `ERROR_TEXT_BYTES` of it: one that does not decode has no sentence."""
    if coding.strip().lower() == ZSTD:
        body = _inflated_head(body)
    return reason_from_bytes(body)


def _inflated_head(body: bytes | bytearray) -> bytes:
    """What a zstd body decodes to, or b"" past `ERROR_TEXT_BYTES` or on any fault."""
    out = bytearray()
    try:
        for chunk in inflate(iter((bytes(body[:ERROR_TEXT_BYTES]),)), "", ""):
            out += chunk
            if len(out) > ERROR_TEXT_BYTES:
                return b""
    except PeerError:
        return b""
    return bytes(out)


def parse_retry_after(headers: httpx.Headers, now: float | None = None) -> float | None:
    """Seconds to wait from `Retry-After` (delta-seconds or an HTTP date), else None."""
    value = headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def translate_transport(exc: httpx.HTTPError | httpx.StreamError, where: str,
                        peer: str) -> PeerError:
    """httpx's exceptions become ours at the point they enter."""
    if isinstance(exc, httpx.TimeoutException):
        return PeerTransientError(f"{where} timed out ({type(exc).__name__})", peer=peer)
    if _caused_by_tls(exc):
        return PeerRequestError(f"{where} failed the TLS handshake: {exc}", peer=peer)
    if isinstance(exc, httpx.UnsupportedProtocol):
        return PeerRequestError(f"{where} cannot be requested: {exc}", peer=peer)
    if isinstance(exc, httpx.DecodingError):
        return PeerProtocolError(f"{where} sent an undecodable body: {exc}", peer=peer)
    if isinstance(exc, httpx.TransportError):
        return PeerTransientError(f"{where} failed: {exc or type(exc).__name__}", peer=peer)
    return PeerProtocolError(f"{where} failed: {exc or type(exc).__name__}", peer=peer)


def _caused_by_tls(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
