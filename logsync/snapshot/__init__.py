"""Snapshot join (RFC 004 §9.6): an empty replica copies a peer's whole store at once.

`making` builds and caches the consistent copy a server streams (`GET /sync/snapshot`);
`checking` is the joiner's verification of a downloaded copy (the audit of `logsync
verify` plus the rules only a whole-file copy needs); `joining` downloads, checks and
installs it under the joiner's own identity. The wire format is one JSON line (the
preamble: format, the server's replica id, the vector the copy holds, its size and
SHA-256) and then exactly `size` bytes of SQLite file; a joiner that asks for zstd gets
that same body as zstd frames, decoded as they arrive.
"""

from __future__ import annotations

SNAPSHOT_PATH = "/sync/snapshot"
SNAPSHOT_FORMAT = "logsync-snapshot-1"
SNAPSHOT_TYPE = "application/vnd.logsync.snapshot"
SHA256_HEADER = "X-Logsync-Snapshot-Sha256"
SIZE_HEADER = "X-Logsync-Snapshot-Size"
MAX_PREAMBLE_BYTES = 1024 * 1024  # one JSON line; a vector of 4096 origins is ~250 KB
# Files in the palace directory: the server's cached copy and the joiner's download.
SERVE_PREFIX = ".logsync-snapshot-serve-"
JOIN_PREFIX = ".logsync-snapshot-join-"
# How fast a snapshot must move, on either side (the server sending, the joiner writing):
# within TRANSFER_BASE_S seconds of its start plus one second per TRANSFER_MIN_RATE bytes
# moved so far. Counted on what has moved, never on the size announced: a peer announcing
# 50 GiB and sending a byte every 10 s is cut after a minute, not after 14 hours.
TRANSFER_BASE_S = 60.0
TRANSFER_MIN_RATE = 1024 * 1024


def transfer_behind(started: float, moved: int, now: float,
                    base_s: float = TRANSFER_BASE_S) -> bool:
    """Whether a transfer that began at `started` (monotonic) and has moved `moved` bytes
    is behind the pace above at `now`."""
    return now > started + base_s + moved / TRANSFER_MIN_RATE


# Tables whose rows are the source's own and never travel (RFC 004 §7.6).
LOCAL_ONLY_TABLES = ("logsync_conflicts", "logsync_quarantine", "logsync_health")


class SnapshotRefused(Exception):
    """A snapshot failed a check; the message is the one sentence naming what failed."""
