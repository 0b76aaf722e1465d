"""The hostile test server itself: stopping it while connections pour in leaves no socket
open, so no ResourceWarning surfaces, as a failure, in whichever test collects it later."""

from __future__ import annotations

import gc
import socket
import threading
import time
import warnings

from logsync.hostile import partner_scene

from .server import HostileServer


def _connect_until(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: peer\r\n\r\n")
        except OSError:
            pass


def test_a_server_stopped_under_a_stream_of_connections_leaves_no_socket_open() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(5):
            server = HostileServer(partner_scene()).start()
            stop = threading.Event()
            clients = [threading.Thread(target=_connect_until, args=(server.port, stop))
                       for _ in range(4)]
            for client in clients:
                client.start()
            time.sleep(0.05)
            try:
                server.stop()
            finally:
                stop.set()
                for client in clients:
                    client.join(5)
            del server
            gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not unclosed, f"{len(unclosed)} sockets left open, first: {unclosed[0]}"
