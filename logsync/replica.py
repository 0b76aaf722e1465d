"""One stable replica id per palace directory, kept in `replica.json`.

The id names the palace copy (the seat), not the writer. It is minted once,
written atomically, and never rotated silently: a corrupt or foreign-shaped
file is an error, because a second identity would fork this replica's
op-log provenance.

A new palace mints its signing key first (`logsync/keyfile.py`) and derives its id from the
public key (`self_certifying_id`), so peers can check the key against the id; a palace
that already has an id keeps it (its key is minted at the first writable open, and
peers pin it on first sight).

The one deliberate rotation is `logsync reidentify` (a cloned palace's remedy):
`replace_identity` writes a new key and its id so that a crash leaves the old identity
or the new one, never the new id with the old key: the new key goes to a pending file,
then replica.json is replaced (the commit point), then the pending key replaces the key
file. Every read of the id finishes a change committed but not completed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from nacl.signing import SigningKey

from logsync.errors import ReplicaIdentityError, shorten
from logsync.files import UnreadableJSON, read_json, write_atomic, write_exclusive
from logsync.ids import REPLICA_ID_RE, is_replica_id
from logsync.keyfile import load_or_mint_signing_key
from logsync.keys import KEY_FILENAME, public_key_of, self_certifying_id

__all__ = ["PENDING_KEY_FILENAME", "REPLICA_FILENAME", "REPLICA_ID_RE", "get_replica_id",
           "is_replica_id", "mint_replica_id", "read_replica_id", "replace_identity"]

REPLICA_FILENAME = "replica.json"
PENDING_KEY_FILENAME = KEY_FILENAME + ".next"  # a new key, in place once replica.json names it
_SEED_RE = re.compile(rb"[0-9a-f]{64}")


def mint_replica_id() -> str:
    """A random id (not key-derived): only for callers that pass it as `mint`."""
    return f"rep_{secrets.token_hex(16)}"


def read_replica_id(palace: Path, *, finish: bool = True) -> str | None:
    """The stored id, None if there is no file, an error if it is untrustworthy. With
    `finish`, a reidentify committed but interrupted is completed first (its key put in
    place), so the id is never returned beside the old key."""
    path = Path(palace) / REPLICA_FILENAME
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    except UnreadableJSON as exc:
        if not exc.damaged:
            raise ReplicaIdentityError(str(exc)) from None
        raise ReplicaIdentityError(
            f"{path} is corrupt: it {exc.reason}; refusing to mint a second identity for "
            "this palace: restore the file or delete it explicitly") from None
    if not isinstance(data, dict) or "replica_id" not in data:
        raise ReplicaIdentityError(
            f"{path} is corrupt (expected a JSON object with a replica_id); refusing to "
            "mint a second identity for this palace: restore the file or delete it explicitly"
        )
    replica_id = data["replica_id"]
    if not is_replica_id(replica_id):
        raise ReplicaIdentityError(
            f"{path} holds replica_id={shorten(replica_id)}, which is not 'rep_' followed by 12 or "
            "32 lowercase hex digits; refusing to mint a second identity"
        )
    if finish:
        _finish_pending_key(Path(palace), str(replica_id))
    return str(replica_id)


def identity_moved(palace: Path, running_id: str) -> str | None:
    """Why a process running as `running_id` must stop, when the palace's replica.json now
    names another id (`logsync reidentify` meanwhile); None when it does not (or cannot
    be read: that is reported where the palace is opened, not here)."""
    try:
        current = read_replica_id(palace, finish=False)
    except ReplicaIdentityError:
        return None
    if current is None or current == running_id:
        return None
    return (f"the palace was given a new identity ({current}) while this daemon ran as "
            f"{running_id}: stopping, so that it starts again under the new one")


def get_replica_id(palace: Path, mint: Callable[[], str] | None = None) -> str:
    """Return this palace's id, minting and persisting it on first use: by default derived
    from the palace's signing key (minted first if absent), else `mint()`."""
    palace = Path(palace)
    existing = read_replica_id(palace)
    if existing is not None:
        return existing
    if mint is None:
        palace.mkdir(parents=True, exist_ok=True)
        # Racing first opens agree on the key (first writer wins), hence on the id.
        replica_id = self_certifying_id(public_key_of(load_or_mint_signing_key(palace)))
    else:
        replica_id = mint()
    if not is_replica_id(replica_id):
        raise ReplicaIdentityError(f"minted replica id {replica_id!r} is malformed")
    palace.mkdir(parents=True, exist_ok=True)
    # First writer wins, atomically: two processes minting at once agree on one id.
    write_exclusive(palace / REPLICA_FILENAME, json.dumps({"replica_id": replica_id}, indent=2)
                    + "\n")
    winner = read_replica_id(palace)
    assert winner is not None
    return winner


# ── a deliberate new identity (`logsync reidentify`) ──────────────────


def replace_identity(
    palace: Path, new_key: SigningKey, *, after: Callable[[str], None] | None = None
) -> str:
    """Make `new_key` the palace's key and its self-certifying id the palace's id; returns
    the id. Three durable steps (each file synced, then the directory): the pending key,
    replica.json (the commit point), the key file. `after(step)` runs after each step
    (tests stop there to play a crash). Raises OSError; the caller holds the store's
    write lock, so no local writer appends while the files change."""
    palace = Path(palace)
    new_id = self_certifying_id(public_key_of(new_key))
    pending, key_path = palace / PENDING_KEY_FILENAME, palace / KEY_FILENAME
    step = after or (lambda _name: None)
    write_atomic(pending, bytes(new_key).hex() + "\n", mode=0o600)
    _sync_dir(palace)
    step("pending_key")
    write_atomic(palace / REPLICA_FILENAME, json.dumps({"replica_id": new_id}, indent=2) + "\n",
                 mode=0o644)
    _sync_dir(palace)
    step("replica_json")
    try:
        os.replace(pending, key_path)
    except FileNotFoundError:  # a concurrent reader finished the change first
        if _certified_seed(key_path) != new_id:
            raise
    _sync_dir(palace)
    step("key")
    return new_id


def _finish_pending_key(palace: Path, replica_id: str) -> None:
    """A pending key whose id is the palace's: a committed reidentify a crash interrupted
    before the key file was replaced; put it in place. Any other pending key is an
    attempt that never committed: left for the next `replace_identity` to overwrite
    (removing it here could race a reidentify under way)."""
    pending = palace / PENDING_KEY_FILENAME
    if _certified_seed(pending) != replica_id:
        return
    try:
        os.replace(pending, palace / KEY_FILENAME)
        _sync_dir(palace)
    except FileNotFoundError:
        return  # finished meanwhile by another opener
    except OSError as exc:
        raise ReplicaIdentityError(
            f"an interrupted `logsync reidentify` left the new key in {pending}, which cannot "
            f"be put in place ({exc.strerror or exc}): run any logsync command on this palace "
            "as its owner"
        ) from None


def _certified_seed(path: Path) -> str | None:
    """The id a seed file's key certifies; None when absent or not a seed (bounded read)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(257)
    except OSError:
        return None
    seed = data.strip()
    if len(data) > 256 or not _SEED_RE.fullmatch(seed):
        return None
    return self_certifying_id(public_key_of(SigningKey(bytes.fromhex(seed.decode("ascii")))))


def _sync_dir(directory: Path) -> None:
    """fsync a directory, so a rename in it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
