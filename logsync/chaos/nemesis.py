"""Carries a schedule (``schedule.make_schedule``) out on a cluster, on time, logging every
action to the timeline with the time it was due and the time it ran.

Each fault is a begin and an end action (plus the clock jump halfway through a skew and
the toggles of a flap). An action that fails -- a node that will not restart on a full
disk, say -- is logged as ``nemesis_error`` and the schedule goes on; ``heal_all`` then
restores everything whatever state the faults left: links up, cuts and proxy faults gone,
disks freed, paused processes continued, skewed nodes restarted on the real clock, dead
ones started. What it cannot restore is returned (and fails the run's verdict).

A pause lasts its scheduled length from the moment its SIGSTOP really happened: an
earlier slow step (a restart waits for the daemon to serve) delays its begin, and its end
moves with it; a pause that began is ended by the nemesis even after the window closed
(``stop``), so it is never cut short by the heal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from logsync.chaos.cluster import Cluster
from logsync.chaos.schedule import Fault, cut_pairs
from logsync.chaos.timeline import Timeline

HEAL_ATTEMPTS = 3


@dataclass
class Action:
    at: float  # seconds after the round began
    fault: Fault
    phase: str
    index: int  # the fault's place in the schedule


def actions(faults: list[Fault]) -> list[Action]:
    out: list[Action] = []
    for index, fault in enumerate(faults):
        out.append(Action(fault.start, fault, "begin", index))
        if fault.kind == "skew":
            out.append(Action(fault.start + fault.duration / 2, fault, "jump", index))
        if fault.kind == "flap":
            period = float(fault.params.get("period", 1.0))
            t, up = fault.start + period, True
            while t < fault.end - 0.1:
                out.append(Action(t, fault, "up" if up else "down", index))
                t, up = t + period, not up
        out.append(Action(fault.end, fault, "end", index))
    return sorted(out, key=lambda a: (a.at, a.phase != "end"))


class Nemesis:
    def __init__(self, cluster: Cluster, timeline: Timeline, faults: list[Fault],
                 round_no: int = 0) -> None:
        self.cluster = cluster
        self.timeline = timeline
        self.faults = faults
        self.round_no = round_no
        self.errors: list[str] = []

    def run(self, began: float, stop: threading.Event) -> None:
        """Run every action at ``began + at`` (timeline seconds) until ``stop`` is set;
        then only the ends of pauses that began, each at its time."""
        pending = actions(self.faults)
        paused: set[int] = set()  # the indexes of pauses whose SIGSTOP happened
        while pending:
            action = pending.pop(0)
            if stop.is_set() and not (action.phase == "end" and action.index in paused):
                continue
            due = began + action.at
            while self.timeline.now() < due:
                left = max(0.0, due - self.timeline.now())
                if action.index in paused:  # a pause's end is kept whatever ``stop`` says
                    time.sleep(min(0.2, left))
                elif stop.wait(min(0.2, left)):
                    break
            if stop.is_set() and action.index not in paused:
                continue
            done_at = self._do(action, due - began)
            if action.fault.kind == "pause" and action.phase == "begin" and done_at is not None:
                paused.add(action.index)
                for later in pending:  # its end: the full length from the real SIGSTOP
                    if later.index == action.index and later.phase == "end":
                        later.at = max(later.at, done_at - began + action.fault.duration)
                pending.sort(key=lambda a: (a.at, a.phase != "end"))
            elif action.phase == "end":
                paused.discard(action.index)

    def _do(self, action: Action, due: float) -> float | None:
        """Carry one action out; the timeline time it was done, or None if it failed."""
        fault = action.fault
        step = self._step(fault, action.phase)
        began = time.monotonic()
        try:
            step()
        except Exception as exc:  # a fault that failed is logged; the schedule goes on
            message = f"{fault.kind} {action.phase} on {fault.targets}: {exc}"
            self.errors.append(message)
            self.timeline.log("nemesis_error", round=self.round_no, index=action.index,
                              fault=fault.kind, phase=action.phase, error=str(exc)[:500])
            return None
        entry = self.timeline.log("fault", round=self.round_no, index=action.index,
                                  fault=fault.kind, phase=action.phase, targets=fault.targets,
                                  params=fault.params, due=round(due, 2),
                                  took=round(time.monotonic() - began, 2))
        return float(entry["t"])

    def _step(self, fault: Fault, phase: str) -> Callable[[], object]:
        c, kind, who = self.cluster, fault.kind, fault.targets[0] if fault.targets else ""
        p = fault.params
        table: dict[tuple[str, str], Callable[[], object]] = {
            ("isolate", "begin"): lambda: c.isolate(who),
            ("flap", "begin"): lambda: c.isolate(who),
            ("flap", "down"): lambda: c.isolate(who),
            ("flap", "up"): c.heal_network,
            ("partition", "begin"): lambda: c.cut(cut_pairs(fault)),
            ("bridge", "begin"): lambda: c.cut(cut_pairs(fault)),
            ("kill", "begin"): lambda: c.kill(who),
            ("kill", "end"): lambda: c.start_node(who),
            ("hub_kill", "begin"): lambda: c.kill("hub"),
            ("hub_kill", "end"): lambda: c.start_node("hub"),
            ("pause", "begin"): lambda: c.pause(who),
            ("pause", "end"): lambda: c.resume(who),
            ("skew", "begin"): lambda: (c.set_clock(who, p["offset"]),
                                        c.restart(who, skewed=True)),
            ("skew", "jump"): lambda: c.set_clock(who, p["offset"] + p["jump"]),
            ("skew", "end"): lambda: c.restart(who, skewed=False),
            ("disk", "begin"): lambda: c.fill_disk(who),
            ("disk", "end"): lambda: c.free_disk(who),
            ("lossy", "begin"): lambda: c.degrade(
                (fault.targets[0], fault.targets[1]), loss=p["loss"], reset=p["reset"],
                delay=p["delay"]),
            ("lossy", "end"): lambda: c.degrade((fault.targets[0], fault.targets[1]),
                                                loss=0.0, reset=0.0, delay=0.0),
        }
        if kind in ("isolate", "partition", "bridge", "flap") and phase == "end":
            return c.heal_network
        return table[(kind, phase)]


def heal_all(cluster: Cluster, timeline: Timeline, round_no: int = 0) -> list[str]:
    """Undo every fault, whatever state it was left in; return what could not be undone.

    The network is healed first and logged at once (``network_healed``): replication
    resumes there, so the time to convergence is measured from it, not from the end of
    the restarts that follow."""
    problems: list[str] = []

    def attempt(what: str, step: Callable[[], object]) -> bool:
        for n in range(HEAL_ATTEMPTS):
            try:
                step()
                return True
            except Exception as exc:
                if n == HEAL_ATTEMPTS - 1:
                    problems.append(f"{what}: {exc}")
                time.sleep(1.0)
        return False

    if attempt("network", cluster.heal_network):
        timeline.log("network_healed", round=round_no)
    for pair in list(cluster.proxy_of):
        attempt(f"link {pair}", lambda pair=pair: cluster.degrade(
            pair, loss=0.0, reset=0.0, delay=0.0))
    for name, node in cluster.nodes.items():
        attempt(f"disk of {name}", lambda name=name: cluster.free_disk(name))
        if node.paused:
            attempt(f"SIGCONT {name}", lambda name=name: cluster.resume(name))
        if node.skewed and cluster.running(name):
            attempt(f"restart {name} on the real clock",
                    lambda name=name: cluster.restart(name, skewed=False))
        if not cluster.running(name):
            attempt(f"start {name}", lambda name=name: cluster.start_node(name, skewed=False))
    timeline.log("heal", round=round_no, problems=problems)
    return problems
