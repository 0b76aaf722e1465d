"""What a pull round asks of the local store, as values: the round yields these beside
its network `Request`s and `Batch`es, and the driver performs them (`perform`).

So the round itself touches nothing: the httpx client runs the store effects in a
worker thread (SQLite is synchronous) and advances the round on the event loop; the
simulator performs them on its node's store, where it can also crash in the middle
of an apply. An exception a store call raises is thrown back into the round, which
turns a store's refusal of a page (`ValidationError`) into that origin's failure and
lets everything else (a `StoreError`: disk full, read-only) end the round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from logsync.responder import push_page


class StoreLike(Protocol):
    """What a round needs from `logsync.store.Store`."""

    @property
    def replica_id(self) -> str: ...

    def version_vector(self) -> dict[str, int]: ...

    def origin_top(self, origin: str) -> int: ...

    def own_seen_top(self) -> int: ...

    def missing_artifacts(self, ids: Iterable[str]) -> list[str]: ...

    def apply_remote(self, events: list[dict], artifacts: list[dict]) -> Any: ...

    def apply_chained(self, events: list[dict], artifacts: list[dict], origin: str, after: int,
                      prev: bytes, signatures: Mapping[int, bytes] | None = None) -> Any: ...

    def pin_keys(self, keys: Mapping[str, bytes], peer: str) -> dict[str, str]: ...

    def chain_digests_at(self, origin: str, seqs: Sequence[int]) -> list[bytes | None]: ...

    def list_ops(self, origin: str, after: int = 0, limit: int = 500, *,
                 max_limit: int = 500) -> list[dict]: ...

    def record_divergence(self, **found: Any) -> int: ...

    def adopt_tip_signatures(self, points: Sequence[tuple[str, int, bytes, bytes]]) -> int: ...


@dataclass(frozen=True)
class ReadVector:
    """The local version vector: origin -> highest contiguous origin_seq held."""


@dataclass(frozen=True)
class ReadOwnSeen:
    """The highest slot of our own origin ever seen (held, or refused as forged)."""


@dataclass(frozen=True)
class MissingArtifacts:
    """Which of these artifact ids the store lacks, in the given order."""

    ids: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class ApplyPage:
    """Apply one page in one transaction; answered by the store's `ApplyResult`. With
    `prev` (the peer's chain digest at `after`, `ext=chain`), only if ours is the same."""

    events: list[dict]
    artifacts: list[dict]
    origin: str = ""
    after: int = 0
    prev: bytes | None = None
    signatures: Mapping[int, bytes] | None = None


@dataclass(frozen=True)
class ReadDigests:
    """Our chain digest at each `(origin, seq)` (None above the chain's tip)."""

    points: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class ReadOps:
    """Up to `limit` of our held ops of `origin` above `after`, as served."""

    origin: str
    after: int
    limit: int


@dataclass(frozen=True, eq=False)
class PinKeys:
    """Pin the origin keys a peer published (`Store.pin_keys`); answered by origin ->
    'new' | 'same' | 'changed'."""

    keys: Mapping[str, bytes]
    peer: str


@dataclass(frozen=True, eq=False)
class RecordDivergence:
    """Record a chain divergence found against a peer (`Store.record_divergence`)."""

    origin: str
    seq: int
    peer: str
    local_digest: bytes | None
    remote_digest: bytes | None
    remote_ops: list[dict]


@dataclass(frozen=True)
class AdoptTipSignatures:
    """Store the origin's signatures of tips we hold unsigned with the same digest
    (`Store.adopt_tip_signatures`); answered by how many were taken."""

    points: tuple[tuple[str, int, bytes, bytes], ...]  # (origin, seq, digest, signature)


@dataclass(frozen=True)
class ServePushPage:
    """Our page of `origin` above `after` to push, encoded (`responder.push_page`)."""

    origin: str
    after: int
    limit: int
    max_bytes: int
    sender: str


StoreEffect = (ReadVector | ReadOwnSeen | MissingArtifacts | ApplyPage | ReadDigests | ReadOps
               | RecordDivergence | PinKeys | ServePushPage | AdoptTipSignatures)
STORE_EFFECTS = (ReadVector, ReadOwnSeen, MissingArtifacts, ApplyPage, ReadDigests, ReadOps,
                 RecordDivergence, PinKeys, ServePushPage, AdoptTipSignatures)


def perform(store: StoreLike, effect: StoreEffect) -> Any:
    """Carry out one store effect (blocking: SQLite)."""
    if isinstance(effect, ReadVector):
        return dict(store.version_vector())
    if isinstance(effect, ReadOwnSeen):
        return store.own_seen_top()
    if isinstance(effect, MissingArtifacts):
        return list(store.missing_artifacts(effect.ids))
    if isinstance(effect, ApplyPage):
        if effect.prev is not None:
            return store.apply_chained(effect.events, effect.artifacts, effect.origin,
                                       effect.after, effect.prev, effect.signatures)
        return store.apply_remote(effect.events, effect.artifacts)
    if isinstance(effect, ReadDigests):
        return [store.chain_digests_at(origin, [seq])[0] for origin, seq in effect.points]
    if isinstance(effect, ReadOps):
        return store.list_ops(effect.origin, effect.after, effect.limit,
                              max_limit=effect.limit)
    if isinstance(effect, AdoptTipSignatures):
        return store.adopt_tip_signatures(effect.points)
    if isinstance(effect, ServePushPage):
        return push_page(store, effect.origin, effect.after, effect.limit, effect.max_bytes,
                         effect.sender)
    if isinstance(effect, PinKeys):
        return store.pin_keys(effect.keys, effect.peer)
    if isinstance(effect, RecordDivergence):
        return store.record_divergence(
            origin=effect.origin, seq=effect.seq, peer=effect.peer,
            local_digest=effect.local_digest, remote_digest=effect.remote_digest,
            remote_ops=effect.remote_ops)
    raise TypeError(f"not a store effect: {effect!r}")
