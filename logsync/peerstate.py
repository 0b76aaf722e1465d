"""Per-peer sync state and its transitions, in one place (STYLE.md §4).

Rules:

- A peer starts unknown: `reachable` None, nothing pulled, no vector.
- `record_success(report, now)`: reachable; `last_error` cleared (its time kept,
  as upstream does); `last_success_at = now`; last pulled counts replaced and
  added to the totals; the peer's vector and profile replaced; drift
  recomputed from the local vector at the end of the round; the failure
  streak reset.
- `record_failure(error, now)`: not reachable (upstream's meaning: the last
  round failed, whatever the cause; `last_error_kind` says which); the
  error's one sentence and time kept; the last known vector and profile kept
  ("last seen as"); the failure streak grows.
- Drift for an origin is the peer's vector entry minus ours, clamped at zero:
  the ops we lack from that peer. (Upstream origins may have gaps in
  origin_seq, so for them it is an upper bound.)

Timestamps are passed in as unix seconds; nothing here reads a clock. The
whole book persists as `peer_state.json` in the palace directory, written
atomically, so `logsync status` in another process can read it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from logsync.engine import error_kind as engine_error_kind
from logsync.errors import ConfigError
from logsync.files import UnreadableJSON, read_json, write_atomic
from logsync.report import RoundReport

PEER_STATE_FILENAME = "peer_state.json"
FORMAT_VERSION = 1
# Upper bounds (seconds) of the page fetch+apply histogram kept per peer; the last count
# is everything above the last bound.
PAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def iso_utc(at: float | None) -> str | None:
    """Upstream's timestamp shape, `YYYY-MM-DDTHH:MM:SSZ`, from unix seconds."""
    return None if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def lack(holder: Mapping[str, int], other: Mapping[str, int]) -> dict[str, int]:
    """Ops per origin `holder` has and `other` does not (only the non-zero ones): with the
    peer's vector first, what we lack (`we_lack`); with ours first, what the peer lacks
    (`they_lack`)."""
    gaps = {origin: int(top) - int(other.get(origin, 0)) for origin, top in holder.items()}
    return {origin: gap for origin, gap in sorted(gaps.items()) if gap > 0}


def drift(remote: Mapping[str, int], local: Mapping[str, int]) -> dict[str, int]:
    """Ops per origin the peer holds and we do not: `lack(remote, local)`."""
    return lack(remote, local)


# A fault's kind (`error_kind`) in the words `status`, the status page and the metrics'
# readers see: one table for all of them.
KIND_WORDS = {"auth": "auth failed", "transport": "unreachable", "protocol": "protocol error",
              "store": "store error", "internal": "internal error"}


def error_kind(error: BaseException) -> str:
    """A short word for status output and metrics labels (see `engine.error_kind`)."""
    return engine_error_kind(error)


@dataclass
class PeerState:
    """Everything we know about one configured peer."""

    name: str
    url: str
    replica_id: str | None = None
    reachable: bool | None = None
    last_attempt_at: float | None = None
    last_success_at: float | None = None
    last_error: str | None = None
    last_error_kind: str | None = None
    last_error_at: float | None = None
    consecutive_failures: int = 0
    rounds_ok: int = 0
    rounds_failed: int = 0
    last_pulled_events: int = 0
    last_pulled_artifacts: int = 0
    total_pulled_events: int = 0
    total_pulled_artifacts: int = 0
    total_conflicts: int = 0
    total_quarantined: int = 0
    remote_version_vector: dict[str, int] | None = None
    profile: dict[str, Any] | None = None
    extensions: list[str] = field(default_factory=list)
    drift: dict[str, int] = field(default_factory=dict)
    stopped_origins: dict[str, str] = field(default_factory=dict)
    skipped_origins: dict[str, str] = field(default_factory=dict)
    failed_origins: dict[str, str] = field(default_factory=dict)
    page_time_counts: list[int] = field(default_factory=lambda: [0] * (len(PAGE_BUCKETS) + 1))
    page_time_sum: float = 0.0
    # A catch-up under way (a round that has applied ops and owes more): done/total ops,
    # rate in ops/s, eta in seconds, began_at unix seconds. None when no round runs.
    catchup: dict[str, Any] | None = None
    last_push_at: float | None = None
    total_pushed_events: int = 0
    takes_pushes: bool | None = None  # None: never tried

    def record_attempt(self, now: float) -> None:
        self.last_attempt_at = now

    def record_push(self, report: Any, now: float) -> None:
        """A push round (`push.PushReport`): what the peer reached of each origin we
        offered raises its last known vector (it holds at least that now)."""
        self.takes_pushes = report.supported
        if not report.supported:
            return
        self.last_push_at = now
        self.total_pushed_events += report.pushed
        merged = dict(self.remote_version_vector or report.remote_vector)
        for origin, top in report.remote_vector.items():
            merged[origin] = max(merged.get(origin, 0), top)
        for origin, progress in report.origins.items():
            merged[origin] = max(merged.get(origin, 0), progress.reached)
        self.remote_version_vector = merged

    def record_pages(self, seconds: list[float]) -> None:
        """Fold a round's page fetch+apply times into the histogram."""
        if len(self.page_time_counts) != len(PAGE_BUCKETS) + 1:  # an older file's shape
            self.page_time_counts = [0] * (len(PAGE_BUCKETS) + 1)
        for value in seconds:
            index = next((i for i, bound in enumerate(PAGE_BUCKETS) if value <= bound),
                         len(PAGE_BUCKETS))
            self.page_time_counts[index] += 1
            self.page_time_sum += value

    def record_progress(self, done: int, total: int, began_at: float, now: float) -> None:
        """A running round's progress: `done` of `total` ops since `began_at`."""
        elapsed = max(now - began_at, 1e-9)
        rate = done / elapsed
        left = max(total - done, 0)
        self.catchup = {"done": done, "total": total, "rate": round(rate, 1),
                        "eta_s": round(left / rate, 1) if rate > 0 else None,
                        "began_at": iso_utc(began_at)}

    def end_progress(self) -> None:
        self.catchup = None

    def record_success(self, report: RoundReport, now: float) -> None:
        self.record_pages(report.page_seconds)
        self.catchup = None
        self.replica_id = report.peer_replica or self.replica_id
        self.reachable = True
        self.last_success_at = now
        self.last_error = None
        self.last_error_kind = None
        self.consecutive_failures = 0
        self.rounds_ok += 1
        self.last_pulled_events = report.applied
        self.last_pulled_artifacts = report.artifacts
        self.total_pulled_events += report.applied
        self.total_pulled_artifacts += report.artifacts
        self.total_conflicts += report.conflicts
        self.total_quarantined += report.quarantined
        self.remote_version_vector = dict(report.remote_vector)
        self.profile = report.remote_profile or self.profile
        self.extensions = list(report.extensions)
        self.drift = drift(report.remote_vector, report.local_vector_after)
        self.stopped_origins = report.stopped_origins()
        self.skipped_origins = dict(report.skipped_origins)
        self.failed_origins = report.failed_origins()

    def record_targeted(self, report: RoundReport, now: float) -> None:
        """A notified round: same bookkeeping as a success, but it saw no vector, so the
        peer's last known vector only rises to what the round reached."""
        vector, profile = self.remote_version_vector, self.profile
        extensions, skipped = list(self.extensions), dict(self.skipped_origins)
        self.record_success(report, now)
        merged = dict(vector or {})
        for origin, progress in report.origins.items():
            merged[origin] = max(merged.get(origin, 0), progress.target)
        self.remote_version_vector, self.profile = merged, profile
        self.extensions, self.skipped_origins = extensions, skipped
        self.drift = drift(merged, report.local_vector_after)

    def record_failure(self, error: BaseException, now: float,
                       report: RoundReport | None = None) -> None:
        if report is not None:
            self.record_pages(report.page_seconds)
        self.catchup = None
        self.reachable = False
        self.last_error = str(error) or type(error).__name__
        self.last_error_kind = error_kind(error)
        self.last_error_at = now
        self.consecutive_failures += 1
        self.rounds_failed += 1

    def drift_against(self, local: Mapping[str, int] | None) -> dict[str, int]:
        """Drift recomputed against a fresher local vector, else the stored one."""
        if local is None or self.remote_version_vector is None:
            return dict(self.drift)
        return drift(self.remote_version_vector, local)

    def they_lack(self, local: Mapping[str, int] | None) -> dict[str, int] | None:
        """What the peer lacks of ours, from its last vector (None: never seen one)."""
        if local is None or self.remote_version_vector is None:
            return None
        return lack(local, self.remote_version_vector)

    def as_upstream_peer_entry(self, local: Mapping[str, int] | None = None) -> dict[str, Any]:
        """One `/sync/peers` peer entry: upstream keys first, then ours (additive)."""
        current = self.drift_against(local)
        theirs = self.they_lack(local)
        return {
            "name": self.name,
            "url": self.url,
            "replica_id": self.replica_id,
            "reachable": self.reachable,
            "last_error": self.last_error,
            "last_error_at": iso_utc(self.last_error_at),
            "last_success_at": iso_utc(self.last_success_at),
            "last_pulled_events": self.last_pulled_events,
            "last_pulled_artifacts": self.last_pulled_artifacts,
            "remote_version_vector": self.remote_version_vector,
            "profile": self.profile,
            "last_error_kind": self.last_error_kind,
            "last_attempt_at": iso_utc(self.last_attempt_at),
            "consecutive_failures": self.consecutive_failures,
            "drift": current,
            "drift_total": sum(current.values()),
            "we_lack": sum(current.values()) if self.remote_version_vector is not None else None,
            "they_lack": None if theirs is None else sum(theirs.values()),
            "they_lack_by_origin": theirs,
            "totals": {
                "pulled_events": self.total_pulled_events,
                "pulled_artifacts": self.total_pulled_artifacts,
                "conflicts": self.total_conflicts,
                "quarantined": self.total_quarantined,
                "rounds_ok": self.rounds_ok,
                "rounds_failed": self.rounds_failed,
                "pushed_events": self.total_pushed_events,
            },
            "extensions": list(self.extensions),
            "stopped_origins": dict(self.stopped_origins),
            "failed_origins": dict(self.failed_origins),
            "skipped_origins": dict(self.skipped_origins),
            "catchup": dict(self.catchup) if self.catchup else None,
            "takes_pushes": self.takes_pushes,
            "last_push_at": iso_utc(self.last_push_at),
            "page_seconds": {"buckets": list(PAGE_BUCKETS),
                             "counts": list(self.page_time_counts),
                             "sum": round(self.page_time_sum, 6)},
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> PeerState:
        """Rebuild from `to_json()`; unknown keys (a newer writer) are ignored."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ConfigError(f"peer state entry {data!r:.60} is not an object with a name")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ConfigError(
                f"peer state entry for {data['name']!r} is incomplete: {exc}"
            ) from None


@dataclass
class PeerBook:
    """The state of every peer, keyed by name (the URL when a peer has no name)."""

    peers: dict[str, PeerState] = field(default_factory=dict)

    def get(self, name: str, url: str) -> PeerState:
        """The peer's state, created on first sight; a changed URL is adopted."""
        state = self.peers.get(name)
        if state is None:
            state = self.peers[name] = PeerState(name=name, url=url)
        state.url = url
        return state

    def retain(self, names: set[str]) -> None:
        """Forget peers no longer configured."""
        for name in set(self.peers) - names:
            del self.peers[name]

    def to_json(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION,
                "peers": {name: s.to_json() for name, s in sorted(self.peers.items())}}

    @classmethod
    def from_json(cls, data: object, source: str = PEER_STATE_FILENAME) -> PeerBook:
        if not isinstance(data, dict) or not isinstance(data.get("peers"), dict):
            raise ConfigError(f"{source} is not an object with a 'peers' object")
        return cls({name: PeerState.from_json(entry) for name, entry in data["peers"].items()})

    @classmethod
    def load(cls, palace: str | os.PathLike[str]) -> PeerBook:
        """Read `peer_state.json`; an empty book if there is none yet."""
        path = Path(palace) / PEER_STATE_FILENAME
        try:
            data = read_json(path)
        except FileNotFoundError:
            return cls()
        except UnreadableJSON as exc:
            advice = "; delete it to start afresh" if exc.damaged else ""
            raise ConfigError(f"{exc}{advice}") from None
        return cls.from_json(data, str(path))

    def save(self, palace: str | os.PathLike[str]) -> Path:
        """Write atomically (temp file, fsync, rename): readers never see half a file."""
        directory = Path(palace)
        path = directory / PEER_STATE_FILENAME
        payload = json.dumps(self.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        try:
            write_atomic(path, payload)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
        return path
