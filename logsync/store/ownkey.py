"""Which signing key a store opens with (`Store.open`): reads go on without one, writes
need the one the store records as its own, and `keyless` (reidentify) takes what is there
and says what is wrong. A key file this user may not read is someone else's, never a lost
one."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from nacl.signing import SigningKey

from logsync.errors import KeyFileError
from logsync.keyfile import KEY_FILENAME, load_or_mint_signing_key, read_signing_key
from logsync.keys import public_key_of

REIDENTIFY = "`logsync reidentify --yes`"  # the way on when a palace's key is lost


def _not_ours(palace: Path) -> bool:
    """Whether this user may not read the key file (another user's 0600 file)."""
    return not os.access(palace / KEY_FILENAME, os.R_OK)


def _recorded_own_key(db_path: Path, replica_id: str) -> bytes | None:
    """The key the store records as its own for `replica_id` (read-only; a store that
    cannot be read here records none: opening it says what is wrong)."""
    if not db_path.is_file():
        return None
    try:
        conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT public_key FROM logsync_keys WHERE origin = ? AND "
                               "source = 'self'", (replica_id,)).fetchone()
        finally:
            conn.close()
    except (sqlite3.Error, OSError, RuntimeError):
        return None
    return None if row is None else bytes(row[0])


def key_for_reading(palace: Path) -> tuple[SigningKey | None, str | None]:
    """A read-only open's key and why there is none: reads need no key, so an absent
    file, another user's 0600 file or a damaged one only leaves the recorded key to
    stand in (a damaged one is named, for the CLI to warn)."""
    try:
        return read_signing_key(palace), None
    except KeyFileError as exc:
        return None, None if _not_ours(palace) else str(exc)


def key_for_writing(palace: Path, db_path: Path, replica_id: str,
                    keyless: bool) -> tuple[SigningKey | None, str | None]:
    """A writable open's key, minted on first use. One that is lost (the store records
    ours), damaged or another key than the recorded one is refused, naming the remedies,
    unless `keyless`. A file this user may not read is refused even then: it is someone
    else's key, not a lost one."""
    try:
        key = read_signing_key(palace)
    except KeyFileError as exc:
        if _not_ours(palace):
            raise  # run as the palace's owner
        if keyless:
            return None, str(exc)
        raise KeyFileError(f"{exc}, or give the palace a new identity: {REIDENTIFY}") \
            from None
    recorded = _recorded_own_key(db_path, replica_id)
    if key is not None:
        if keyless and recorded is not None and public_key_of(key) != recorded:
            return None, (f"the signing key {palace / KEY_FILENAME} is not the one the "
                          f"store records for {replica_id}")
        return key, None
    if recorded is not None:
        # minting now would leave a second key behind even though the open fails
        problem = (f"the signing key {palace / KEY_FILENAME} is missing, but the store "
                   f"records a key for {replica_id} (its ops are signed with it)")
        if keyless:
            return None, problem
        raise KeyFileError(f"{problem}: restore the original key file, or give the palace "
                           f"a new identity: {REIDENTIFY}")
    return load_or_mint_signing_key(palace), None
