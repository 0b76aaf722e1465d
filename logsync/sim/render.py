"""A `Scenario` back to a scenario file that parses to the same run (hypothesis prints a
failing example this way, to replay with `logsync simulate FILE`)."""

from __future__ import annotations

import math

from logsync.sim.spec import (
    FAULT_KIND_KEYS,
    RANDOM_KEYS,
    Expect,
    Fault,
    Latency,
    LinkSpec,
    Scenario,
    SyncSpec,
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
        lines += [f"{k} = {getattr(r, k)}" for k in RANDOM_KEYS[:7]]
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
    for key in ("median_reach", "max_reach", "requests_per_event", "messages_per_event"):
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
    names = FAULT_KIND_KEYS[f.kind]

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
    if f.kind == "overload":
        out.append(f"retry_after = {f.retry_after!r}")
    if f.kind == "restore":
        out.append(f"backup_at = {f.backup_at!r}")
    if f.kind == "clone":
        out.append(f'of = "{f.of}"')
    if f.kind == "byzantine":
        out += [f"rate = {f.rate!r}", f"tamper = {q(f.tamper)}"]
    if f.kind == "link" and f.link is not None:
        link = _link_toml(f.link)
        out += link if f.link.latency.a >= 0 else link[1:]
    return out
