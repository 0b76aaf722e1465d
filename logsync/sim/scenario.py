"""Scenario files: TOML in, a frozen `Scenario` out, or one sentence naming the bad key.

Times are seconds of virtual time, written as a number (`2.5`) or a string with a
unit (`"100ms"`, `"30s"`, `"5m"`, `"2h"`, `"3d"`, `"2w"`); fault windows are absolute
(`at`/`until` measured from the start of the run). The layout, every key optional
except where noted, is documented in `simulations/README.md`; the key tables of
`spec.py` are the authority on what each table allows.

A scenario may carry `[variants.NAME]` tables whose sub-tables replace, key by key,
the same tables of the base scenario (e.g. `[variants.3d.sync]`), so one file holds the
settings for several targets.

This module reads and validates; the types are in `spec.py` and writing a scenario back
out is `render.py`. Both are re-exported here, so `from logsync.sim.scenario import
Scenario, Fault, render_scenario, ...` keeps working.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from logsync.sim.render import render_scenario
from logsync.sim.spec import (
    ACTIONS,
    EXPECT_KEYS,
    FAULT_KEYS,
    FAULT_KIND_KEYS,
    FAULT_KINDS,
    FAULT_REQUIRED,
    LATENCY_DISTS,
    MAX_NODES,
    MIX_DEFAULT,
    NETWORK_KEYS,
    NODE_KEYS,
    RANDOM_KEYS,
    SYNC_KEYS,
    SYNC_MODES,
    TAMPERS,
    TOP_KEYS,
    TOPOLOGIES,
    TOPOLOGY_KEYS,
    WORKLOAD_KEYS,
    Expect,
    Fault,
    Latency,
    LinkSpec,
    RandomFaults,
    Scenario,
    ScenarioError,
    SyncSpec,
    Workload,
)
from logsync.sim.table import MAX_DURATION_S, Table, is_node, natural, parse_duration

__all__ = [  # what importers of this module use; the spec types live in spec.py
    "ACTIONS", "FAULT_KINDS", "LATENCY_DISTS", "MAX_NODES", "SYNC_MODES", "TAMPERS",
    "TOPOLOGIES", "Expect", "Fault", "Latency", "LinkSpec", "RandomFaults", "Scenario",
    "ScenarioError", "SyncSpec", "Workload", "load_scenario", "parse_duration",
    "parse_scenario", "render_scenario", "scenario_from_dict",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


# ── reading ───────────────────────────────────────────────────────────


def load_scenario(path: str | Path, variant: str | None = None) -> Scenario:
    """Read and validate a scenario file (optionally one of its variants)."""
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot read the scenario file ({exc.strerror or exc})") \
            from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{source}: the scenario file is not UTF-8 text") from None
    return parse_scenario(text, source=source, variant=variant)


def parse_scenario(
    text: str, *, source: str = "<scenario>", variant: str | None = None
) -> Scenario:
    """Parse TOML text into a Scenario; every problem is one ScenarioError sentence."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML ({exc})") from None
    return scenario_from_dict(data, source=source, variant=variant)


def scenario_from_dict(
    data: Mapping[str, Any], *, source: str = "<scenario>", variant: str | None = None
) -> Scenario:
    data = _apply_variant(dict(data), source, variant)
    top = Table(data, source, "", TOP_KEYS)
    name = top.text("name", default=Path(source).stem or "scenario")
    nodes, skew, skew_max, upstream, agents = _read_nodes(top.table("nodes", NODE_KEYS))
    known = set(nodes)
    topo = top.table("topology", TOPOLOGY_KEYS)
    topology = topo.choice("kind", TOPOLOGIES, default="full-mesh")
    scenario = Scenario(
        name=name,
        description=top.text("description", default=""),
        seed=top.integer("seed", default=1, low=0),
        duration=top.duration("duration", default=60.0, low=0.001),
        nodes=nodes,
        skew=tuple((n, s) for n, s in skew.items() if _known(n, known, "nodes.skew", source)),
        skew_max=skew_max,
        upstream=tuple(n for n in upstream if _known(n, known, "nodes.upstream", source)),
        agents=agents,
        topology=topology,
        k=topo.integer("k", default=min(3, len(nodes) - 1), low=1, high=len(nodes) - 1)
        if topology == "random-k" else 3,
        hub=topo.node("hub", known, default=nodes[0]),
        edges=_read_edges(topo, known) if topology == "edges" else (),
        link=_read_link(top.table("network", NETWORK_KEYS), base=LinkSpec()),
        sync=_read_sync(top.table("sync", SYNC_KEYS)),
        workloads=tuple(
            _read_workload(t, known) for t in top.tables("workload", WORKLOAD_KEYS)
        ),
        faults=tuple(_read_fault(t, known) for t in top.tables("fault", FAULT_KEYS)),
        random=_read_random(top.table("random", RANDOM_KEYS)),
        expect=_read_expect(top.table("expect", EXPECT_KEYS)),
        sample_every=top.duration("sample_every", default=None, low=0.001),
        replay=top.fraction("replay", default=0.0),
        variant=variant,
        source=source,
    )
    _check_network_nodes(scenario)
    _check_clock_reach(scenario)
    _check_sampling(scenario)
    _check_size(scenario)
    return scenario


def _known(name: str, known: set[str], key: str, source: str) -> bool:
    if name not in known:
        raise ScenarioError(
            f"{source}: {key} names node {name!r}, which is not one of the scenario's nodes"
        )
    return True


def _apply_variant(data: dict[str, Any], source: str, variant: str | None) -> dict[str, Any]:
    variants = data.pop("variants", {})
    if not isinstance(variants, dict):
        raise ScenarioError(f"{source}: 'variants' must be a table of named variants")
    if variant is None:
        return data
    if variant not in variants:
        allowed = ", ".join(sorted(variants)) or "none are defined"
        raise ScenarioError(f"{source}: variant {variant!r} is not defined; allowed: {allowed}")
    override = variants[variant]
    if not isinstance(override, dict):
        raise ScenarioError(f"{source}: variants.{variant} must be a table")
    merged = dict(data)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged





def _read_nodes(t: Table) -> tuple[tuple[str, ...], dict[str, float], float, list[str], int]:
    if t.has("names"):
        names = t.data["names"]
        if not isinstance(names, list) or not names or len(names) > MAX_NODES \
                or not all(isinstance(n, str) and _NAME_RE.match(n) for n in names):
            raise t.fail("names", names, f"must be 1-{MAX_NODES} names of letters, digits, "
                         "'_', '.', '-' (at most 32 characters)")
        if len(set(names)) != len(names):
            raise t.fail("names", names, "must not repeat a name")
        nodes = tuple(names)
    else:
        count = t.integer("count", default=3, low=1, high=MAX_NODES)
        nodes = tuple(f"n{i}" for i in range(count))
    skew_raw = t.data.get("skew", {})
    if not isinstance(skew_raw, dict):
        raise t.fail("skew", skew_raw, "must be a table of node = offset (e.g. n1 = \"-2m\")")
    skew_table = Table(skew_raw, t.source, f"{t.path}.skew", tuple(skew_raw))
    skew = {n: skew_table.duration(n, 0.0, negative=True) for n in skew_raw}
    upstream = t.data.get("upstream", [])
    if not isinstance(upstream, list) or not all(isinstance(n, str) for n in upstream):
        raise t.fail("upstream", upstream, "must be a list of node names")
    agents = t.integer("agents", default=2, low=1, high=50)
    return nodes, skew, t.duration("skew_max", 0.0), upstream, agents


def _read_edges(t: Table, known: set[str]) -> tuple[tuple[str, str], ...]:
    raw = t.data.get("edges")
    if not isinstance(raw, list) or not raw:
        raise t.fail("edges", raw, "must be a non-empty list of [node, node] pairs "
                     "when kind = \"edges\"")
    edges = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2 and all(is_node(p, known) for p in pair)
                and pair[0] != pair[1]):
            raise t.fail("edges", pair, "must be a pair of two different node names")
        edges.append((pair[0], pair[1]))
    return tuple(edges)


def _read_latency(t: Table, key: str, default: Latency) -> Latency:
    raw = t.data.get(key)
    if raw is None:
        return default
    if not isinstance(raw, dict):
        seconds = t.duration(key, None, low=0.0)
        return Latency("fixed", seconds, 0.0)
    allowed = {"fixed": ("dist", "value"), "uniform": ("dist", "min", "max"),
               "normal": ("dist", "mean", "sd"), "exponential": ("dist", "mean"),
               "lognormal": ("dist", "median", "sigma")}
    dist = raw.get("dist")
    if not isinstance(dist, str) or dist not in allowed:
        raise t.fail(f"{key}.dist", dist, f"is not allowed; allowed: {', '.join(LATENCY_DISTS)}")
    sub = Table(raw, t.source, f"{t._name(t.path, key)}", allowed[dist])
    if dist == "fixed":
        return Latency("fixed", sub.duration("value", 0.05), 0.0)
    if dist == "uniform":
        low, high = sub.duration("min", 0.0), sub.duration("max", 0.1)
        if high < low:
            raise sub.fail("max", raw.get("max"), "must not be below min")
        return Latency("uniform", low, high)
    if dist == "normal":
        return Latency("normal", sub.duration("mean", 0.05), sub.duration("sd", 0.01))
    if dist == "exponential":
        return Latency("exponential", sub.duration("mean", 0.05), 0.0)
    return Latency("lognormal", sub.duration("median", 0.05), sub.number("sigma", 0.5, 0, 5))


def _read_link(t: Table, base: LinkSpec) -> LinkSpec:
    return LinkSpec(
        latency=_read_latency(t, "latency", base.latency),
        loss=t.fraction("loss", base.loss),
        duplicate=t.fraction("duplicate", base.duplicate),
        reorder=t.fraction("reorder", base.reorder),
        reorder_delay=t.duration("reorder_delay", base.reorder_delay),
    )


def _read_sync(t: Table) -> SyncSpec:
    d = SyncSpec()
    spec = SyncSpec(
        mode=t.choice("mode", SYNC_MODES, d.mode),
        interval=t.duration("interval", d.interval, low=0.001),
        jitter=t.number("jitter", d.jitter, 0.0, 0.99),
        debounce=t.duration("debounce", d.debounce),
        backoff_base=t.duration("backoff_base", d.backoff_base, low=0.001),
        backoff_cap=t.duration("backoff_cap", d.backoff_cap, low=0.001),
        notify=t.boolean("notify", d.notify),
        page_limit=t.integer("page_limit", None, low=1, high=100_000),
        extensions=t.boolean("extensions", d.extensions),
        timeout=t.duration("timeout", d.timeout, low=0.001),
        attempts=t.integer("attempts", d.attempts, low=1, high=100),
        retry_backoff=t.duration("retry_backoff", d.retry_backoff),
        retry_max=t.duration("retry_max", d.retry_max),
        max_page=t.integer("max_page", d.max_page, low=1, high=100_000),
        origins_in_flight=t.integer("origins_in_flight", d.origins_in_flight, low=1, high=1000),
        coalesce=t.duration("coalesce", d.coalesce),
        pages=t.boolean("pages", d.pages),
        lazy=t.duration("lazy", d.lazy),
    )
    return spec


def _read_workload(t: Table, known: set[str]) -> Workload:
    mix_raw = t.data.get("mix")
    if mix_raw is None:
        mix = MIX_DEFAULT
    else:
        if not isinstance(mix_raw, dict) or not mix_raw:
            raise t.fail("mix", mix_raw, f"must be a table of action = weight; actions: "
                         f"{', '.join(ACTIONS)}")
        mix_t = Table(mix_raw, t.source, f"{t.path}.mix", ACTIONS)
        mix = tuple((a, mix_t.number(a, 0.0)) for a in ACTIONS if a in mix_raw)
        if sum(w for _, w in mix) <= 0:
            raise t.fail("mix", mix_raw, "must give at least one action a positive weight")
    start = t.duration("from", 0.0)
    until = t.duration("until", float("inf")) if t.has("until") else float("inf")
    if until <= start:
        raise t.fail("until", t.data.get("until"), "must be later than 'from'")
    return Workload(
        nodes=t.node_list("nodes", known, allow_all=True) if t.has("nodes")
        else tuple(sorted(known, key=natural)),
        rate=t.number("rate", 1.0, low=0.0, high=100_000.0),
        start=start, until=until, mix=mix,
        patch_bytes=t.integer("patch_bytes", 400, low=1, high=4 * 1024 * 1024),
    )


def _read_fault(t: Table, known: set[str]) -> Fault:
    kind = t.choice("kind", FAULT_KINDS, default="")
    allowed = ("kind", "at", "until", *FAULT_KIND_KEYS[kind])
    for key in t.data:
        if key not in allowed:
            raise ScenarioError(
                f"{t.source}: {t.path}.{key} is not used by a {kind!r} fault; "
                f"allowed: {', '.join(allowed)}"
            )
    for key in FAULT_REQUIRED[kind]:
        if key not in t.data:
            raise ScenarioError(f"{t.source}: {t.path} is a {kind!r} fault and needs "
                                f"'{key}' (it takes: {', '.join(allowed)})")
    at = t.duration("at", 0.0)
    until = t.duration("until", None) if t.has("until") else None
    if until is not None and until <= at:
        raise t.fail("until", t.data["until"], "must be later than 'at'")
    return Fault(
        kind=kind, at=at, until=until,
        node=t.node("node", known),
        nodes=t.node_list("nodes", known) if t.has("nodes") else (),
        groups=_read_groups(t, known) if t.has("groups") else (),
        src=t.node_list("src", known) if t.has("src") else (),
        dst=t.node_list("dst", known) if t.has("dst") else (),
        by=t.duration("by", 0.0, negative=True),
        period=t.duration("period", 1.0, low=0.002),
        serve_delay=t.duration("serve_delay", 0.0),
        link=_read_link(t, LinkSpec(latency=Latency("fixed", -1.0))) if kind == "link" else None,
        mid_apply=t.boolean("mid_apply", False),
        backup_at=t.duration("backup_at", 0.0),
        rate=t.fraction("rate", 0.5),
        tamper=_read_tamper(t) if t.has("tamper") else (),
        retry_after=t.duration("retry_after", 0.0),
        of=_read_of(t, known) if kind == "clone" else None,
    )


def _read_of(t: Table, known: set[str]) -> str | None:
    """A clone's source: another node than the one that becomes its copy."""
    source = t.node("of", known)
    if source == t.data.get("node"):
        raise t.fail("of", source, "must name another node than 'node' (the one replaced)")
    return source


def _read_groups(t: Table, known: set[str]) -> tuple[tuple[str, ...], ...]:
    raw = t.data["groups"]
    ok = isinstance(raw, list) and len(raw) >= 2 and all(
        isinstance(g, list) and g and all(is_node(n, known) for n in g) for g in raw)
    if not ok:
        raise t.fail("groups", raw, "must be two or more non-empty lists of node names")
    flat = [n for g in raw for n in g]
    if len(set(flat)) != len(flat):
        raise t.fail("groups", raw, "must not list a node in two groups")
    return tuple(tuple(g) for g in raw)


def _read_tamper(t: Table) -> tuple[str, ...]:
    raw = t.data["tamper"]
    if not isinstance(raw, list) or not raw or not all(x in TAMPERS for x in raw):
        raise t.fail("tamper", raw, f"must be a non-empty list drawn from: {', '.join(TAMPERS)}")
    return tuple(raw)


def _read_random(t: Table) -> RandomFaults:
    window_raw = t.data.get("window", [0, 0])
    if not (isinstance(window_raw, list) and len(window_raw) == 2):
        raise t.fail("window", window_raw, "must be [start, end] in seconds or durations")
    start, end = (parse_duration(x) for x in window_raw)
    if start is None or end is None or end < start or start < 0:
        raise t.fail("window", window_raw, "must be [start, end] with 0 <= start <= end")
    counts = {k: t.integer(k, 0, low=0, high=1000) for k in RANDOM_KEYS[:7]}
    if any(counts.values()) and end <= start:
        raise t.fail("window", window_raw, "must be a non-empty span when faults are drawn")
    return RandomFaults(
        window=(start, end), max_length=t.duration("max_length", 10.0, low=0.001),
        max_jump=t.duration("max_jump", 300.0), **counts,
    )


def _read_expect(t: Table) -> Expect:
    return Expect(
        converge_within=t.duration("converge_within", 120.0, low=0.001),
        median_reach=t.duration("median_reach", None),
        max_reach=t.duration("max_reach", None),
        requests_per_event=t.number("requests_per_event", None),
        messages_per_event=t.number("messages_per_event", None),
    )


MAX_SAMPLES = 20_000


MAX_APPLIES = 2_000_000  # ops a run may apply across its nodes: about 15 min on 2 cores


def expected_applies(s: Scenario) -> float:
    """What the workload asks for: events (each workload's rate over the part of the run
    it writes in) times the nodes each must reach."""
    events = sum(w.rate * max(0.0, min(w.until, s.duration) - w.start) for w in s.workloads)
    return events * len(s.nodes)


def _check_size(s: Scenario) -> None:
    """A run's work is bounded as everything it holds is: a rate or a duration mistyped
    by a factor of a thousand is refused at once, not found out an hour into the run."""
    applies = expected_applies(s)
    if applies > MAX_APPLIES:
        events = applies / len(s.nodes)
        raise ScenarioError(
            f"{s.source}: the workload asks for about {events:,.0f} events on "
            f"{len(s.nodes)} nodes, {applies:,.0f} applies in all; a run is bounded to "
            f"{MAX_APPLIES:,} (lower [[workload]] rate, duration or nodes.count)")


def _check_sampling(s: Scenario) -> None:
    """The lag samples a run keeps (one per `sample_every` of its longest run) are
    bounded, as everything a run holds is."""
    longest = s.duration + s.expect.converge_within
    if s.sample_every is not None and longest / s.sample_every > MAX_SAMPLES:
        raise ScenarioError(
            f"{s.source}: sample_every={s.sample_every:g} s would take more than "
            f"{MAX_SAMPLES} lag samples over a run of up to {longest:g} s (duration + "
            f"expect.converge_within): it must be at least {longest / MAX_SAMPLES:g} s")


def _check_clock_reach(s: Scenario) -> None:
    """Skews and jumps together keep every wall clock within `MAX_DURATION_S` of the
    virtual time (each alone is checked where it is read; many add up)."""
    reach = (max((abs(skew) for _, skew in s.skew), default=0.0) + s.skew_max
             + sum(abs(f.by) for f in s.faults if f.kind == "clock_jump")
             + s.random.clock_jumps * s.random.max_jump)
    if reach > MAX_DURATION_S:
        raise ScenarioError(
            f"{s.source}: the clocks' skews and jumps add up to {reach:.0f} s, past the "
            f"{MAX_DURATION_S:.0f} s (3650 days) a node's wall clock may stray from the "
            "virtual time")


def _check_network_nodes(s: Scenario) -> None:
    if s.topology == "random-k" and len(s.nodes) < 2:
        raise ScenarioError(f"{s.source}: topology.kind=\"random-k\" needs at least 2 nodes")
    for w in s.workloads:
        if w.start >= s.duration:
            raise ScenarioError(
                f"{s.source}: a workload starts at {w.start:g} s, at or after duration="
                f"{s.duration:g} s, so it would never run"
            )


