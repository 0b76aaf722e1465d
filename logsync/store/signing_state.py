"""An origin's signing state (issue 10, item 4): the one answer `info`, `status` and
`verify` give about how far the ops we hold of an origin are proven by its author.

Pure SQL over a connection, read-only. Per origin:

- ``state``: ``signed`` (the key in `logsync_keys` has source ``self``, ours, or
  ``certified``, the origin's id is derived from it), ``pinned`` (a key trusted on first
  sight: the id does not certify it) or ``unsigned`` (no key known);
- ``signed_to``: the highest origin_seq with a stored signature (0: none, and always 0
  for an unsigned origin, whose signatures no key could check; a store keeps none:
  signatures of a peer's origin are stored only once verified with its key). Each chain
  digest binds the one before, so that signature covers every held op at or below it;
- ``unproven``: held ops above ``signed_to``, ops taken through peers that cannot carry
  signatures (a MemPalace hub) or written by another program. For an unsigned origin
  that is every op held.

Stored signatures are counted here, not checked: `logsync verify` (`store/audit.py`)
checks them. The cost is a few index seeks per origin plus a walk over its unproven ops
(all of an unsigned origin's, along the events index): the count itself is that walk.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from logsync.errors import StoreError
from logsync.store.chaining import ORIGINS_SQL
from logsync.store.faults import describe_fault

State = Literal["signed", "pinned", "unsigned"]
SIGNED_SOURCES = ("self", "certified")  # keyring sources whose key needs no trust
SIGNED_TO_SQL = (
    "SELECT origin_seq FROM logsync_chain WHERE origin = ? AND signature IS NOT NULL "
    "ORDER BY origin_seq DESC LIMIT 1"
)
UNPROVEN_SQL = "SELECT count(*) FROM events WHERE origin_replica = ? AND origin_seq > ?"


@dataclass(frozen=True)
class SigningState:
    origin: str
    state: State
    signed_to: int  # highest origin_seq with a stored signature; 0: none
    unproven: int  # held ops above signed_to

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "signed_to": self.signed_to, "unproven": self.unproven}

    def summary(self) -> str:
        return phrase(self.to_json())


def phrase(entry: dict[str, Any]) -> str:
    """A `SigningState.to_json()` entry in words, as `info` and `status` print it:
    ``signed, signed to 12, 0 unproven`` / ``unsigned, 7 unproven``."""
    if entry["state"] == "unsigned":
        return f"unsigned, {entry['unproven']} unproven"
    return f"{entry['state']}, signed to {entry['signed_to']}, {entry['unproven']} unproven"


def signing_states(
    conn: sqlite3.Connection, origins: Iterable[str] | None = None
) -> dict[str, SigningState]:
    """Every held origin's signing state (or only these origins', held or not), by
    origin in sorted order."""
    if origins is None:
        origins = [str(r[0]) for r in conn.execute(ORIGINS_SQL).fetchall()]
    sources = {str(r[0]): r[1] for r in conn.execute("SELECT origin, source FROM logsync_keys")}
    return {origin: signing_state(conn, origin, sources.get(origin, None))
            for origin in sorted(set(origins), key=str)}


def signing_state(conn: sqlite3.Connection, origin: str, source: Any) -> SigningState:
    """One origin's state, given its keyring source (None: no key known)."""
    state: State = ("unsigned" if source is None
                    else "signed" if source in SIGNED_SOURCES else "pinned")
    signed_to = 0  # without a key no signature can be checked: it proves nothing
    if state != "unsigned":
        row = conn.execute(SIGNED_TO_SQL, (origin,)).fetchone()
        signed_to = int(row[0]) if row is not None else 0
    unproven = int(conn.execute(UNPROVEN_SQL, (origin, signed_to)).fetchone()[0])
    return SigningState(origin, state, signed_to, unproven)


def read_signing_states(store: Any, origins: Iterable[str] | None = None
                        ) -> dict[str, SigningState]:
    """`signing_states` on an open `Store`'s read connection (one snapshot); a SQLite
    fault is a `StoreError` naming the store, as every other read."""
    conn = store._reader()
    began = not conn.in_transaction
    try:
        if began:
            conn.execute("BEGIN")
        return signing_states(conn, origins)
    except sqlite3.Error as exc:
        raise StoreError(describe_fault(store.db_path, "read", exc)) from None
    finally:
        if began and conn.in_transaction:
            conn.execute("ROLLBACK")
