"""Per-origin Ed25519 signing keys (issue 10, item 3): the self-certifying replica id
and signatures over chain digests.

Why Ed25519 through PyNaCl (libsodium): its verify is strict (it rejects non-canonical
signatures and small-order public keys), which a cross-implementation spec needs, and
it is the faster verifier here (39 µs against 62 µs for `cryptography`).

Pure (no files, no clock), so the sans-IO deciding modules (the responder, page checks)
can verify: the key file is read and minted by ``logsync/keyfile.py``.
"""

from __future__ import annotations

import functools
import hashlib

from nacl.exceptions import CryptoError
from nacl.signing import SigningKey, VerifyKey

__all__ = ["KEY_FILENAME", "PUBLIC_KEY_BYTES", "SIGNATURE_BYTES", "SIGNATURE_DOMAIN",
           "certifies", "public_key_of", "self_certifying_id", "sign_digest", "verify_digest"]

KEY_FILENAME = "logsync-signing-key"  # in the palace; read and written by `keyfile.py`
REPLICA_ID_DOMAIN = b"logsync-replica-v1\x00"
SIGNATURE_DOMAIN = b"logsync-op-sig-v1\x00"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32  # a chain digest (`logsync.chain`)
VERIFIED_KEPT = 8192  # verification results remembered (`_verified`)


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
    return _verified(key, body, sig)


@functools.lru_cache(maxsize=VERIFIED_KEPT)
def _verified(key: bytes, body: bytes, sig: bytes) -> bool:
    """Ed25519 verification, a pure function of its bytes: the same signature reaching us
    again (the same op in a pulled page, a pushed page and a page frame; every simulated
    node) is checked once. Bounded: the least recently used results go."""
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
