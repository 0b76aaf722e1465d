"""What a scenario is: the frozen spec types a scenario file becomes, the names each
choice allows, and the keys each table of the file allows.

`scenario.py` reads a file into these types (one sentence naming the bad key),
`render.py` writes them back out as a file; the simulator's modules take them as they are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from logsync.defaults import DEFAULT_COALESCE_S, DEFAULT_DEBOUNCE_S, DEFAULT_ORIGINS_IN_FLIGHT
from logsync.errors import ConfigError
from logsync.hostile import SIM_KINDS
from logsync.outbox import LAZY_S

TOPOLOGIES = ("full-mesh", "hub-and-spoke", "ring", "random-k", "edges")
LATENCY_DISTS = ("fixed", "uniform", "normal", "exponential", "lognormal")
SYNC_MODES = ("round", "targeted")
ACTIONS = ("ask", "reply", "ack", "patch", "claim", "note")
TAMPERS = ("corrupt", "bad_artifact", "wrong_origin", "stale_fork", "id_reuse", "fork",
           *SIM_KINDS)  # the hostile corpus shared with tests/hostile/ (logsync.hostile)
FAULT_KINDS = (
    "partition", "oneway", "isolate", "crash", "clock_jump", "slow", "link", "flap",
    "restore", "byzantine", "overload", "clone",
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
    coalesce: float = DEFAULT_COALESCE_S  # frames to one subscriber: one batch per window
    pages: bool = True  # logsync subscribers take page frames (`streamframes.py`)
    lazy: float = LAZY_S  # a lazy name waits this long for an eager write (`outbox.py`)


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
    retry_after: float = 0.0  # overload: the Retry-After its 503s carry (0: none)
    of: str | None = None  # clone: the node whose palace `node` becomes a copy of

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
        if self.kind == "clone":
            parts.append(f"of={self.of}")
        if self.kind == "byzantine":
            parts.append(f"rate={self.rate:g} tamper={','.join(self.tamper)}")
        if self.kind == "flap":
            parts.append(f"period={self.period:g}")
        if self.kind == "slow":
            parts.append(f"serve_delay={self.serve_delay:g}")
        if self.kind == "overload":
            parts.append(f"retry_after={self.retry_after:g}")
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
    messages_per_event: float | None = None  # as Maelstrom counts: requests, answers, frames


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

    def digest(self) -> str:
        """sha256 of what this scenario runs: not its seed, its name, its variant's name,
        its file's path or its description, and skews in any order. Two reports with the
        same digest and seed ran the same scenario (a changed trace is then the code's
        doing), whatever the file's comments, layout or name."""
        fields = {k: v for k, v in asdict(self).items()
                  if k not in ("seed", "source", "description", "name", "variant")}
        fields["skew"] = sorted(fields["skew"])
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ── the keys each table of a scenario file allows ────────────────────

TOP_KEYS = (
    "name", "description", "seed", "duration", "nodes", "topology", "network", "sync",
    "workload", "fault", "random", "expect", "sample_every", "replay",
)
NODE_KEYS = ("count", "names", "skew", "skew_max", "upstream", "agents")
TOPOLOGY_KEYS = ("kind", "k", "hub", "edges")
LINK_KEYS = ("latency", "loss", "duplicate", "reorder", "reorder_delay")
NETWORK_KEYS = LINK_KEYS
SYNC_KEYS = (
    "mode", "interval", "jitter", "debounce", "backoff_base", "backoff_cap", "notify",
    "page_limit", "extensions", "timeout", "attempts", "retry_backoff", "retry_max",
    "max_page", "origins_in_flight", "coalesce", "pages", "lazy",
)
WORKLOAD_KEYS = ("nodes", "rate", "from", "until", "mix", "patch_bytes")
FAULT_KEYS = (
    "kind", "at", "until", "node", "nodes", "groups", "src", "dst", "by", "period",
    "serve_delay", "mid_apply", "backup_at", "rate", "tamper", "retry_after", "of",
    *LINK_KEYS,
)
FAULT_KIND_KEYS = {
    "partition": ("groups",),
    "oneway": ("src", "dst"),
    "isolate": ("node",),
    "crash": ("node", "mid_apply"),
    "clock_jump": ("node", "by"),
    "slow": ("node", "serve_delay"),
    "link": ("src", "dst", *LINK_KEYS),
    "flap": ("nodes", "period"),
    "restore": ("node", "backup_at"),
    "byzantine": ("node", "rate", "tamper"),
    "overload": ("node", "retry_after"),
    "clone": ("node", "of"),
}
FAULT_REQUIRED = {
    "partition": ("groups",), "oneway": ("src", "dst"), "isolate": ("node",),
    "crash": ("node",), "clock_jump": ("node", "by"), "slow": ("node", "serve_delay"),
    "link": ("src", "dst"), "flap": ("nodes",), "restore": ("node", "backup_at"),
    "byzantine": ("node", "tamper"), "overload": ("node",), "clone": ("node", "of"),
}
RANDOM_KEYS = (
    "partitions", "oneways", "crashes", "clock_jumps", "flaps", "slow", "link_faults",
    "window", "max_length", "max_jump",
)
EXPECT_KEYS = ("converge_within", "median_reach", "max_reach", "requests_per_event",
               "messages_per_event")

# A workload without a `mix` table does these actions with these weights.
MIX_DEFAULT = (("ask", 4.0), ("reply", 3.0), ("ack", 2.0), ("patch", 1.0), ("claim", 1.0),
               ("note", 1.0))
