"""The palace's signing key file, ``<palace>/logsync-signing-key`` (`keys.KEY_FILENAME`).

It holds the 32-byte Ed25519 *seed* as 64 lowercase hex digits and a newline (text, so
it survives copies and editors; surrounding whitespace is ignored when read). It is
created with mode 0600, exclusively (first writer wins, like ``replica.json``), never
rewritten, and never served: nothing under ``/sync/*`` reads it. A file that is corrupt
or open to group/others is an error, never replaced: a second key would be a second
identity. Kept apart from the pure `keys.py` so deciding modules can verify without I/O.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from nacl.signing import SigningKey

from logsync.errors import KeyFileError
from logsync.files import write_exclusive
from logsync.keys import KEY_FILENAME

__all__ = ["KEY_FILENAME", "load_or_mint_signing_key", "read_signing_key"]

_SEED_RE = re.compile(rb"[0-9a-f]{64}")
_MAX_FILE_BYTES = 256  # a seed file is 65 bytes; anything much larger is not one


def read_signing_key(palace: Path) -> SigningKey | None:
    """The palace's signing key; None when there is no key file. A file that cannot be
    read, is not a seed, or is open to group/others raises `KeyFileError` (one sentence)."""
    path = Path(palace) / KEY_FILENAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyFileError(f"cannot read the signing key {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"the signing key {path} is not a regular file")
        if info.st_mode & 0o077:
            raise KeyFileError(
                f"the signing key {path} is open to group/others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}): run `chmod 600 {path}`"
            )
        data = os.read(fd, _MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read the signing key {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    seed = data.strip()
    if len(data) > _MAX_FILE_BYTES or not _SEED_RE.fullmatch(seed):
        raise KeyFileError(
            f"the signing key {path} is corrupt (expected 64 lowercase hex digits); refusing "
            "to mint a second key for this palace: restore the file"
        )
    return SigningKey(bytes.fromhex(seed.decode("ascii")))


def load_or_mint_signing_key(palace: Path, seed: bytes | None = None) -> SigningKey:
    """The palace's signing key, minted and written (0600, first writer wins) when there
    is none yet; the palace directory must exist. `seed` (32 bytes) mints that key instead
    of a random one: the simulator's nodes, whose runs replay from the scenario's seed."""
    path = Path(palace) / KEY_FILENAME
    existing = read_signing_key(palace)
    if existing is not None:
        return existing
    if seed is not None and len(seed) != 32:
        raise ValueError(f"an Ed25519 seed is 32 bytes, not {len(seed)}")
    seed = bytes(SigningKey.generate()) if seed is None else seed
    try:
        write_exclusive(path, seed.hex() + "\n", mode=0o600)
    except OSError as exc:
        raise KeyFileError(
            f"cannot create the signing key {path}: {exc.strerror or exc}"
        ) from None
    winner = read_signing_key(palace)  # ours, or the one a concurrent opener wrote first
    if winner is None:
        raise KeyFileError(f"the signing key {path} vanished right after it was written")
    return winner
