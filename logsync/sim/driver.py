"""The simulator's driver of the engine: pull rounds as messages on the virtual network.

This is the simulated twin of `client.py` plus the pull loops of the daemon:

- Each node keeps one `engine.PullSchedule` per peer it pulls from. A due
  schedule starts a round; its outcome goes back through `succeeded()` /
  `failed()`; a change notification goes through `notified()`.
- A *full* round is `engine.pull_round(...)` with `batch_artifacts=True`, as
  the client runs it. Each `Request` it yields becomes a request message; the
  answer message is `send()`-ed back in. A request that times out is retried
  as the client retries (`attempts`, exponential wait with jitter); when the
  attempts are spent, or on an error status, the `PeerError` the client would
  raise is `throw()`-n in.
- `targeted` mode is the daemon's loop (`daemon.py`): every stream frame names
  an (origin, origin_seq) and wakes the schedule; a round begins by asking
  `engine.choose_targets` (the frames since the last round, the local vector,
  the origins in flight from other peers, whether a full round is owed, the
  time since the last one). None means the full `pull_round`; otherwise one
  `engine.targeted_origin` per chosen origin, side by side (at most
  `origins_in_flight`, as `client.run_targeted`), claimed in the node's
  in-flight map for the round so no origin is pulled from two peers at once.
  A failed round, or a stream that reconnects after a cut or a restart of the
  peer, makes the next round full.
- `round` mode is the daemon before targeted rounds: every trigger runs the
  full `pull_round`.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logsync import engine
from logsync.errors import PeerError, PeerProtocolError, PeerRequestError, PeerTransientError
from logsync.sim.clock import US, to_s, to_us
from logsync.sim.network import Message
from logsync.sim.node import PeerLink, SimNode, SimulatedCrash

if TYPE_CHECKING:
    from logsync.sim.runner import Simulation


@dataclass
class Flow:
    """One generator being driven: a whole round, or one origin of a targeted round.
    `step` counts the generator's steps, so a retry scheduled for an old step is dropped."""

    gen: Generator[Any, Any, Any]
    origin: str | None = None
    requests: list[engine.Request] = field(default_factory=list)
    waiting: dict[int, int] = field(default_factory=dict)
    open_slots: set[int] = field(default_factory=set)
    tries: list[int] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    batch: bool = False
    step: int = 0


@dataclass
class Run:
    node: SimNode
    link: PeerLink
    kind: str
    report: engine.RoundReport
    started_us: int
    claimed: dict[str, int] = field(default_factory=dict)
    flows: list[Flow] = field(default_factory=list)
    queued: list[Flow] = field(default_factory=list)
    over: bool = False


class Driver:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.spec = sim.scenario.sync
        self.by_mid: dict[int, tuple[Run, Flow]] = {}

    # ── node lifecycle ────────────────────────────────────────────────

    def start_node(self, node: SimNode) -> None:
        """A (re)started daemon: fresh schedules, the first round due at once."""
        now = self.sim.clock.now
        node.peers = {}
        for peer in node.pulls_from:
            schedule = engine.PullSchedule(
                rng=self.sim.rng, interval=self.spec.interval, jitter=self.spec.jitter,
                debounce=self.spec.debounce, backoff_base=self.spec.backoff_base,
                backoff_cap=self.spec.backoff_cap,
            )
            link = PeerLink(peer, schedule)
            node.peers[peer] = link
            schedule.start(now)
            self._arm(node, link)

    def stop_node(self, node: SimNode) -> None:
        for link in node.peers.values():
            if link.run is not None:
                self._abandon(link.run)
        node.peers = {}
        node.inflight.clear()

    # ── timers ────────────────────────────────────────────────────────

    def _arm(self, node: SimNode, link: PeerLink, at_least_us: int = 0) -> None:
        due = link.schedule.next_due
        if due is None:
            return
        link.timer += 1
        when = max(self.sim.clock.now_us, math.ceil(due * US), at_least_us)
        self.sim.schedule(when, self._due, (node, link, link.timer, node.incarnation))

    def _due(self, node: SimNode, link: PeerLink, token: int, incarnation: int) -> None:
        if not node.up or incarnation != node.incarnation or token != link.timer:
            return
        if node.peers.get(link.name) is not link or link.run is not None:
            return
        if not link.schedule.is_due(self.sim.clock.now):
            self._arm(node, link, self.sim.clock.now_us + 1)  # float rounding: one tick on
            return
        self._start_run(node, link)

    # ── notifications ─────────────────────────────────────────────────

    def on_notify(self, node: SimNode, peer: str, tops: tuple[tuple[str, int], ...]) -> None:
        """A frame from `peer`'s stream: note what it names and wake the schedule."""
        link = node.peers.get(peer)
        if link is None:
            return
        for origin, top in tops:
            if top > link.notified.get(origin, 0):
                link.notified[origin] = top
        self._wake(node, link)

    def reconnected(self, node: SimNode, peer: str) -> None:
        """The stream from `peer` came back (a cut healed, the peer restarted): frames may
        have been missed, so the next round is full."""
        link = node.peers.get(peer)
        if link is not None:
            link.wants_full = True
            self._wake(node, link)

    def _wake(self, node: SimNode, link: PeerLink) -> None:
        before = link.schedule.next_due
        due = link.schedule.notified(self.sim.clock.now)
        if due is not None and due != before:
            self._arm(node, link)

    # ── rounds ────────────────────────────────────────────────────────

    def _start_run(self, node: SimNode, link: PeerLink) -> None:
        now_us = self.sim.clock.now_us
        report = engine.RoundReport(peer=link.name)
        link.schedule.begin(self.sim.clock.now)
        targets = None
        if self.spec.mode == "targeted":
            since = float("inf") if link.last_full_us is None \
                else to_s(now_us - link.last_full_us)
            targets = engine.choose_targets(  # the daemon's own decision
                link.notified, node.vv, node.replica_id, node.inflight,
                extensions_known=link.extensions is not None and not link.wants_full,
                since_full=since, interval=self.spec.interval,
            )
        link.notified = {}
        if link.backoff is None:
            link.backoff = engine.OriginBackoff(rng=self.sim.rng)
        held_back = link.backoff.held(self.sim.clock.now)  # as the daemon holds them back
        if targets:
            targets = {o: t for o, t in targets.items() if o not in held_back}
        if targets is None:
            link.wants_full = False
            link.last_full_us = now_us
            run = Run(node, link, "full", report, now_us)
            run.flows = [Flow(engine.pull_round(
                node.view.pulling_from(link.name), link.name, page_limit=self.spec.page_limit,
                use_extensions=self.spec.extensions, batch_artifacts=True, report=report,
                held_back=held_back))]
        elif not targets:
            link.schedule.succeeded(self.sim.clock.now)
            self._arm(node, link)
            return
        else:
            run = Run(node, link, "targeted", report, now_us, claimed=dict(targets))
            node.inflight.update(targets)
            flows = [self._origin_flow(node, link, run, o, t) for o, t in sorted(targets.items())]
            limit = self.spec.origins_in_flight
            run.flows, run.queued = flows[:limit], flows[limit:]
        link.run = run
        self.sim.metrics.rounds += 1
        self.sim.trace.log("sync", f"{node.name} round#{self.sim.metrics.rounds} {run.kind} "
                           f"<- {link.name}" + (f" origins={len(run.flows) + len(run.queued)}"
                                                if run.kind == "targeted" else ""))
        for flow in list(run.flows):
            if not run.over:
                self._advance(run, flow, first=True)

    def _origin_flow(self, node: SimNode, link: PeerLink, run: Run, origin: str,
                     top: int) -> Flow:
        gen = engine.targeted_origin(  # the daemon's targeted pull, as client.run_targeted runs it
            node.view.pulling_from(link.name), link.name, origin, top,
            link.extensions or engine.Extensions(), run.report,
            page_limit=self.spec.page_limit, batch_artifacts=True, held=node.vv.get(origin, 0),
        )
        return Flow(gen, origin=origin)

    def _advance(self, run: Run, flow: Flow, value: Any = None,
                 exc: BaseException | None = None, first: bool = False) -> None:
        node = run.node
        try:
            if first:
                step = next(flow.gen)
            elif exc is not None:
                step = flow.gen.throw(exc)
            else:
                step = flow.gen.send(value)
        except StopIteration:
            self._flow_done(run, flow)
            return
        except PeerError as error:
            self._fail(run, error)
            return
        except SimulatedCrash:
            run.over = True
            self.sim.crash_mid_apply(node)
            return
        except Exception as error:  # the engine must only ever raise PeerError
            self.sim.violation(6, f"{node.name}: the engine raised {type(error).__name__} "
                               f"({error}) pulling from {run.link.name}")
            self._fail(run, PeerProtocolError(str(error), peer=run.link.name))
            return
        self._issue(run, flow, step)

    def _issue(self, run: Run, flow: Flow, step: Any) -> None:
        requests = step.requests if isinstance(step, engine.Batch) else (step,)
        flow.batch = isinstance(step, engine.Batch)
        flow.requests = list(requests)
        flow.answers = [None] * len(requests)
        flow.tries = [1] * len(requests)
        flow.open_slots = set(range(len(requests)))
        flow.waiting = {}
        flow.step += 1
        for slot in range(len(requests)):
            self._send(run, flow, slot)

    def _send(self, run: Run, flow: Flow, slot: int) -> None:
        request = flow.requests[slot]
        mid = self.sim.next_mid()
        flow.waiting[mid] = slot
        self.by_mid[mid] = (run, flow)
        self.sim.metrics.request(request.path)
        self.sim.net.send(Message("req", run.node.name, run.link.name, mid, request.path,
                                  dict(request.params), incarnation=run.node.incarnation))
        self.sim.schedule(self.sim.clock.now_us + to_us(self.spec.timeout), self._timeout,
                          (run, flow, mid))

    def on_response(self, node: SimNode, msg: Message) -> None:
        entry = self.by_mid.pop(msg.mid, None)
        if entry is None or entry[0].over or entry[0].node is not node:
            return
        run, flow = entry
        slot = flow.waiting.pop(msg.mid)
        request = flow.requests[slot]
        run.report.bytes_received += msg.size
        self.sim.metrics.bytes += msg.size
        if msg.status == 200:
            flow.answers[slot] = msg.answer
        elif msg.status == 404 and request.missing_ok:
            flow.answers[slot] = None
        else:
            said = msg.answer.get("error") if isinstance(msg.answer, dict) else msg.answer
            self._throw(run, flow, PeerRequestError(
                f"peer {run.link.name}: GET {request.path} answered {msg.status}: {said}",
                peer=run.link.name))
            return
        flow.open_slots.discard(slot)
        if not flow.open_slots:
            self._advance(run, flow, flow.answers if flow.batch else flow.answers[0])

    def _timeout(self, run: Run, flow: Flow, mid: int) -> None:
        """As the client does: a timed-out request is retried (equal-jitter exponential
        wait, tenacity's `wait_random_exponential`) up to `attempts`, then the round fails."""
        if run.over or mid not in flow.waiting:
            return
        slot = flow.waiting.pop(mid)
        self.by_mid.pop(mid, None)
        request = flow.requests[slot]
        if flow.tries[slot] < self.spec.attempts:
            high = min(self.spec.retry_max, self.spec.retry_backoff * 2 ** (flow.tries[slot] - 1))
            wait = to_us(self.sim.rng.uniform(0.0, high))
            flow.tries[slot] += 1
            self.sim.trace.log("sync", f"{run.node.name} retries {request.path} on "
                               f"{run.link.name} (attempt {flow.tries[slot]}) in {wait}us")
            self.sim.schedule(self.sim.clock.now_us + wait, self._resend,
                              (run, flow, slot, flow.step))
            return
        self._throw(run, flow, PeerTransientError(
            f"peer {run.link.name}: GET {request.path} timed out after {self.spec.timeout:g} s "
            f"({flow.tries[slot]} attempts)", peer=run.link.name))

    def _resend(self, run: Run, flow: Flow, slot: int, step: int) -> None:
        if not run.over and flow.step == step and slot in flow.open_slots:
            self._send(run, flow, slot)

    def _throw(self, run: Run, flow: Flow, error: PeerError) -> None:
        for mid in flow.waiting:
            self.by_mid.pop(mid, None)
        flow.waiting.clear()
        flow.open_slots.clear()
        flow.step += 1
        self._advance(run, flow, exc=error)

    # ── endings ───────────────────────────────────────────────────────

    def _flow_done(self, run: Run, flow: Flow) -> None:
        run.flows.remove(flow)
        if run.queued:
            nxt = run.queued.pop(0)
            run.flows.append(nxt)
            self._advance(run, nxt, first=True)
            return
        if not run.flows and not run.over:
            self._finish(run, None)

    def _fail(self, run: Run, error: PeerError) -> None:
        if run.over:
            return
        self._finish(run, error)

    def _finish(self, run: Run, error: PeerError | None) -> None:
        run.over = True
        node, link = run.node, run.link
        self._close_flows(run)
        if link.run is run:
            link.run = None
        now = self.sim.clock.now
        took = to_s(self.sim.clock.now_us - run.started_us)
        if link.backoff is not None:  # failed origins, also of a failed round (the daemon's)
            link.backoff.record(run.report, now)
        if error is None:
            if run.kind == "full":
                link.extensions = run.report.negotiated if self.spec.extensions \
                    else engine.Extensions()
            due = link.schedule.succeeded(now)
            self.sim.trace.log("sync", f"{node.name} round {run.kind} <- {link.name} ok "
                               f"applied={run.report.applied} requests={run.report.requests} "
                               f"took={took:.6f} next={due:.6f}")
        else:
            self.sim.metrics.rounds_failed += 1
            link.wants_full = True
            due = link.schedule.failed(now)
            self.sim.trace.log("sync", f"{node.name} round {run.kind} <- {link.name} failed "
                               f"({type(error).__name__}: {error}) next={due:.6f}")
        self._arm(node, link)
        self.sim.metrics.conflicts_seen += run.report.conflicts
        self.sim.metrics.quarantined_seen += run.report.quarantined

    def _close_flows(self, run: Run) -> None:
        for flow in run.flows + run.queued:
            for mid in flow.waiting:
                self.by_mid.pop(mid, None)
            flow.waiting.clear()
            flow.open_slots.clear()
            flow.gen.close()
        run.flows, run.queued = [], []
        for origin, top in run.claimed.items():  # as the daemon releases its claims
            if run.node.inflight.get(origin) == top:
                del run.node.inflight[origin]
        run.claimed = {}

    def _abandon(self, run: Run) -> None:
        """The node died: its rounds stop where they are, nothing reported."""
        run.over = True
        self._close_flows(run)
        run.link.run = None
