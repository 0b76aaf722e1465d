"""Invariant checks over the real stores (DESIGN.md invariants 1-8).

Per node (at the end of the safety phase and after convergence):
  1. per-origin prefix: the origin_seqs held for each origin are exactly 1..vv[origin];
  3. verbatim: every event equals, field for field but `seq`, the copy its author returned;
  4. no dangling references: every artifact an event names is held;
  6. nothing unauthored: every stored event was appended by some node (a corrupt,
     forged or forked op that got in is reported here);
  and the simulator's mirrors agree with the store (vector).
Across the fleet (after convergence):
  the same vector, the same (origin, origin_seq) -> event and id -> artifact, byte
  for byte; where two replicas hold different content for one key, some replica must
  have recorded a conflict naming it (invariant 5: divergence is never silent), every
  replica lacking a key another holds must have recorded a divergence or fork of its
  origin (it refused the other history), and every replica that met another version in
  a round that compared the origin must have recorded one (`forks.py`); vectors may
  differ only where histories part; the same owed sets, claim winners and presence on
  every node.
Invariants 2, 7 and 8 are checked as the run goes (`node.py`, `runner.py`); the replay of
invariant 2 is `replay_page` here. `Violations` keeps what broke, for the report.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from logsync import views
from logsync.sim import forks
from logsync.sim.clock import VirtualClock, to_s
from logsync.sim.node import SimNode
from logsync.sim.report import Violation
from logsync.sim.trace import Trace

Report = Callable[[int, str], None]

VIOLATIONS_KEPT = 10
INVARIANT_NAMES = {
    0: "liveness", 1: "per-origin prefix", 2: "idempotent apply", 3: "verbatim",
    4: "no dangling references", 5: "divergence is never silent",
    6: "a bad op never enters", 7: "clocks", 8: "crash safety",
}


class Violations:
    """The broken invariants of one run, each traced; past ten of one kind, only counted."""

    def __init__(self, clock: VirtualClock, trace: Trace) -> None:
        self.kept: list[Violation] = []
        self._clock = clock
        self._trace = trace
        self._counts: dict[int, int] = {}

    def record(self, invariant: int, text: str) -> None:
        self._trace.log("VIOLATION", f"[{invariant}] {text}")
        seen = self._counts.get(invariant, 0) + 1
        self._counts[invariant] = seen
        if seen <= VIOLATIONS_KEPT:
            self.kept.append(Violation(invariant, INVARIANT_NAMES[invariant], text,
                                       to_s(self._clock.now_us)))

    def count_suppressed(self) -> None:
        """One closing line per kind that went past the ten kept."""
        for invariant, seen in sorted(self._counts.items()):
            if seen > VIOLATIONS_KEPT:
                self.kept.append(Violation(
                    invariant, INVARIANT_NAMES[invariant],
                    f"... and {seen - VIOLATIONS_KEPT} more of this kind (see --trace)",
                    to_s(self._clock.now_us)))


def replay_page(node: SimNode, rng: random.Random, trace: Trace, report: Report) -> None:
    """Invariant 2: re-apply a page the node applied before (drawn with `rng`); nothing
    may change."""
    events, artifacts = node.recent_pages[rng.randrange(len(node.recent_pages))]
    store = node.store_or_fail()
    before = store.counts()
    result = store.apply_remote(events, artifacts)
    node.store_changed()
    after = store.counts()
    trace.log("check", f"{node.name} replays a page of {len(events)} ops: "
              f"applied={result.applied} duplicates={result.duplicates}")
    if result.applied or result.artifacts_applied \
            or (before["events"], before["artifacts"]) != (after["events"], after["artifacts"]):
        report(2, f"{node.name}: re-applying a page of {len(events)} ops changed the "
                  f"store (applied={result.applied}, counts {before} -> {after})")


def same_vectors(nodes: list[SimNode]) -> bool:
    """Liveness: every node is up and holds the same version vector."""
    if not all(n.up for n in nodes):
        return False
    first = nodes[0].vv
    return all(n.vv == first for n in nodes[1:])


def canonical(item: dict[str, Any], drop: str = "seq") -> dict[str, Any]:
    """The item without the local `seq`. Values come from SQLite columns (str, int,
    None) and JSON (metadata), so equal values are equal bytes on the wire."""
    if drop in item:
        item = dict(item)
        del item[drop]
    return item


@dataclass
class Snapshot:
    node: str
    replica_id: str
    vector: dict[str, int]
    events: list[dict[str, Any]]
    by_key: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    key_of_id: dict[str, tuple[str, int]] = field(default_factory=dict)
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    recorded: set[str] = field(default_factory=set)  # origins with a divergence or fork


def snapshot(node: SimNode) -> Snapshot:
    store = node.store_or_fail()
    events = list(store.iter_events())
    snap = Snapshot(node.name, node.replica_id, store.version_vector(), events,
                    counts=store.counts(), conflicts=store.list_conflicts(500),
                    quarantine=store.list_quarantine(500),
                    recorded=forks.recorded_origins(store))
    for event in events:
        key = (event["origin_replica"], event["origin_seq"])
        snap.by_key[key] = canonical(event)
        snap.key_of_id[event["id"]] = key
    snap.artifacts = {a["id"]: canonical(a) for a in store.iter_artifacts()}
    return snap


def check_node(snap: Snapshot, node: SimNode, authored: dict[str, dict[str, Any]],
               report: Report) -> None:
    """Invariants 1, 3, 4, 6 and the mirror, on one replica."""
    seqs: dict[str, list[int]] = {}
    for origin, seq in snap.by_key:
        seqs.setdefault(origin, []).append(seq)
    for origin, held in sorted(seqs.items()):
        held.sort()
        top = snap.vector.get(origin, 0)
        if held != list(range(1, top + 1)):
            gaps = sorted(set(range(1, top + 1)) - set(held))[:5]
            report(1, f"{snap.node} holds origin {origin[:12]} up to {top} but not "
                      f"seqs {gaps}: not a prefix")
    if node.vv != snap.vector:
        report(1, f"{snap.node}: the simulator's mirror {_short(node.vv)} differs from the "
                  f"store's vector {_short(snap.vector)}")
    held = {key: event["id"] for key, event in snap.by_key.items()}
    mirrored = {key: since[0] for key, since in node.held_since.items()}
    if mirrored != held:
        wrong = sorted(k for k in set(held) | set(mirrored) if held.get(k) != mirrored.get(k))
        report(1, f"{snap.node}: the simulator's record of the ops it holds differs from the "
                  f"store at {len(wrong)} slots, e.g. {wrong[0][0][:12]} seq {wrong[0][1]}")
    for event in snap.events:
        for artifact_id in event["artifact_ids"]:
            if artifact_id not in snap.artifacts:
                report(4, f"{snap.node}: event {event['id']} names artifact {artifact_id}, "
                          "which is not held")
        copy = authored.get(event["id"])
        if copy is None:
            report(6, f"{snap.node} stored event {event['id']} (origin "
                      f"{event['origin_replica'][:12]} seq {event['origin_seq']}), which no "
                      "node authored")
        elif copy != snap.by_key[(event["origin_replica"], event["origin_seq"])]:
            report(3, f"{snap.node} holds event {event['id']} with content that differs from "
                      "what its author wrote")


def _short(vector: dict[str, int]) -> str:
    return "{" + ", ".join(f"{o[:10]}:{t}" for o, t in sorted(vector.items())) + "}"


@dataclass
class FleetVerdict:
    identical: bool
    divergent_keys: int = 0
    recorded: int = 0
    silent: int = 0


def check_fleet(snaps: list[Snapshot], report: Report,
                nodes: dict[str, SimNode] | None = None, *,
                converged: bool = True) -> FleetVerdict:
    """Identical vectors, events and artifacts everywhere, or divergence that is recorded
    (by every replica that met it, when `nodes` gives what each one met: `forks.py`).

    An artifact may be missing from some replicas only when every op naming it sits in
    a recorded divergent slot (the op itself never reached them). A fleet that never
    converged (a liveness violation already) is only checked for safety: an op or an
    artifact some replica lacks has not arrived yet, which is lag, not divergence; two
    contents for one slot or one artifact id, unrecorded, still are."""
    first = snaps[0]
    recorded_keys, recorded_ids = _recorded(snaps)
    if converged:
        _check_vectors(snaps, report)
    divergent: set[tuple[str, int]] = set()
    for snap in snaps[1:]:
        for key in set(snap.by_key) | set(first.by_key):
            if snap.by_key.get(key) != first.by_key.get(key):
                divergent.add(key)
    silent, excused = 0, set(recorded_ids)
    for origin, seq in sorted(divergent):
        held = [s.by_key[(origin, seq)] for s in snaps if (origin, seq) in s.by_key]
        names = {str(event["id"]) for event in held}
        named = (origin, seq) in recorded_keys or bool(names & recorded_ids) \
            or all(event == held[0] for event in held)
        unaware = [s.node for s in snaps if (origin, seq) not in s.by_key
                   and origin not in s.recorded]
        if named and not unaware:
            excused.update(a for event in held for a in event.get("artifact_ids") or [])
            continue
        if named and not converged:
            continue  # not arrived yet: lag, and it excuses no artifact
        silent += 1
        if silent <= 5:
            holders = sorted({s.node for s in snaps if (origin, seq) in s.by_key})
            report(5, f"replicas hold different content for origin {origin[:12]} seq {seq} "
                      f"(held by {', '.join(holders)}) and no replica recorded a conflict"
                      if not named else
                      f"origin {origin[:12]} seq {seq} is held by {', '.join(holders)} but not "
                      f"by {', '.join(unaware)}, which recorded no divergence or fork of it")
    if nodes is not None:
        forks.check_met(snaps, nodes, divergent, report)
    if silent > 5:
        report(5, f"... and {silent - 5} more silently divergent (origin, seq) slots")
    for snap in snaps[1:]:
        for art in sorted(set(snap.artifacts) | set(first.artifacts)):
            mine, theirs = first.artifacts.get(art), snap.artifacts.get(art)
            if mine == theirs or art in excused:
                continue
            if mine is None or theirs is None:
                if not converged:
                    continue  # not arrived yet
                has, lacks = (snap, first) if mine is None else (first, snap)
                report(5, f"artifact {art} is held by {has.node} but not by {lacks.node}, and "
                          "no recorded conflict explains it")
            else:
                report(5, f"artifact {art} differs between {first.node} and {snap.node} and "
                          "no conflict was recorded")
    return FleetVerdict(not divergent, len(divergent), len(divergent) - silent, silent)


def _check_vectors(snaps: list[Snapshot], report: Report) -> None:
    """Vectors may differ only where histories part: a replica behind another on an
    origin whose ops it holds the same way has not converged."""
    for i, low in enumerate(snaps):
        for other in snaps[i + 1:]:
            if low.vector == other.vector:
                continue
            for origin in sorted(set(low.vector) | set(other.vector)):
                a, b = sorted((low, other), key=lambda s: s.vector.get(origin, 0))
                top = a.vector.get(origin, 0)
                if top < b.vector.get(origin, 0) and all(
                        a.by_key.get((origin, s)) == b.by_key.get((origin, s))
                        for s in range(1, top + 1)):
                    report(0, f"after convergence {other.node} has vector "
                              f"{_short(other.vector)} but {low.node} has {_short(low.vector)}")
                    break


def _recorded(snaps: list[Snapshot]) -> tuple[set[tuple[str, int]], set[str]]:
    keys: set[tuple[str, int]] = set()
    ids: set[str] = set()
    for snap in snaps:
        for conflict in snap.conflicts:
            if conflict.get("origin_replica") and conflict.get("origin_seq") is not None:
                keys.add((conflict["origin_replica"], conflict["origin_seq"]))
            if conflict.get("item_id"):
                ids.add(conflict["item_id"])
    return keys, ids


def check_views(snaps: list[Snapshot], agents: list[str], report: Report) -> dict[str, Any]:
    """Owed sets, claim winners and presence must be the same on every replica."""
    def owed_ids(snap: Snapshot) -> dict[str, list[str]]:
        return {a: [e["id"] for e in items]
                for a, items in views.owed_by_agent(snap.events, set(agents)).items()}

    first = snaps[0]
    base_owed = owed_ids(first)
    base_claims = {c: w["id"] for c, w in views.claim_winners(first.events).items()}
    base_presence = {a: p["event_id"] for a, p in views.presence(first.events).items()}
    for snap in snaps[1:]:
        other = owed_ids(snap)
        for agent in sorted(set(other) | set(base_owed)):
            if other.get(agent) != base_owed.get(agent):
                report(0, f"owed set of {agent} differs between {first.node} and {snap.node}")
        winners = {c: w["id"] for c, w in views.claim_winners(snap.events).items()}
        if winners != base_claims:
            report(0, f"claim winners differ between {first.node} and {snap.node}")
        seen = {a: p["event_id"] for a, p in views.presence(snap.events).items()}
        if seen != base_presence:
            report(0, f"presence differs between {first.node} and {snap.node}")
    return {
        "owed": sum(len(v) for v in base_owed.values()),
        "claims": len(base_claims),
        "agents_seen": len(base_presence),
    }


def checkpoint(nodes: Iterable[SimNode], authored: dict[str, dict[str, Any]],
               report: Report) -> None:
    """The per-node invariants on every node's real store, in the middle of a run."""
    for node in nodes:
        check_node(snapshot(node), node, authored, report)


@dataclass
class Final:
    """The last checks of a run: every up node's snapshot, the fleet verdict (None with
    fewer than two), and the views summary (empty unless the fleet is identical)."""

    snaps: list[Snapshot]
    verdict: FleetVerdict | None
    views: dict[str, Any]


def final(nodes: dict[str, SimNode], authored: dict[str, dict[str, Any]], agents: list[str],
          report: Report, *, converged: bool = True) -> Final:
    """Every up node alone, then the fleet, then the views (when the fleet is identical)."""
    snaps = [snapshot(n) for n in nodes.values() if n.up]
    for snap in snaps:
        check_node(snap, nodes[snap.node], authored, report)
    verdict = check_fleet(snaps, report, nodes, converged=converged) \
        if len(snaps) > 1 else None
    view_summary = check_views(snaps, agents, report) \
        if verdict is not None and verdict.identical else {}
    return Final(snaps, verdict, view_summary)


def ledger_kinds(snaps: list[Snapshot], ledger: str) -> dict[str, int]:
    """How many conflict rows of each kind (or quarantine rows of each kind and reason)."""
    out: dict[str, int] = {}
    for snap in snaps:
        for row in getattr(snap, ledger):
            key = row.get("kind", "?") if ledger == "conflicts" else \
                f"{row.get('kind', '?')}: {str(row.get('reason', ''))[:60]}"
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
