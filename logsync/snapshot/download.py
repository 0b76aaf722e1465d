"""The joiner's side of the wire: read the preamble, write the file, check size and digest.

Every value in the preamble is the peer's and checked before it is used; the file is
written to disk a chunk at a time (memory stays a few MiB), refused the moment it passes
its announced size or the joiner's byte cap, and its SHA-256 must match. Hashing and
writing run on a thread of their own (both release the GIL), so they overlap the socket
reads instead of adding to them. The file is not fsynced here: the joiner fsyncs the
candidate before it installs it, and a file that is never installed need not be durable.
"""

from __future__ import annotations

import hashlib
import json
import queue
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx

from logsync.answers import translate_transport
from logsync.errors import PeerProtocolError, PeerTooLargeError
from logsync.fetchpolicy import PeerDeadlineError
from logsync.ids import is_replica_id
from logsync.snapshot import MAX_PREAMBLE_BYTES, SNAPSHOT_FORMAT, SNAPSHOT_PATH

MIN_RATE = 1024 * 1024  # bytes per second a download must average past its base deadline
MAX_QUEUED = 8 * 1024 * 1024  # bytes received but not yet hashed and written
_HEX64 = re.compile(r"[0-9a-f]{64}")


async def download_snapshot(client: Any, dest: Path, max_bytes: int) -> dict[str, Any]:
    """`GET /sync/snapshot` through a `PeerClient` (its connection, caps and error
    translation) into `dest`; the checked preamble. Bounded in time: the client's
    `request_deadline` plus a second per MiB announced."""
    where = f"peer {client.name}: GET {SNAPSHOT_PATH}"
    try:
        async with client._http.stream("GET", SNAPSHOT_PATH) as response:
            if response.status_code != 200:
                body = await client._read_capped(response, where)
                client._check_status(response, bytes(body), where)
                raise PeerProtocolError(f"{where} answered {response.status_code}",
                                        peer=client.name)
            return await receive(response.aiter_raw(), dest, max_bytes, where, client.name,
                                 client.request_deadline)
    except TimeoutError:
        raise PeerDeadlineError(f"{where} did not finish in time", peer=client.name) from None
    except (httpx.HTTPError, httpx.StreamError) as exc:
        raise translate_transport(exc, where, client.name) from None


async def receive(chunks: AsyncIterator[bytes], dest: Path, max_bytes: int, where: str,
                  peer: str, base_deadline_s: float) -> dict[str, Any]:
    """Write the snapshot's file to `dest`; return its checked preamble."""
    head = bytearray()
    preamble: dict[str, Any] | None = None
    written = 0
    with anyio.fail_after(base_deadline_s) as scope, dest.open("wb") as out:
        sink = _Sink(out)
        try:
            async for chunk in chunks:
                if preamble is None:
                    head += chunk
                    line, found, rest = bytes(head).partition(b"\n")
                    if not found:
                        if len(head) > MAX_PREAMBLE_BYTES:
                            raise PeerProtocolError(f"{where}: the preamble is longer than "
                                                    f"{MAX_PREAMBLE_BYTES} bytes", peer=peer)
                        continue
                    preamble = parse_preamble(line, max_bytes, where, peer)
                    scope.deadline += preamble["size"] / MIN_RATE
                    chunk = rest
                written += len(chunk)
                if written > preamble["size"]:
                    raise PeerProtocolError(f"{where} sent more than the {preamble['size']} "
                                            "bytes it announced", peer=peer)
                if sink.queued() > MAX_QUEUED:  # the disk is behind: let it catch up
                    await anyio.to_thread.run_sync(sink.wait_below, MAX_QUEUED)
                sink.put(chunk)
        finally:
            sha256 = sink.close()
    if preamble is None:
        raise PeerProtocolError(f"{where} ended before its preamble", peer=peer)
    if written != preamble["size"]:
        raise PeerProtocolError(f"{where} ended after {written} of the {preamble['size']} "
                                "bytes it announced", peer=peer)
    if sha256 != preamble["sha256"]:
        raise PeerProtocolError(f"{where}: the file's SHA-256 is {sha256}, not "
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
