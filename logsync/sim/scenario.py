"""Scenario files: TOML in, a frozen `Scenario` out, or one sentence naming the bad key.

Times are seconds of virtual time, written as a number (`2.5`) or a string with a
unit (`"100ms"`, `"30s"`, `"5m"`, `"2h"`, `"3d"`, `"2w"`); fault windows are absolute
(`at`/`until` measured from the start of the run). The layout, every key optional
except where noted, is documented in `simulations/README.md`; `Scenario.describe_keys`
is the authority on what each table allows.

A scenario may carry `[variants.NAME]` tables whose sub-tables replace, key by key,
the same tables of the base scenario (e.g. `[variants.3d.sync]`), so one file holds the
settings for several targets.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from logsync.defaults import DEFAULT_DEBOUNCE_S, DEFAULT_ORIGINS_IN_FLIGHT
from logsync.errors import ConfigError
from logsync.hostile import SIM_KINDS

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")

TOPOLOGIES = ("full-mesh", "hub-and-spoke", "ring", "random-k", "edges")
LATENCY_DISTS = ("fixed", "uniform", "normal", "exponential", "lognormal")
SYNC_MODES = ("round", "targeted")
ACTIONS = ("ask", "reply", "ack", "patch", "claim", "note")
TAMPERS = ("corrupt", "bad_artifact", "wrong_origin", "stale_fork", "id_reuse", "fork",
           *SIM_KINDS)  # the hostile corpus shared with tests/hostile/ (logsync.hostile)
FAULT_KINDS = (
    "partition", "oneway", "isolate", "crash", "clock_jump", "slow", "link", "flap",
    "restore", "byzantine",
)
MAX_NODES = 200


class ScenarioError(ConfigError):
    """A scenario file that cannot be run; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Latency:
    """A one-way delay distribution; `a`/`b` mean what `dist` says (seconds)."""

    dist: str = "fixed"
    a: float = 0.05
    b: float = 0.0

    def describe(self) -> str:
        return f"{self.dist}({self.a:g},{self.b:g})"


@dataclass(frozen=True)
class LinkSpec:
    latency: Latency = field(default_factory=Latency)
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.2


@dataclass(frozen=True)
class SyncSpec:
    """The daemon's knobs: the engine's PullSchedule plus how notifications are used."""

    mode: str = "targeted"
    interval: float = 15.0
    jitter: float = 0.1
    debounce: float = DEFAULT_DEBOUNCE_S
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    notify: bool = True
    page_limit: int | None = None
    extensions: bool = True
    timeout: float = 5.0
    attempts: int = 4
    retry_backoff: float = 0.5
    retry_max: float = 10.0
    max_page: int = 5000
    origins_in_flight: int = DEFAULT_ORIGINS_IN_FLIGHT


@dataclass(frozen=True)
class Workload:
    nodes: tuple[str, ...]
    rate: float
    start: float
    until: float
    mix: tuple[tuple[str, float], ...]
    patch_bytes: int = 400


@dataclass(frozen=True)
class Fault:
    """One scripted (or drawn) fault; which fields matter depends on `kind`."""

    kind: str
    at: float
    until: float | None = None
    node: str | None = None
    nodes: tuple[str, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    src: tuple[str, ...] = ()
    dst: tuple[str, ...] = ()
    by: float = 0.0
    period: float = 1.0
    serve_delay: float = 0.0
    link: LinkSpec | None = None
    mid_apply: bool = False
    backup_at: float = 0.0
    rate: float = 0.5
    tamper: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [self.kind, f"at={self.at:g}"]
        if self.until is not None:
            parts.append(f"until={self.until:g}")
        for name in ("node",):
            if getattr(self, name):
                parts.append(f"{name}={getattr(self, name)}")
        for name in ("nodes", "src", "dst"):
            if getattr(self, name):
                parts.append(f"{name}={','.join(getattr(self, name))}")
        if self.groups:
            parts.append("groups=" + "|".join(",".join(g) for g in self.groups))
        if self.kind == "clock_jump":
            parts.append(f"by={self.by:g}")
        if self.mid_apply:
            parts.append("mid_apply")
        if self.kind == "restore":
            parts.append(f"backup_at={self.backup_at:g}")
        if self.kind == "byzantine":
            parts.append(f"rate={self.rate:g} tamper={','.join(self.tamper)}")
        if self.kind == "flap":
            parts.append(f"period={self.period:g}")
        if self.kind == "slow":
            parts.append(f"serve_delay={self.serve_delay:g}")
        return " ".join(parts)


@dataclass(frozen=True)
class RandomFaults:
    """Faults drawn from the seed, VOPR style: counts per kind inside a window."""

    partitions: int = 0
    oneways: int = 0
    crashes: int = 0
    clock_jumps: int = 0
    flaps: int = 0
    slow: int = 0
    link_faults: int = 0
    window: tuple[float, float] = (0.0, 0.0)
    max_length: float = 10.0
    max_jump: float = 300.0


@dataclass(frozen=True)
class Expect:
    """Targets the report is graded against (None = not graded)."""

    converge_within: float = 120.0
    median_reach: float | None = None
    max_reach: float | None = None
    requests_per_event: float | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    duration: float
    nodes: tuple[str, ...]
    skew: tuple[tuple[str, float], ...] = ()
    skew_max: float = 0.0
    upstream: tuple[str, ...] = ()
    agents: int = 2
    topology: str = "full-mesh"
    k: int = 3
    hub: str | None = None
    edges: tuple[tuple[str, str], ...] = ()
    link: LinkSpec = field(default_factory=LinkSpec)
    sync: SyncSpec = field(default_factory=SyncSpec)
    workloads: tuple[Workload, ...] = ()
    faults: tuple[Fault, ...] = ()
    random: RandomFaults = field(default_factory=RandomFaults)
    expect: Expect = field(default_factory=Expect)
    sample_every: float | None = None
    replay: float = 0.0
    variant: str | None = None
    source: str = "<scenario>"

    def with_seed(self, seed: int) -> Scenario:
        return replace(self, seed=seed)


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
    top = _Table(data, source, "", _TOP_KEYS)
    name = top.text("name", default=Path(source).stem or "scenario")
    nodes, skew, skew_max, upstream, agents = _read_nodes(top.table("nodes", _NODE_KEYS))
    known = set(nodes)
    topo = top.table("topology", _TOPOLOGY_KEYS)
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
        link=_read_link(top.table("network", _NETWORK_KEYS), base=LinkSpec()),
        sync=_read_sync(top.table("sync", _SYNC_KEYS)),
        workloads=tuple(
            _read_workload(t, known) for t in top.tables("workload", _WORKLOAD_KEYS)
        ),
        faults=tuple(_read_fault(t, known) for t in top.tables("fault", _FAULT_KEYS)),
        random=_read_random(top.table("random", _RANDOM_KEYS)),
        expect=_read_expect(top.table("expect", _EXPECT_KEYS)),
        sample_every=top.duration("sample_every", default=None, low=0.001),
        replay=top.fraction("replay", default=0.0),
        variant=variant,
        source=source,
    )
    _check_network_nodes(scenario)
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


_TOP_KEYS = (
    "name", "description", "seed", "duration", "nodes", "topology", "network", "sync",
    "workload", "fault", "random", "expect", "sample_every", "replay",
)
_NODE_KEYS = ("count", "names", "skew", "skew_max", "upstream", "agents")
_TOPOLOGY_KEYS = ("kind", "k", "hub", "edges")
_LINK_KEYS = ("latency", "loss", "duplicate", "reorder", "reorder_delay")
_NETWORK_KEYS = _LINK_KEYS
_SYNC_KEYS = (
    "mode", "interval", "jitter", "debounce", "backoff_base", "backoff_cap", "notify",
    "page_limit", "extensions", "timeout", "attempts", "retry_backoff", "retry_max",
    "max_page", "origins_in_flight",
)
_WORKLOAD_KEYS = ("nodes", "rate", "from", "until", "mix", "patch_bytes")
_FAULT_KEYS = (
    "kind", "at", "until", "node", "nodes", "groups", "src", "dst", "by", "period",
    "serve_delay", "mid_apply", "backup_at", "rate", "tamper", *_LINK_KEYS,
)
_FAULT_KIND_KEYS = {
    "partition": ("groups",),
    "oneway": ("src", "dst"),
    "isolate": ("node",),
    "crash": ("node", "mid_apply"),
    "clock_jump": ("node", "by"),
    "slow": ("node", "serve_delay"),
    "link": ("src", "dst", *_LINK_KEYS),
    "flap": ("nodes", "period"),
    "restore": ("node", "backup_at"),
    "byzantine": ("node", "rate", "tamper"),
}
_FAULT_REQUIRED = {
    "partition": ("groups",), "oneway": ("src", "dst"), "isolate": ("node",),
    "crash": ("node",), "clock_jump": ("node", "by"), "slow": ("node", "serve_delay"),
    "link": ("src", "dst"), "flap": ("nodes",), "restore": ("node", "backup_at"),
    "byzantine": ("node", "tamper"),
}
_RANDOM_KEYS = (
    "partitions", "oneways", "crashes", "clock_jumps", "flaps", "slow", "link_faults",
    "window", "max_length", "max_jump",
)
_EXPECT_KEYS = ("converge_within", "median_reach", "max_reach", "requests_per_event")
_MIX_DEFAULT = (("ask", 4.0), ("reply", 3.0), ("ack", 2.0), ("patch", 1.0), ("claim", 1.0),
                ("note", 1.0))


class _Table:
    """One TOML table with its path, for messages that name the exact key."""

    def __init__(self, data: Any, source: str, path: str, allowed: tuple[str, ...]) -> None:
        where = path or "the top level"
        if not isinstance(data, dict):
            raise ScenarioError(f"{source}: {where} must be a table")
        for key in data:
            if key not in allowed:
                raise ScenarioError(
                    f"{source}: {self._name(path, key)} is not a known key; "
                    f"allowed in {where}: {', '.join(allowed)}"
                )
        self.data, self.source, self.path = data, source, path

    @staticmethod
    def _name(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def fail(self, key: str, value: Any, rule: str) -> ScenarioError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return ScenarioError(f"{self.source}: {self._name(self.path, key)}={shown} {rule}")

    def has(self, key: str) -> bool:
        return key in self.data

    def table(self, key: str, allowed: tuple[str, ...]) -> _Table:
        return _Table(self.data.get(key, {}), self.source, self._name(self.path, key), allowed)

    def tables(self, key: str, allowed: tuple[str, ...]) -> list[_Table]:
        raw = self.data.get(key, [])
        if not isinstance(raw, list):
            raise self.fail(key, raw, f"must be an array of tables ([[{key}]])")
        return [
            _Table(item, self.source, f"{self._name(self.path, key)}[{i}]", allowed)
            for i, item in enumerate(raw)
        ]

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, value, "must be a string")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.data.get(key, default)
        if value not in allowed:
            raise self.fail(key, value, f"is not allowed; allowed: {', '.join(allowed)}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, value, "must be true or false")
        return value

    def integer(self, key: str, default: Any, low: int | None = None,
                high: int | None = None) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, value, "must be an integer")
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(key, value, f"must be an integer in [{low}, {high}]"
                            if high is not None else f"must be an integer >= {low}")
        return value

    def number(self, key: str, default: Any, low: float = 0.0,
               high: float | None = None) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise self.fail(key, value, "must be a number")
        if value < low or (high is not None and value > high):
            bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
            raise self.fail(key, value, f"must be a number {bound}")
        return float(value)

    def fraction(self, key: str, default: float) -> float:
        return self.number(key, default, 0.0, 1.0)

    def duration(self, key: str, default: Any, low: float = 0.0,
                 negative: bool = False) -> Any:
        value = self.data.get(key, default)
        if value is None and default is None:
            return None
        seconds = parse_duration(value)
        if seconds is None:
            raise self.fail(key, value, "must be seconds as a number or a string like "
                            "'250ms', '30s', '5m', '2h', '3d', '2w'")
        if not negative and seconds < low:
            raise self.fail(key, value, f"must be at least {low:g} s")
        return seconds

    def node(self, key: str, known: set[str], default: Any = None) -> Any:
        value = self.data.get(key, default)
        if value is None:
            return None
        if value not in known:
            raise self.fail(key, value, f"is not a node; nodes: {', '.join(sorted(known))}")
        return value

    def node_list(self, key: str, known: set[str], *, allow_all: bool = False) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if allow_all and value == "all":
            return tuple(sorted(known, key=_natural))
        if not isinstance(value, list) or not value:
            rule = "must be a non-empty list of node names" + (" or \"all\"" if allow_all else "")
            raise self.fail(key, value, rule)
        for item in value:
            if item not in known:
                raise self.fail(key, value, f"names {item!r}, which is not a node; "
                                f"nodes: {', '.join(sorted(known, key=_natural))}")
        return tuple(value)


def parse_duration(value: Any) -> float | None:
    """Seconds from a number or a '<n><unit>' string; None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            return float(match.group(1)) * _UNITS[match.group(2)]
    return None


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _read_nodes(t: _Table) -> tuple[tuple[str, ...], dict[str, float], float, list[str], int]:
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
    skew_table = _Table(skew_raw, t.source, f"{t.path}.skew", tuple(skew_raw))
    skew = {n: skew_table.duration(n, 0.0, negative=True) for n in skew_raw}
    upstream = list(t.data.get("upstream", []))
    if not all(isinstance(n, str) for n in upstream):
        raise t.fail("upstream", upstream, "must be a list of node names")
    agents = t.integer("agents", default=2, low=1, high=50)
    return nodes, skew, t.duration("skew_max", 0.0), upstream, agents


def _read_edges(t: _Table, known: set[str]) -> tuple[tuple[str, str], ...]:
    raw = t.data.get("edges")
    if not isinstance(raw, list) or not raw:
        raise t.fail("edges", raw, "must be a non-empty list of [node, node] pairs "
                     "when kind = \"edges\"")
    edges = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2 and all(p in known for p in pair)
                and pair[0] != pair[1]):
            raise t.fail("edges", pair, "must be a pair of two different node names")
        edges.append((pair[0], pair[1]))
    return tuple(edges)


def _read_latency(t: _Table, key: str, default: Latency) -> Latency:
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
    if dist not in allowed:
        raise t.fail(f"{key}.dist", dist, f"is not allowed; allowed: {', '.join(LATENCY_DISTS)}")
    sub = _Table(raw, t.source, f"{t._name(t.path, key)}", allowed[dist])
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


def _read_link(t: _Table, base: LinkSpec) -> LinkSpec:
    return LinkSpec(
        latency=_read_latency(t, "latency", base.latency),
        loss=t.fraction("loss", base.loss),
        duplicate=t.fraction("duplicate", base.duplicate),
        reorder=t.fraction("reorder", base.reorder),
        reorder_delay=t.duration("reorder_delay", base.reorder_delay),
    )


def _read_sync(t: _Table) -> SyncSpec:
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
    )
    return spec


def _read_workload(t: _Table, known: set[str]) -> Workload:
    mix_raw = t.data.get("mix")
    if mix_raw is None:
        mix = _MIX_DEFAULT
    else:
        if not isinstance(mix_raw, dict) or not mix_raw:
            raise t.fail("mix", mix_raw, f"must be a table of action = weight; actions: "
                         f"{', '.join(ACTIONS)}")
        mix_t = _Table(mix_raw, t.source, f"{t.path}.mix", ACTIONS)
        mix = tuple((a, mix_t.number(a, 0.0)) for a in ACTIONS if a in mix_raw)
        if sum(w for _, w in mix) <= 0:
            raise t.fail("mix", mix_raw, "must give at least one action a positive weight")
    start = t.duration("from", 0.0)
    until = t.duration("until", float("inf")) if t.has("until") else float("inf")
    if until <= start:
        raise t.fail("until", t.data.get("until"), "must be later than 'from'")
    return Workload(
        nodes=t.node_list("nodes", known, allow_all=True) if t.has("nodes")
        else tuple(sorted(known, key=_natural)),
        rate=t.number("rate", 1.0, low=0.0, high=100_000.0),
        start=start, until=until, mix=mix,
        patch_bytes=t.integer("patch_bytes", 400, low=1, high=4 * 1024 * 1024),
    )


def _read_fault(t: _Table, known: set[str]) -> Fault:
    kind = t.choice("kind", FAULT_KINDS, default="")
    allowed = ("kind", "at", "until", *_FAULT_KIND_KEYS[kind])
    for key in t.data:
        if key not in allowed:
            raise ScenarioError(
                f"{t.source}: {t.path}.{key} is not used by a {kind!r} fault; "
                f"allowed: {', '.join(allowed)}"
            )
    for key in _FAULT_REQUIRED[kind]:
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
    )


def _read_groups(t: _Table, known: set[str]) -> tuple[tuple[str, ...], ...]:
    raw = t.data["groups"]
    ok = isinstance(raw, list) and len(raw) >= 2 and all(
        isinstance(g, list) and g and all(n in known for n in g) for g in raw)
    if not ok:
        raise t.fail("groups", raw, "must be two or more non-empty lists of node names")
    flat = [n for g in raw for n in g]
    if len(set(flat)) != len(flat):
        raise t.fail("groups", raw, "must not list a node in two groups")
    return tuple(tuple(g) for g in raw)


def _read_tamper(t: _Table) -> tuple[str, ...]:
    raw = t.data["tamper"]
    if not isinstance(raw, list) or not raw or not all(x in TAMPERS for x in raw):
        raise t.fail("tamper", raw, f"must be a non-empty list drawn from: {', '.join(TAMPERS)}")
    return tuple(raw)


def _read_random(t: _Table) -> RandomFaults:
    window_raw = t.data.get("window", [0, 0])
    if not (isinstance(window_raw, list) and len(window_raw) == 2):
        raise t.fail("window", window_raw, "must be [start, end] in seconds or durations")
    start, end = (parse_duration(x) for x in window_raw)
    if start is None or end is None or end < start or start < 0:
        raise t.fail("window", window_raw, "must be [start, end] with 0 <= start <= end")
    counts = {k: t.integer(k, 0, low=0, high=1000) for k in _RANDOM_KEYS[:7]}
    if any(counts.values()) and end <= start:
        raise t.fail("window", window_raw, "must be a non-empty span when faults are drawn")
    return RandomFaults(
        window=(start, end), max_length=t.duration("max_length", 10.0, low=0.001),
        max_jump=t.duration("max_jump", 300.0), **counts,
    )


def _read_expect(t: _Table) -> Expect:
    return Expect(
        converge_within=t.duration("converge_within", 120.0, low=0.001),
        median_reach=t.duration("median_reach", None),
        max_reach=t.duration("max_reach", None),
        requests_per_event=t.number("requests_per_event", None),
    )


def _check_network_nodes(s: Scenario) -> None:
    if s.topology == "random-k" and len(s.nodes) < 2:
        raise ScenarioError(f"{s.source}: topology.kind=\"random-k\" needs at least 2 nodes")
    for w in s.workloads:
        if w.start >= s.duration:
            raise ScenarioError(
                f"{s.source}: a workload starts at {w.start:g} s, at or after duration="
                f"{s.duration:g} s, so it would never run"
            )


def render_scenario(s: Scenario) -> str:
    """The Scenario as a scenario file that parses back to the same run (used to print
    failing hypothesis examples)."""
    def q(items: tuple[str, ...]) -> str:
        return "[" + ", ".join(f'"{n}"' for n in items) + "]"

    lines = [f'name = "{s.name}"', f"seed = {s.seed}", f"duration = {s.duration!r}",
             f"replay = {s.replay!r}"]
    if s.sample_every is not None:
        lines.append(f"sample_every = {s.sample_every!r}")
    lines += ["", "[nodes]", f"names = {q(s.nodes)}", f"agents = {s.agents}",
              f"skew_max = {s.skew_max!r}", f"upstream = {q(s.upstream)}"]
    if s.skew:
        lines.append("skew = { " + ", ".join(f"{n} = {v!r}" for n, v in s.skew) + " }")
    lines += ["", "[topology]", f'kind = "{s.topology}"']
    if s.topology == "random-k":
        lines.append(f"k = {s.k}")
    if s.topology == "hub-and-spoke":
        lines.append(f'hub = "{s.hub or s.nodes[0]}"')
    if s.topology == "edges":
        lines.append("edges = [" + ", ".join(f'["{a}", "{b}"]' for a, b in s.edges) + "]")
    lines += ["", "[network]", *_link_toml(s.link), "", "[sync]", *_sync_toml(s.sync), "",
              "[expect]", *_expect_toml(s.expect)]
    r = s.random
    if any((r.partitions, r.oneways, r.crashes, r.clock_jumps, r.flaps, r.slow,
            r.link_faults)):
        lines += ["", "[random]", f"window = [{r.window[0]!r}, {r.window[1]!r}]",
                  f"max_length = {r.max_length!r}", f"max_jump = {r.max_jump!r}"]
        lines += [f"{k} = {getattr(r, k)}" for k in _RANDOM_KEYS[:7]]
    for w in s.workloads:
        lines += ["", "[[workload]]", f"nodes = {q(w.nodes)}", f"rate = {w.rate!r}",
                  f"from = {w.start!r}", f"patch_bytes = {w.patch_bytes}"]
        if math.isfinite(w.until):
            lines.append(f"until = {w.until!r}")
        lines.append("mix = { " + ", ".join(f"{a} = {v!r}" for a, v in w.mix) + " }")
    for f in s.faults:
        lines += ["", "[[fault]]", *_fault_toml(f)]
    return "\n".join(lines) + "\n"


def _link_toml(link: LinkSpec) -> list[str]:
    return [_latency_toml(link.latency), f"loss = {link.loss!r}",
            f"duplicate = {link.duplicate!r}", f"reorder = {link.reorder!r}",
            f"reorder_delay = {link.reorder_delay!r}"]


def _sync_toml(sync: SyncSpec) -> list[str]:
    out = [f'mode = "{sync.mode}"']
    for key in ("interval", "jitter", "debounce", "backoff_base", "backoff_cap", "timeout",
                "retry_backoff", "retry_max"):
        out.append(f"{key} = {getattr(sync, key)!r}")
    out += [f"notify = {str(sync.notify).lower()}", f"extensions = {str(sync.extensions).lower()}",
            f"max_page = {sync.max_page}", f"origins_in_flight = {sync.origins_in_flight}",
            f"attempts = {sync.attempts}"]
    if sync.page_limit is not None:
        out.append(f"page_limit = {sync.page_limit}")
    return out


def _expect_toml(expect: Expect) -> list[str]:
    out = [f"converge_within = {expect.converge_within!r}"]
    for key in ("median_reach", "max_reach", "requests_per_event"):
        if getattr(expect, key) is not None:
            out.append(f"{key} = {getattr(expect, key)!r}")
    return out


def _latency_toml(lat: Latency) -> str:
    if lat.dist == "fixed":
        return f"latency = {lat.a!r}"
    keys = {"uniform": ("min", "max"), "normal": ("mean", "sd"), "exponential": ("mean",),
            "lognormal": ("median", "sigma")}[lat.dist]
    values = (lat.a, lat.b)
    inner = ", ".join(f"{k} = {v!r}" for k, v in zip(keys, values, strict=False))
    return f'latency = {{ dist = "{lat.dist}", {inner} }}'


def _fault_toml(f: Fault) -> list[str]:
    out = [f'kind = "{f.kind}"', f"at = {f.at!r}"]
    if f.until is not None:
        out.append(f"until = {f.until!r}")
    names = _FAULT_KIND_KEYS[f.kind]

    def q(items: tuple[str, ...]) -> str:
        return "[" + ", ".join(f'"{n}"' for n in items) + "]"

    if "node" in names and f.node:
        out.append(f'node = "{f.node}"')
    for key in ("nodes", "src", "dst"):
        if key in names and getattr(f, key):
            out.append(f"{key} = {q(getattr(f, key))}")
    if "groups" in names:
        out.append("groups = [" + ", ".join(q(g) for g in f.groups) + "]")
    if f.kind == "clock_jump":
        out.append(f"by = {f.by!r}")
    if f.kind == "crash" and f.mid_apply:
        out.append("mid_apply = true")
    if f.kind == "flap":
        out.append(f"period = {f.period!r}")
    if f.kind == "slow":
        out.append(f"serve_delay = {f.serve_delay!r}")
    if f.kind == "restore":
        out.append(f"backup_at = {f.backup_at!r}")
    if f.kind == "byzantine":
        out += [f"rate = {f.rate!r}", f"tamper = {q(f.tamper)}"]
    if f.kind == "link" and f.link is not None:
        link = _link_toml(f.link)
        out += link if f.link.latency.a >= 0 else link[1:]
    return out
