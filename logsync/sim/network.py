"""The virtual network: every request, answer and change notification is a message.

Each send draws, from the run's one `random.Random`, whether the message is lost,
duplicated or delayed out of order, and how long each copy takes; each delivery
re-checks the cuts (a partition also eats what was in flight). Every decision is
a trace line, so a failing run can be replayed and read from its seed.

Change notifications model SSE frames on a TCP stream: random loss, duplication
and reordering do not apply to them (TCP hides those as delay), but a cut or a
down subscriber drops them; when a cut heals or a publisher restarts, the
subscriber's stream reconnects and, as the daemon does, owes a full round.

Cuts are predicates over (source, destination): a partition cuts both ways
between groups, a one-way cut only from `src` to `dst` (a request gets through
and its answer does not, or the reverse), an isolated node is cut from all,
a flapping link is a cut the runner switches on and off.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logsync.sim.clock import VirtualClock, to_us
from logsync.sim.scenario import Latency, LinkSpec
from logsync.sim.trace import Trace


@dataclass(slots=True)
class Message:
    """One message. `kind` is "req", "resp" or "notify"; `mid` pairs a request and its answers."""

    kind: str
    src: str
    dst: str
    mid: int
    path: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    status: int = 200
    answer: Any = None
    size: int = 0
    incarnation: int = 0
    tops: tuple[tuple[str, int], ...] = ()  # a frame's named tops
    pages: list[bytes] = field(default_factory=list)  # a frame's page bodies
    more: bool = False  # a frame asking for a full round
    retry_after: float | None = None  # a 429/503's Retry-After, in seconds

    def label(self) -> str:
        if self.kind == "req":
            return f"req#{self.mid} {self.path}{_params(self.params)}"
        if self.kind == "resp":
            return f"resp#{self.mid} {self.status} {self.size}B"
        return f"notify#{self.mid} {len(self.pages)} page(s) {len(self.tops)} origin(s)"


def _params(params: dict[str, Any]) -> str:
    if not params:
        return ""
    shown = []
    for key, value in params.items():
        text = str(value)
        shown.append(f"{key}={text[:12] if key == 'origin' else text}")
    return "?" + "&".join(shown)


@dataclass
class Cut:
    label: str
    test: Callable[[str, str], bool]
    active: bool = True


@dataclass
class NetStats:
    sent: int = 0
    delivered: int = 0
    lost: int = 0
    cut: int = 0
    duplicated: int = 0
    reordered: int = 0
    down: int = 0


class Network:
    """Links between named nodes with per-link specs, overrides and cuts."""

    def __init__(
        self,
        clock: VirtualClock,
        rng: random.Random,
        trace: Trace,
        base: LinkSpec,
        schedule: Callable[[int, Callable[..., None], tuple[Any, ...]], None],
        deliver: Callable[[Message], bool],
    ) -> None:
        self.clock, self.rng, self.trace, self.base = clock, rng, trace, base
        self._schedule, self._deliver = schedule, deliver
        self.cuts: list[Cut] = []
        self.overrides: list[tuple[frozenset[str], frozenset[str], LinkSpec, str]] = []
        self.stats = NetStats()
        self._fixed: dict[float, int] = {}

    # ── faults ────────────────────────────────────────────────────────

    def add_cut(self, cut: Cut) -> Cut:
        self.cuts.append(cut)
        return cut

    def remove_cut(self, cut: Cut) -> None:
        if cut in self.cuts:
            self.cuts.remove(cut)

    def add_override(self, src: tuple[str, ...], dst: tuple[str, ...], spec: LinkSpec,
                     label: str) -> None:
        self.overrides.append((frozenset(src), frozenset(dst), spec, label))

    def remove_override(self, label: str) -> None:
        self.overrides = [o for o in self.overrides if o[3] != label]

    def heal_all(self) -> None:
        """The liveness phase: no cuts, no overrides, no loss or duplication."""
        self.cuts.clear()
        self.overrides.clear()
        self.base = LinkSpec(latency=self.base.latency, reorder=self.base.reorder,
                             reorder_delay=self.base.reorder_delay)

    def cut_by(self, src: str, dst: str) -> Cut | None:
        for cut in self.cuts:
            if cut.active and cut.test(src, dst):
                return cut
        return None

    def spec(self, src: str, dst: str) -> LinkSpec:
        for o_src, o_dst, spec, _label in reversed(self.overrides):
            if src in o_src and dst in o_dst:
                if spec.latency.a < 0:
                    return LinkSpec(self.base.latency, spec.loss, spec.duplicate,
                                    spec.reorder, spec.reorder_delay)
                return spec
        return self.base

    # ── sending ───────────────────────────────────────────────────────

    def send(self, msg: Message, extra_delay_us: int = 0) -> None:
        """Decide the fate of one message and schedule each surviving copy.

        A send on a clean link with a fixed latency involves no choice and writes no
        trace line (its delivery follows from what is traced); every drawn latency,
        loss, duplicate, reorder and cut does.
        """
        self.stats.sent += 1
        if self.cuts:
            cut = self.cut_by(msg.src, msg.dst)
            if cut is not None:
                self.stats.cut += 1
                self.trace.log("net", f"drop {msg.src}->{msg.dst} {msg.label()} cut={cut.label}")
                return
        spec = self.spec(msg.src, msg.dst) if self.overrides else self.base
        if msg.kind == "notify" and (spec.loss or spec.duplicate or spec.reorder):
            spec = LinkSpec(spec.latency)  # a frame on a TCP stream: late, never lost
        lat = spec.latency
        if lat.dist == "fixed" and not (spec.loss or spec.duplicate or spec.reorder):
            delay = self._fixed_us(lat.a) + extra_delay_us
            self._schedule(self.clock.now_us + delay, self._arrive, (msg,))
            return
        where = f"{msg.src}->{msg.dst} {msg.label()}"
        if spec.loss and self.rng.random() < spec.loss:
            self.stats.lost += 1
            self.trace.log("net", f"drop {where} loss")
            return
        copies = 1
        if spec.duplicate and self.rng.random() < spec.duplicate:
            copies = 2
            self.stats.duplicated += 1
        for copy in range(copies):
            delay = to_us(sample_latency(lat, self.rng)) + extra_delay_us
            note = ""
            if spec.reorder and self.rng.random() < spec.reorder:
                extra = to_us(self.rng.uniform(0.0, spec.reorder_delay))
                delay += extra
                note = f" reorder+{extra}us"
                self.stats.reordered += 1
            tag = " dup" if copy else ""
            self.trace.log("net", f"send {where} in={delay}us{note}{tag}")
            self._schedule(self.clock.now_us + delay, self._arrive, (msg,))

    def _fixed_us(self, seconds: float) -> int:
        cached = self._fixed.get(seconds)
        if cached is None:
            cached = self._fixed[seconds] = to_us(max(0.0001, seconds))
        return cached

    def _arrive(self, msg: Message) -> None:
        cut = self.cut_by(msg.src, msg.dst) if self.cuts else None
        if cut is not None:
            self.stats.cut += 1
            self.trace.log("net", f"drop-in-flight {msg.src}->{msg.dst} {msg.label()} "
                           f"cut={cut.label}")
            return
        if self._deliver(msg):
            self.stats.delivered += 1
        else:
            self.stats.down += 1


def sample_latency(lat: Latency, rng: random.Random) -> float:
    """One draw (seconds, never below 0.1 ms) from a latency distribution."""
    if lat.dist == "fixed":
        value = lat.a
    elif lat.dist == "uniform":
        value = rng.uniform(lat.a, lat.b)
    elif lat.dist == "normal":
        value = rng.gauss(lat.a, lat.b)
    elif lat.dist == "exponential":
        value = rng.expovariate(1.0 / lat.a) if lat.a > 0 else 0.0
    else:
        value = lat.a * math.exp(rng.gauss(0.0, lat.b))
    return max(0.0001, value)
