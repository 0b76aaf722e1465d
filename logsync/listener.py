"""An asyncio TCP listener whose stop leaves no connection open.

`asyncio.start_server` plus `Server.close()` is not enough for that on Python 3.11:

- a connection is set up over several turns of the loop after `accept()` (its transport,
  then the protocol's `connection_made`, then the handler's task), so one pass that
  closes what is open misses the connections accepted last;
- a connection accepted just before `Server.close()` fails the transport's
  `server._attach()` assertion, which asyncio swallows with the socket still open.

Either way the socket is left to the garbage collector, whose ResourceWarning then lands
in whatever runs next. `Listener.stop` therefore stops accepting first (the listening
socket's reader is removed), closes every connection and cancels every handler until a
few turns pass with none left (bounded by a deadline), and closes the server last.
Used by the chaos proxy and by the hostile-peer test server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

QUIET_TURNS = 5  # a connection accepted last is open within two turns of the loop
SPIN_TURNS = 20  # turns taken back to back before waiting a millisecond between them


class Listener:
    """Serves each connection with `handler(reader, writer)` until `stop`."""

    def __init__(self, handler: Handler, *, limit: int = 2 ** 16) -> None:
        self._handler = handler
        self._limit = limit
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.BaseTransport] = set()  # made, not yet lost
        self._tasks: set[asyncio.Task[None]] = set()  # handlers running
        self.port = 0

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on `host`:`port` (0: a free port); returns the port."""
        self._server = await asyncio.get_running_loop().create_server(
            self._protocol, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, close every connection, then close the server."""
        server, self._server = self._server, None
        if server is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for sock in server.sockets:
            loop.remove_reader(sock.fileno())
        quiet = turns = 0
        while quiet < QUIET_TURNS and loop.time() < deadline:
            for task in list(self._tasks):
                task.cancel()
            for transport in list(self._open):
                transport.abort()  # its socket closes on a later turn, in connection_lost
            turns += 1
            await asyncio.sleep(0 if turns < SPIN_TURNS else 0.001)
            quiet = 0 if self._tasks or self._open else quiet + 1
        server.close()

    def _protocol(self) -> asyncio.Protocol:
        """`asyncio.start_server`'s protocol, noting its connection while it is open."""
        protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=self._limit),
                                                self._serve)
        made, lost = protocol.connection_made, protocol.connection_lost
        mine: list[asyncio.BaseTransport] = []

        def connection_made(transport: asyncio.BaseTransport) -> None:
            mine.append(transport)
            self._open.add(transport)
            made(transport)

        def connection_lost(exc: Exception | None) -> None:
            self._open.difference_update(mine)
            lost(exc)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._handler(reader, writer)
        except asyncio.CancelledError:
            pass  # cancelled by `stop`: end as a finished handler, not a failed one
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
