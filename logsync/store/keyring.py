"""The keyring: one Ed25519 public key per origin, table `logsync_keys` (issue 10, item 3).

A key is written once and never replaced here: our own at open (source ``'self'``), a
peer's on first sight (``'certified'`` when the origin's id is derived from the key,
``'pinned'`` otherwise, trust on first use). A different key later for a known origin
is reported as ``'changed'`` and left out: the caller records the conflict. MemPalace
ignores the table. Everything here runs inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

from logsync.errors import KeyFileError, ReplicaIdentityError, ValidationError
from logsync.keys import PUBLIC_KEY_BYTES, certifies

KEYS_DDL = (
    "CREATE TABLE IF NOT EXISTS logsync_keys (\n"
    "    origin TEXT PRIMARY KEY,\n"
    "    public_key BLOB NOT NULL,\n"
    "    source TEXT NOT NULL,\n"  # 'self' | 'certified' (id derived from key) | 'pinned'
    "    first_seen TEXT NOT NULL\n"
    ")"
)
SOURCES = ("self", "certified", "pinned")
PinOutcome = Literal["new", "same", "changed"]
PublishedOutcome = Literal["new", "same", "changed", "replaced", "ignored"]


def create_keys_table(conn: sqlite3.Connection) -> None:
    """The migration step (`schema.migrate`)."""
    conn.execute(KEYS_DDL)


def known_key(conn: sqlite3.Connection, origin: str) -> bytes | None:
    row = conn.execute(
        "SELECT public_key FROM logsync_keys WHERE origin = ?", (origin,)
    ).fetchone()
    return None if row is None else bytes(row[0])


def all_keys(conn: sqlite3.Connection) -> dict[str, bytes]:
    """Every known origin's public key."""
    return {
        str(r[0]): bytes(r[1])
        for r in conn.execute("SELECT origin, public_key FROM logsync_keys ORDER BY origin")
    }


def pin_key(conn: sqlite3.Connection, origin: str, public_key: bytes, now: str) -> PinOutcome:
    """Pin a peer's key on first sight: 'new' (written), 'same' (already this key) or
    'changed' (another key is pinned; nothing is written, the caller records a conflict)."""
    return _pin(conn, origin, _checked(public_key), now, None)


def pin_published(
    conn: sqlite3.Connection, origin: str, public_key: bytes, now: str, publisher: str
) -> PublishedOutcome:
    """A key that peer `publisher` advertises for `origin`, by the rule that keeps one peer
    from choosing another origin's key: a key the origin's id certifies is always taken
    (over one merely pinned, 'replaced'); any other key only from the origin itself, on
    first sight ('new'). A third party's uncertified key for an unknown origin is
    'ignored'; any key other than the one held is 'changed' (never written: the caller
    records it)."""
    key = _checked(public_key)
    outcome = published_outcome(held_key(conn, origin), origin, key, publisher)
    if outcome == "new":
        _pin(conn, origin, key, now, None)
    elif outcome == "replaced":
        conn.execute("UPDATE logsync_keys SET public_key = ?, source = 'certified', "
                     "first_seen = ? WHERE origin = ?", (key, now, origin))
    return outcome


def held_key(conn: sqlite3.Connection, origin: str) -> tuple[bytes, str] | None:
    """The key held for `origin` and its source ('self' | 'certified' | 'pinned')."""
    row = conn.execute("SELECT public_key, source FROM logsync_keys WHERE origin = ?",
                       (origin,)).fetchone()
    return None if row is None else (bytes(row[0]), str(row[1]))


def published_outcome(held: tuple[bytes, str] | None, origin: str, public_key: bytes,
                      publisher: str) -> PublishedOutcome:
    """`pin_published`'s decision, without writing: a caller that reads 'same' or
    'ignored' for every key needs no write transaction."""
    key = _checked(public_key)
    if held is None:
        return "new" if certifies(origin, key) or publisher == origin else "ignored"
    if held[0] == key:
        return "same"
    if held[1] == "pinned" and certifies(origin, key):
        return "replaced"
    return "changed"


def check_own_origin(conn: sqlite3.Connection, origin: str, public_key: bytes | None) -> None:
    """Refuse a palace whose key the store records as the own key of another origin:
    replica.json's id was changed by hand (reads check it too, so `status` never shows
    the edited id as this palace's). Without the key (a reader who may not read the key
    file), a store that records another origin as its own and none for `origin` is
    refused too: an edit, or a `reidentify` interrupted before its next writable open,
    which only the owner can tell apart."""
    if public_key is None:
        other = conn.execute(
            "SELECT origin FROM logsync_keys WHERE source = 'self' AND origin != ? AND NOT "
            "EXISTS (SELECT 1 FROM logsync_keys WHERE source = 'self' AND origin = ?) "
            "LIMIT 1", (origin, origin)).fetchone()
        if other is not None:
            raise ReplicaIdentityError(
                f"replica.json names {origin}, but the store records {other[0]} as this "
                f"palace's own origin and nothing for {origin}: replica.json was changed "
                "by hand, or `logsync reidentify` was interrupted; run any writable "
                "command as the palace's owner, which finishes the one or names the id "
                "to restore for the other")
        return
    other = conn.execute(
        "SELECT origin FROM logsync_keys WHERE source = 'self' AND public_key = ? AND "
        "origin != ? LIMIT 1", (public_key, origin)).fetchone()
    if other is not None:
        raise ReplicaIdentityError(
            f"replica.json names {origin}, but this palace's signing key is recorded in its "
            f"store as the key of {other[0]}, its own origin: restore that id in "
            "replica.json (then `logsync reidentify` gives the palace a new identity, if "
            "that was the aim)"
        )


def record_own_key(conn: sqlite3.Connection, origin: str, public_key: bytes, now: str) -> None:
    """Our own key's row, at every writable open. A different key already recorded for our
    origin means the key file was replaced or lost: refused, like a second replica id.
    Our key recorded as the own key of *another* origin means replica.json's id was
    changed by hand: refused too, or one key would sign as two origins (`reidentify`
    marks the old row as no longer ours, and makes a new key)."""
    check_own_origin(conn, origin, public_key)
    if _pin(conn, origin, _checked(public_key), now, "self") == "changed":
        raise KeyFileError(
            f"the signing key of this palace is not the one recorded for {origin} in its "
            "store (the key file was replaced or lost): restore the original key file, or "
            "give the palace a new identity: `logsync reidentify --yes`"
        )


def _pin(
    conn: sqlite3.Connection, origin: str, key: bytes, now: str, source: str | None
) -> PinOutcome:
    held = known_key(conn, origin)
    if held is not None:
        return "same" if held == key else "changed"
    if source is None:
        source = "certified" if certifies(origin, key) else "pinned"
    conn.execute(
        "INSERT INTO logsync_keys (origin, public_key, source, first_seen) VALUES (?, ?, ?, ?)",
        (origin, key, source, now),
    )
    return "new"


def _checked(public_key: object) -> bytes:
    raw = bytes(public_key) if isinstance(public_key, bytes | bytearray | memoryview) else None
    if raw is None or len(raw) != PUBLIC_KEY_BYTES:
        shape = f"{len(raw)} bytes" if raw is not None else f"a {type(public_key).__name__}"
        raise ValidationError(f"public_key must be {PUBLIC_KEY_BYTES} raw bytes, not {shape}")
    return raw
