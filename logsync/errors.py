"""The one exceptions module.

Our faults are kept apart from the peer's, and only the transient branch is
retried (STYLE.md §6)::

    LogsyncError
    ├── ValidationError (also ValueError)   bad input: one sentence naming field, value, rule
    ├── NotFoundError (also KeyError-like)  an id that does not exist here
    ├── ReplicaIdentityError                replica.json is corrupt or foreign-shaped
    │   └── KeyFileError                    the palace's signing key file is unusable
    ├── StoreError                          the database refused (locked, corrupt, full)
    ├── ConfigError                         peers.json, scenario files, CLI settings
    └── PeerError                           anything a peer did or failed to do
        ├── PeerTransientError              connect errors, timeouts, 5xx, 429/503 (retried)
        ├── PeerAuthError                   401/403: wrong or missing token (not retried)
        ├── PeerRequestError                other 4xx (not retried)
        └── PeerProtocolError               malformed or lying answers (not retried)
            └── PeerTooLargeError           an answer past a size/item bound: ask for less
"""

from __future__ import annotations


class LogsyncError(Exception):
    """Base of every error logsync raises on purpose."""


class ValidationError(LogsyncError, ValueError):
    """Input broke a rule; the message names the field, the value and the rule."""


class NotFoundError(LogsyncError):
    """An id (event, artifact, peer) that this replica does not hold."""


class ReplicaIdentityError(LogsyncError):
    """replica.json cannot be trusted; we refuse to mint a second identity."""


class KeyFileError(ReplicaIdentityError):
    """The signing key file is unreadable, corrupt or exposed; never replaced silently."""


class StoreError(LogsyncError):
    """SQLite failed underneath us (locked past the timeout, corrupt, disk full)."""


class ConfigError(LogsyncError):
    """A configuration file or setting is malformed."""


class PeerError(LogsyncError):
    """A peer failed, refused, or answered something we cannot accept; `status` is the
    HTTP status when the peer answered one."""

    def __init__(self, message: str, *, peer: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer
        self.status = status


class PeerTransientError(PeerError):
    """Worth retrying: the network or the peer may recover."""

    def __init__(
        self, message: str, *, peer: str | None = None, retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message, peer=peer, status=status)
        self.retry_after = retry_after


class PeerAuthError(PeerError):
    """The peer rejected our credentials (401/403)."""


class PeerRequestError(PeerError):
    """The peer rejected the request itself (a 4xx other than auth)."""


class PeerProtocolError(PeerError):
    """The peer's answer is malformed, oversize, or contradicts itself."""


class PeerTooLargeError(PeerProtocolError):
    """The answer passed a byte or item bound; a smaller page may pass (the engine halves)."""


def shorten(value: object, limit: int = 60) -> str:
    """repr() of a value, cut so error sentences stay one line."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nesting beyond the stack, an int beyond str()
        text = f"<{type(value).__name__} too deep or too large to show>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
