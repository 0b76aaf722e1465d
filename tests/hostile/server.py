"""A hostile peer: a real HTTP/1.1 server on 127.0.0.1, in a thread of the test process.

Plain asyncio, not uvicorn: it must be able to drip one byte every 20 s, reset a
connection before answering and stream hundreds of megabytes. What it answers is
decided by `logsync.hostile.Scene.answer`; this module only does the socket work.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from urllib.parse import parse_qsl, urlsplit

from logsync.hostile import Answer, Scene, Stream
from logsync.listener import Listener

STOP_TIMEOUT_S = 10.0
MAX_HEADER_BYTES = 64 * 1024


class HostileServer:
    """Serves one `Scene` until `stop()`; every request is recorded in `requests`."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.requests: list[tuple[float, str, dict[str, str]]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self.bytes_sent = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HostileServer:
        self._thread = threading.Thread(target=self._run, name="hostile-peer", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise AssertionError("the hostile peer did not start within 10 s")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(self._shutdown)
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise AssertionError("the hostile peer did not stop within 10 s")

    def seen(self, path: str, **match: str) -> list[dict[str, str]]:
        """Params of every recorded request to `path` whose params include `match`."""
        with self._lock:
            recorded = list(self.requests)
        return [p for _, q, p in recorded
                if q == path and all(p.get(k) == v for k, v in match.items())]

    # ── the loop thread ───────────────────────────────────────────────

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        listener = Listener(self._accept, limit=MAX_HEADER_BYTES)
        self.port = await listener.start("127.0.0.1")
        self._ready.set()
        await self._stopped.wait()
        await listener.stop(STOP_TIMEOUT_S / 2)

    def _shutdown(self) -> None:
        self._stopped.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError, OSError):
            pass
        finally:
            writer.transport.abort()

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        while True:
            request_line = await reader.readline()
            if not request_line:
                return
            wants_msgpack = False
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "accept" and "application/msgpack" in value:
                    wants_msgpack = True
            _method, target, _version = request_line.decode("latin-1").split(" ", 2)
            parts = urlsplit(target)
            params = dict(parse_qsl(parts.query, keep_blank_values=True))
            with self._lock:
                self.requests.append((time.monotonic(), parts.path, params))
            answer = self.scene.answer(parts.path, params)
            if not await self._send(writer, answer, wants_msgpack):
                return

    async def _send(self, writer: asyncio.StreamWriter, answer: Answer,
                    wants_msgpack: bool) -> bool:
        """Write one answer; False when the connection must end afterwards."""
        body = answer.body
        if isinstance(body, Stream):
            return await self._stream(writer, answer, body)
        headers, data = answer.encoded(msgpack=wants_msgpack)
        self._head(writer, Answer(answer.status, headers), len(data))
        writer.write(data)
        await writer.drain()
        self.bytes_sent += len(data)
        return True

    def _head(self, writer: asyncio.StreamWriter, answer: Answer, length: int | None,
              chunked: bool = False) -> None:
        lines = [f"HTTP/1.1 {answer.status} {_reason(answer.status)}"]
        lines += [f"{k}: {v}" for k, v in answer.headers]
        if chunked:
            lines.append("transfer-encoding: chunked")
        elif length is None:
            lines.append("connection: close")
        else:
            lines.append(f"content-length: {length}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def _stream(self, writer: asyncio.StreamWriter, answer: Answer, spec: Stream) -> bool:
        if spec.kind == "reset":
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if spec.kind == "drip":
            self._head(writer, answer, spec.length)
            await writer.drain()
            for _ in range(spec.length):
                await asyncio.sleep(spec.interval)
                writer.write(spec.fill[:1])
                await writer.drain()
            return False
        if spec.kind == "bytes":
            self._head(writer, answer, spec.length)
            await self._write_bytes(writer, spec)
            return True
        if spec.kind == "chunked":
            self._head(writer, answer, None, chunked=True)
            await self._write_chunked(writer, spec)
            return False
        if spec.kind == "sse":
            return await self._sse(writer, answer, spec)
        raise AssertionError(f"unknown stream kind {spec.kind!r}")

    async def _sse(self, writer: asyncio.StreamWriter, answer: Answer, spec: Stream) -> bool:
        """The scene's frames (later ones too, as the test appends them), then pings."""
        self._head(writer, answer, None)
        sent, idle = 0, 0.0
        while True:
            frames = self.scene.stream_frames
            for frame in frames[sent:]:
                writer.write(frame)
            sent = len(frames)
            if idle >= spec.interval:
                writer.write(b": ping\n\n")
                idle = 0.0
            await writer.drain()
            await asyncio.sleep(0.2)
            idle += 0.2

    async def _write_chunked(self, writer: asyncio.StreamWriter, spec: Stream) -> None:
        """`prefix`, then `fill` up to `length`, as HTTP chunks of `spec.chunk` bytes."""
        def framed(data: bytes) -> bytes:
            return b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + spec.chunk]),
                                                 data[i:i + spec.chunk])
                            for i in range(0, len(data), spec.chunk))
        writer.write(framed(spec.prefix))
        left = spec.length - len(spec.prefix)
        batch = max(1, 65536 // (spec.chunk + 8)) * spec.chunk  # payload per 64 KiB write
        unit = framed((spec.fill * (batch // len(spec.fill) + 1))[:batch])
        while left > 0:
            piece = unit if left >= batch else framed((spec.fill * left)[:left])
            writer.write(piece)
            left -= min(left, batch)
            self.bytes_sent += len(piece)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _write_bytes(self, writer: asyncio.StreamWriter, spec: Stream) -> None:
        writer.write(spec.prefix)
        left = spec.length - len(spec.prefix) - len(spec.suffix)
        unit = spec.fill * max(1, spec.chunk // len(spec.fill))
        while left > 0:
            piece = unit if left >= len(unit) else unit[:left]
            writer.write(piece)
            left -= len(piece)
            self.bytes_sent += len(piece)
            await writer.drain()
        writer.write(spec.suffix)
        await writer.drain()


def _reason(status: int) -> str:
    return {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(
        status, "Status")
