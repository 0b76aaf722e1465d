"""`logsync reidentify`: a new replica id and signing key for a palace (a clone's remedy,
RFC 004 §3.1, §3.2).

Two palaces copied from one directory share an id and a key, so both author ops under
one origin and every peer that meets both records forks. Reidentifying one of them gives
it a fresh key and the id that key certifies; nothing held is rewritten: its ops so far
stay under the old origin (as anyone else's would), its next local op is seq 1 of the
new origin, and peers pin the new key on first sight, as for any new replica.

The files change under the store's write lock (`replica.replace_identity`: crash-safe,
old identity or new, never a mix), so no local writer of this store appends in between;
in the same transaction the old key's keyring row stops being ours (``self``) and
becomes what any other replica holds for that origin (``certified`` when the old id is
derived from it, else ``pinned``). The new key's row is written by the next writable
open, as at every open. A process that opened the palace before (a running `logsync
serve`) still holds the old identity in memory: it must be restarted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nacl.signing import SigningKey

from logsync.errors import ReplicaIdentityError, StoreError
from logsync.keys import certifies, public_key_of, self_certifying_id
from logsync.replica import read_replica_id, replace_identity


@dataclass(frozen=True)
class Reidentified:
    previous_id: str
    replica_id: str
    warning: str | None = None  # the identity changed, and something after it did not


def reidentify_store(store: Any, after: Callable[[str], None] | None = None) -> Reidentified:
    """Give `store`'s palace a new key and id (module docstring); closes `store`, whose
    in-memory identity is the old one. Raises `ReplicaIdentityError` (nothing changed)
    when the store was opened under another id than replica.json's, or the files cannot
    be written."""
    old_id = store.replica_id
    if read_replica_id(store.palace) != old_id:
        raise ReplicaIdentityError(
            f"this store was opened as {old_id}, which is not the id in {store.palace}'s "
            "replica.json: reidentify replaces the palace's own identity only"
        )
    old_key = store.public_key
    new_key = SigningKey.generate()
    changed: list[str] = []
    warning = None
    try:
        with store._atomic(durable=True) as conn:
            if old_key is not None:
                conn.execute(
                    "UPDATE logsync_keys SET source = ? WHERE origin = ? AND source = 'self'",
                    ("certified" if certifies(old_id, old_key) else "pinned", old_id))
            try:
                changed.append(replace_identity(store.palace, new_key, after=after))
            except OSError as exc:
                warning = _after_failure(store.palace, old_id, new_key, exc)
                changed.append(self_certifying_id(public_key_of(new_key)))
    except StoreError as exc:
        if not changed:
            raise
        warning = f"the old key's keyring row still says it is this palace's own ({exc})"
    store.close()
    return Reidentified(old_id, changed[0], warning)


def _after_failure(palace: Any, old_id: str, new_key: SigningKey, exc: OSError) -> str:
    """A file step failed: before the commit point nothing changed (raise, and the
    transaction rolls back); after it the new id stands, and the key is put in place by
    the next read of the id (a warning)."""
    try:
        now = read_replica_id(palace, finish=False)
    except ReplicaIdentityError:
        now = None
    new_id = self_certifying_id(public_key_of(new_key))
    if now != new_id:
        raise ReplicaIdentityError(
            f"cannot write the new identity in {palace} ({exc.strerror or exc}): the "
            f"palace keeps {old_id}"
        ) from None
    return (f"the palace is now {new_id}, but putting its new key in place failed "
            f"({exc.strerror or exc}): the next logsync command on it finishes that")
