"""One chaos run: a cluster, then rounds of (faults + workload, heal, convergence, check).

A round is the nemesis window (``window`` seconds of faults drawn by
``schedule.make_schedule`` while the workload appends), then ``heal_all``, then the wait
for convergence (bounded by ``converge_timeout``; the time reported is from the network
heal, ``heal_at``) and the checker, which also looks for every append the CLI reported
failed. A round fails when the workload acknowledged nothing in it (nothing was checked);
a run fails when a kind of its mix was scheduled and never ran because the nemesis could
not carry it out (an error), and says which kinds did not run otherwise. A soak repeats rounds
until ``duration`` has passed; the tests run one round per seed. The run's directory
holds ``timeline.jsonl`` (as it happens), ``verdict.json``, ``timeline.png`` and every
process's log; ``RunResult.replay`` is the command that replays its nemesis schedule.
"""

from __future__ import annotations

import random
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from statistics import median
from typing import Any

from logsync.chaos import netns
from logsync.chaos.checker import check, read_replica, wait_converged
from logsync.chaos.cluster import Cluster, ClusterConfig, edges
from logsync.chaos.interop import REPO_ROOT
from logsync.chaos.interop import hub as H
from logsync.chaos.nemesis import Nemesis, heal_all
from logsync.chaos.report import plot, write_json
from logsync.chaos.schedule import NETWORK, Fault, make_schedule, parse_mix
from logsync.chaos.timeline import Timeline
from logsync.chaos.workload import Workload

NEMESIS_JOIN_S = 90.0  # a fault step may wait for a restart (30 s) and more


@dataclass
class RunConfig:
    seed: int
    out: Path
    topology: str = "mesh"
    mix: str = "standard"
    nodes: int = 5
    mode: str = "auto"
    window: float = 40.0
    rounds: int = 1
    duration: float = 0.0  # > 0: a soak, rounds until this many seconds have passed
    rate: float = 4.0
    interval: float = 2.0
    converge_timeout: float = 120.0
    daemon_module: str = "logsync"
    expected_ledgers: bool = False
    echo: bool = False

    def members(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)] + ["hub"]

    def disk_nodes(self) -> tuple[str, ...]:
        if "disk" not in parse_mix(self.mix):
            return ()
        return (f"n{random.Random(self.seed).randint(1, self.nodes)}",)

    def lossy_links(self, mode: str) -> list[tuple[str, str]]:
        """Links a ``lossy`` fault may hit: all in loopback mode, two drawn in netns mode."""
        if "lossy" not in parse_mix(self.mix):
            return []
        links = [pair for a, b in edges(self.topology, self.members()) for pair in
                 ((a, b), (b, a))]
        if mode == "loopback":
            return links
        return sorted(random.Random(self.seed + 7).sample(links, min(2, len(links))))

    def replay(self, mode: str) -> str:
        """The command line of this run: every setting the command line has, the ones that
        differ from its defaults too, numbers written so its parser reads them back."""
        argv = ["python", "-m", "logsync.chaos", "--seed", str(self.seed), "--topology",
                self.topology, "--mix", self.mix, "--nodes", str(self.nodes), "--mode", mode,
                "--window", _number(self.window)]
        argv += (["--duration", _number(self.duration)] if self.duration
                 else ["--rounds", str(self.rounds)])
        defaults = RunConfig(seed=0, out=Path())
        for option, name in (("--rate", "rate"), ("--interval", "interval"),
                             ("--converge-timeout", "converge_timeout")):
            if getattr(self, name) != getattr(defaults, name):
                argv += [option, _number(getattr(self, name))]
        if self.daemon_module != defaults.daemon_module:
            argv += ["--daemon-module", self.daemon_module]
        return shlex.join(argv)


def _number(value: float) -> str:
    """``value`` in plain decimals, exactly (``repr``'s digits; no exponent, which the
    command line's duration parser does not take): 1e6 -> 1000000, 0.5 -> 0.5."""
    text = format(Decimal(repr(float(value))), "f")
    return text[:-2] if text.endswith(".0") else text


@dataclass
class RunResult:
    ok: bool
    summary: dict[str, Any]
    out: Path
    replay: str
    leftovers: list[str] = field(default_factory=list)

    def line(self) -> str:
        s = self.summary
        conv = s["convergence_s"]
        not_run = s.get("faults_not_run") or {}
        return (f"seed {s['seed']} {s['topology']}/{s['mix']} ({s['mode']}): "
                f"{'PASS' if self.ok else 'FAIL'}; acknowledged {s['acknowledged']}, lost "
                f"{s['lost']}, duplicated {s['duplicated']}, divergent {s['divergent']}; "
                f"heal->converged median {conv['median']} s, max {conv['max']} s"
                + (f"; faults of the mix that never ran: {', '.join(sorted(not_run))}"
                   if not_run else ""))


def run(cfg: RunConfig, mempalace_exe: Path | None = None) -> RunResult:
    """Run it; everything the harness made is gone when this returns (or raises)."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    timeline = Timeline(cfg.out / "timeline.jsonl", echo=cfg.echo)
    exe = mempalace_exe or H.ensure_mempalace()
    kinds = parse_mix(cfg.mix)
    proxied = tuple(cfg.lossy_links("netns")) if cfg.mode != "loopback" else ()
    cluster = Cluster(ClusterConfig(
        root=cfg.out, nodes=cfg.nodes, topology=cfg.topology, mode=cfg.mode,
        interval=cfg.interval, disk_nodes=cfg.disk_nodes(), proxied=proxied,
        daemon_module=cfg.daemon_module, seed=cfg.seed), timeline, exe)
    rounds: list[dict[str, Any]] = []
    workload = Workload(cluster, timeline, seed=cfg.seed, rate=cfg.rate)
    try:
        with cluster:
            links = cfg.lossy_links(cluster.mode)
            for round_no in range(10_000 if cfg.duration else cfg.rounds):
                faults = make_schedule(cfg.seed, kinds, cfg.window, cfg.members(),
                                       disk_nodes=list(cfg.disk_nodes()), links=links,
                                       round_no=round_no)
                rounds.append(_round(cfg, cluster, timeline, workload, faults, round_no))
                if cfg.duration and timeline.now() >= cfg.duration:
                    break
    finally:
        problems = cluster.close()
        leftovers = netns.find([cluster.tag]).describe() if cluster.tag else []
    summary = _summary(cfg, cluster, workload, rounds, problems, leftovers)
    result = RunResult(ok=summary["ok"], summary=summary, out=cfg.out,
                       replay=cfg.replay(cluster.mode), leftovers=leftovers)
    png = plot(summary, timeline.entries, cfg.out / "timeline.png")
    summary["plot"] = str(png) if png else None
    write_json(summary, cfg.out / "verdict.json")
    timeline.log("verdict", ok=result.ok, line=result.line(), replay=result.replay)
    return result


def _round(cfg: RunConfig, cluster: Cluster, timeline: Timeline, workload: Workload,
           faults: list[Fault], round_no: int) -> dict[str, Any]:
    began = timeline.now()
    first_op = len(workload.history)
    timeline.log("round", round=round_no, window=cfg.window,
                 schedule=[f.as_dict() for f in faults])
    nemesis = Nemesis(cluster, timeline, faults, round_no)
    stop_faults, stop_appends = threading.Event(), threading.Event()
    threads = [threading.Thread(target=nemesis.run, args=(began, stop_faults),
                                name="chaos-nemesis", daemon=True),
               threading.Thread(target=workload.run, args=(stop_appends, round_no),
                                name="chaos-workload", daemon=True)]
    for thread in threads:
        thread.start()
    deadline = began + cfg.window
    while timeline.now() < deadline:
        time.sleep(min(0.5, max(0.01, deadline - timeline.now())))
    stop_faults.set()  # a fault still running is ended by the heal (a pause by the nemesis)
    stop_appends.set()
    for thread in threads:
        thread.join(NEMESIS_JOIN_S)
    healing = timeline.now()
    heal_problems = heal_all(cluster, timeline, round_no)
    healed = timeline.now()
    # replication resumes at the network heal: convergence is timed from there (the
    # restarts that follow it in heal_all are part of the recovery, not before it)
    heal_at = next((float(e["t"]) for e in timeline.of("network_healed")
                    if e.get("round") == round_no and e["t"] >= round(healing, 3) - 0.001),
                   healing)
    ran = _ran(timeline, round_no, faults, heal_at, healed)
    acked = workload.acknowledged()
    failed = [o.tag for o in list(workload.history) if o.outcome == "fail"]
    members = list(cluster.nodes.values())

    def read(deep: bool = False) -> list:
        return [read_replica(n.name, n.kind, n.palace, deep=deep) for n in members]

    took = wait_converged(read, acked, timeout=cfg.converge_timeout,
                          since=timeline.t0 + heal_at)
    timeline.log("converged" if took is not None else "not_converged", round=round_no,
                 after_heal_s=None if took is None else round(took, 2))
    verdict = check(read(deep=True), acked, failed=failed,
                    expected_ledgers=cfg.expected_ledgers)
    verdict.converged = took is not None
    verdict.convergence_s = None if took is None else round(took, 2)
    if took is None:
        verdict.fail(f"did not converge within {cfg.converge_timeout:g} s of the heal")
    for problem in heal_problems:
        verdict.fail(f"could not heal: {problem}")
    ops = list(workload.history)[first_op:]  # this round's
    appends = {o: sum(1 for x in ops if x.outcome == o) for o in ("ok", "fail", "info")}
    if not appends["ok"]:
        verdict.fail(f"the workload acknowledged no append this round ({len(ops)} tried: "
                     f"{appends['fail']} failed, {appends['info']} indeterminate): "
                     "nothing was checked")
    timeline.log("check", round=round_no, ok=verdict.ok, problems=verdict.problems[:10])
    return {"round": round_no, "began": round(began, 2), "heal_at": round(heal_at, 2),
            "healed_at": round(healed, 2), "convergence_s": verdict.convergence_s,
            "faults": [{**f.as_dict(), "ran": r} for f, r in zip(faults, ran, strict=True)],
            "nemesis_errors": nemesis.errors, "verdict": verdict.as_dict(),
            "appends": appends}


def _ran(timeline: Timeline, round_no: int, faults: list[Fault], heal_at: float,
         healed: float) -> list[list[float] | None]:
    """When each fault of the round really began and ended (if it did not end: the network
    heal for a network fault, the end of the heal for the others)."""
    acts = [e for e in timeline.of("fault") if e.get("round") == round_no]
    out: list[list[float] | None] = []
    for index, fault in enumerate(faults):
        times = {e["phase"]: e["t"] for e in acts if e["index"] == index}
        ended = heal_at if fault.kind in NETWORK else healed
        out.append([times["begin"], round(times.get("end", ended), 3)]
                   if "begin" in times else None)
    return out


def source_of_checkout() -> dict[str, Any]:
    """The commit the daemons ran and whether the checkout had uncommitted changes: a run
    from a tree someone is editing can load half an edit into a restarted daemon (a soak
    once did), so a verdict says what it judged."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True,
                                  text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no", "--", "logsync")
    return {"commit": git("rev-parse", "HEAD"),
            "dirty": None if status is None else bool(status)}


def _summary(cfg: RunConfig, cluster: Cluster, workload: Workload, rounds: list[dict],
             problems: list[str], leftovers: list[str]) -> dict[str, Any]:
    times = [r["convergence_s"] for r in rounds if r["convergence_s"] is not None]
    verdicts = [r["verdict"] for r in rounds]
    history = workload.history
    acknowledged = sum(1 for o in history if o.outcome == "ok")
    ran, not_run, failing = _faults_run(cfg, rounds)
    ok = (bool(rounds) and all(v["ok"] for v in verdicts) and not leftovers and not problems
          and acknowledged > 0 and not failing)
    run_problems = failing + (["the workload acknowledged no append: nothing was checked"]
                              if not acknowledged else [])
    return {
        "ok": ok, "seed": cfg.seed, "topology": cfg.topology, "mix": cfg.mix,
        "mode": cluster.mode, "mode_reason": cluster.mode_reason, "tag": cluster.tag,
        "members": cfg.members(),
        "window_s": cfg.window, "rounds_run": len(rounds), "interval_s": cfg.interval,
        "replay": cfg.replay(cluster.mode or cfg.mode),
        "problems": run_problems,
        "acknowledged": acknowledged,
        "failed": sum(1 for o in history if o.outcome == "fail"),
        "indeterminate": sum(1 for o in history if o.outcome == "info"),
        "lost": max((len(v["lost"]) for v in verdicts), default=0),
        "duplicated": max((len(v["duplicated"]) for v in verdicts), default=0),
        "divergent": max((len(v["divergent"]) for v in verdicts), default=0),
        "convergence_s": {"median": round(median(times), 2) if times else None,
                          "max": round(max(times), 2) if times else None,
                          "each": times},
        "faults": ran, "faults_not_run": not_run,
        "nemesis_errors": [e for r in rounds for e in r.get("nemesis_errors", [])],
        "cleanup_problems": problems, "leftovers": leftovers, "swept_at_start": cluster.swept,
        "source": source_of_checkout(),
        "rounds": rounds, "history": [o.as_dict() for o in history],
    }


def _faults_run(cfg: RunConfig, rounds: list[dict]) -> tuple[dict[str, int], dict[str, str],
                                                            list[str]]:
    """Faults that ran, by kind; the kinds of the mix that never ran, and why; and the
    problems that fail the run: a kind scheduled whose every fault the nemesis failed to
    carry out (a ``nemesis_error``: the run did not test what it says it did). A kind that
    was never scheduled (a window too short for it) or never began without an error (the
    window closed first: an earlier step ran late) is reported, not failed: the harness
    did nothing wrong that the verdict could trust less for."""
    faults = [f for r in rounds for f in r["faults"]]
    ran: dict[str, int] = {}
    for f in faults:
        if f.get("ran"):
            ran[f["kind"]] = ran.get(f["kind"], 0) + 1
    errors = [e for r in rounds for e in r.get("nemesis_errors", [])]
    not_run: dict[str, str] = {}
    failing: list[str] = []
    try:
        mix = parse_mix(cfg.mix)
    except ValueError:
        mix = ()
    for kind in sorted(set(mix) | {f["kind"] for f in faults}):
        if ran.get(kind):
            continue
        scheduled = sum(1 for f in faults if f["kind"] == kind)
        errored = [e for e in errors if e.split(" ", 1)[0] == kind]
        if not scheduled:
            not_run[kind] = "never scheduled"
        elif errored:
            not_run[kind] = f"{scheduled} scheduled, none ran: {errored[0][:200]}"
            failing.append(f"fault {kind}: {not_run[kind]}")
        else:
            not_run[kind] = f"{scheduled} scheduled, none began before the window closed"
    return dict(sorted(ran.items())), not_run, failing
