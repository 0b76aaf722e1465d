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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol


class StoreLike(Protocol):
    """What a round needs from `logsync.store.Store`."""

    @property
    def replica_id(self) -> str: ...

    def version_vector(self) -> dict[str, int]: ...

    def own_seen_top(self) -> int: ...

    def missing_artifacts(self, ids: Iterable[str]) -> list[str]: ...

    def apply_remote(self, events: list[dict], artifacts: list[dict]) -> Any: ...


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
    """Apply one page in one transaction; answered by the store's `ApplyResult`."""

    events: list[dict]
    artifacts: list[dict]


StoreEffect = ReadVector | ReadOwnSeen | MissingArtifacts | ApplyPage
STORE_EFFECTS = (ReadVector, ReadOwnSeen, MissingArtifacts, ApplyPage)


def perform(store: StoreLike, effect: StoreEffect) -> Any:
    """Carry out one store effect (blocking: SQLite)."""
    if isinstance(effect, ReadVector):
        return dict(store.version_vector())
    if isinstance(effect, ReadOwnSeen):
        return store.own_seen_top()
    if isinstance(effect, MissingArtifacts):
        return list(store.missing_artifacts(effect.ids))
    if isinstance(effect, ApplyPage):
        return store.apply_remote(effect.events, effect.artifacts)
    raise TypeError(f"not a store effect: {effect!r}")
