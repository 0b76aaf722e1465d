"""``python -m logsync.chaos``: one chaos run (or a soak) from a seed; exit 0 on PASS.

    python -m logsync.chaos --seed 7                       # one 40 s round, mesh, standard mix
    python -m logsync.chaos --seed 7 --duration 30m        # a soak: 60 s rounds for 30 minutes
    python -m logsync.chaos --seed 7 --schedule-only       # print the nemesis schedule, run nothing

Needs a checkout (it reuses tests/interop/hub.py), the MemPalace 3.11 venv (installed on
first use by scripts/install-mempalace.sh), root and ip(8) for network namespaces (else
loopback with proxies), libfaketime for the skew fault and root for the disk fault.
A failing run prints the command that replays its nemesis schedule.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from logsync.chaos.cluster import MODES, TOPOLOGIES
from logsync.chaos.netns import sweep
from logsync.chaos.run import RunConfig, run
from logsync.chaos.schedule import KINDS, MIXES, make_schedule, parse_mix

_UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: want a duration like 90s, 30m or 2h")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m logsync.chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--topology", choices=TOPOLOGIES, default="mesh")
    p.add_argument("--mix", default="standard",
                   help=f"one of {', '.join(MIXES)}, or a comma list of {', '.join(KINDS)}")
    p.add_argument("--nodes", type=int, default=5, help="logsync daemons (plus one hub)")
    p.add_argument("--mode", choices=MODES, default="auto")
    p.add_argument("--window", type=seconds, default=None,
                   help="seconds of faults per round (default 40 s; 60 s in a soak)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--duration", type=seconds, default=0.0,
                   help="soak: run rounds until this much time has passed (e.g. 30m)")
    p.add_argument("--rate", type=float, default=4.0, help="appends per second (about)")
    p.add_argument("--interval", type=float, default=2.0, help="the daemons' --interval")
    p.add_argument("--converge-timeout", type=seconds, default=120.0)
    p.add_argument("--daemon-module", default="logsync",
                   help="`python -m` this instead of logsync (a planted defect)")
    p.add_argument("--out", type=Path, default=None, help="run directory (default: a new one)")
    p.add_argument("--schedule-only", action="store_true",
                   help="print the nemesis schedule as JSON and exit")
    p.add_argument("--sweep", action="store_true",
                   help="remove what dead harnesses left behind, and exit")
    p.add_argument("--quiet", action="store_true", help="no timeline on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.sweep:
        removed = sweep()
        print("\n".join(removed) if removed else "nothing left behind")
        return 0
    try:
        parse_mix(args.mix)
    except ValueError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    window = args.window or (60.0 if args.duration else 40.0)
    out = args.out or Path(tempfile.mkdtemp(prefix=f"chaos-s{args.seed}-"))
    cfg = RunConfig(seed=args.seed, out=out, topology=args.topology, mix=args.mix,
                    nodes=args.nodes, mode=args.mode, window=window, rounds=args.rounds,
                    duration=args.duration, rate=args.rate, interval=args.interval,
                    converge_timeout=args.converge_timeout,
                    daemon_module=args.daemon_module, echo=not args.quiet)
    if args.schedule_only:
        members = cfg.members()
        links = cfg.lossy_links("loopback" if args.mode == "loopback" else "netns")
        faults = [f.as_dict() for r in range(args.rounds) for f in make_schedule(
            cfg.seed, parse_mix(cfg.mix), window, members, disk_nodes=list(cfg.disk_nodes()),
            links=links, round_no=r)]
        print(json.dumps(faults, indent=1))
        return 0

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)  # SIGTERM cleans up like Ctrl-C
    began = time.monotonic()
    try:
        result = run(cfg)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(result.line())
    print(f"run directory {result.out} (verdict.json, timeline.png, timeline.jsonl, logs/); "
          f"{time.monotonic() - began:.0f} s")
    source = result.summary.get("source") or {}
    print(f"source: commit {source.get('commit') or '?'}"
          + (" with uncommitted changes under logsync/ (not replayable as such)"
             if source.get("dirty") else ""))
    if not result.ok:
        for problem in result.summary.get("problems", []):
            print(f"  run: {problem[:400]}")
        for rnd in result.summary["rounds"]:
            for problem in rnd["verdict"]["problems"][:8]:
                print(f"  round {rnd['round']}: {problem[:400]}")
        if result.leftovers or result.summary["cleanup_problems"]:
            print(f"  cleanup: {result.summary['cleanup_problems']} {result.leftovers}")
        print(f"replay: {result.replay}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
