"""`logsync serve`'s settings and their checks (one sentence naming the value and the rule);
kept apart from the daemon so the CLI and tests build one without the server stack."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from logsync.defaults import (
    DEFAULT_CACHE_MIB,
    DEFAULT_COALESCE_S,
    DEFAULT_HOST,
    DEFAULT_INTERVAL_S,
    DEFAULT_PORT,
    MIB,
    MIN_INTERVAL_S,
)
from logsync.errors import ConfigError, shorten
from logsync.server import is_loopback_host
from logsync.server.commits import COMMIT_CHECK_S

MAX_CACHE_MIB = 64 * 1024


@dataclass
class DaemonConfig:
    palace: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    interval: float = DEFAULT_INTERVAL_S
    tls_cert: str | None = None
    tls_key: str | None = None
    ca_file: str | None = None
    notifications: bool = True
    log_level: str = "info"
    extra_hosts: tuple[str, ...] = ()
    snapshot: bool = True  # an empty store joins from a peer's snapshot (RFC 004 §9.6)
    commit_check: float = COMMIT_CHECK_S  # other processes' commits (0: the streams' poll)
    coalesce: float = DEFAULT_COALESCE_S  # a stream's frames within this of its last: batched
    cache_mib: int = DEFAULT_CACHE_MIB  # kept /sync/ops answers, split evenly (0: none)

    def check(self) -> None:
        """Refuse settings that would expose the log or half-configure TLS."""
        if not is_loopback_host(self.host) and not self.token:
            raise ConfigError(
                f"refusing to bind {shorten(self.host)} without a token: a non-loopback bind "
                "exposes every event and artifact; pass --token (or LOGSYNC_TOKEN)"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together: pass both or neither")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port={self.port} is invalid: must be 0-65535")
        if not MIN_INTERVAL_S <= self.interval < math.inf:
            raise ConfigError(f"interval={self.interval} is invalid: must be a finite number "
                              f"of seconds, at least {MIN_INTERVAL_S}")
        if not 0 <= self.coalesce <= 1:
            raise ConfigError(f"coalescing frames over {self.coalesce} s is invalid: must be "
                              "0 (off) to 1 second")
        if type(self.cache_mib) is not int or not 0 <= self.cache_mib <= MAX_CACHE_MIB:
            raise ConfigError(f"cache of {self.cache_mib} MiB is invalid: must be a whole "
                              f"number of MiB from 0 (keep no answers) to {MAX_CACHE_MIB}")
        if not 0 <= self.commit_check <= 1:
            raise ConfigError(f"commit check every {self.commit_check} s is invalid: must be "
                              "0 (off) to 1 second")

    def cache_bytes(self) -> tuple[int, int]:
        """The server's two answer caches' bounds, op cache and page cache: each half of
        `cache_mib` (`opcache.py` keeps encoded ops, `pagecache.py` whole answers)."""
        half = self.cache_mib * MIB // 2
        return half, self.cache_mib * MIB - half
