"""The nemesis schedule: which fault, when, for how long, on what -- a pure function of the
seed and the settings, so a run's faults replay exactly from the command it prints.

Kinds (``KINDS``; ``MIXES`` names the usual sets):

=========== ==================================================================== ==========
kind        what happens                                                          targets
=========== ==================================================================== ==========
isolate     one member loses every link (namespace mode: its veth goes down)      any member
partition   majority/minority: every pair across the cut is lost                  a split
bridge      two halves that cannot see each other, one member seeing both         a split
flap        one member's link goes down and up every 0.5-1.5 s                    any member
kill        kill -9, restarted 1-5 s later                                        a daemon
pause       SIGSTOP for longer than the request timeout, then SIGCONT             any member
skew        restarted under libfaketime 30 s - 1 h off, the clock jumps halfway, a daemon
            then restarted on the real clock
disk        the palace's tmpfs filled to the last byte, then freed                a disk node
lossy       a proxied link stalls (loss), resets and slows chunks                 a link
hub_kill    kill -9 of the hub, restarted 2-6 s later                             the hub
=========== ==================================================================== ==========

Network kinds (isolate, partition, bridge, flap) never overlap each other; a member has
at most one process fault (kill, pause, skew, disk, hub_kill) at a time, a link one lossy
fault; network, process and link faults overlap freely. Every kind of the mix is placed
once before any repeats (the longest first). Every fault starts within the round's
window; one still running when the window closes is ended by the final heal
(``nemesis.heal_all``), except pauses, which always run their full length (longer than
the request timeout). The last network fault (a partition, bridge or isolation, when the
mix has one) begins 5-9 s before the window closes and is still on when it does: the heal
ends it, so the time from the heal to convergence is the recovery from a split with
writes on both sides.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

NETWORK = ("isolate", "partition", "bridge", "flap")
PROCESS = ("kill", "pause", "skew", "disk", "hub_kill")
KINDS = (*NETWORK, *PROCESS, "lossy")
MIXES = {
    "standard": ("partition", "bridge", "isolate", "kill", "pause", "skew"),
    "hub": ("partition", "isolate", "kill", "pause", "skew", "hub_kill"),
    "disk": ("partition", "kill", "pause", "skew", "disk", "lossy"),
    "all": KINDS,
    "none": (),
}
SPLITS = ("partition", "bridge", "isolate")  # the kinds that may be on at the heal
HEALED_BY_S = 10.0  # the final split's nominal end lies past the window: the heal ends it
REQUEST_TIMEOUT_S = 30.0  # logsync's per-read timeout (client.PeerClient): pauses exceed it
WARMUP_S = 2.0


@dataclass
class Fault:
    kind: str
    start: float
    duration: float
    targets: list[str]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> float:
        return self.start + self.duration

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_mix(text: str) -> tuple[str, ...]:
    """A mix name (``MIXES``) or a comma list of kinds."""
    if text in MIXES:
        return MIXES[text]
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"fault mix {text!r}: want one of {', '.join(MIXES)} or a comma list "
                         f"of {', '.join(KINDS)}; unknown: {', '.join(unknown) or 'none'}")
    return kinds


def _length(kind: str, rng: random.Random, pause_s: float) -> float:
    if kind == "pause":
        return pause_s + rng.uniform(1.0, 5.0)
    low, high = {"kill": (1.0, 5.0), "hub_kill": (2.0, 6.0), "isolate": (4.0, 10.0),
                 "partition": (5.0, 12.0), "bridge": (5.0, 12.0), "flap": (5.0, 10.0),
                 "skew": (8.0, 15.0), "disk": (5.0, 10.0), "lossy": (8.0, 15.0)}[kind]
    return rng.uniform(low, high)


def _targets(kind: str, rng: random.Random, members: list[str], free: list[str],
             disk_nodes: list[str], links: list[tuple[str, str]],
             reserved: set[str]) -> tuple[list[str], dict]:
    daemons = [m for m in free if m != "hub"]
    if kind in ("isolate", "flap"):
        return [rng.choice(members)], {}
    if kind == "partition":
        order = rng.sample(members, len(members))
        k = rng.randint(1, max(1, (len(order) - 1) // 2))
        return order, {"minority": sorted(order[:k]), "majority": sorted(order[k:])}
    if kind == "bridge":
        order = rng.sample(members, len(members))
        half = (len(order) - 1) // 2
        return order, {"bridge": order[0], "a": sorted(order[1:1 + half]),
                       "b": sorted(order[1 + half:])}
    if kind in ("kill", "skew"):
        return ([rng.choice(daemons)] if daemons else []), (
            {"offset": rng.choice([-1, 1]) * round(rng.uniform(30, 3600)),
             "jump": rng.choice([-600.0, -60.0, 120.0, 3600.0])} if kind == "skew" else {})
    if kind == "pause":  # it lasts: not on a member another kind alone can hit
        usable = [m for m in free if m not in reserved] or free
        return ([rng.choice(usable)] if usable else []), {}
    if kind == "disk":
        usable = [n for n in disk_nodes if n in free]
        return ([rng.choice(usable)] if usable else []), {}
    if kind == "hub_kill":
        return (["hub"] if "hub" in free else []), {}
    if kind == "lossy":
        if not links:
            return [], {}
        puller, peer = rng.choice(links)
        return [puller, peer], {"loss": rng.choice([0.1, 0.3, 0.5]),
                                "reset": rng.choice([0.0, 0.02, 0.05]),
                                "delay": rng.choice([0.0, 0.05, 0.2])}
    raise ValueError(f"unknown fault kind {kind!r}")


def make_schedule(seed: int, kinds: tuple[str, ...], window: float, members: list[str], *,
                  disk_nodes: list[str] = (), links: list[tuple[str, str]] = (),  # type: ignore[assignment]
                  round_no: int = 0, pause_s: float = REQUEST_TIMEOUT_S) -> list[Fault]:
    """Faults within ``[WARMUP_S, window]``, in start order; the same inputs, the same list."""
    if not kinds:
        return []
    rng = random.Random(seed * 1_000_003 + round_no)
    todo = sorted(set(kinds), key=lambda k: (k != "pause", k != "skew", kinds.index(k)))
    first = [todo[0], *rng.sample(todo[1:], len(todo) - 1)] if todo else []
    net_free_at = WARMUP_S
    node_free_at = dict.fromkeys(members, WARMUP_S)
    link_free_at: dict[tuple[str, str], float] = {}
    reserved = set(disk_nodes) | ({"hub"} if "hub_kill" in kinds else set())
    placed: set[str] = set()
    faults: list[Fault] = []
    splits = [k for k in kinds if k in SPLITS]
    final_start = window - rng.uniform(5.0, 9.0) if splits else window + 1.0
    t = WARMUP_S
    for _ in range(10_000):  # bounded
        if t >= window - 1.0:
            break
        kind = first.pop(0) if first else rng.choice(kinds)
        length = _length(kind, rng, pause_s)
        start = max(t, net_free_at) if kind in NETWORK else t
        if kind in NETWORK and start + length > final_start - 0.5:
            length = final_start - 0.5 - start  # the network's tail is the final split's
        if (start + 1.0 > window or (kind == "pause" and start + length > window)
                or (kind in NETWORK and length < 2.0)):
            t += rng.uniform(1.0, 3.0)
            continue
        free = [m for m in members if node_free_at[m] <= start]
        idle = [pair for pair in links if link_free_at.get(pair, 0.0) <= start]
        targets, params = _targets(kind, rng, members, free, list(disk_nodes), idle, reserved)
        if not targets:
            if kind in todo and kind not in placed:
                first.append(kind)  # a kind of the mix not placed yet: try it again later
            t += rng.uniform(1.0, 3.0)
            continue
        placed.add(kind)
        if kind == "flap":
            params = {"period": round(rng.uniform(0.5, 1.5), 2)}
        fault = Fault(kind=kind, start=round(start, 2), duration=round(length, 2),
                      targets=targets, params=params)
        faults.append(fault)
        if kind in NETWORK:
            net_free_at = fault.end + 0.5
        elif kind in PROCESS:
            for target in targets:
                node_free_at[target] = fault.end + 0.5
        else:
            link_free_at[(targets[0], targets[1])] = fault.end + 0.5
        t += rng.uniform(1.0, 4.0)
    if splits:
        kind = rng.choice(splits)
        targets, params = _targets(kind, rng, members, members, [], [], set())
        faults.append(Fault(kind=kind, start=round(final_start, 2),
                            duration=round(window - final_start + HEALED_BY_S, 2),
                            targets=targets, params=params))
    return sorted(faults, key=lambda f: f.start)


def cut_pairs(fault: Fault) -> list[tuple[str, str]]:
    """The pairs a partition or bridge cuts."""
    p = fault.params
    if fault.kind == "partition":
        return [(a, b) for a in p["minority"] for b in p["majority"]]
    if fault.kind == "bridge":
        return [(a, b) for a in p["a"] for b in p["b"]]
    return []
