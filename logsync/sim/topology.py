"""Who pulls from whom, and the faults a seed draws (VOPR style).

Edges are undirected: on an edge A-B, A pulls from B and B from A, and each
subscribes to the other's change notifications.
"""

from __future__ import annotations

import random

from logsync.sim.spec import Fault, LinkSpec, Scenario
from logsync.sim.trace import Trace


def build_edges(s: Scenario, rng: random.Random) -> list[tuple[str, str]]:
    nodes = list(s.nodes)
    if s.topology == "full-mesh":
        pairs = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    elif s.topology == "hub-and-spoke":
        hub = s.hub or nodes[0]
        pairs = [(hub, n) for n in nodes if n != hub]
    elif s.topology == "ring":
        pairs = [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))] \
            if len(nodes) > 2 else [(nodes[0], nodes[1])] if len(nodes) == 2 else []
    elif s.topology == "random-k":
        pairs = _random_k(nodes, s.k, rng)
    else:
        pairs = list(s.edges)
    unique: dict[tuple[str, str], None] = {}
    for a, b in pairs:
        key = (a, b) if nodes.index(a) < nodes.index(b) else (b, a)
        unique[key] = None
    return list(unique)


def _random_k(nodes: list[str], k: int, rng: random.Random) -> list[tuple[str, str]]:
    """Each node links to k others at random; components are then joined into one."""
    pairs = []
    for node in nodes:
        others = [n for n in nodes if n != node]
        for peer in rng.sample(others, min(k, len(others))):
            pairs.append((node, peer))
    parent = {n: n for n in nodes}

    def find(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a, b in pairs:
        parent[find(a)] = find(b)
    roots = sorted({find(n) for n in nodes}, key=nodes.index)
    for a, b in zip(roots, roots[1:], strict=False):
        pairs.append((a, b))
    return pairs


def draw_faults(s: Scenario, rng: random.Random, trace: Trace) -> list[Fault]:
    """The random faults of `[random]`, drawn from the run's seed and traced."""
    r = s.random
    start, end = r.window
    nodes = list(s.nodes)
    drawn: list[Fault] = []

    def window() -> tuple[float, float]:
        at = rng.uniform(start, end)
        return at, at + rng.uniform(r.max_length * 0.1, r.max_length)

    for _ in range(r.partitions if len(nodes) > 1 else 0):
        at, until = window()
        shuffled = rng.sample(nodes, len(nodes))
        cut = rng.randrange(1, len(nodes))
        groups = (tuple(sorted(shuffled[:cut], key=nodes.index)),
                  tuple(sorted(shuffled[cut:], key=nodes.index)))
        drawn.append(Fault("partition", at, until, groups=groups))
    for _ in range(r.oneways if len(nodes) > 1 else 0):
        at, until = window()
        src = rng.choice(nodes)
        dst = tuple(n for n in nodes if n != src and rng.random() < 0.5) or \
            (rng.choice([n for n in nodes if n != src]),)
        drawn.append(Fault("oneway", at, until, src=(src,), dst=dst))
    for _ in range(r.crashes):
        at, until = window()
        drawn.append(Fault("crash", at, until, node=rng.choice(nodes),
                           mid_apply=rng.random() < 0.5))
    for _ in range(r.clock_jumps):
        at, _until = window()
        drawn.append(Fault("clock_jump", at, node=rng.choice(nodes),
                           by=round(rng.uniform(-r.max_jump, r.max_jump), 3)))
    for _ in range(r.flaps if len(nodes) > 1 else 0):
        at, until = window()
        pair = tuple(sorted(rng.sample(nodes, 2), key=nodes.index))
        drawn.append(Fault("flap", at, until, nodes=pair,
                           period=round(rng.uniform(0.2, 5.0), 3)))
    for _ in range(r.slow):
        at, until = window()
        drawn.append(Fault("slow", at, until, node=rng.choice(nodes),
                           serve_delay=round(rng.uniform(0.1, 2.0), 3)))
    for _ in range(r.link_faults if len(nodes) > 1 else 0):
        at, until = window()
        a, b = rng.sample(nodes, 2)
        spec = LinkSpec(latency=s.link.latency, loss=round(rng.uniform(0.1, 0.6), 3),
                        duplicate=round(rng.uniform(0.0, 0.3), 3),
                        reorder=round(rng.uniform(0.0, 0.5), 3), reorder_delay=0.5)
        drawn.append(Fault("link", at, until, src=(a, b), dst=(a, b), link=spec))
    for fault in drawn:
        trace.fault(f"drawn {fault.describe()}")
    return drawn
