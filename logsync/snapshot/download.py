"""The joiner's side of the wire: read the preamble, write the file, check size and digest.

Every value in the preamble is the peer's and checked before it is used; the file is
written straight to disk a chunk at a time (memory stays one chunk), refused the moment
it passes its announced size or the joiner's byte cap, and its SHA-256 must match.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
    digest, written = hashlib.sha256(), 0
    with anyio.fail_after(base_deadline_s) as scope, dest.open("wb") as out:
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
                raise PeerProtocolError(f"{where} sent more than the {preamble['size']} bytes "
                                        "it announced", peer=peer)
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if preamble is None:
        raise PeerProtocolError(f"{where} ended before its preamble", peer=peer)
    if written != preamble["size"]:
        raise PeerProtocolError(f"{where} ended after {written} of the {preamble['size']} "
                                "bytes it announced", peer=peer)
    if digest.hexdigest() != preamble["sha256"]:
        raise PeerProtocolError(f"{where}: the file's SHA-256 is {digest.hexdigest()}, not "
                                f"the {preamble['sha256']} its preamble names", peer=peer)
    return preamble


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
