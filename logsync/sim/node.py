"""One simulated replica: a real `Store` on disk, its clock, its peers and its daemon state.

The node keeps a few mirrors of what its store holds (version vector, sorted
HLCs, an inbox of asks per agent) so the runner can measure lag and check
invariants after every step without re-reading SQLite; the mirrors are
compared with the store itself at every checkpoint, so a wrong mirror is
itself reported.

It also keeps the answers it gave since its store last changed (`answers`), so a request
repeated before the store changes is answered without running the responder again.

The driver performs the rounds' store effects on the node's real `Store` and
tells the node what each applied page added (`after_apply`); `crash_on_apply`
arms the driver to crash the next apply inside its transaction.

For invariant 5 (`forks.py`) the node also remembers since when it holds its copy of
each (origin, origin_seq) (`held_since`: the op's id and the virtual time it was
authored or stored; a restore or clone keeps the time only where the op is the same),
and, per peer and origin, when the last round that compared our chain with the peer's
began (`compared`, noted by the driver).
"""

from __future__ import annotations

import bisect
import hashlib
import random
import shutil
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from logsync import hlc as hlc_mod
from logsync.holders import Holders
from logsync.keyfile import load_or_mint_signing_key
from logsync.sim.clock import NodeClock, VirtualClock
from logsync.sim.trace import Trace
from logsync.store import Store

MAX_ANSWERS_KEPT = 256  # per node, between two changes of its store


@dataclass
class Ask:
    """An open ask addressed to one of this node's agents, as the agent saw it arrive."""

    event_id: str
    from_agent: str
    to_agent: str
    correlation_id: str | None
    stream: str
    room: str


def node_key_seed(seed: int, name: str) -> bytes:
    """The seed of node `name`'s signing key in a run of scenario seed `seed`: drawn from
    neither the run's `rng` (adding a draw would shift every trace) nor the OS."""
    return hashlib.sha256(f"logsync-sim-signing-key\0{seed}\0{name}".encode()).digest()


class NodeDriver(Protocol):
    """What a node needs of the driver of its daemon (`sim.driver.Driver`)."""

    def start_node(self, node: SimNode) -> None: ...

    def stop_node(self, node: SimNode) -> None: ...


class NodeHost(Protocol):
    """What a node needs of its simulation (`sim.runner.Simulation`), and no more: the
    node holds this, not a back-reference to the runner."""

    clock: VirtualClock
    rng: random.Random
    trace: Trace
    metrics: Any  # sim.runner.Metrics: the counters a node adds to
    registry: Any  # sim.runner.Registry: where authored and arrived ops are recorded
    driver: NodeDriver

    def violation(self, invariant: int, text: str) -> None: ...

    def notify_change(self, node: SimNode, tops: tuple[tuple[str, int], ...],
                      source: str | None = None) -> None: ...

    def maybe_replay(self, node: SimNode) -> None: ...


class SimNode:
    def __init__(self, sim: NodeHost, name: str, replica_id: str, directory: Path,
                 skew_ms: int, logsync: bool, agents: list[str], key_seed: bytes) -> None:
        self.sim = sim
        self.key_seed = key_seed  # its signing key's seed: a run replays from its own seed
        self.name = name
        self.replica_id = replica_id
        self.dir = directory
        self.clock = NodeClock(sim.clock, skew_ms)
        self.logsync = logsync
        self.agents = agents
        self.store: Store | None = None
        self._vector: dict[str, int] | None = None
        # (path, params) -> (status, body, size): what this node answered since its store
        # last changed (`runner._serve`); the responder is a function of the store and the
        # request, so the same request to the same store gets the same answer
        self.answers: dict[tuple[Any, ...], tuple[int, Any, int]] = {}
        self.page_frames: dict[tuple[Any, ...], Any] = {}  # pages built since the last change
        self.up = False
        self.incarnation = 0
        self.pulls_from: list[str] = []
        self.subscribers: list[str] = []
        self.holders = Holders()  # what each subscriber is known to hold (the daemon's)
        self.vv: dict[str, int] = {}
        self.hlcs: list[str] = []
        self.inbox: dict[str, list[Ask]] = {}
        self.crash_on_apply = False
        self.serve_delay_us = 0
        self.overload: tuple[float | None] | None = None  # (Retry-After,) while it 503s
        self.byzantine: tuple[float, tuple[str, ...]] | None = None
        self.recent_pages: deque[tuple[list[dict], list[dict]]] = deque(maxlen=8)
        self.backups: list[tuple[float, Path]] = []
        # (origin, origin_seq) -> (id of the op held there, virtual us since it is held)
        self.held_since: dict[tuple[str, int], tuple[str, int]] = {}
        # peer -> origin -> virtual us at which the last round comparing it began
        self.compared: dict[str, dict[str, int]] = {}

    # ── identity and store lifecycle ──────────────────────────────────

    def new_id(self, prefix: str) -> str:
        moment = datetime.fromtimestamp(self.clock.wall_ms() / 1000, UTC)
        return f"{prefix}_{moment:%Y%m%dT%H%M%S}_{self.sim.rng.getrandbits(48):012x}"

    def open(self) -> None:
        """Start (or restart) the node: open its store, rebuild mirrors, start pulling.
        A palace without a key gets the node's seeded one (`Store.open` would mint a
        random key, and signatures and certified ids would differ between replays)."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        load_or_mint_signing_key(self.dir, self.key_seed)
        self.store = Store.open(self.dir, wall_ms=self.clock.wall_ms, new_id=self.new_id,
                                replica_id=self.replica_id)
        self.up = True
        self.incarnation += 1
        self.holders = Holders()  # a daemon's memory: gone with a restart
        self.store_changed()
        self.vv = self.stored_vector()
        self.hlcs, self.inbox = [], {}
        now, before, self.held_since = self.sim.clock.now_us, self.held_since, {}
        for event in self.store.iter_events():  # agents restart with what the store holds
            if event["hlc"]:
                self.hlcs.append(event["hlc"])
            self.note_arrival(event)
            key = (event["origin_replica"], event["origin_seq"])
            kept = before.get(key)  # the same op as before a restart or restore keeps its time
            self.held_since[key] = kept if kept and kept[0] == event["id"] else (event["id"], now)
            self.sim.registry.arrived(self, event)  # a restored or cloned palace's ops
        self.hlcs.sort()
        self.sim.driver.start_node(self)

    def stored_vector(self) -> dict[str, int]:
        """`store.version_vector()`, read once per change of the store: every write to a
        node's store goes through this node, which calls `store_changed()` after it."""
        if self._vector is None:
            self._vector = self.store_or_fail().version_vector()
        return dict(self._vector)

    def store_changed(self) -> None:
        self._vector = None
        self.answers.clear()
        self.page_frames.clear()

    def store_touched(self) -> None:
        """A store effect other than an apply ran (it may write signatures, keys, ledgers,
        chain repairs): answers given before may differ now."""
        self.answers.clear()
        self.page_frames.clear()

    def answered(self, key: tuple[Any, ...]) -> tuple[int, Any, int] | None:
        """The answer (status, body, size) this node gave `key` (path and params) since
        its store last changed, if any."""
        return self.answers.get(key)

    def remember_answer(self, key: tuple[Any, ...], reply: tuple[int, Any, int]) -> None:
        if len(self.answers) >= MAX_ANSWERS_KEPT:
            self.answers.clear()
        self.answers[key] = reply

    def store_or_fail(self) -> Store:
        if self.store is None:
            raise AssertionError(f"node {self.name} is down but its store was used")
        return self.store

    def crash(self, reason: str) -> None:
        """Stop at once: rounds abandoned, store closed without any tidy-up."""
        if not self.up:
            return
        self.sim.driver.stop_node(self)
        self.store_changed()
        self.up = False
        self.crash_on_apply = False
        if self.store is not None:
            self.store.close()
        self.store = None
        self.sim.trace.log("node", f"{self.name} down ({reason})")

    def snapshot(self, at: float) -> None:
        """A cold backup of the palace directory (store closed, copied, reopened)."""
        target = self.dir.parent / f"{self.dir.name}.backup{len(self.backups)}"
        was_up = self.up
        if was_up:
            self.crash("backup copy")
        shutil.copytree(self.dir, target)
        self.backups.append((at, target))
        if was_up:
            self.open()

    def become_copy_of(self, other: SimNode) -> None:
        """Replace the palace with a cold copy of `other`'s, replica id included (a clone):
        from now on both write as that replica."""
        self.crash(f"replaced by a copy of {other.name}'s palace")
        was_up = other.up
        if was_up:
            other.crash("copied")
        shutil.rmtree(self.dir)
        shutil.copytree(other.dir, self.dir)
        if was_up:
            other.open()
        self.replica_id = other.replica_id
        self.open()

    def note_compared(self, peer: str, origins: set[str], started_us: int) -> None:
        """A round that began at `started_us` compared these origins with `peer`'s chain."""
        seen = self.compared.setdefault(peer, {})
        for origin in origins:
            seen[origin] = max(seen.get(origin, started_us), started_us)

    def restore(self, backup_at: float) -> bool:
        """Replace the palace with the newest backup taken at or before `backup_at`."""
        chosen = [path for at, path in self.backups if at <= backup_at + 1e-9]
        if not chosen:
            return False
        self.crash("restored from backup")
        shutil.rmtree(self.dir)
        shutil.copytree(chosen[-1], self.dir)
        self.open()
        return True

    # ── local writes (the workload calls these through the store) ─────

    def authored(self, event: dict[str, Any]) -> None:
        """Bookkeeping after a local append: check invariant 7, mirror, notify."""
        self.store_changed()
        seq, stamp = event["origin_seq"], event["hlc"]
        ceiling = hlc_mod.drift_ceiling(self.clock.wall_ms())
        below = bisect.bisect_left(self.hlcs, ceiling)
        if below and not stamp > self.hlcs[below - 1]:
            self.sim.violation(7, f"{self.name} authored {event['id']} with hlc {stamp}, not "
                               f"above {self.hlcs[below - 1]} which it already held")
        if seq != self.vv.get(self.replica_id, 0) + 1:
            self.sim.violation(1, f"{self.name} authored origin_seq {seq} after "
                               f"{self.vv.get(self.replica_id, 0)}: local seqs must be gap-free")
        self.vv[self.replica_id] = seq
        self.held_since[(self.replica_id, seq)] = (event["id"], self.sim.clock.now_us)
        bisect.insort(self.hlcs, stamp)
        self.note_arrival(event)
        self.sim.registry.authored(self, event)
        self.sim.notify_change(self, ((self.replica_id, seq),))

    def note_arrival(self, event: dict[str, Any]) -> None:
        if event["type"] == "task.request" and event["status"] == "open" \
                and event["to_agent"] in self.agents and event["from_agent"] != event["to_agent"]:
            self.inbox.setdefault(event["to_agent"], []).append(Ask(
                event["id"], event["from_agent"], event["to_agent"],
                event["correlation_id"], event["stream"], event["room"]))

    # ── remote applies (the driver calls this after each ApplyPage) ────

    def after_apply(self, events: list[dict], artifacts: list[dict], result: Any,
                    source: str | None = None) -> None:
        """Check the per-origin prefix of what one page added; mirror it; notify."""
        new_tops: list[tuple[str, int]] = []
        firsts: dict[str, int] = {}
        for origin, top in result.high_water.items():
            old = self.vv.get(origin, 0)
            if top <= old:
                continue
            fresh = [e for e in events if isinstance(e, dict) and e.get("origin_replica") == origin
                     and isinstance(e.get("origin_seq"), int) and old < e["origin_seq"] <= top]
            seqs = [e["origin_seq"] for e in fresh]
            if seqs != list(range(old + 1, top + 1)) \
                    or result.applied_per_origin.get(origin, 0) != top - old:
                self.sim.violation(1, f"{self.name}: a page moved origin {origin[:12]} from "
                                   f"{old} to {top} but held seqs {seqs[:5]}...: not a prefix")
            self.vv[origin] = top
            for event in fresh:
                self.held_since[(origin, event["origin_seq"])] = (event["id"],
                                                                  self.sim.clock.now_us)
                bisect.insort(self.hlcs, event["hlc"])
                self.note_arrival(event)
                self.sim.registry.arrived(self, event)
            new_tops.append((origin, top))
            firsts[origin] = old + 1
        if result.applied and not (result.stopped or result.quarantined or result.conflicts):
            self.recent_pages.append((list(events), list(artifacts)))
        self.sim.metrics.applies += result.applied
        if new_tops:
            self.sim.notify_change(self, tuple(new_tops), source, firsts)
        self.sim.maybe_replay(self)
