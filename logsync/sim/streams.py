"""The simulated nodes' change streams: each subscriber's `outbox.Outbox` (the daemon's
rule), its writes built by the real responder (`streamframes.write_parts`) and sent as
one message each. A byzantine node's pages are tampered with as its answers are."""

from __future__ import annotations

import json
import math
from typing import Any

from logsync.ids import is_replica_id
from logsync.outbox import Outbox, direct_header, parse_direct
from logsync.sim.clock import US
from logsync.sim.network import Message
from logsync.sim.node import SimNode
from logsync.sim.serve import tamper
from logsync.streamframes import write_parts

DEEP = 100_000  # nesting of a page too deep to encode (a decoder refuses it)


class Streams:
    """What every node's stream owes every subscriber, and the timers that write it."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim  # sim.runner.Simulation
        # (node, subscriber) -> ((both incarnations), what the node's stream owes it)
        self.outboxes: dict[tuple[str, str], tuple[tuple[int, int], Outbox]] = {}

    def changed(self, node: SimNode, tops: tuple[tuple[str, int], ...], source: str | None,
                firsts: dict[str, int] | None) -> None:
        """New ops `firsts[o]..top` (default: the top alone) of each origin are stored on
        `node`: every subscriber but `source` is owed them."""
        now = self.sim.clock.now
        for peer in node.subscribers:
            if peer == source:
                continue
            box = self._outbox(node, peer)
            was = box.due()
            for origin, top in tops:
                box.add(origin, (firsts or {}).get(origin, top), top, now)
            self._arm(node, peer, box, was)

    def _outbox(self, node: SimNode, peer: str) -> Outbox:
        """The node's outbox for one subscriber; a new one when either side restarted
        or the peers the subscriber names as streamed directly changed (the daemon's
        watcher reconnects to name them, and runs a full round on reconnecting)."""
        key = (node.name, peer)
        entry = self.outboxes.get(key)
        sub = self.sim.nodes[peer]
        spec = self.sim.scenario.sync
        pages = spec.pages and node.logsync and sub.logsync
        direct = self._direct(sub, node) if pages else frozenset()
        if entry is not None and entry[0] == (node.incarnation, sub.incarnation) \
                and entry[1].direct != direct:
            node.holders.forget(sub.replica_id)  # a new stream, as the server's
            self.sim.driver.reconnected(sub, node.name)
        elif entry is not None and entry[0] == (node.incarnation, sub.incarnation):
            return entry[1]
        box = Outbox(node.replica_id, direct, pages=pages, coalesce=spec.coalesce,
                     lazy=spec.lazy)
        self.outboxes[key] = ((node.incarnation, sub.incarnation), box)
        return box

    def _direct(self, sub: SimNode, publisher: SimNode) -> frozenset[str]:
        """What `sub` names to `publisher` as streamed directly: the daemon's header
        (`peertask.direct_headers`), from the peer ids its rounds have learnt."""
        known = (link.replica for link in self.sim.driver.links.get(sub.name, {}).values())
        named = parse_direct(direct_header(known, publisher.replica_id), is_replica_id)
        return named if isinstance(named, frozenset) else frozenset()

    def _arm(self, node: SimNode, peer: str, box: Outbox, was: float | None) -> None:
        due = box.due()
        if due is None or due == was:
            return  # nothing owed, or its write is already scheduled
        now_us = self.sim.clock.now_us
        when = now_us if due <= self.sim.clock.now else max(now_us + 1, math.ceil(due * US))
        self.sim.schedule(when, self._write, (node, peer, box, node.incarnation))

    def _write(self, node: SimNode, peer: str, box: Outbox, incarnation: int) -> None:
        """The subscriber's write is due: its pages and names, one message."""
        if not node.up or node.incarnation != incarnation \
                or self.outboxes.get((node.name, peer), (None, None))[1] is not box:
            return  # either side restarted meanwhile: the stream went with it
        rid = self.sim.nodes[peer].replica_id
        write = box.take(self.sim.clock.now, lambda o, t: node.holders.holds(rid, o, t))
        if write is None:  # not yet due: an earlier due moved, or float rounding
            self._arm(node, peer, box, None)
            return
        if write:
            pages, named = write_parts(node.store_or_fail(), write, node.replica_id,
                                       node.page_frames)
            if node.byzantine is not None:
                pages = [self._tampered(node, rid, page) for page in pages]
            self.sim.metrics.notifications += 1
            self.sim.net.send(Message("notify", node.name, peer, self.sim.next_mid(),
                                      tops=tuple(named.items()), pages=pages, more=write.more,
                                      size=sum(map(len, pages)) + 16 * len(named)))
        self._arm(node, peer, box, None)

    def _tampered(self, node: SimNode, requester: str, page: bytes) -> bytes:
        """A byzantine node's page, altered at its rate as its `/sync/ops` answers are."""
        assert node.byzantine is not None
        rate, kinds = node.byzantine
        if self.sim.rng.random() >= rate:
            return page
        body = json.loads(page)
        params = {"origin": body.get("origin"), "after": body.get("after"),
                  "limit": len(body.get("events") or ())}
        done = tamper(node.store_or_fail(), "/sync/ops", params, body, kinds, self.sim.rng,
                      requester)
        if not done:
            return page
        self.sim.metrics.tampered += 1
        self.sim.trace.fault(f"{node.name} streams a tampered page: {done}")
        try:
            return json.dumps(body, ensure_ascii=False).encode("utf-8")
        except RecursionError:  # nesting past any decoder: what the wire would carry
            return b"[" * DEEP + b"]" * DEEP
