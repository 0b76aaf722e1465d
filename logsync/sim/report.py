"""What a run found: figures, faults, violations, graded against the scenario's targets."""

from __future__ import annotations

import math
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Any

from logsync.sim.spec import Expect


@dataclass(frozen=True)
class Violation:
    invariant: int
    name: str
    text: str
    at: float

    def line(self) -> str:
        label = "liveness" if self.invariant == 0 else f"invariant {self.invariant} ({self.name})"
        return f"t={self.at:.3f}s {label}: {self.text}"


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values."""
    if not values:
        return None
    rank = max(1, math.ceil(q * len(values)))
    return values[rank - 1]


@dataclass
class SimReport:
    scenario: str
    variant: str | None
    seed: int
    source: str
    trace_hash: str
    trace_lines: int
    scenario_digest: str  # `Scenario.digest`: what ran, its seed, names, path and description aside
    nodes: list[str]
    duration: float
    heal_at: float | None
    converged_at: float | None
    convergence_s: float | None
    events: int
    artifacts: int
    requests: dict[str, int]
    requests_total: int
    bytes: int
    answers: int
    notifications: int
    rounds: int
    rounds_failed: int
    applies: int
    replays: int
    tampered: int
    skipped_writes: int
    reach_count: int
    reach_median: float | None
    reach_p99: float | None
    reach_max: float | None
    lost: int
    conflicts: dict[str, int]
    quarantined: dict[str, int]
    conflict_kinds: dict[str, int]
    quarantine_reasons: dict[str, int]
    divergent: int
    divergent_recorded: int
    views: dict[str, Any]
    faults: list[str]
    windows: list[dict[str, Any]]
    samples: list[tuple[float, list[int]]]
    violations: list[Violation]
    wall_seconds: float
    expect: Expect
    net: dict[str, int] = field(default_factory=dict)

    @property
    def requests_per_event(self) -> float | None:
        return self.requests_total / self.events if self.events else None

    @property
    def messages_total(self) -> int:
        """Messages as Maelstrom counts them: each request, each answer, each change frame."""
        return self.requests_total + self.answers + self.notifications

    @property
    def messages_per_event(self) -> float | None:
        return self.messages_total / self.events if self.events else None

    @property
    def bytes_per_event(self) -> float | None:
        return self.bytes / self.events if self.events else None

    @property
    def ok(self) -> bool:
        return not self.violations

    def targets(self) -> dict[str, dict[str, Any]]:
        """Each graded target: wanted, got, met."""
        e = self.expect
        graded: dict[str, dict[str, Any]] = {}
        for name, wanted, got in (
            ("median_reach_s", e.median_reach, self.reach_median),
            ("max_reach_s", e.max_reach, self.reach_max),
            ("requests_per_event", e.requests_per_event, self.requests_per_event),
            ("messages_per_event", e.messages_per_event, self.messages_per_event),
        ):
            if wanted is not None:
                graded[name] = {"target": wanted, "got": got,
                                "met": got is not None and got < wanted}
        return graded

    def targets_met(self) -> bool:
        return all(t["met"] for t in self.targets().values())

    def missed(self) -> list[str]:
        """The targets this run missed, by name."""
        return [name for name, t in self.targets().items() if not t["met"]]

    def verdict(self) -> str:
        """OK; FAILED (an invariant or liveness broke); or TARGETS MISSED (naming them)."""
        if not self.ok:
            return "FAILED"
        missed = self.missed()
        return f"TARGETS MISSED ({', '.join(missed)})" if missed else "OK"

    def replay(self) -> str:
        """The command that runs this seed again, as a shell reads it."""
        variant = f" --variant {shlex.quote(self.variant)}" if self.variant else ""
        return f"logsync simulate {shlex.quote(self.source)}{variant} --seed {self.seed}"

    def max_lag(self) -> dict[str, int]:
        return {name: max((s[1][i] for s in self.samples), default=0)
                for i, name in enumerate(self.nodes)}

    def as_dict(self, *, samples: bool = True) -> dict[str, Any]:
        out = {
            "scenario": self.scenario, "variant": self.variant, "seed": self.seed,
            "source": self.source, "ok": self.ok, "targets_missed": self.missed(),
            "replay": self.replay(), "trace_hash": self.trace_hash,
            "trace_lines": self.trace_lines, "scenario_digest": self.scenario_digest,
            "nodes": self.nodes,
            "virtual_time": {"duration_s": self.duration, "heal_at_s": self.heal_at,
                             "converged_at_s": self.converged_at,
                             "convergence_after_heal_s": self.convergence_s},
            "events": self.events, "artifacts": self.artifacts,
            "requests": {"total": self.requests_total, "by_path": self.requests,
                         "per_event": _round(self.requests_per_event)},
            "bytes": {"total": self.bytes, "per_event": _round(self.bytes_per_event)},
            "notifications": self.notifications,
            "messages": {"total": self.messages_total, "requests": self.requests_total,
                         "answers": self.answers, "change_frames": self.notifications,
                         "per_event": _round(self.messages_per_event)},
            "rounds": {"total": self.rounds, "failed": self.rounds_failed},
            "applies": self.applies, "replays_checked": self.replays,
            "tampered_answers": self.tampered, "writes_skipped_node_down": self.skipped_writes,
            "reach": {"events_reaching_every_node": self.reach_count,
                      "median_s": _round(self.reach_median), "p99_s": _round(self.reach_p99),
                      "max_s": _round(self.reach_max), "lost": self.lost},
            "targets": self.targets(),
            "conflicts": self.conflicts, "conflict_kinds": self.conflict_kinds,
            "quarantined": self.quarantined, "quarantine_reasons": self.quarantine_reasons,
            "divergent_slots": {"total": self.divergent, "recorded": self.divergent_recorded},
            "views": self.views, "max_lag_ops": self.max_lag(), "faults": self.faults,
            "network": self.net,
            "violations": [v.line() for v in self.violations],
            "wall_seconds": round(self.wall_seconds, 3),
        }
        if samples:
            out["lag_samples"] = [{"t": round(t, 6), "lag": lags} for t, lags in self.samples]
        return out

    def text(self) -> str:
        name = self.scenario + (f" [{self.variant}]" if self.variant else "")
        lines = [f"scenario {name} seed={self.seed}: {self.verdict()}",
                 f"  trace sha256 {self.trace_hash} ({self.trace_lines} lines)",
                 f"  scenario sha256 {self.scenario_digest} (what runs: seed, names and path "
                 "aside)"]
        if self.verdict() != "OK":
            lines.append(f"  replay with `{self.replay()}`")
        conv = "never" if self.convergence_s is None else f"{self.convergence_s:.3f} s"
        lines.append(f"  nodes {len(self.nodes)}, events {self.events}, artifacts "
                     f"{self.artifacts}, applies {self.applies}")
        lines.append(f"  convergence after heal (t={_fmt(self.heal_at)} s): {conv}")
        lines.append(f"  requests {self.requests_total} ({_fmt(self.requests_per_event)}/event), "
                     f"bytes {self.bytes} ({_fmt(self.bytes_per_event, 0)}/event), "
                     f"notifications {self.notifications}")
        lines.append(f"  messages {self.messages_total} ({_fmt(self.messages_per_event)}/event, "
                     f"as Maelstrom counts: {self.requests_total} requests, {self.answers} "
                     f"answers, {self.notifications} change frames)")
        lines.append("  requests by path: " + ", ".join(f"{p} {n}" for p, n in
                                                         self.requests.items()))
        lines.append(f"  rounds {self.rounds} ({self.rounds_failed} failed)")
        lines.append(f"  reach every node: median {_fmt(self.reach_median)} s, p99 "
                     f"{_fmt(self.reach_p99)} s, max {_fmt(self.reach_max)} s "
                     f"({self.reach_count}/{self.events} events, {self.lost} never reached "
                     "every node)")
        for target, t in self.targets().items():
            lines.append(f"  target {target} < {t['target']:g}: got {_fmt(t['got'])} "
                         f"{'met' if t['met'] else 'MISSED'}")
        lines.append(f"  conflicts {sum(self.conflicts.values())} {self.conflict_kinds or ''}"
                     f"  quarantined {sum(self.quarantined.values())}")
        for reason, count in self.quarantine_reasons.items():
            lines.append(f"    quarantine x{count}: {reason}")
        lag = self.max_lag()
        worst = sorted(lag.items(), key=lambda kv: -kv[1])[:5]
        lines.append("  max lag (ops behind): " + ", ".join(f"{n} {v}" for n, v in worst))
        if self.faults:
            lines.append(f"  faults ({len(self.faults)}):")
            lines += [f"    {f}" for f in self.faults[:12]]
            if len(self.faults) > 12:
                lines.append(f"    ... {len(self.faults) - 12} more (see --json)")
        if self.violations:
            lines.append(f"  VIOLATIONS ({len(self.violations)}):")
            lines += [f"    {v.line()}" for v in self.violations[:20]]
        lines.append(f"  wall clock {self.wall_seconds:.2f} s")
        return "\n".join(lines)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summarise(reports: list[SimReport], errors: dict[int, str] | None = None, *,
              scenario_digest: str | None = None) -> dict[str, Any]:
    """A sweep over seeds: pass/fail per seed and the spread of the main figures. `errors`:
    seeds whose run raised (or whose worker died), one sentence each; they count as failed
    and are listed in their place among the seeds. `scenario_digest`: the swept scenario's
    (`Scenario.digest`), else the reports'."""
    errors = errors or {}
    def spread(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {"min": round(min(values), 4), "median": round(statistics.median(values), 4),
                "max": round(max(values), 4)}

    return {
        "runs": len(reports) + len(errors),
        "scenario_digest": scenario_digest or next((r.scenario_digest for r in reports), None),
        "failed_seeds": sorted([r.seed for r in reports if not r.ok] + list(errors)),
        "targets_missed_seeds": [r.seed for r in reports if not r.targets_met()],
        "convergence_s": spread([r.convergence_s for r in reports
                                 if r.convergence_s is not None]),
        "requests_per_event": spread([r.requests_per_event for r in reports
                                      if r.requests_per_event is not None]),
        "messages_per_event": spread([r.messages_per_event for r in reports
                                      if r.messages_per_event is not None]),
        "reach_median_s": spread([r.reach_median for r in reports if r.reach_median is not None]),
        "reach_max_s": spread([r.reach_max for r in reports if r.reach_max is not None]),
        "conflicts": sum(sum(r.conflicts.values()) for r in reports),
        "quarantined": sum(sum(r.quarantined.values()) for r in reports),
        "wall_seconds": round(sum(r.wall_seconds for r in reports), 3),
        "seeds": sorted([{"seed": r.seed, "ok": r.ok, "targets_missed": r.missed(),
                          "trace_hash": r.trace_hash,
                          "violations": [v.line() for v in r.violations][:5]} for r in reports]
                        + [{"seed": seed, "ok": False, "targets_missed": [], "trace_hash": None,
                            "violations": [], "error": error} for seed, error in errors.items()],
                        key=lambda entry: entry["seed"]),
    }


def summary_text(summary: dict[str, Any], name: str) -> str:
    missed = summary["targets_missed_seeds"]
    lines = [f"sweep {name}: {summary['runs']} seeds, "
             f"{len(summary['failed_seeds'])} failed"
             + (f" ({', '.join(map(str, summary['failed_seeds']))})"
                if summary["failed_seeds"] else "")
             + (f", {len(missed)} missed targets ({', '.join(map(str, missed))})"
                if missed else "")]
    if summary["scenario_digest"]:
        lines.append(f"  scenario sha256 {summary['scenario_digest']} (what runs: seeds, "
                     "names and paths aside)")
    for key in ("convergence_s", "requests_per_event", "messages_per_event", "reach_median_s",
                "reach_max_s"):
        if summary[key]:
            s = summary[key]
            lines.append(f"  {key}: min {s['min']} median {s['median']} max {s['max']}")
    lines.append(f"  conflicts {summary['conflicts']}, quarantined {summary['quarantined']}")
    for seed in summary["seeds"]:
        if seed.get("error"):
            lines.append(f"  seed {seed['seed']}: error: {seed['error']}")
        elif not seed["ok"]:
            lines.append(f"  seed {seed['seed']}: " + "; ".join(seed["violations"][:2]))
        if seed.get("targets_missed"):
            lines.append(f"  seed {seed['seed']}: missed {', '.join(seed['targets_missed'])}")
    # Wall clock last, on a line of its own: the one line that differs between runs.
    elapsed = summary.get("elapsed_seconds")
    lines.append(f"  wall clock {summary['wall_seconds']} s over the seeds"
                 + (f", {elapsed} s elapsed" if elapsed is not None else ""))
    return "\n".join(lines)
