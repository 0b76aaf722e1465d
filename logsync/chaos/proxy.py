"""A fault-injecting TCP proxy: one asyncio event loop in one thread, one listener per link.

The kernel here has no netem, so a lossy or slow link is made in user space. A link
forwards bytes between a puller and the peer it pulls, and its state says what happens
to each chunk on the way:

- ``frozen``: nothing moves (chunks already read wait; new connections are accepted by
  the kernel and then wait; a close or a reset from either side waits too, so a peer's
  keep-alive close does not tell the puller of the cut): a partition, seen by the client
  as a timeout. Unfreezing delivers what waited, as TCP's retransmissions would after a
  real partition heals;
- ``loss`` (0..1): per chunk, the chance of a retransmission stall (0.2-1 s);
- ``reset`` (0..1): per chunk, the chance the connection is cut (both sides aborted);
- ``delay`` (seconds): latency added to every chunk;
- ``rate`` (bytes per second, 0: unlimited): the link's bandwidth, one medium shared by
  both directions and every connection (a chunk waits for the bytes queued before it).

``rewrite_host`` makes a link rewrite the ``Host`` header of each request to the peer's
own address: a loopback-bound daemon or hub pins ``Host`` to its bind address and port
(DNS-rebinding defence), which a proxy on another port would not match.

Every wait is bounded by the clients' own timeouts; ``ProxyHub.stop`` cancels everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from logsync.chaos.netns import ChaosError
from logsync.listener import Listener

CHUNK = 65536
CONNECT_TIMEOUT_S = 5.0
CONTROL_TIMEOUT_S = 10.0
MAX_HEAD = 65536


class HostRewriter:
    """Rewrites the ``Host`` line of every HTTP/1.1 request head in a byte stream.

    Bodies pass by ``Content-Length``; anything it cannot follow (chunked request bodies,
    a head over 64 KiB, a bad length) switches it to passing bytes through unchanged.
    """

    def __init__(self, host: str) -> None:
        self.host = host.encode("ascii")
        self.buffer = b""
        self.body_left = 0
        self.raw = False

    def feed(self, data: bytes) -> bytes:
        if self.raw:
            return data
        out = bytearray()
        self.buffer += data
        while True:
            if self.body_left:
                take = min(self.body_left, len(self.buffer))
                out += self.buffer[:take]
                self.buffer = self.buffer[take:]
                self.body_left -= take
                if self.body_left:
                    break
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self.raw = True
                    out += self.buffer
                    self.buffer = b""
                break
            head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
            out += self._rewrite(head) + b"\r\n\r\n"
            if self.raw:
                out += self.buffer
                self.buffer = b""
                break
        return bytes(out)

    def _rewrite(self, head: bytes) -> bytes:
        lines = head.split(b"\r\n")
        for index, line in enumerate(lines[1:], start=1):
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"host":
                lines[index] = b"Host: " + self.host
            elif key == b"content-length":
                try:
                    self.body_left = int(value.strip())
                except ValueError:
                    self.raw = True
            elif key == b"transfer-encoding":
                self.raw = True
        return b"\r\n".join(lines)


@dataclass
class Link:
    name: str
    target: tuple[str, int]
    rewrite_host: str | None
    port: int = 0
    loss: float = 0.0
    reset: float = 0.0
    delay: float = 0.0
    rate: float = 0.0
    free_at: float = 0.0  # the loop time at which the link has sent what is queued
    frozen: bool = False
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    connections: int = 0
    resets: int = 0
    stalls: int = 0
    bytes: int = 0
    listener: Listener | None = None


class ProxyHub:
    """The proxies of one cluster; thread-safe control from the harness's thread."""

    def __init__(self, seed: int = 0) -> None:
        self.links: dict[str, Link] = {}
        self._rng = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ── the loop's thread ──

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(CONTROL_TIMEOUT_S):
            raise ChaosError("the proxy thread did not start")

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop is None:
            coro.close()
            raise ChaosError("the proxy is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(CONTROL_TIMEOUT_S)

    def stop(self) -> None:
        """Close every listener and connection, stop the loop, join the thread (bounded)."""
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._close_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        self._loop = None
        self._thread = None

    async def _close_all(self) -> None:
        links = [link.listener for link in self.links.values() if link.listener is not None]
        for listener in links:
            await listener.stop(CONTROL_TIMEOUT_S / 2 / len(links))
        for _ in range(3):  # a closed upstream transport closes its socket on a later turn
            await asyncio.sleep(0)

    # ── control ──

    def add(self, name: str, listen_host: str, target_host: str, target_port: int, *,
            rewrite_host: bool = False) -> int:
        """A new link listening on ``listen_host`` (a free port); returns the port."""
        host = f"{target_host}:{target_port}" if rewrite_host else None
        return int(self._call(self._add(name, listen_host, (target_host, target_port), host)))

    async def _add(self, name: str, listen_host: str, target: tuple[str, int],
                   rewrite: str | None) -> int:
        link = Link(name=name, target=target, rewrite_host=rewrite)
        link.opened.set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(link, reader, writer)

        link.listener = Listener(handle)
        link.port = await link.listener.start(listen_host)
        self.links[name] = link
        return link.port

    def set(self, name: str, *, frozen: bool | None = None, loss: float | None = None,
            reset: float | None = None, delay: float | None = None,
            rate: float | None = None) -> None:
        self._call(self._set(self.links[name], frozen, loss, reset, delay, rate))

    async def _set(self, link: Link, frozen: bool | None, loss: float | None,
                   reset: float | None, delay: float | None, rate: float | None) -> None:
        if rate is not None:
            link.rate = rate
        if loss is not None:
            link.loss = loss
        if reset is not None:
            link.reset = reset
        if delay is not None:
            link.delay = delay
        if frozen is not None:
            link.frozen = frozen
            (link.opened.clear if frozen else link.opened.set)()

    def clear(self, name: str) -> None:
        self.set(name, frozen=False, loss=0.0, reset=0.0, delay=0.0, rate=0.0)

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: {"connections": link.connections, "resets": link.resets,
                       "stalls": link.stalls, "bytes": link.bytes}
                for name, link in self.links.items()}

    # ── one connection ──

    async def _serve(self, link: Link, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        link.connections += 1
        upstream_writer = None
        try:
            await link.opened.wait()
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(*link.target), CONNECT_TIMEOUT_S)
            rewriter = HostRewriter(link.rewrite_host) if link.rewrite_host else None
            pumps = [asyncio.create_task(self._pump(link, reader, upstream_writer, rewriter)),
                     asyncio.create_task(self._pump(link, upstream_reader, writer, None))]
            try:
                done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
            if any(p.exception() for p in done if not p.cancelled()):
                await link.opened.wait()
                _abort(writer, upstream_writer)
        except (TimeoutError, OSError, _Reset):
            await link.opened.wait()  # a reset does not cross a frozen link either
            _abort(writer, upstream_writer)
        finally:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the proxy stops: drop what is
                _abort(writer, upstream_writer)         # buffered, close at once
            for w in (writer, upstream_writer):
                if w is not None:
                    w.close()

    async def _pump(self, link: Link, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    rewriter: HostRewriter | None) -> None:
        while True:
            try:
                data = await src.read(CHUNK)
            except OSError:  # the source reset: the other side learns of it once thawed
                await link.opened.wait()
                raise
            if not data:
                await link.opened.wait()  # a close does not cross a frozen link
                with contextlib.suppress(OSError, RuntimeError):
                    if dst.can_write_eof():
                        dst.write_eof()
                return
            await link.opened.wait()
            if link.delay:
                await asyncio.sleep(link.delay)
            if link.loss and self._rng.random() < link.loss:
                link.stalls += 1
                await asyncio.sleep(self._rng.uniform(0.2, 1.0))
            if link.reset and self._rng.random() < link.reset:
                link.resets += 1
                await link.opened.wait()
                raise _Reset
            if link.rate:
                now = asyncio.get_running_loop().time()
                link.free_at = max(now, link.free_at) + len(data) / link.rate
                await asyncio.sleep(link.free_at - now)
            await link.opened.wait()
            if rewriter is not None:
                data = rewriter.feed(data)
            link.bytes += len(data)
            dst.write(data)
            await dst.drain()


class _Reset(Exception):
    """A chunk drew a connection reset."""


def _abort(*writers: asyncio.StreamWriter | None) -> None:
    for writer in writers:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.transport.abort()
