"""Signed pages (issue 10, items 3-4), pure: which signatures a page carries, and whether
a page of a signed origin proves itself.

Every author signs the chain digest of each op it writes (`logsync/keys.py`). A page
served with `ext=chain` carries ``"chain": {"prev": <hex>, "sigs": [[seq, <hex>], ...]}``:
the signatures the server holds for the page's ops at *checkpoints* (``seq`` a multiple
of `CHECKPOINT`) and for its last op, and the server ends a page of a signed origin at
its last op with a signature (`signed_end`). The puller recomputes the chain from its
own ``D(after)`` (equal to ``prev``, checked first) over the page's ops and verifies
every signature the page carries; the one at the last op covers every op of the page,
since each digest binds the one before. Checkpoints cost ``1/CHECKPOINT`` of the ops in
signature checks and wire bytes, and let a relay serve pages that end where its own
pulls did not: whatever ``after`` a puller asks from, a page of at least `CHECKPOINT`
ops holds one. A relay stores only signatures it verified, so it never passes on one
that would fail at the next hop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from logsync.chain import canonical_op, next_digest
from logsync.errors import ValidationError, shorten
from logsync.keys import verify_digest
from logsync.model import checked_remote_row

CHECKPOINT = 64
BAD_SIGNATURE = "bad_signature"
CHAIN_MISMATCH = "chain_mismatch"
UNSIGNED = "unsigned_page"  # the server holds no signature to end the page with
MISSING_ARTIFACT = "missing_artifact"  # as the store's own apply check names it


def carries_signature(seq: int, last: int) -> bool:
    """Whether a page whose last op is `last` carries the signature of op `seq`."""
    return seq == last or seq % CHECKPOINT == 0


def signed_end(seqs: Sequence[int], signed: set[int]) -> int:
    """How many of the page's ops to serve so that it ends at an op with a signature:
    all of them if the last is signed, else up to the last signed one, else all (the
    page then carries no end signature and a puller that knows the origin's key refuses
    it)."""
    for index in range(len(seqs) - 1, -1, -1):
        if seqs[index] in signed:
            return index + 1
    return len(seqs)


@dataclass(frozen=True)
class PageProof:
    """What a signed page proved: the digests and verified signatures to store."""

    digests: dict[int, bytes]
    signatures: dict[int, bytes]
    links: dict[int, tuple[bytes, bytes]]  # seq -> (digest before it, its digest)


def verify_page(
    public_key: bytes,
    prev: bytes,
    events: Sequence[Mapping[str, Any]],
    artifact_sha256s: Mapping[str, str | None],
    signatures: Mapping[int, bytes],
) -> PageProof | tuple[str, int, str]:
    """Check a page of a signed origin: its chain from `prev` and every signature it
    carries, which must include its last op. Returns the proof, or `(reason, seq,
    sentence)` for the first op that fails (`BAD_SIGNATURE` or `CHAIN_MISMATCH`), or for
    the last when the page carries no signature for it (`UNSIGNED`: a server that holds
    none, such as a relay that got the ops from a MemPalace hub)."""
    digest = prev
    digests: dict[int, bytes] = {}
    links: dict[int, tuple[bytes, bytes]] = {}
    first, end = (events[0], events[-1]) if events else (None, None)
    # the first op the next signature vouches for
    covered = first.get("origin_seq") if isinstance(first, Mapping) else None
    last = end.get("origin_seq") if isinstance(end, Mapping) else None
    if not isinstance(last, int) or last not in signatures:
        return (UNSIGNED, last if isinstance(last, int) else 0,
                "the page of a signed origin does not carry the signature of its last op")
    for event in events:
        if not isinstance(event, Mapping):  # a caller's page: the wire takes only objects
            return (CHAIN_MISMATCH, 0, f"the op {shorten(event)} is not an object, so it "
                    "cannot be put on the origin's chain")
        seq = event.get("origin_seq")
        ids = event.get("artifact_ids")
        try:
            if not isinstance(ids, list) or not all(isinstance(a, str) for a in ids):
                raise ValueError("artifact_ids is not a list of ids")
            absent = next((a for a in ids if artifact_sha256s.get(a) is None), None)
            if absent is not None:  # not a forgery: the op cannot be checked (nor stored)
                return (MISSING_ARTIFACT, seq if isinstance(seq, int) else 0,
                        f"names artifact {absent!r}, which is not present")
            before = digest
            digest = next_digest(digest, canonical_op(event, [artifact_sha256s.get(a)
                                                              for a in ids]))
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            # checked before the validator: a hostile op (metadata nested past the stack)
            # is refused here, as the validator would, never raised out of the round
            return (CHAIN_MISMATCH, seq if isinstance(seq, int) else 0,
                    f"the op cannot be put on the origin's chain: {_why(event, exc)}")
        assert isinstance(seq, int)
        digests[seq] = digest
        links[seq] = (before, digest)
        signature = signatures.get(seq) if carries_signature(seq, last) else None
        if signature is None:
            continue
        if not verify_digest(public_key, digest, signature):
            return (BAD_SIGNATURE, seq, f"the origin's signature at origin_seq {seq} does not "
                    f"verify over the chain of ops {covered}..{seq} as served (one of them "
                    "altered or invented, or an artifact's content swapped)")
        covered = seq + 1
    kept = {seq: sig for seq, sig in signatures.items()
            if seq in digests and carries_signature(seq, last)}
    return PageProof(digests, kept, links)


def _why(event: Mapping[str, Any], exc: BaseException) -> str:
    """Why an op has no canonical bytes, as the validator says it (`metadata={'x': nan} is
    invalid: must not hold NaN or Infinity (not JSON)`), else the error's own words: an
    operator reads it in the quarantine, never an exception's repr."""
    try:
        checked_remote_row(event)
    except ValidationError as refused:
        return str(refused)
    except Exception:  # noqa: BLE001 - the validator's own failure says nothing better
        pass
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
