"""Per-origin Ed25519 signing keys (issue 10, item 3): the palace's key file, the
self-certifying replica id, and signatures over chain digests.

Why Ed25519 through PyNaCl (libsodium): its verify is strict (it rejects non-canonical
signatures and small-order public keys), which a cross-implementation spec needs, and
it is the faster verifier here (39 µs against 62 µs for `cryptography`).

The key file, ``<palace>/logsync-signing-key``, holds the 32-byte Ed25519 *seed* as 64
lowercase hex digits and a newline (text, so it survives copies and editors; surrounding
whitespace is ignored when read). It is created with mode 0600, exclusively (first
writer wins, like ``replica.json``), never rewritten, and never served: nothing under
``/sync/*`` reads it. A file that is corrupt or open to group/others is an error, never
replaced: a second key would be a second identity.

Everything but ``read_signing_key`` and ``load_or_mint_signing_key`` is pure.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

from nacl.exceptions import CryptoError
from nacl.signing import SigningKey, VerifyKey

from logsync.errors import KeyFileError
from logsync.files import write_exclusive

__all__ = ["KEY_FILENAME", "PUBLIC_KEY_BYTES", "SIGNATURE_BYTES", "SIGNATURE_DOMAIN",
           "certifies", "load_or_mint_signing_key", "public_key_of", "read_signing_key",
           "self_certifying_id", "sign_digest", "verify_digest"]

KEY_FILENAME = "logsync-signing-key"
REPLICA_ID_DOMAIN = b"logsync-replica-v1\x00"
SIGNATURE_DOMAIN = b"logsync-op-sig-v1\x00"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32  # a chain digest (`logsync.chain`)
_SEED_RE = re.compile(rb"[0-9a-f]{64}")
_MAX_FILE_BYTES = 256  # a seed file is 65 bytes; anything much larger is not one


# ── identity (pure) ───────────────────────────────────────────────────


def public_key_of(key: SigningKey) -> bytes:
    """The raw 32-byte Ed25519 public key."""
    return bytes(key.verify_key)


def self_certifying_id(public_key: bytes) -> str:
    """A replica id derived from its public key (upstream-shaped: `rep_` + 32 hex), so a
    peer can check a key against the id without having pinned it before."""
    return "rep_" + hashlib.sha256(REPLICA_ID_DOMAIN + bytes(public_key)).hexdigest()[:32]


def certifies(replica_id: object, public_key: object) -> bool:
    """Whether `replica_id` is the self-certifying id of `public_key` (never raises)."""
    key = _raw(public_key, PUBLIC_KEY_BYTES)
    return key is not None and isinstance(replica_id, str) and (
        self_certifying_id(key) == replica_id
    )


# ── signatures (pure) ─────────────────────────────────────────────────


def sign_digest(key: SigningKey, digest: bytes) -> bytes:
    """The 64-byte signature over ``SIGNATURE_DOMAIN || digest`` (a 32-byte chain digest).

    The domain keeps these signatures from ever being valid for another message type.
    """
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"a chain digest is {DIGEST_BYTES} bytes, not {len(digest)}")
    return bytes(key.sign(SIGNATURE_DOMAIN + bytes(digest)).signature)


def verify_digest(public_key: object, digest: object, signature: object) -> bool:
    """Whether `signature` is `public_key`'s over the digest; False for anything malformed
    (wrong type or length, a small-order key, a non-canonical signature), never raises."""
    key = _raw(public_key, PUBLIC_KEY_BYTES)
    body = _raw(digest, DIGEST_BYTES)
    sig = _raw(signature, SIGNATURE_BYTES)
    if key is None or body is None or sig is None:
        return False
    try:
        VerifyKey(key).verify(SIGNATURE_DOMAIN + body, sig)
    except (CryptoError, ValueError, TypeError):  # BadSignatureError is a CryptoError
        return False
    return True


def _raw(value: object, size: int) -> bytes | None:
    """`value` as bytes when it is bytes-like of exactly `size` bytes (never `bytes(int)`)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        return None
    raw = bytes(value)
    return raw if len(raw) == size else None


# ── the key file ──────────────────────────────────────────────────────


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
            "to mint a second key for this palace: restore the file or delete it explicitly"
        )
    return SigningKey(bytes.fromhex(seed.decode("ascii")))


def load_or_mint_signing_key(palace: Path) -> SigningKey:
    """The palace's signing key, minted and written (0600, first writer wins) when there
    is none yet; the palace directory must exist."""
    path = Path(palace) / KEY_FILENAME
    existing = read_signing_key(palace)
    if existing is not None:
        return existing
    seed = bytes(SigningKey.generate())
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
