"""The event loop: one seeded run of a scenario, from empty stores to a graded report.

A run has two phases. The *safety* phase lasts `duration` of virtual time: the
workload appends, the scripted and drawn faults come and go, and invariants are
checked step by step. At `duration` everything heals (cuts, overrides, loss,
crashed nodes restart, byzantine peers turn honest) and the workload stops; the
*liveness* phase then runs until every node holds the same version vector (when a
restore or a clone can part an origin's history: until the fleet has settled, see
`forks.settled`), or until `expect.converge_within` passes (a violation). The stores are then
compared in full (`checks.py`). What each fault kind does is `faults.py`.

One `random.Random(seed)` makes every choice (ids, latencies, losses, workload,
drawn faults, schedule jitter); time is an integer microsecond counter; nothing
reads the wall clock except the report's own `wall_seconds`.
"""

from __future__ import annotations

import gc
import heapq
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from logsync.errorcodes import error_body
from logsync.sim import checks, faults, forks, workload
from logsync.sim.clock import VirtualClock, to_s, to_us
from logsync.sim.driver import Driver
from logsync.sim.network import Cut, Message, Network
from logsync.sim.node import SimNode, node_key_seed
from logsync.sim.report import SimReport, percentile
from logsync.sim.scratch import claimed_dir, remove_abandoned, scratch_base
from logsync.sim.serve import Sizer, serve, tamper
from logsync.sim.spec import Scenario, Workload
from logsync.sim.streams import Streams
from logsync.sim.topology import build_edges, draw_faults
from logsync.sim.trace import Trace


@dataclass
class Metrics:
    requests: dict[str, int] = field(default_factory=dict)
    answers: int = 0  # answers sent (a lost request gets none)
    bytes: int = 0
    notifications: int = 0
    rounds: int = 0
    rounds_failed: int = 0
    applies: int = 0
    conflicts_seen: int = 0
    quarantined_seen: int = 0
    replays: int = 0
    tampered: int = 0
    skipped_writes: int = 0

    def request(self, path: str) -> None:
        self.requests[path] = self.requests.get(path, 0) + 1


class Registry:
    """Every op any node authored, and which nodes hold it since when."""

    def __init__(self, fleet: int) -> None:
        self.fleet = fleet
        self.copies: dict[str, dict[str, Any]] = {}
        self.born: dict[str, int] = {}
        self.holders: dict[str, set[str]] = {}
        self.reach: dict[str, int] = {}
        self.now_us: Callable[[], int] = lambda: 0

    def authored(self, node: SimNode, event: dict[str, Any]) -> None:
        self.copies[event["id"]] = checks.canonical(event)
        self.born[event["id"]] = self.now_us()
        self.holders[event["id"]] = {node.name}
        self._maybe_reached(event["id"])

    def arrived(self, node: SimNode, event: dict[str, Any]) -> None:
        holders = self.holders.get(event["id"])
        if holders is not None and node.name not in holders:
            holders.add(node.name)
            self._maybe_reached(event["id"])

    def _maybe_reached(self, event_id: str) -> None:
        if len(self.holders[event_id]) == self.fleet and event_id not in self.reach:
            self.reach[event_id] = self.now_us() - self.born[event_id]


class Simulation:
    def __init__(self, scenario: Scenario, workdir: Path, trace_sink: TextIO | None = None) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed)
        self.clock = VirtualClock()
        self.trace = Trace(self.clock, trace_sink)
        self.queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = 0
        self._mid = 0
        self.metrics = Metrics()
        self.registry = Registry(len(scenario.nodes))
        self.registry.now_us = lambda: self.clock.now_us
        self._violations = checks.Violations(self.clock, self.trace)
        self.violations = self._violations.kept
        self.windows: list[dict[str, Any]] = []
        self.samples: list[tuple[float, list[int]]] = []
        self.phase = "safety"
        self.heal_us: int | None = None
        self.converged_us: int | None = None
        self.final: checks.Final | None = None
        self.done = False
        self.net = Network(self.clock, self.rng, self.trace, scenario.link, self.schedule,
                           self._deliver)
        self.driver = Driver(self)
        self.streams = Streams(self)
        self.sizer = Sizer()
        self.nodes = self._make_nodes(workdir)
        self.everyone = [a for n in self.nodes.values() for a in n.agents]
        self.faults = list(scenario.faults) + draw_faults(scenario, self.rng, self.trace)
        # A restored or cloned palace re-uses slots: histories may part for good.
        self.forks_possible = any(f.kind in faults.FORKING for f in self.faults)
        self.fault_ctx = faults.FaultContext(
            clock=self.clock, trace=self.trace, schedule=self.schedule, net=self.net,
            nodes=self.nodes, duration=scenario.duration, windows=self.windows,
            in_safety=lambda: self.phase == "safety", restart=self._restart,
            reconnect=self._reconnect)

    # ── set-up ────────────────────────────────────────────────────────

    def _make_nodes(self, workdir: Path) -> dict[str, SimNode]:
        s = self.scenario
        skews = dict(s.skew)
        nodes = {}
        for name in s.nodes:
            rid = f"rep_{self.rng.getrandbits(128):032x}"
            skew = skews.get(name, 0.0)
            if name not in skews and s.skew_max:
                skew = self.rng.uniform(-s.skew_max, s.skew_max)
            nodes[name] = SimNode(self, name, rid, workdir / name, int(round(skew * 1000)),
                                  name not in s.upstream, workload.agent_names(name, s.agents),
                                  node_key_seed(s.seed, name))
            self.trace.log("setup", f"node {name} replica={rid} skew_ms={int(round(skew * 1000))}"
                           f" {'logsync' if name not in s.upstream else 'upstream-hub'}")
        for a, b in build_edges(s, self.rng):
            nodes[a].pulls_from.append(b)
            nodes[b].pulls_from.append(a)
            self.trace.log("setup", f"edge {a} <-> {b}")
        for node in nodes.values():
            node.pulls_from.sort()
            node.subscribers = list(node.pulls_from)
        return nodes

    # ── the loop ──────────────────────────────────────────────────────

    def schedule(self, when_us: int, fn: Callable[..., None], args: tuple[Any, ...] = ()) -> None:
        self._order += 1
        heapq.heappush(self.queue, (when_us, self._order, fn, args))

    def next_mid(self) -> int:
        self._mid += 1
        return self._mid

    def run(self, started: float | None = None) -> SimReport:
        """Run to the end; `started` (perf_counter) lets the caller count set-up too."""
        started = time.perf_counter() if started is None else started
        s = self.scenario
        for node in self.nodes.values():
            node.open()
        for w in s.workloads:
            self._next_write(w)
        for fault in self.faults:
            self.schedule(to_us(fault.at), faults.start, (self.fault_ctx, fault))
        self.schedule(to_us(s.duration), self._heal)
        self._sample()
        deadline = to_us(s.duration + s.expect.converge_within)
        self.schedule(deadline, self._deadline)
        while self.queue and not self.done:
            when, _, fn, args = heapq.heappop(self.queue)
            self.clock.advance(when)
            fn(*args)
        return self._finish(time.perf_counter() - started)

    def _deadline(self) -> None:
        if not self.done:
            goal = "settled: no node behind another on the same history, every one that met " \
                "another history recording it" if self.forks_possible else \
                "every node holding the same version vector"
            self.violation(0, f"not converged {self.scenario.expect.converge_within:g} s after "
                              f"the heal ({goal})")
            self.done = True

    def _sample(self) -> None:
        if self.done:
            return
        tops: dict[str, int] = {}
        for node in self.nodes.values():
            for origin, top in node.vv.items():
                if top > tops.get(origin, 0):
                    tops[origin] = top
        lags = [sum(max(0, t - n.vv.get(o, 0)) for o, t in tops.items())
                for n in self.nodes.values()]
        self.samples.append((self.clock.now, lags))
        every = self.scenario.sample_every or max(self.scenario.duration / 200, 0.01)
        self.schedule(self.clock.now_us + to_us(every), self._sample)

    # ── messages ──────────────────────────────────────────────────────

    def _deliver(self, msg: Message) -> bool:
        node = self.nodes[msg.dst]
        if not node.up:
            self.trace.log("net", f"drop {msg.src}->{msg.dst} {msg.label()} (node down)")
            return False
        if msg.kind == "req":
            self._serve(node, msg)
        elif msg.kind == "resp":
            if msg.incarnation != node.incarnation:
                self.trace.log("net", f"{node.name} ignores resp#{msg.mid} from a past life")
            else:
                self.driver.on_response(node, msg)
        else:
            self.metrics.bytes += msg.size  # a frame's bytes, counted as it arrives
            self.driver.on_notify(node, msg.src, msg.tops, msg.pages, msg.more)
        return True

    def _serve(self, node: SimNode, msg: Message) -> None:
        self.metrics.answers += 1
        if node.overload is not None:  # the overload fault: 503, maybe with a Retry-After
            self.net.send(Message("resp", node.name, msg.src, msg.mid, msg.path, status=503,
                                  answer=error_body(503, f"{node.name} is overloaded", "busy"),
                                  size=64,
                                  incarnation=msg.incarnation, retry_after=node.overload[0]),
                          extra_delay_us=node.serve_delay_us)
            return
        # The same request to an unchanged store is answered as before (the fleet's
        # requests after one notification arrive together); a byzantine node's answers are
        # altered in place, so it answers each afresh.
        key = (msg.path, *msg.params.items()) if node.byzantine is None else None
        hit = node.answered(key) if key is not None else None
        if hit is not None:
            status, body, size = hit
        else:
            status, body, size = self._answer(node, msg)
            if key is not None:
                node.remember_answer(key, (status, body, size))
        reply = Message("resp", node.name, msg.src, msg.mid, msg.path, status=status,
                        answer=body, size=size, incarnation=msg.incarnation)
        self.net.send(reply, extra_delay_us=node.serve_delay_us)

    def _answer(self, node: SimNode, msg: Message) -> tuple[int, Any, int]:
        """(status, body, bytes on the wire) of one request, from the real responder."""
        status, body = serve(node.store_or_fail(), msg.path, msg.params, logsync=node.logsync,
                             max_page=self.scenario.sync.max_page, vector=node.stored_vector)
        done = None
        if status == 200 and node.byzantine is not None:
            rate, kinds = node.byzantine
            if self.rng.random() < rate:
                done = tamper(node.store, msg.path, msg.params, body, kinds, self.rng,
                              self.nodes[msg.src].replica_id)
                if done:
                    self.metrics.tampered += 1
                    self.trace.fault(f"{node.name} serves {msg.src} a tampered answer: {done}")
        return status, body, self.sizer.size(body, exact=done is not None)

    def notify_change(self, node: SimNode, tops: tuple[tuple[str, int], ...],
                      source: str | None = None, firsts: dict[str, int] | None = None) -> None:
        """The node stored new ops: its streams owe them to its subscribers (`streams`)."""
        if source is not None:  # none to the peer they were just pulled from
            node.holders.note(self.nodes[source].replica_id, dict(tops))
        if self.scenario.sync.notify:
            self.streams.changed(node, tops, source, firsts)
        if self.phase == "liveness":
            self._check_converged()

    # ── workload ──────────────────────────────────────────────────────

    def _next_write(self, w: Workload) -> None:
        if w.rate <= 0:
            return
        start = max(self.clock.now, w.start)
        when = start + self.rng.expovariate(w.rate)
        if when < min(w.until, self.scenario.duration):
            self.schedule(to_us(when), self._write, (w,))

    def _write(self, w: Workload) -> None:
        if self.phase != "safety":
            return
        node = self.nodes[self.rng.choice(w.nodes)]
        action = workload.pick_action(w, self.rng)
        if not node.up:
            self.metrics.skipped_writes += 1
            self.trace.log("work", f"{node.name} is down: {action} not written")
        else:
            serial = len(self.registry.copies) + 1
            for event in workload.perform(node, action, w, self.rng, self.everyone, serial):
                self.trace.log("work", f"{node.name} {action} {event['id']} "
                               f"seq={event['origin_seq']} hlc={event['hlc'][:20]}")
                node.authored(event)
        self._next_write(w)

    # ── invariants as the run goes ────────────────────────────────────

    def violation(self, invariant: int, text: str) -> None:
        """Record a broken invariant; past ten of one kind, only count them."""
        self._violations.record(invariant, text)

    def maybe_replay(self, node: SimNode) -> None:
        """Invariant 2, drawn with probability `replay`: re-apply a page applied before."""
        if not self.scenario.replay or not node.recent_pages \
                or self.rng.random() >= self.scenario.replay:
            return
        checks.replay_page(node, self.rng, self.trace, self.violation)
        self.metrics.replays += 1

    def crash_mid_apply(self, node: SimNode) -> None:
        faults.crash_mid_apply(self.fault_ctx, node)

    def _restart(self, node: SimNode) -> None:
        if node.up:
            return
        expected = self.fault_ctx.expect_at_restart.pop(node.name, None)
        node.open()
        self.trace.log("node", f"{node.name} up (incarnation {node.incarnation})")
        for other in self.nodes.values():  # its streams connect anew (`holders.forget`)
            other.holders.forget(node.replica_id)
        for other in self.nodes.values():
            if other.up and node.name in other.pulls_from:
                self.driver.reconnected(other, node.name)
        if expected is not None and node.vv != expected:
            self.violation(8, f"{node.name} restarted with vector {node.vv} but had committed "
                              f"{expected} before the crash")
        if self.phase == "liveness":
            self._check_converged()

    # ── faults (`faults.py`) ──────────────────────────────────────────

    def _reconnect(self, cuts: list[Cut]) -> None:
        """Streams broken by these cuts reconnect (the daemon then owes a full round)."""
        for node in self.nodes.values():
            if not node.up:
                continue
            for peer in node.pulls_from:
                if any(c.test(peer, node.name) or c.test(node.name, peer) for c in cuts):
                    self.nodes[peer].holders.forget(node.replica_id)
                    self.driver.reconnected(node, peer)

    def take_backups(self) -> None:
        """Backups are taken when a restore fault names the moment (`backup_at`)."""
        faults.take_backups(self.fault_ctx, self.faults)

    # ── the liveness phase ────────────────────────────────────────────

    def _heal(self) -> None:
        self.phase = "liveness"
        self.heal_us = self.clock.now_us
        self.trace.fault("heal everything: liveness phase begins")
        faults.heal_all(self.fault_ctx)
        if self.faults:
            self._checkpoint("end of the safety phase")
        self._check_converged()

    def _checkpoint(self, when: str) -> None:
        """Per-node invariants on the real stores (a run without faults skips this one:
        the final check follows within moments and covers the same ground)."""
        checks.checkpoint(self.nodes.values(), self.registry.copies,
                          lambda i, t, w=when: self.violation(i, f"{t} ({w})"))

    def after_round(self) -> None:
        """A round ended: where histories may part, recording one can settle the fleet."""
        if self.phase == "liveness" and self.forks_possible:
            self._check_converged()

    def _check_converged(self) -> None:
        if self.done or self.converged_us is not None:
            return
        nodes = list(self.nodes.values())
        if not self.forks_possible and checks.same_vectors(nodes):
            self.converged_us = self.clock.now_us
            self.trace.log("check", "converged: every node holds the same version vector")
            self.done = True
        elif self.forks_possible and forks.settled(nodes):
            self.converged_us = self.clock.now_us
            self.trace.log("check", "converged: no node is behind another on the same history, "
                           "and each that met another history recorded it")
            self.done = True

    # ── the end ───────────────────────────────────────────────────────

    def _finish(self, wall: float) -> SimReport:
        self.done = True
        if self.converged_us is not None:
            self.samples.append((self.clock.now, [0] * len(self.nodes)))
        final = checks.final(self.nodes, self.registry.copies, self.everyone, self.violation,
                             converged=self.converged_us is not None)
        self.final = final  # what the last checks saw (tests read the snapshots)
        for node in self.nodes.values():
            node.crash("end of run")
        self._violations.count_suppressed()
        return self._report(wall, final)

    def _report(self, wall: float, final: checks.Final) -> SimReport:
        s = self.scenario
        snaps, verdict = final.snaps, final.verdict
        reach = sorted(to_s(v) for v in self.registry.reach.values())
        events = len(self.registry.copies)
        requests = sum(self.metrics.requests.values())
        heal = to_s(self.heal_us) if self.heal_us is not None else None
        converged = to_s(self.converged_us) if self.converged_us is not None else None
        return SimReport(
            scenario=s.name, variant=s.variant, seed=s.seed, source=s.source,
            trace_hash=self.trace.digest(), trace_lines=self.trace.lines,
            scenario_digest=s.digest(), nodes=list(self.nodes), duration=s.duration, heal_at=heal,
            converged_at=converged,
            convergence_s=None if converged is None or heal is None else converged - heal,
            events=events, artifacts=max((sn.counts["artifacts"] for sn in snaps), default=0),
            requests=dict(sorted(self.metrics.requests.items())), requests_total=requests,
            bytes=self.metrics.bytes, answers=self.metrics.answers,
            notifications=self.metrics.notifications,
            rounds=self.metrics.rounds, rounds_failed=self.metrics.rounds_failed,
            applies=self.metrics.applies, replays=self.metrics.replays,
            tampered=self.metrics.tampered, skipped_writes=self.metrics.skipped_writes,
            reach_count=len(reach),
            reach_median=statistics.median(reach) if reach else None,
            reach_p99=percentile(reach, 0.99), reach_max=reach[-1] if reach else None,
            lost=events - len(reach),
            conflicts={sn.node: sn.counts["conflicts"] for sn in snaps},
            quarantined={sn.node: sn.counts["quarantined"] for sn in snaps},
            conflict_kinds=checks.ledger_kinds(snaps, "conflicts"),
            quarantine_reasons=checks.ledger_kinds(snaps, "quarantine"),
            divergent=0 if verdict is None else verdict.divergent_keys,
            divergent_recorded=0 if verdict is None else verdict.recorded,
            views=final.views, faults=list(self.trace.faults), windows=self.windows,
            samples=self.samples, violations=self.violations, wall_seconds=wall,
            expect=s.expect, net=dict(self.net.stats.__dict__),
        )


# The cyclic garbage collector's thresholds during a run. A run allocates millions of
# short-lived acyclic objects (messages, queue entries, answers) beside a large live heap
# (every node's mirrors), so at the default (700, 10, 10) the collector keeps walking the
# heap for little garbage: broadcast-25's full-mesh variant spent a quarter of its CPU
# there. Garbage with cycles is still collected, only less often.
GC_THRESHOLDS = (50_000, 20, 100)


# Where runs make their directories when the caller names none: set in a sweep's worker
# processes (`cli/sim.py`) to a directory the sweep owns, so a worker stopped mid-run
# (Ctrl-C, a crash, its pool breaking) leaves nothing behind once the sweep removes it.
_workdir: Path | None = None


def use_workdir(path: Path | None) -> None:
    """Make `path` the directory runs of this process work in (None: `scratch_base()`)."""
    global _workdir
    _workdir = path


def run_scenario(scenario: Scenario, *, trace_sink: TextIO | None = None,
                 workdir: Path | None = None) -> SimReport:
    """Run one seed of a scenario in a fresh directory of its own (`sim/scratch.py`: in
    tmpfs when there is one, and removed by a later run if this process dies)."""
    base = workdir or _workdir
    if base is None:
        base = scratch_base()
        remove_abandoned(base)
    started = time.perf_counter()
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        with claimed_dir("logsync-sim-", base) as root:
            sim = Simulation(scenario, root, trace_sink)
            sim.take_backups()
            report = sim.run(started)
    finally:
        gc.set_threshold(*thresholds)
    report.wall_seconds = time.perf_counter() - started
    return report
