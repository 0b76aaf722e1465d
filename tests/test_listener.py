"""`logsync.listener.Listener`: a stop leaves no connection open and stops only itself."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import warnings
from collections.abc import Callable
from typing import Any

from logsync.listener import Listener


async def _echo_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.readline())
    await writer.drain()
    writer.close()


def _connect_until(port: int, stop: threading.Event, opened: list[int],
                   busy: Callable[[], None]) -> None:
    """A client in a thread of its own, so connections arrive while the loop is busy;
    `busy` is called once 20 are made."""
    told = False
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"ping\n")
                opened.append(1)
        except OSError:
            pass
        if len(opened) >= 20 and not told:
            told = True
            busy()


def _run(coro: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Runs `coro` on a fresh loop; returns its result and what reached the loop's
    exception handler."""
    loop = asyncio.new_event_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        return loop.run_until_complete(coro), errors
    finally:
        loop.close()


def test_a_stop_under_a_stream_of_connections_leaves_no_socket_open() -> None:
    async def scene() -> int:
        listener = Listener(_echo_line)
        port = await listener.start("127.0.0.1")
        stop, opened, loop = threading.Event(), [], asyncio.get_running_loop()
        # the stop is woken by the clients' thread, as a test's stop is: in the same turn
        # of the loop as the last accepted connections
        flowing = asyncio.Event()
        clients = [threading.Thread(target=_connect_until,
                                    args=(port, stop, opened,
                                          lambda: loop.call_soon_threadsafe(flowing.set)))
                   for _ in range(4)]
        for client in clients:
            client.start()
        await asyncio.wait_for(flowing.wait(), 5)
        try:
            await listener.stop(5.0)
        finally:
            stop.set()
            for client in clients:
                client.join(5)
        return len(opened)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(5):
            opened, errors = _run(scene())
            assert opened > 0 and errors == []
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not unclosed, f"{len(unclosed)} sockets left open, first: {unclosed[0]}"


def test_a_handler_that_never_ends_is_cancelled_within_the_deadline_and_logs_nothing() -> None:
    async def scene() -> tuple[float, bool]:
        started = asyncio.Event()

        async def forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            started.set()
            await asyncio.Event().wait()

        listener = Listener(forever)
        port = await listener.start("127.0.0.1")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.wait_for(started.wait(), 5)
        loop = asyncio.get_running_loop()
        begun = loop.time()
        await listener.stop(5.0)
        took = loop.time() - begun
        closed = await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        await asyncio.sleep(0.01)
        return took, closed

    (took, closed), errors = _run(scene())
    assert took < 1.0 and closed and errors == []


def test_stopping_one_listener_leaves_another_on_the_same_loop_serving() -> None:
    async def scene() -> bytes:
        first, second = Listener(_echo_line), Listener(_echo_line)
        await first.start("127.0.0.1")
        port = await second.start("127.0.0.1")
        await first.stop(5.0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"still here\n")
        answer = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        await second.stop(5.0)
        await asyncio.sleep(0.01)
        return answer

    answer, errors = _run(scene())
    assert answer == b"still here\n" and errors == []
