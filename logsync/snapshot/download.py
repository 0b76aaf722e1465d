"""The joiner's side of the wire: read the preamble, write the file, check size and digest.

Every value in the preamble is the peer's and checked before it is used; the file is
written to disk a chunk at a time (memory stays a few MiB), refused the moment it passes
its announced size or the joiner's byte cap, and its SHA-256 must match. The download is
a plain blocking GET (the joiner has nothing else to do meanwhile; an async client costs
about half again the CPU per byte), and hashing and writing run on a thread of their own
(both release the GIL), so they overlap the socket reads instead of adding to them. The
file is not fsynced here: the joiner fsyncs the candidate before it installs it, and a
file that is never installed need not be durable.

The joiner asks for zstd; an answer so encoded is decoded as it arrives, at most
`INFLATE_CHUNK` bytes at a time and in a window of at most `ZSTD_MAX_WINDOW`, so every
bound above holds for the decoded bytes; the deadline is checked on every chunk received,
so a stream that decodes to nothing (skippable frames) still ends.
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from logsync import __version__
from logsync.answers import (
    ACCEPT_ENCODING,
    encoding_problem,
    error_text,
    parse_retry_after,
    translate_transport,
)
from logsync.errorcodes import ERRORS_CODED, ERRORS_HEADER
from logsync.errors import PeerProtocolError, PeerTooLargeError, StoreError
from logsync.fetchpolicy import FetchPolicy, PeerDeadlineError
from logsync.ids import is_replica_id
from logsync.snapshot import (
    MAX_PREAMBLE_BYTES,
    SNAPSHOT_FORMAT,
    SNAPSHOT_PATH,
    TRANSFER_BASE_S,
    TRANSFER_MIN_RATE,
    transfer_behind,
)
from logsync.zstdcoding import INFLATE_CHUNK, inflate

ERROR_BODY_BYTES = 64 * 1024  # of a non-200 answer, read for its message
MAX_QUEUED = 8 * 1024 * 1024  # bytes received but not yet hashed and written
# What a stream may take on the wire beyond the bytes it decodes to: a 1/128 share
# (zstd's own bound is 1/256, and 3 bytes per 128 KiB block) and a fixed MiB.
ENCODED_SLACK_DIVISOR = 128
ENCODED_SLACK_BYTES = 1024 * 1024
SPARE_DISK_BYTES = 64 * 1024 * 1024  # left free on the palace's disk after the download
_HEX64 = re.compile(r"[0-9a-f]{64}")


def open_client(url: str, token: str | None, *, tls: Any = False,
                timeout: float = 30.0) -> httpx.Client:
    """A blocking client for the look and the download, with the headers `PeerClient`
    sends. `tls` is httpx's `verify` (`client.tls_context`); each read waits at most
    `timeout` (the look's own is shorter)."""
    headers = {"User-Agent": f"logsync/{__version__}", "Accept": "application/json",
               ERRORS_HEADER: ERRORS_CODED, **ACCEPT_ENCODING}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=url, headers=headers, verify=tls, follow_redirects=False,
                        timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)))


def look(http: httpx.Client, look_s: float) -> Any:
    """`GET /sync/version_vector` once, within about `look_s`: the decoded answer, or None
    for any failure (the ordinary pull that follows retries and reports it)."""
    began = time.monotonic()
    body = bytearray()
    try:
        with http.stream("GET", "/sync/version_vector",
                         timeout=httpx.Timeout(look_s)) as response:
            if response.status_code != 200 or encoding_problem(response.headers):
                return None
            for chunk in response.iter_raw():
                body += chunk
                if len(body) > MAX_PREAMBLE_BYTES or time.monotonic() - began > look_s:
                    return None
    except (httpx.HTTPError, httpx.StreamError):
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def download_snapshot(http: httpx.Client, dest: Path, max_bytes: int, *, name: str,
                      base_deadline_s: float = TRANSFER_BASE_S) -> dict[str, Any]:
    """`GET /sync/snapshot` into `dest` (blocking); the checked preamble. The download
    must keep the pace of `transfer_behind` (with `base_deadline_s`) on what it wrote."""
    where = f"peer {name}: GET {SNAPSHOT_PATH}"
    receiver = Receiver(dest, max_bytes, where, name, base_deadline_s)
    try:
        with http.stream("GET", SNAPSHOT_PATH, headers={"Accept-Encoding": "zstd"}) as response:
            if response.status_code != 200:
                raise _status_error(response, where, name)
            problem = encoding_problem(response.headers, ("zstd",))
            if problem is not None:
                raise PeerProtocolError(f"{where} {problem}", peer=name)
            zstd = response.headers.get("content-encoding", "").strip().lower() == "zstd"
            chunks = receiver.timed(response.iter_raw())
            with receiver:
                for chunk in inflate(chunks, where, name) if zstd else chunks:
                    receiver.feed(chunk)
            return receiver.finish()
    except (httpx.HTTPError, httpx.StreamError) as exc:
        raise translate_transport(exc, where, name) from None


def _status_error(response: httpx.Response, where: str, peer: str) -> Exception:
    body = bytearray()
    for chunk in response.iter_raw():
        body += chunk
        if len(body) >= ERROR_BODY_BYTES:
            break
    text = error_text(bytes(body), response.headers.get("content-encoding", ""))
    error = FetchPolicy().error_for_status(response.status_code, text, where, peer,
                                           parse_retry_after(response.headers))
    return error or PeerProtocolError(f"{where} answered {response.status_code}", peer=peer)


class Receiver:
    """The file as it arrives: the preamble parsed from the first line, the rest handed
    to a `_Sink`, every bound checked on every chunk."""

    def __init__(self, dest: Path, max_bytes: int, where: str, peer: str,
                 base_deadline_s: float) -> None:
        self.dest, self.max_bytes, self.where, self.peer = dest, max_bytes, where, peer
        self.started, self.base_s = time.monotonic(), base_deadline_s
        self.preamble: dict[str, Any] | None = None
        self.written = 0
        self.received = 0  # bytes off the wire, before any decoding
        self._head = bytearray()
        self._sink: _Sink | None = None
        self._sha256: str | None = None

    def __enter__(self) -> Receiver:
        self._out = self.dest.open("wb")
        self._sink = _Sink(self._out)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            assert self._sink is not None
            self._sha256 = self._sink.close()
        finally:
            self._out.close()

    def timed(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """`chunks` as they arrive, encoded or not, each let through only within the
        deadline and within `encoded_cap` of what the file decodes to: a stream of
        skippable zstd frames, which decode to nothing, ends at a byte count too."""
        for chunk in chunks:
            self.check_deadline()
            self.received += len(chunk)
            if self.received > self.encoded_cap():
                what = ("the start of a stream can take before its preamble"
                        if self.preamble is None else
                        "a stream of the announced size can take")
                raise PeerProtocolError(f"{self.where} sent more than {self.encoded_cap()} "
                                        f"bytes on the wire, past what {what}",
                                        peer=self.peer)
            yield chunk

    def encoded_cap(self) -> int:
        """The most a stream of this file may take on the wire, with room for zstd's
        worst case (incompressible blocks cost 3 bytes each per 128 KiB, plus frame
        headers): the announced size and the preamble; before the preamble is known, what
        the first two decoded chunks can take (a preamble is at most
        `MAX_PREAMBLE_BYTES`, and the decoder hands over `INFLATE_CHUNK` bytes at a time,
        so a preamble not found by then is refused anyway). Without that early bound, a
        stream of skippable frames after a small first frame would be bounded only by
        time: the decoder reads on until it has a whole chunk to hand over."""
        if self.preamble is None:
            whole = MAX_PREAMBLE_BYTES + 2 * INFLATE_CHUNK
        else:
            whole = min(self.preamble["size"], self.max_bytes) + MAX_PREAMBLE_BYTES
        return whole + whole // ENCODED_SLACK_DIVISOR + ENCODED_SLACK_BYTES

    def check_deadline(self) -> None:
        now = time.monotonic()
        if transfer_behind(self.started, self.written, now, self.base_s):
            raise PeerDeadlineError(
                f"{self.where} fell behind: {self.written} bytes of the file in "
                f"{now - self.started:.0f} s, where a snapshot must move "
                f"{TRANSFER_MIN_RATE // 1024 // 1024} MiB a second after its first "
                f"{self.base_s:.0f} s", peer=self.peer)

    def feed(self, chunk: bytes) -> None:
        self.check_deadline()
        if self.preamble is None:
            scanned = len(self._head)  # only the new bytes are searched: a preamble
            self._head += chunk        # dripped a byte a read stays linear
            end = self._head.find(b"\n", scanned)
            if end < 0:
                if len(self._head) > MAX_PREAMBLE_BYTES:
                    raise PeerProtocolError(f"{self.where}: the preamble is longer than "
                                            f"{MAX_PREAMBLE_BYTES} bytes", peer=self.peer)
                return
            line, chunk = bytes(self._head[:end]), bytes(self._head[end + 1:])
            self.preamble = parse_preamble(line, self.max_bytes, self.where, self.peer)
            check_room(self.dest.parent, self.preamble["size"])
        self.written += len(chunk)
        if self.written > self.preamble["size"]:
            raise PeerProtocolError(f"{self.where} sent more than the "
                                    f"{self.preamble['size']} bytes it announced",
                                    peer=self.peer)
        assert self._sink is not None
        self._sink.wait_below(MAX_QUEUED)  # the disk is behind: let it catch up
        self._sink.put(chunk)

    def finish(self) -> dict[str, Any]:
        """After the last chunk (and `__exit__`): the preamble, if the file is whole."""
        where, peer, preamble = self.where, self.peer, self.preamble
        if preamble is None:
            raise PeerProtocolError(f"{where} ended before its preamble", peer=peer)
        if self.written != preamble["size"]:
            raise PeerProtocolError(f"{where} ended after {self.written} of the "
                                    f"{preamble['size']} bytes it announced", peer=peer)
        if self._sha256 != preamble["sha256"]:
            raise PeerProtocolError(f"{where}: the file's SHA-256 is {self._sha256}, not "
                                    f"the {preamble['sha256']} its preamble names", peer=peer)
        return preamble


class _Sink:
    """Hashes and writes the chunks it is given, in order, on a thread of its own."""

    def __init__(self, out: Any) -> None:
        self._out, self._digest = out, hashlib.sha256()
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._queued = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="snapshot-sink", daemon=True)
        self._thread.start()

    def queued(self) -> int:
        with self._lock:
            return self._queued

    def wait_below(self, limit: int) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._queued <= limit or not self._thread.is_alive())

    def put(self, chunk: bytes) -> None:
        if self._error is not None:
            raise self._error  # e.g. the disk is full: the download stops here
        with self._lock:
            self._queued += len(chunk)
        self._chunks.put(chunk)

    def close(self) -> str:
        """Wait for every chunk to be written; the SHA-256 hex of them all."""
        self._chunks.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._out.flush()
        return self._digest.hexdigest()

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            if self._error is None:
                try:
                    self._digest.update(chunk)
                    self._out.write(chunk)
                except BaseException as exc:  # handed to the receiving side
                    self._error = exc
            with self._lock:
                self._queued -= len(chunk)
                self._lock.notify_all()


def check_room(directory: Path, size: int) -> None:
    """Refuse a snapshot the palace's disk cannot hold with `SPARE_DISK_BYTES` to spare,
    before its first byte is written (a zstd stream of a few KiB can announce, and decode
    to, the whole byte cap)."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # unknowable here: the write itself fails with ENOSPC if it comes to that
    if size + SPARE_DISK_BYTES > free:
        raise StoreError(f"the {size}-byte snapshot does not fit on the disk of {directory}: "
                         f"{free} bytes are free and {SPARE_DISK_BYTES} are kept spare")


def parse_preamble(line: bytes, max_bytes: int, where: str, peer: str) -> dict[str, Any]:
    """The preamble's fields, each checked: one sentence naming the first that is wrong."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        raise PeerProtocolError(f"{where}: the preamble is not JSON", peer=peer) from None
    if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
        raise PeerProtocolError(f"{where}: the preamble's format is not {SNAPSHOT_FORMAT}",
                                peer=peer)
    size, sha, vector = data.get("size"), data.get("sha256"), data.get("vector")
    if not is_replica_id(data.get("replica_id")):
        raise PeerProtocolError(f"{where}: the preamble's replica_id is not a replica id",
                                peer=peer)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise PeerProtocolError(f"{where}: the preamble's size={size!r} is not a byte count",
                                peer=peer)
    if size > max_bytes:
        raise PeerTooLargeError(f"{where} announced a {size}-byte snapshot; the cap is "
                                f"{max_bytes} bytes", peer=peer)
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
        raise PeerProtocolError(f"{where}: the preamble's sha256 is not 64 hex digits",
                                peer=peer)
    if not isinstance(vector, dict) or not all(
            is_replica_id(o) and type(n) is int and n >= 1 for o, n in vector.items()):
        raise PeerProtocolError(f"{where}: the preamble's vector is not replica ids mapped "
                                "to seqs of at least 1", peer=peer)
    return data
