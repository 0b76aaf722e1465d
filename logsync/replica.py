"""One stable replica id per palace directory, kept in `replica.json`.

The id names the palace copy (the seat), not the writer. It is minted once,
written atomically, and never rotated silently: a corrupt or foreign-shaped
file is an error, because a second identity would fork this replica's
op-log provenance.

A new palace mints its signing key first (`logsync/keyfile.py`) and derives its id from the
public key (`self_certifying_id`), so peers can check the key against the id; a palace
that already has an id keeps it (its key is minted at the first writable open, and
peers pin it on first sight).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path

from logsync.errors import ReplicaIdentityError
from logsync.files import write_exclusive
from logsync.ids import REPLICA_ID_RE, is_replica_id
from logsync.keyfile import load_or_mint_signing_key
from logsync.keys import public_key_of, self_certifying_id

__all__ = ["REPLICA_FILENAME", "REPLICA_ID_RE", "get_replica_id", "is_replica_id",
           "mint_replica_id", "read_replica_id"]

REPLICA_FILENAME = "replica.json"


def mint_replica_id() -> str:
    """A random id (not key-derived): only for callers that pass it as `mint`."""
    return f"rep_{secrets.token_hex(16)}"


def read_replica_id(palace: Path) -> str | None:
    """The stored id, None if there is no file, an error if it is untrustworthy."""
    path = Path(palace) / REPLICA_FILENAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReplicaIdentityError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
        replica_id = data["replica_id"]
    except (ValueError, KeyError, TypeError):
        raise ReplicaIdentityError(
            f"{path} is corrupt (expected a JSON object with a replica_id); refusing to "
            "mint a second identity for this palace: restore the file or delete it explicitly"
        ) from None
    if not is_replica_id(replica_id):
        raise ReplicaIdentityError(
            f"{path} holds replica_id={replica_id!r}, which is not 'rep_' followed by 12 or "
            "32 lowercase hex digits; refusing to mint a second identity"
        )
    return str(replica_id)


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
