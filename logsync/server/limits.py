"""Connection-level limits for the uvicorn server, and the checks `serve` runs before it.

uvicorn (0.54) has a keep-alive timeout but no bound on how long a client may take to
send its request head, and its ``limit_concurrency`` counts *open connections* as well as
requests in flight, so a thousand idle sockets would turn every request into a 503.
``GuardedH11Protocol`` fixes both for our server:

- a connection that has not completed its request head ``HEADER_TIMEOUT_S`` after it
  opened (or after it started the next head on a kept-alive connection) is closed;
- ``limit_concurrency`` counts requests in flight only (uvicorn answers 503 beyond it);
- a connection beyond ``max_connections()`` is closed the moment it is accepted, so the
  process keeps file descriptors for the clients that do talk;
- a connection whose client takes nothing of an answer for ``WRITE_STALL_S`` is aborted,
  freeing its buffered answer and its request slot.

``listen_socket`` and ``check_tls`` turn a port in use or a TLS pair that cannot be
loaded into one ``ConfigError`` sentence before anything is printed or served.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import re
import resource
import socket
import ssl
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from logsync.errors import ConfigError

logger = logging.getLogger("logsync.server")

HEADER_TIMEOUT_S = 10.0
# A client that takes no byte of an answer for this long is cut off (our own pullers give
# up on a request after 60 s): memory per connection is one buffered answer, for a while.
WRITE_STALL_S = 60.0
KEEP_ALIVE_S = 5
LIMIT_CONCURRENCY = 256  # requests in flight; uvicorn answers 503 beyond it
MAX_INCOMPLETE_EVENT_BYTES = 16 * 1024  # a request head larger than this is a 400
BACKLOG = 2048
CONNECTION_CEILING = 8192
FD_RESERVE = 64  # descriptors kept for the store, logs and outgoing pulls


def max_connections() -> int:
    """Open connections we accept: 8192, or fewer when the fd limit is lower."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return CONNECTION_CEILING
    if soft == resource.RLIM_INFINITY:
        return CONNECTION_CEILING
    return max(16, min(CONNECTION_CEILING, soft - FD_RESERVE))


class _NoConnections:
    """Stands in for the connection set while uvicorn applies ``limit_concurrency``."""

    def __len__(self) -> int:
        return 0


_NO_CONNECTIONS = _NoConnections()

class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and a connection ceiling."""

    header_timeout_s = HEADER_TIMEOUT_S
    write_stall_s = WRITE_STALL_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None

    def pause_writing(self) -> None:
        """The client is not taking what we wrote: it has `write_stall_s` to start again.
        Closing would wait for the buffer to drain (forever, for a client that never
        reads), so a stalled connection is aborted, its buffered answer freed."""
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.write_stall_s, self._stalled)

    def resume_writing(self) -> None:
        self._cancel_stall_timer()
        super().resume_writing()

    def _cancel_stall_timer(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stalled(self) -> None:
        self._stall_timer = None
        logger.info("aborting a connection whose client took nothing for %g s",
                    self.write_stall_s)
        self.transport.abort()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        no_delay(transport)
        if len(self.connections) > max_connections():
            logger.warning(
                "connection refused: %d connections are open, the maximum",
                len(self.connections) - 1,
            )
            transport.abort()
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_stall_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm_head_timer()  # a head begun (or not yet complete): it has a deadline
        else:
            self._cancel_head_timer()

    def handle_events(self) -> None:
        # uvicorn compares len(self.connections) with limit_concurrency too; idle sockets
        # must not turn requests into 503s, so only requests in flight (tasks) count.
        self.connections = _NO_CONNECTIONS  # type: ignore[assignment]
        try:
            super().handle_events()
        finally:
            self.connections = self.server_state.connections


    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._cancel_head_timer()  # the keep-alive timer governs the idle gap

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            logger.debug(
                "closing a connection that sent no complete request head in %g s",
                self.header_timeout_s,
            )
            self.transport.close()


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Nagle off on a TCP connection, whatever made its socket: an answer's head and body
    are two writes, and the second must not wait for the client's delayed ACK."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def uvicorn_limits() -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords that bound connections and request heads."""
    return {
        "http": GuardedH11Protocol,
        "limit_concurrency": LIMIT_CONCURRENCY,
        "timeout_keep_alive": KEEP_ALIVE_S,
        "h11_max_incomplete_event_size": MAX_INCOMPLETE_EVENT_BYTES,
        "backlog": BACKLOG,
    }


def listen_socket(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """Bind and listen now, so a port in use is one sentence before anything is served."""
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto
    # says TCP; without it Nagle holds an answer's second write for the client's delayed
    # ACK, ~40 ms on about half of all requests.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(backlog)
        sock.set_inheritable(True)
    except socket.gaierror as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {where}: the host does not resolve ({exc.strerror})"
        ) from None
    except OSError as exc:
        sock.close()
        reason = (
            "address already in use"
            if exc.errno == errno.EADDRINUSE
            else ((exc.strerror or str(exc)).lower())
        )
        raise ConfigError(f"cannot listen on {where}: {reason}") from None
    return sock


class _Encrypted(Exception):
    """The key asked for a passphrase."""


def _no_passphrase() -> str:
    raise _Encrypted


def check_tls(cert: str | None, key: str | None) -> None:
    """Load the certificate and key once, so a bad pair is one sentence, not a traceback."""
    if not cert or not key:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # a passphrase-protected key would make OpenSSL ask the terminal, without end
        context.load_cert_chain(cert, key, password=_no_passphrase)
    except _Encrypted:
        raise ConfigError(f"TLS key {key} is encrypted (it asks for a passphrase), which the "
                          "daemon cannot answer: give it an unencrypted key (`openssl pkey "
                          f"-in {key} -out plain-key.pem`, kept private)") from None
    except ssl.SSLError as exc:
        text = str(exc.reason or (exc.args[1] if len(exc.args) > 1 else exc))
        text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", text).strip()
        if "MISMATCH" in text.upper():
            hint = f"the key {key} does not match it"
        elif "PEM" in text.upper() or "NO_START_LINE" in text.upper():
            hint = f"it or the key {key} is not a PEM file ({text})"
        else:
            hint = text
        raise ConfigError(f"TLS certificate {cert} cannot be used: {hint}") from None
    except OSError as exc:
        raise ConfigError(
            f"TLS certificate {cert} cannot be used: {exc.filename or key}: "
            f"{(exc.strerror or str(exc)).lower()}"
        ) from None
