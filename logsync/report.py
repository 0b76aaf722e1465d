"""What one pull round did: per origin (`OriginProgress`) and in all (`RoundReport`).
Plain data the engine fills in as it goes, so a driver can watch progress and keep
what a failed round got done; peer state, status and the CLI read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from logsync.wire import Extensions, skipped_sentence

MAX_OPS_PER_ROUND = 250_000  # a round ends after this many ops; the next round goes on
STOP_CAUGHT_UP = "caught up"
STOP_EMPTY = "peer served no ops although its vector promised more"
STOP_SHORT = "peer served a short page before reaching its promised vector entry"
STOP_STORE = "store stopped this origin"
STOP_FAILED = "failed"
STOP_CAPPED = "round op cap reached; the rest next round"
STOP_DIVERGED = "diverged"  # the peer holds another history of this origin (recorded)


@dataclass
class OriginProgress:
    """What one round did for one origin."""

    origin: str
    start: int
    target: int
    reached: int
    pages: int = 0
    applied: int = 0
    duplicates: int = 0
    conflicts: int = 0
    quarantined: int = 0
    artifacts: int = 0
    artifacts_missing: int = 0
    stop_reason: str = ""
    error_kind: str | None = None  # set when the origin failed this round (rule 6)
    diverged_at: int | None = None  # first origin_seq where the peer's chain differs
    digest_requests: int = 0  # `/sync/digests` requests the divergence search made

    @property
    def failed(self) -> bool:
        return self.error_kind is not None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


PAGE_TIMES = 10_000


@dataclass
class RoundReport:
    """One round against one peer. The driver may pass one in to watch progress
    (it stays meaningful if the round fails midway) and adds `bytes_received`."""

    peer: str
    peer_replica: str | None = None
    remote_vector: dict[str, int] = field(default_factory=dict)
    remote_profile: dict[str, Any] | None = None
    remote_profiles: dict[str, Any] = field(default_factory=dict)
    extensions: list[str] = field(default_factory=list)
    negotiated: Extensions | None = None
    skipped_origins: dict[str, str] = field(default_factory=dict)
    origins: dict[str, OriginProgress] = field(default_factory=dict)
    local_vector_before: dict[str, int] = field(default_factory=dict)
    local_vector_after: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    bytes_received: int = 0
    ops_budget: int = MAX_OPS_PER_ROUND
    transient_streak: int = 0
    tip_signatures: int = 0  # tip signatures adopted from the peer (engine rule 8)
    searches: int = 0  # divergence searches this round (`divergence.MAX_SEARCHES_PER_ROUND`)
    key_changes: list[str] = field(default_factory=list)  # origins whose key the peer changed
    # Seconds from asking for a page to its apply's end, per page (the driver times them;
    # at most PAGE_TIMES kept, for the metrics histogram).
    page_seconds: list[float] = field(default_factory=list)

    def time_page(self, seconds: float) -> None:
        if len(self.page_seconds) < PAGE_TIMES:
            self.page_seconds.append(seconds)

    @property
    def capped(self) -> bool:
        """The round stopped at its op cap: more is owed right away."""
        return any(p.stop_reason == STOP_CAPPED for p in self.origins.values())

    def failed_origins(self) -> dict[str, str]:
        """Origins that failed this round (rule 6), with the reason."""
        return {o: p.stop_reason for o, p in self.origins.items() if p.failed}

    def total(self, name: str) -> int:
        """Sum of one OriginProgress counter over all origins."""
        return sum(getattr(progress, name) for progress in self.origins.values())

    @property
    def applied(self) -> int:
        return self.total("applied")

    @property
    def artifacts(self) -> int:
        return self.total("artifacts")

    @property
    def conflicts(self) -> int:
        return self.total("conflicts")

    @property
    def quarantined(self) -> int:
        return self.total("quarantined")

    def stopped_origins(self) -> dict[str, str]:
        """Origins the store stopped this round, with the reason."""
        return {
            origin: p.stop_reason
            for origin, p in self.origins.items()
            if p.stop_reason.startswith(STOP_STORE)
        }

    def skipped_line(self) -> str | None:
        """`wire.skipped_sentence` of the peer's vector: None when it lists none."""
        return skipped_sentence(self.skipped_origins)

    def as_upstream_stats(self, url: str) -> dict[str, Any]:
        """The per-peer stats dict upstream's `sync_with_peer` returns."""
        return {
            "peer_url": url,
            "peer_replica": self.peer_replica or "?",
            "pulled_events": self.applied,
            "pulled_artifacts": self.artifacts,
            "per_origin": {o: p.applied for o, p in self.origins.items() if p.applied},
            "remote_version_vector": dict(self.remote_vector),
            "remote_profile": self.remote_profile,
            "remote_profiles": dict(self.remote_profiles),
        }

    def as_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready (the upstream stats keys plus ours)."""
        totals = {k: self.total(k) for k in ("applied", "duplicates", "conflicts")}
        totals |= {k: self.total(k) for k in ("quarantined", "artifacts", "artifacts_missing")}
        return self.as_upstream_stats(self.peer) | {
            "extensions": list(self.extensions),
            "skipped_origins": dict(self.skipped_origins),
            "origins": {o: p.as_dict() for o, p in self.origins.items()},
            "totals": totals,
            "requests": self.requests,
            "bytes_received": self.bytes_received,
            "failed_origins": self.failed_origins(),
        }
