"""N idle peers on loopback in one process, for the idle-CPU figure of growth.py.

Each peer listens on its own port and answers what an idle logsync peer answers a
daemon that pulls from it: `/sync/version_vector` (an empty vector under its own
replica id) and `/logstream/stream` (an open Server-Sent Events stream with a ping
comment every 15 s, as the daemon's stream does); anything else is a 404. The ports
are printed as one JSON line on stdout once every peer listens; the process runs
until it is terminated. With COUNTS, the requests each peer got, per path, are
rewritten there as JSON at most once a second (so the caller can check that the
daemon did pull from every peer). Usage: python benchmarks/_idle_peers.py N [COUNTS]
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

LOOPBACK = "127.0.0.1"
PING_EVERY_S = 15.0
MAX_PEERS = 200
MAX_HEADER_BYTES = 16 * 1024  # a request head past this closes the connection


COUNTED = ("/sync/version_vector", "/logstream/stream")
counts: list[dict[str, int]] = []


def vector_body(index: int) -> bytes:
    return json.dumps({"replica_id": f"rep_{index + 1:032x}", "version_vector": {}}).encode()


async def serve_connection(index: int, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            request = head.split(b"\r\n", 1)[0].split()
            path = request[1].split(b"?", 1)[0] if len(request) > 1 else b""
            shown = path.decode("ascii", "replace")
            key = shown if shown in COUNTED else "other"
            counts[index][key] = counts[index].get(key, 0) + 1
            if path == b"/logstream/stream":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n: ping\n\n")
                await writer.drain()
                while True:  # until the daemon goes away
                    await asyncio.sleep(PING_EVERY_S)
                    writer.write(b": ping\n\n")
                    await writer.drain()
            if path == b"/sync/version_vector":
                status, body = b"200 OK", vector_body(index)
            else:
                status, body = b"404 Not Found", b'{"error": "not found"}'
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        return
    finally:
        writer.close()


async def write_counts(target: Path) -> None:
    while True:
        target.write_text(json.dumps(counts))  # noqa: ASYNC240 - a few bytes, once a second
        await asyncio.sleep(1.0)


async def main(count: int, target: Path | None) -> None:
    counts.extend({} for _ in range(count))
    servers = []
    for index in range(count):
        server = await asyncio.start_server(
            lambda r, w, i=index: serve_connection(i, r, w), LOOPBACK, 0,
            limit=MAX_HEADER_BYTES)
        servers.append(server)
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print(json.dumps({"ports": ports}), flush=True)
    if target is not None:
        await write_counts(target)
    await asyncio.Event().wait()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) in (2, 3) and sys.argv[1].isdigit() else 0
    if not 1 <= n <= MAX_PEERS:
        sys.exit(f"usage: _idle_peers.py N [COUNTS], with N a whole number from 1 to "
                 f"{MAX_PEERS}")
    asyncio.run(main(n, Path(sys.argv[2]) if len(sys.argv) == 3 else None))
