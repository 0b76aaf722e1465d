"""What each fault kind does: `HANDLERS` maps a kind (`spec.FAULT_KINDS`) to the handler
that starts it; each handler schedules its own end at `until`.

A handler gets a `FaultContext`, the few things of a run a fault touches (clock, trace,
schedule, network, nodes, the report's fault windows), never the `Simulation` itself.
The runner owns the phase and the node restarts; the context reaches them through
`in_safety`, `restart` and `reconnect`. Nothing here draws from the run's rng: the
order of `schedule` calls is the only thing the trace depends on, and it is the
order the runner used when the handlers were its methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logsync.sim.clock import VirtualClock, to_us
from logsync.sim.network import Cut, Network
from logsync.sim.node import SimNode
from logsync.sim.spec import Fault, LinkSpec
from logsync.sim.trace import Trace

Schedule = Callable[[int, Callable[..., None], tuple[Any, ...]], None]


@dataclass
class FaultContext:
    """What fault handlers read and change, handed over by the runner."""

    clock: VirtualClock
    trace: Trace
    schedule: Schedule
    net: Network
    nodes: dict[str, SimNode]
    duration: float
    windows: list[dict[str, Any]]
    in_safety: Callable[[], bool]
    restart: Callable[[SimNode], None]
    reconnect: Callable[[list[Cut]], None]
    # A crashed node's vector at the crash, compared when it comes back (invariant 8).
    expect_at_restart: dict[str, dict[str, int]] = field(default_factory=dict)
    # How long a node armed to crash inside an apply stays down once it does.
    mid_apply_down: dict[str, int] = field(default_factory=dict)


def start(ctx: FaultContext, fault: Fault) -> None:
    """A fault's window opens (only in the safety phase)."""
    if not ctx.in_safety():
        return
    ctx.trace.fault(f"start {fault.describe()}")
    until = fault.until if fault.until is not None else ctx.duration
    HANDLERS[fault.kind](ctx, fault, until)


def _window(ctx: FaultContext, fault: Fault, until: float, label: str) -> None:
    ctx.windows.append({"kind": fault.kind, "start": fault.at,
                        "end": min(until, ctx.duration), "label": label})


# ── cuts: partition, oneway, isolate, flap ────────────────────────────


def _cut_window(ctx: FaultContext, fault: Fault, until: float,
                test: Callable[[str, str], bool], label: str) -> None:
    cut = ctx.net.add_cut(Cut(label, test))
    _window(ctx, fault, until, label)
    ctx.schedule(to_us(until), _end_cut, (ctx, cut))


def _end_cut(ctx: FaultContext, cut: Cut) -> None:
    if cut in ctx.net.cuts:
        ctx.net.remove_cut(cut)
        ctx.trace.fault(f"heal {cut.label}")
        ctx.reconnect([cut])


def _start_partition(ctx: FaultContext, fault: Fault, until: float) -> None:
    group = {n: i for i, g in enumerate(fault.groups) for n in g}
    label = "partition " + "|".join(",".join(g) for g in fault.groups)
    _cut_window(ctx, fault, until, lambda a, b: a in group and b in group
                and group[a] != group[b], label)


def _start_oneway(ctx: FaultContext, fault: Fault, until: float) -> None:
    src, dst = set(fault.src), set(fault.dst)
    label = f"oneway {','.join(fault.src)}->{','.join(fault.dst)}"
    _cut_window(ctx, fault, until, lambda a, b: a in src and b in dst, label)


def _start_isolate(ctx: FaultContext, fault: Fault, until: float) -> None:
    name = fault.node
    _cut_window(ctx, fault, until, lambda a, b: name in (a, b), f"isolate {name}")


def _start_flap(ctx: FaultContext, fault: Fault, until: float) -> None:
    pair = set(fault.nodes)
    label = f"flap {','.join(fault.nodes)}"
    cut = ctx.net.add_cut(Cut(label, lambda a, b: a in pair and b in pair))
    _window(ctx, fault, until, label)
    ctx.schedule(to_us(until), _end_cut, (ctx, cut))  # at `until`, not at the next flip
    _toggle(ctx, cut, fault.period / 2, until)


def _toggle(ctx: FaultContext, cut: Cut, half: float, until: float) -> None:
    if not ctx.in_safety():
        ctx.net.remove_cut(cut)
        return
    ctx.trace.fault(f"{cut.label} {'down' if cut.active else 'up'}")
    if ctx.clock.now + half < until:
        ctx.schedule(ctx.clock.now_us + to_us(half), _flip, (ctx, cut, half, until))


def _flip(ctx: FaultContext, cut: Cut, half: float, until: float) -> None:
    if cut not in ctx.net.cuts:  # healed meanwhile
        return
    cut.active = not cut.active
    if not cut.active:
        ctx.reconnect([cut])
    _toggle(ctx, cut, half, until)


# ── one node: crash, clock_jump, slow, restore, byzantine ─────────────


def _start_crash(ctx: FaultContext, fault: Fault, until: float) -> None:
    node = ctx.nodes[fault.node or ""]
    if not node.up:
        ctx.trace.fault(f"{node.name} is already down")
        return
    _window(ctx, fault, until, f"{node.name} down")
    if fault.mid_apply:
        node.crash_on_apply = True
        ctx.mid_apply_down[node.name] = to_us(until - fault.at)
        return
    ctx.expect_at_restart[node.name] = dict(node.vv)
    node.crash("crash fault")
    ctx.schedule(to_us(until), ctx.restart, (node,))


def crash_mid_apply(ctx: FaultContext, node: SimNode) -> None:
    """The armed node lost power inside an apply: down for the fault's length (1 s if the
    fault did not say), then restarted and checked against what it had committed."""
    ctx.expect_at_restart[node.name] = dict(node.vv)
    node.crash("power lost inside an apply transaction")
    down_us = ctx.mid_apply_down.pop(node.name, to_us(1.0))
    ctx.schedule(ctx.clock.now_us + down_us, ctx.restart, (node,))


def _start_clock_jump(ctx: FaultContext, fault: Fault, until: float) -> None:
    node = ctx.nodes[fault.node or ""]
    node.clock.jump(int(round(fault.by * 1000)))


def _start_overload(ctx: FaultContext, fault: Fault, until: float) -> None:
    """The node answers every /sync/* request 503, with a Retry-After if one is set:
    pullers must retry as the client does (FetchPolicy) and honour the hint."""
    node = ctx.nodes[fault.node or ""]
    node.overload = (fault.retry_after or None,)
    ctx.schedule(to_us(until), _end_overload, (ctx, node))


def _end_overload(ctx: FaultContext, node: SimNode) -> None:
    if node.overload is not None:
        node.overload = None
        ctx.trace.fault(f"{node.name} is no longer overloaded")


def _start_slow(ctx: FaultContext, fault: Fault, until: float) -> None:
    node = ctx.nodes[fault.node or ""]
    node.serve_delay_us = to_us(fault.serve_delay)
    ctx.schedule(to_us(until), _end_slow, (ctx, node))


def _end_slow(ctx: FaultContext, node: SimNode) -> None:
    if node.serve_delay_us:
        node.serve_delay_us = 0
        node.overload = None
        ctx.trace.fault(f"{node.name} serves at full speed again")


def _start_restore(ctx: FaultContext, fault: Fault, until: float) -> None:
    node = ctx.nodes[fault.node or ""]
    if not node.restore(fault.backup_at):
        ctx.trace.fault(f"{node.name}: no backup taken at or before {fault.backup_at:g} s")
    else:
        ctx.trace.fault(f"{node.name} restored from its backup of t={fault.backup_at:g} s: "
                        f"vector now {len(node.vv)} origins")


def _start_clone(ctx: FaultContext, fault: Fault, until: float) -> None:
    """`node`'s palace becomes a cold copy of `of`'s, replica id and all (a palace copied
    to a second machine): both then write as one replica, from the same height."""
    node, source = ctx.nodes[fault.node or ""], ctx.nodes[fault.of or ""]
    node.become_copy_of(source)
    ctx.trace.fault(f"{node.name} is now a copy of {source.name}'s palace (replica "
                    f"{source.replica_id[:12]}, {sum(node.vv.values())} ops)")


def take_backups(ctx: FaultContext, faults: list[Fault]) -> None:
    """Backups are taken when a restore fault names the moment (`backup_at`)."""
    for fault in faults:
        if fault.kind == "restore":
            ctx.schedule(to_us(fault.backup_at), _backup, (ctx, fault))


def _backup(ctx: FaultContext, fault: Fault) -> None:
    node = ctx.nodes[fault.node or ""]
    node.snapshot(ctx.clock.now)
    ctx.trace.fault(f"backup of {node.name} taken ({sum(node.vv.values())} ops)")


def _start_byzantine(ctx: FaultContext, fault: Fault, until: float) -> None:
    node = ctx.nodes[fault.node or ""]
    node.byzantine = (fault.rate, fault.tamper)
    ctx.schedule(to_us(until), _end_byzantine, (ctx, node))


def _end_byzantine(ctx: FaultContext, node: SimNode) -> None:
    if node.byzantine is not None:
        node.byzantine = None
        ctx.trace.fault(f"{node.name} turns honest")


# ── links ─────────────────────────────────────────────────────────────


def _start_link(ctx: FaultContext, fault: Fault, until: float) -> None:
    label = f"link {','.join(fault.src)}->{','.join(fault.dst)} #{fault.at:g}"
    ctx.net.add_override(fault.src, fault.dst, fault.link or LinkSpec(), label)
    _window(ctx, fault, until, label)
    ctx.schedule(to_us(until), _end_link, (ctx, label))


def _end_link(ctx: FaultContext, label: str) -> None:
    ctx.net.remove_override(label)
    ctx.trace.fault(f"heal {label}")


# ── the heal ──────────────────────────────────────────────────────────


def heal_all(ctx: FaultContext) -> None:
    """The end of the safety phase: every cut, override and slow or byzantine node heals,
    no node stays armed to crash, down nodes restart and broken streams reconnect."""
    cuts = list(ctx.net.cuts)
    ctx.net.heal_all()
    for node in ctx.nodes.values():
        node.serve_delay_us = 0
        node.byzantine = None
        node.crash_on_apply = False
    for node in ctx.nodes.values():
        if not node.up:
            ctx.restart(node)
    ctx.reconnect(cuts)


Handler = Callable[[FaultContext, Fault, float], None]

# Fault kind -> the handler that starts it (every kind of `spec.FAULT_KINDS`).
HANDLERS: dict[str, Handler] = {
    "partition": _start_partition,
    "oneway": _start_oneway,
    "isolate": _start_isolate,
    "crash": _start_crash,
    "clock_jump": _start_clock_jump,
    "slow": _start_slow,
    "link": _start_link,
    "flap": _start_flap,
    "restore": _start_restore,
    "byzantine": _start_byzantine,
    "overload": _start_overload,
    "clone": _start_clone,
}

# Fault kinds after which two palaces may hold different ops in one (origin, origin_seq)
# for good (a re-minted slot): the liveness phase then ends when the fleet has settled.
FORKING = ("restore", "clone")
