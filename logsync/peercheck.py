"""Asking every peer for its vector now (`logsync status`): side by side, each with a
short deadline, so a dead peer costs its timeout once and never blocks the others.

What a peer holds and we lack (`we_lack`) and what we hold and it lacks (`they_lack`)
come from the vector it answers now; a peer that does not answer is `unreachable`,
one that refuses our token `auth failed`, one whose answer is not a vector `protocol
error` (the kinds of `engine.error_kind`, in words).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from logsync.engine import error_kind
from logsync.peers import Peer, redact_url
from logsync.peerstate import KIND_WORDS, lack
from logsync.wire import Request, parse_vector_answer

PROBE_TIMEOUT_S = 3.0


@dataclass
class Probe:
    """One peer, looked at now."""

    name: str
    url: str
    state: str = "reachable"  # or a KIND_WORDS value
    error: str | None = None
    replica_id: str | None = None
    extensions: list[str] = field(default_factory=list)
    we_lack: dict[str, int] = field(default_factory=dict)
    they_lack: dict[str, int] = field(default_factory=dict)
    diverged: list[str] = field(default_factory=list)  # origins whose chain tip differs
    skipped: dict[str, str] = field(default_factory=dict)  # vector entries we cannot pull

    @property
    def reachable(self) -> bool:
        return self.state == "reachable"

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reachable": self.reachable, "error": self.error,
                "replica_id": self.replica_id, "takes_pushes": "push" in self.extensions,
                "we_lack": sum(self.we_lack.values()) if self.reachable else None,
                "they_lack": sum(self.they_lack.values()) if self.reachable else None,
                "we_lack_by_origin": dict(self.we_lack) if self.reachable else None,
                "they_lack_by_origin": dict(self.they_lack) if self.reachable else None,
                "diverged": list(self.diverged), "skipped_origins": dict(self.skipped)}


DigestAt = Callable[[str, int], "bytes | None"]


async def probe_one(peer: Peer, local: Mapping[str, int], *, deadline_s: float,
                    ca_file: str | None = None, transport: Any = None,
                    digest_at: DigestAt | None = None) -> Probe:
    """One peer's vector now, or why not (never raises). With `digest_at` (our chain
    digest of an origin at a seq, None where our chain does not reach), each tip the
    peer advertises at or below what we hold is compared: equal counts are not in sync
    when the ops differ."""
    from logsync.client import PeerClient

    name = peer.name or redact_url(peer.url)
    found = Probe(name=name, url=redact_url(peer.url))
    try:
        async with PeerClient(peer.url, peer.token, name=name, ca_file=ca_file,
                              timeout=deadline_s, connect_timeout=deadline_s, attempts=1,
                              request_deadline=deadline_s, round_deadline=deadline_s,
                              transport=transport) as client:
            with anyio.fail_after(deadline_s + 1):
                answer, _ = await client.fetch(Request("/sync/version_vector"))
        remote = parse_vector_answer(answer, name)
    except Exception as exc:  # noqa: BLE001 - the peer's fault is its state, not ours
        kind = error_kind(exc) if not isinstance(exc, TimeoutError) else "transport"
        found.state = KIND_WORDS.get(kind, kind)
        found.error = str(exc) or type(exc).__name__
        return found
    found.replica_id = remote.replica_id
    found.extensions = remote.extensions.names()
    found.we_lack = lack(remote.vector, local)
    found.they_lack = lack(local, remote.vector)
    found.skipped = dict(remote.skipped_origins)
    if digest_at is not None:
        found.diverged = _diverged(remote.tips, local, digest_at)
    return found


def _diverged(tips: Mapping[str, tuple[int, bytes]], local: Mapping[str, int],
              digest_at: DigestAt) -> list[str]:
    out = []
    for origin, (seq, digest) in sorted(tips.items()):
        if seq <= int(local.get(origin, 0)):
            mine = digest_at(origin, seq)
            if mine is not None and mine != digest:
                out.append(origin)
    return out


async def probe_all(peers: Sequence[Peer], local: Mapping[str, int], *,
                    deadline_s: float = PROBE_TIMEOUT_S, ca_file: str | None = None,
                    digest_at: DigestAt | None = None) -> list[Probe]:
    """Every peer at once; results in the peers' order."""
    found: list[Probe | None] = [None] * len(peers)

    async def one(index: int, peer: Peer) -> None:
        found[index] = await probe_one(peer, local, deadline_s=deadline_s, ca_file=ca_file,
                                       digest_at=digest_at)

    async with anyio.create_task_group() as group:
        for index, peer in enumerate(peers):
            group.start_soon(one, index, peer)
    return [f for f in found if f is not None]
