"""What each peer is known to hold, so the change stream sends it no frame for an op it has.

A frame tells a subscriber "pull this"; sent to a peer that already holds the op it is
a wasted message (and, with a hub, half of all frames: every spoke would frame the hub
back about the hub's own ops). Plumtree's rule -- no push to a peer known to hold the
message -- needs only what a replica learns anyway: the ops it pulled from a peer (that
peer served them, so it holds them), and its own ops (the origin holds them). The
subscriber names itself on the stream (`X-Logsync-Replica`, `wire.REPLICA_HEADER`).

Forgetting is always safe: it only costs a frame. So the table is bounded (peers, origins
per peer) by forgetting, and a peer that lost what it held (restored from a backup)
still gets it back from the anti-entropy round, which needs no frame; and what a peer
is known to hold is forgotten whenever its stream (re)connects (a restart, a restore).
Sans-IO: the daemon and the simulator feed it the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_PEERS = 256
MAX_ORIGINS = 4096  # per peer; beyond: that peer's entries are forgotten


class Holders:
    """peer replica id -> origin -> highest origin_seq the peer is known to hold."""

    def __init__(self, max_peers: int = MAX_PEERS, max_origins: int = MAX_ORIGINS) -> None:
        self._tops: dict[str, dict[str, int]] = {}
        self._live: dict[int, tuple[str, Any]] = {}  # rounds running: id -> (peer, report)
        self._max_peers, self._max_origins = max_peers, max_origins

    def note(self, peer: str, tops: Mapping[str, int]) -> None:
        """`peer` holds each origin up to its top (it served us those ops)."""
        known = self._tops.pop(peer, None)
        if known is None:
            known = {}
            while len(self._tops) >= self._max_peers:  # the least recently noted goes
                del self._tops[next(iter(self._tops))]
        self._tops[peer] = known  # most recently noted last
        for origin, top in tops.items():
            if top > known.get(origin, 0):
                if origin not in known and len(known) >= self._max_origins:
                    known.clear()
                known[origin] = top

    def forget(self, peer: str) -> None:
        """The peer's stream (re)connected: it may have restarted from a backup, so what
        it was known to hold is forgotten (its live rounds stay: they are ours)."""
        self._tops.pop(peer, None)

    def running(self, peer: str | None, report: Any) -> int:
        """A round pulling from `peer` runs: its report's `origins[o].reached` counts as
        held while it runs (pages apply mid-round); `finished` with the returned key. A
        peer not yet known (its first round) is the one its report names once the vector
        answer arrives (`report.peer_replica`)."""
        key = id(report)
        self._live[key] = (peer, report)
        return key

    def finished(self, key: int) -> None:
        """The round ended: what it reached is noted, the live view dropped."""
        entry = self._live.pop(key, None)
        if entry is not None:
            peer, report = entry
            peer = peer or getattr(report, "peer_replica", None)
            if peer:
                self.note(peer, {o: p.reached for o, p in report.origins.items()})

    def holds(self, peer: str | None, origin: str, seq: int) -> bool:
        """Is `peer` known to hold (origin, seq)? Unknown peer: no."""
        if not peer:
            return False
        if origin == peer or self._tops.get(peer, {}).get(origin, 0) >= seq:
            return True
        for who, report in self._live.values():
            who = who or getattr(report, "peer_replica", None)
            progress = report.origins.get(origin) if who == peer else None
            if progress is not None and progress.reached >= seq:
                return True
        return False
