"""What the simulator's driver keeps for the rounds it runs: a round in flight (`Run`),
each generator it drives (`Flow`), a prefetched page, a peer link with its `PeerLoop`,
and what the driver needs of its simulation (`DriverHost`)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from logsync import engine
from logsync.peerloop import PeerLoop
from logsync.sim.clock import VirtualClock
from logsync.sim.network import Message, Network
from logsync.sim.node import SimNode
from logsync.sim.spec import Scenario
from logsync.sim.trace import Trace


class SimulatedCrash(BaseException):
    """Raised inside an apply transaction to model power loss; never caught by the store."""


def crash_after(items: Iterable[Any]) -> Iterator[Any]:
    yield from items
    raise SimulatedCrash("power lost while applying a page")


@dataclass
class Flow:
    """One generator being driven: a whole round, or one origin of a targeted round.
    `step` counts the generator's steps, so a retry scheduled for an old step is dropped."""

    gen: Generator[Any, Any, Any]
    origin: str | None = None
    requests: list[engine.Request] = field(default_factory=list)
    waiting: dict[int, int] = field(default_factory=dict)
    open_slots: set[int] = field(default_factory=set)
    holding: set[int] = field(default_factory=set)  # batch slots holding a concurrency unit
    tries: list[int] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    batch: bool = False
    step: int = 0
    prefetched: dict[tuple[Any, ...], Prefetch] = field(default_factory=dict)


@dataclass
class Prefetch:
    """A page asked for before the round asked (`prefetch_guess`): its message id, and
    its answer once it came."""

    mid: int
    reply: Message | None = None


@dataclass
class Run:
    node: SimNode
    link: PeerLink
    kind: str
    report: engine.RoundReport
    started_us: int
    flows: list[Flow] = field(default_factory=list)
    queued: list[Flow] = field(default_factory=list)
    over: bool = False
    held_back: frozenset[str] = frozenset()  # a full round's origins left out (backing off)
    # Batch requests to this peer in flight, and those waiting for a unit: the client's
    # per-peer limiter (FetchPolicy.batch_concurrency), shared by all origins of a round.
    batch_in_flight: int = 0
    batch_waiting: deque[tuple[Flow, int, int]] = field(default_factory=deque)


@dataclass
class PeerLink:
    """One peer a node pulls from: the peer loop that decides (the daemon's
    `_PeerTask.loop`), the driver's timer token and the running round."""

    name: str
    loop: PeerLoop
    timer: int = 0
    run: Run | None = None
    replica: str | None = None  # the peer's id, from its last full round (page frames)


class DriverHost(Protocol):
    """What the driver needs of its simulation (`sim.runner.Simulation`)."""

    scenario: Scenario
    clock: VirtualClock
    rng: random.Random
    trace: Trace
    net: Network
    metrics: Any  # sim.runner.Metrics: rounds, requests, bytes, conflicts seen

    def schedule(self, when_us: int, fn: Callable[..., None],
                 args: tuple[Any, ...] = ()) -> None: ...

    def next_mid(self) -> int: ...

    def violation(self, invariant: int, text: str) -> None: ...

    def crash_mid_apply(self, node: SimNode) -> None: ...

    def after_round(self) -> None: ...
