"""One stable replica id per palace directory, kept in `replica.json`.

The id names the palace copy (the seat), not the writer. It is minted once,
written atomically, and never rotated silently: a corrupt or foreign-shaped
file is an error, because a second identity would fork this replica's
op-log provenance.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from pathlib import Path

from logsync.errors import ReplicaIdentityError
from logsync.files import write_exclusive
from logsync.ids import REPLICA_ID_RE, is_replica_id

__all__ = ["REPLICA_FILENAME", "REPLICA_ID_RE", "get_replica_id", "is_replica_id",
           "mint_replica_id", "read_replica_id"]

REPLICA_FILENAME = "replica.json"


def mint_replica_id() -> str:
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


def get_replica_id(palace: Path, mint: Callable[[], str] = mint_replica_id) -> str:
    """Return this palace's id, minting and persisting it on first use."""
    palace = Path(palace)
    existing = read_replica_id(palace)
    if existing is not None:
        return existing
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
