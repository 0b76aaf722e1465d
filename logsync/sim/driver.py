"""The simulator's driver: it carries out the peer loop's plans on the virtual network.

This is the simulated twin of `client.py` and of the daemon's pull loops, and it
decides nothing itself:

- Each node keeps one `peerloop.PeerLoop` per peer it pulls from (sharing the node's
  `peerloop.Claims`), made, fed and asked exactly as the daemon does: a stream frame
  goes in through `frame()`, a due loop is asked to `begin()` with the node's vector,
  and a round's end goes back through `succeeded()` / `failed()`.
- A `FullRound` plan is `engine.pull_round(...)` with `batch_artifacts=True`, as the
  client runs it; a `TargetedRound` is one `engine.targeted_origin` per origin, side
  by side (as many as `FetchPolicy.origins_in_flight` allows). Each `Request` a round
  yields becomes a request message; the answer message is `send()`-ed back in.
- Requests follow `fetchpolicy.FetchPolicy`, as the client's do: a timeout or a 5xx
  is retried after `retry_wait` (jittered, never before a Retry-After), a status is
  turned into the client's error by `error_for_status`, a batch keeps at most
  `batch_concurrency` requests in flight (fewer against an upstream hub), and the page
  after a full page is prefetched (`prefetch_guess`). When the policy gives up, the
  `PeerError` the client would raise is `throw()`-n in.
- `round` mode (`targeted=False`) is the daemon before targeted rounds: every round
  the loop plans is full.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from logsync import effects, engine
from logsync.effects import STORE_EFFECTS, ApplyPage, ReadVector
from logsync.errorcodes import reason_of
from logsync.errors import PeerError, PeerProtocolError, PeerTransientError
from logsync.fetchpolicy import FetchPolicy, prefetch_guess, request_key
from logsync.peerloop import Claims, FullRound, NoRound, PeerLoop, TargetedRound
from logsync.sim import forks
from logsync.sim.clock import US, to_s, to_us
from logsync.sim.network import Message
from logsync.sim.node import SimNode
from logsync.sim.rounds import (
    DriverHost,
    Flow,
    PeerLink,
    Prefetch,
    Run,
    SimulatedCrash,
    crash_after,
)
from logsync.streamframes import take_pages, tops_frames


class Driver:
    def __init__(self, sim: DriverHost) -> None:
        self.sim = sim
        self.spec = sim.scenario.sync
        self.by_mid: dict[int, tuple[Run, Flow]] = {}
        self.links: dict[str, dict[str, PeerLink]] = {}  # node -> peer -> its link
        self.policy = FetchPolicy(attempts=self.spec.attempts, backoff=self.spec.retry_backoff,
                                  max_backoff=self.spec.retry_max)

    # ── node lifecycle ────────────────────────────────────────────────

    def start_node(self, node: SimNode) -> None:
        """A (re)started daemon: fresh peer loops, the first round due at once."""
        now = self.sim.clock.now
        links = self.links[node.name] = {}
        claims = Claims()  # the node's origins being pulled, shared by its peer loops
        for peer in node.pulls_from:
            loop = PeerLoop.make(
                node.replica_id, claims, self.sim.rng, interval=self.spec.interval,
                jitter=self.spec.jitter, debounce=self.spec.debounce,
                backoff_base=self.spec.backoff_base, backoff_cap=self.spec.backoff_cap,
                targeted=self.spec.mode == "targeted",
            )
            link = PeerLink(peer, loop)
            links[peer] = link
            loop.start(now)
            self._arm(node, link)

    def stop_node(self, node: SimNode) -> None:
        for link in self.links.pop(node.name, {}).values():
            if link.run is not None:
                self._abandon(link.run)

    # ── timers ────────────────────────────────────────────────────────

    def _arm(self, node: SimNode, link: PeerLink, at_least_us: int = 0) -> None:
        due = link.loop.next_due
        if due is None:
            return
        link.timer += 1
        when = max(self.sim.clock.now_us, math.ceil(due * US), at_least_us)
        self.sim.schedule(when, self._due, (node, link, link.timer, node.incarnation))

    def _due(self, node: SimNode, link: PeerLink, token: int, incarnation: int) -> None:
        if not node.up or incarnation != node.incarnation or token != link.timer:
            return
        if self.links.get(node.name, {}).get(link.name) is not link or link.run is not None:
            return
        if not link.loop.is_due(self.sim.clock.now):
            self._arm(node, link, self.sim.clock.now_us + 1)  # float rounding: one tick on
            return
        self._start_run(node, link)

    # ── notifications ─────────────────────────────────────────────────

    def on_notify(self, node: SimNode, peer: str, tops: tuple[tuple[str, int], ...],
                  pages: list[bytes] = (), more: bool = False) -> None:  # type: ignore[assignment]
        """A write from `peer`'s stream: its pages taken by the daemon's rule
        (`streamframes.take_pages`: one transaction), what they leave us lacking and what
        it names noted by the peer loop. The node mirrors what they applied once the
        write commits (a crash inside it commits none of it)."""
        link = self.links.get(node.name, {}).get(peer)
        if link is None:
            return
        before, now = link.loop.next_due, self.sim.clock.now
        # the peer's id from its full rounds, else as its page stream's answer announces it
        publisher = link.replica or self.sim.nodes[peer].replica_id

        applied: list[tuple[Any, ...]] = []  # mirrored once the write's batch commits
        try:
            taken = take_pages(node.store_or_fail(), pages, publisher,
                               served=lambda held: node.holders.note(publisher, held),
                               perform=lambda e: self._perform(node, e, peer, applied))
        except SimulatedCrash:
            self.sim.crash_mid_apply(node)
            return
        for args in applied:
            node.after_apply(*args)
        for took in taken:
            if took.pull is not None:
                link.loop.frame(*took.pull, now)
        for origin, top in tops_frames(tops, more):
            link.loop.frame(origin, top, now)
        self._rearm(node, link, before)

    def reconnected(self, node: SimNode, peer: str) -> None:
        """The stream from `peer` came back (a cut healed, the peer restarted)."""
        link = self.links.get(node.name, {}).get(peer)
        if link is not None:
            before = link.loop.next_due
            link.loop.frame(None, None, self.sim.clock.now)
            self._rearm(node, link, before)

    def _rearm(self, node: SimNode, link: PeerLink, before: float | None) -> None:
        if link.loop.next_due is not None and link.loop.next_due != before:
            self._arm(node, link)

    # ── rounds ────────────────────────────────────────────────────────

    def _start_run(self, node: SimNode, link: PeerLink) -> None:
        now_us = self.sim.clock.now_us
        plan = link.loop.begin(self.sim.clock.now, node.vv)
        if isinstance(plan, NoRound):
            self._arm(node, link)
            return
        report = engine.RoundReport(peer=link.name)
        if isinstance(plan, FullRound):
            run = Run(node, link, "full", report, now_us, held_back=plan.held_back)
            run.flows = [Flow(engine.pull_round(
                node.replica_id, link.name, page_limit=self.spec.page_limit,
                use_extensions=self.spec.extensions, batch_artifacts=True, report=report,
                held_back=plan.held_back))]
        else:
            run = Run(node, link, "targeted", report, now_us)
            report.extensions = plan.extensions.names()
            flows = [self._origin_flow(node, link, run, plan, o, t)
                     for o, t in sorted(plan.targets.items())]
            limit = self.policy.origins_in_flight(self.spec.origins_in_flight,
                                                  upstream=not plan.extensions.names())
            run.flows, run.queued = flows[:limit], flows[limit:]
        link.run = run
        self.sim.metrics.rounds += 1
        self.sim.trace.log("sync", f"{node.name} round#{self.sim.metrics.rounds} {run.kind} "
                           f"<- {link.name}" + (f" origins={len(run.flows) + len(run.queued)}"
                                                if run.kind == "targeted" else ""))
        for flow in list(run.flows):
            if not run.over:
                self._advance(run, flow, first=True)

    def _origin_flow(self, node: SimNode, link: PeerLink, run: Run, plan: TargetedRound,
                     origin: str, top: int) -> Flow:
        gen = engine.targeted_origin(  # the daemon's targeted pull, as client.run_targeted runs it
            link.name, origin, top, plan.extensions, run.report,
            page_limit=self.spec.page_limit, batch_artifacts=True, held=node.vv.get(origin, 0),
        )
        return Flow(gen, origin=origin)

    def _advance(self, run: Run, flow: Flow, value: Any = None,
                 exc: BaseException | None = None, first: bool = False) -> None:
        """Step the round: store effects are performed here at once (no virtual time
        passes), until it asks for the network or ends."""
        node = run.node
        while True:
            try:
                if first:
                    step, first = next(flow.gen), False
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
            except Exception as error:  # the engine must only ever raise PeerError
                self.sim.violation(6, f"{node.name}: the engine raised {type(error).__name__} "
                                   f"({error}) pulling from {run.link.name}")
                self._fail(run, PeerProtocolError(str(error), peer=run.link.name))
                return
            if not isinstance(step, STORE_EFFECTS):
                break
            value, exc = None, None
            try:
                value = self._perform(node, step, run.link.name)
            except SimulatedCrash:
                run.over = True
                self.sim.crash_mid_apply(node)
                return
            except Exception as error:  # noqa: BLE001 - thrown in: the round decides
                exc = error
        self._issue(run, flow, step)

    def _perform(self, node: SimNode, effect: Any, source: str,
                 applied: list[tuple[Any, ...]] | None = None) -> Any:
        """One store effect on the node's real store; an apply may be armed to crash
        inside its transaction (it never commits, as after a `kill -9`). An apply inside
        a batch is mirrored by the caller after the commit (`applied`)."""
        if isinstance(effect, ReadVector):
            return node.stored_vector()  # the node's mirror of the store's vector
        if not isinstance(effect, ApplyPage):
            try:
                return effects.perform(node.store_or_fail(), effect)
            finally:
                node.store_touched()
        store = node.store_or_fail()
        if node.crash_on_apply:
            node.crash_on_apply = False
            self.sim.trace.fault(f"crash {node.name} inside an apply transaction "
                                 f"({len(effect.events)} ops, {len(effect.artifacts)} artifacts)")
            effects.perform(store, replace(effect, artifacts=crash_after(effect.artifacts)))
            node.crash_on_apply = True  # not reached: the page did not continue our chain
            self.sim.trace.fault(f"{node.name} refused the page before its artifacts: still armed")
        try:  # as the client performs it: with `prev`, only onto the same chain (rule 8)
            result = effects.perform(store, effect)
        finally:
            node.store_changed()
        if applied is None:
            node.after_apply(effect.events, effect.artifacts, result, source)
        else:
            applied.append((effect.events, effect.artifacts, result, source))
        return result

    def _issue(self, run: Run, flow: Flow, step: Any) -> None:
        requests = step.requests if isinstance(step, engine.Batch) else (step,)
        flow.batch = isinstance(step, engine.Batch)
        flow.requests = list(requests)
        flow.answers = [None] * len(requests)
        flow.tries = [1] * len(requests)
        flow.open_slots = set(range(len(requests)))
        flow.waiting = {}
        flow.step += 1
        if flow.batch:  # as the client's limiter: a unit per request, shared by the round
            run.batch_waiting.extend((flow, slot, flow.step) for slot in range(len(requests)))
            self._pump(run)
            return
        # The client's prefetcher: a single page request takes its guess, others drop.
        prefetched = flow.prefetched.pop(request_key(requests[0]), None)
        self._drop_prefetches(flow)
        if prefetched is not None:
            self._adopt(run, flow, prefetched)
            return
        self._send(run, flow, 0)

    def _pump(self, run: Run) -> None:
        """Send waiting batch requests while the peer's concurrency allows."""
        cap = self.policy.batch_concurrency(upstream=not run.report.extensions)
        while run.batch_waiting and run.batch_in_flight < cap and not run.over:
            flow, slot, step = run.batch_waiting.popleft()
            if flow.step != step or slot not in flow.open_slots:
                continue  # its flow moved on or closed
            run.batch_in_flight += 1
            flow.holding.add(slot)
            self._send(run, flow, slot)

    def _release(self, run: Run, flow: Flow, slot: int) -> None:
        """A batch request's outcome is final: its unit goes to the next one waiting."""
        if slot in flow.holding:
            flow.holding.discard(slot)
            run.batch_in_flight -= 1
            self._pump(run)

    def _send(self, run: Run, flow: Flow, slot: int) -> None:
        request = flow.requests[slot]
        mid = self._message(run, flow, request)
        flow.waiting[mid] = slot
        self.sim.schedule(self.sim.clock.now_us + to_us(self.spec.timeout), self._timeout,
                          (run, flow, mid))

    def _message(self, run: Run, flow: Flow, request: engine.Request) -> int:
        mid = self.sim.next_mid()
        self.by_mid[mid] = (run, flow)
        self.sim.metrics.request(request.path)
        self.sim.net.send(Message("req", run.node.name, run.link.name, mid, request.path,
                                  dict(request.params), incarnation=run.node.incarnation))
        return mid

    # ── prefetch (the client's `_Prefetcher`, by the same guess) ───────

    def _prefetch(self, run: Run, flow: Flow, request: engine.Request, answer: Any) -> None:
        guess = prefetch_guess(request, answer)
        if guess is not None:
            flow.prefetched[request_key(guess)] = Prefetch(self._message(run, flow, guess))

    def _adopt(self, run: Run, flow: Flow, prefetch: Prefetch) -> None:
        """The round asked for the page already prefetched: its answer, now or when it
        comes (it was sent without a timer: the request's own timer starts now)."""
        reply = prefetch.reply
        self.by_mid.pop(prefetch.mid, None)  # taken: no longer a prefetch
        if reply is None:
            self.by_mid[prefetch.mid] = (run, flow)
            flow.waiting[prefetch.mid] = 0
            self.sim.schedule(self.sim.clock.now_us + to_us(self.spec.timeout), self._timeout,
                              (run, flow, prefetch.mid))
            return
        self._answered(run, flow, 0, reply.status, reply.answer, reply.retry_after)

    def _drop_prefetches(self, flow: Flow) -> None:
        for prefetch in flow.prefetched.values():
            self.by_mid.pop(prefetch.mid, None)
        flow.prefetched.clear()

    # ── answers ───────────────────────────────────────────────────────

    def on_response(self, node: SimNode, msg: Message) -> None:
        entry = self.by_mid.pop(msg.mid, None)
        if entry is None or entry[0].over or entry[0].node is not node:
            return
        run, flow = entry
        run.report.bytes_received += msg.size
        self.sim.metrics.bytes += msg.size
        if msg.mid not in flow.waiting:  # a prefetch the round has not asked for yet
            for prefetch in flow.prefetched.values():
                if prefetch.mid == msg.mid:
                    prefetch.reply = msg
                    self.by_mid[msg.mid] = (run, flow)  # kept until taken or dropped
            return
        slot = flow.waiting.pop(msg.mid)
        self._answered(run, flow, slot, msg.status, msg.answer, msg.retry_after)

    def _answered(self, run: Run, flow: Flow, slot: int, status: int, answer: Any,
                  retry_after: float | None = None) -> None:
        request = flow.requests[slot]
        if status == 404 and request.missing_ok:
            answer = None
        else:
            said = reason_of(answer) if isinstance(answer, dict) else answer
            error = self.policy.error_for_status(
                status, str(said or ""), f"peer {run.link.name}: GET {request.path}",
                run.link.name, retry_after)
            if error is not None:
                self._retry_or_fail(run, flow, slot, error)
                return
        flow.answers[slot] = answer
        flow.open_slots.discard(slot)
        self._release(run, flow, slot)
        if not flow.open_slots:
            if not flow.batch:
                self._prefetch(run, flow, request, answer)
            self._advance(run, flow, flow.answers if flow.batch else flow.answers[0])

    def _timeout(self, run: Run, flow: Flow, mid: int) -> None:
        if run.over or mid not in flow.waiting:
            return
        slot = flow.waiting.pop(mid)
        self.by_mid.pop(mid, None)
        request = flow.requests[slot]
        self._retry_or_fail(run, flow, slot, PeerTransientError(
            f"peer {run.link.name}: GET {request.path} timed out after {self.spec.timeout:g} s "
            f"({flow.tries[slot]} attempts)", peer=run.link.name))

    def _retry_or_fail(self, run: Run, flow: Flow, slot: int, error: PeerError) -> None:
        """As the client does (`FetchPolicy.retry_wait`): retried after a jittered wait,
        or the round is told the request failed."""
        wait = self.policy.retry_wait(flow.tries[slot], error, self.sim.rng)
        if wait is not None:
            flow.tries[slot] += 1
            self.sim.trace.log("sync", f"{run.node.name} retries {flow.requests[slot].path} on "
                               f"{run.link.name} (attempt {flow.tries[slot]}) in {to_us(wait)}us")
            self.sim.schedule(self.sim.clock.now_us + to_us(wait), self._resend,
                              (run, flow, slot, flow.step))
            return
        if flow.batch:  # a batch answers a failed request with its error (engine rule 6)
            flow.answers[slot] = error
            flow.open_slots.discard(slot)
            self._release(run, flow, slot)
            if not flow.open_slots:
                self._advance(run, flow, flow.answers)
            return
        self._throw(run, flow, error)

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
        self._close(run, flow)
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
        """The round ended: the peer loop is told, and says when the next one is due."""
        run.over = True
        node, link = run.node, run.link
        self._close_flows(run)
        if link.run is run:
            link.run = None
        now = self.sim.clock.now
        took = to_s(self.sim.clock.now_us - run.started_us)
        if error is None:
            link.replica = run.report.peer_replica or link.replica
            due = link.loop.succeeded(run.report, now)
            node.note_compared(link.name, forks.compared_origins(
                run.report, run.held_back, full=run.kind == "full"), run.started_us)
            self.sim.trace.log("sync", f"{node.name} round {run.kind} <- {link.name} ok "
                               f"applied={run.report.applied} requests={run.report.requests} "
                               f"took={took:.6f} next={due:.6f}")
        else:
            self.sim.metrics.rounds_failed += 1
            hint = error.retry_after if isinstance(error, PeerTransientError) else None
            due = link.loop.failed(run.report, now, hint)
            self.sim.trace.log("sync", f"{node.name} round {run.kind} <- {link.name} failed "
                               f"({type(error).__name__}: {error}) next={due:.6f}")
        self._arm(node, link)
        self.sim.metrics.conflicts_seen += run.report.conflicts
        self.sim.metrics.quarantined_seen += run.report.quarantined
        self.sim.after_round()

    def _close(self, run: Run, flow: Flow) -> None:
        for mid in flow.waiting:
            self.by_mid.pop(mid, None)
        self._drop_prefetches(flow)
        flow.waiting.clear()
        flow.open_slots.clear()
        run.batch_in_flight -= len(flow.holding)  # its waiting slots are skipped by _pump
        flow.holding.clear()
        flow.gen.close()

    def _close_flows(self, run: Run) -> None:
        for flow in run.flows + run.queued:
            self._close(run, flow)
        run.flows, run.queued = [], []
        run.batch_waiting.clear()

    def _abandon(self, run: Run) -> None:
        """The node died: its rounds stop where they are, nothing reported."""
        run.over = True
        self._close_flows(run)
        run.link.run = None
