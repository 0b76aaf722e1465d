"""Simulator floor: a broadcast scenario's wall time against the SQLite work it cannot avoid.

Runs the scenario once (in process, as `logsync simulate` does), then writes the same
number of ops into as many stores of the real schema (`Store.open`), in the same scratch
place (tmpfs when there is one), with raw statements only: for each op its `events` row
and its `logsync_chain` entry, k ops per write transaction, WAL with
`synchronous=NORMAL` (a remote op's commit), plus the scenario's local appends, one
durable transaction each (`synchronous=FULL`). k is 1, the run's own ops per change frame
(one frame is taken in one transaction) and 10. What the run spends above the floor at its
own k is the Python of taking a frame: parsing, validation, canonical bytes and digests,
key checks, the engine's steps and the simulator's bookkeeping.

Usage: python benchmarks/sim_floor.py [--scenario PATH] [--nodes N] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Any

from _harness import REPO_ROOT, Bench, BenchError, machine, positive_int, run_main

from logsync.errors import LogsyncError
from logsync.sim.runner import run_scenario
from logsync.sim.scenario import parse_scenario
from logsync.sim.scratch import claimed_dir, scratch_base
from logsync.store import Store
from logsync.store.chaining import INSERT_CHAIN
from logsync.store.schema import INSERT_EVENT

DEFAULT_SCENARIO = REPO_ROOT / "simulations" / "broadcast-25.toml"
BODY = "Please review the patch on branch main and reply with findings. " * 3  # ~200 B


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=scenario_file, default=DEFAULT_SCENARIO)
    parser.add_argument("--nodes", type=positive_int, default=None,
                        help="replace the scenario's node count (its [nodes] count)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    return parser.parse_args(argv)


def scenario_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file (a scenario's TOML)")
    return path


def run_sim(path: Path, nodes: int | None) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if nodes is not None:
        text, found = _with_nodes(text, nodes)
        if not found:
            raise BenchError(f"{path} has no `count = N` line to replace with {nodes}")
    try:
        scenario = parse_scenario(text, source=path.name)
    except LogsyncError as exc:  # the scenario's own sentence (ScenarioError)
        raise BenchError(f"{path}: {exc}") from None
    report = run_scenario(scenario)
    if not report.ok or report.lost:
        raise BenchError(f"{path.name}: {report.text()}")
    if report.applies == 0:
        raise BenchError(f"{path.name}: the run applied no remote op (no workload, or one "
                         "node): there is no floor to compare it with")
    return {"nodes": len(report.nodes), "events": report.events, "applies": report.applies,
            "frames": report.notifications, "wall_s": report.wall_seconds,
            "messages_per_event": report.messages_per_event}


def _with_nodes(text: str, nodes: int) -> tuple[str, bool]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("count ="):
            lines[i] = f"count = {nodes}"
            return "\n".join(lines) + "\n", True
    return text, False


def floor_seconds(stores: int, applies: int, per_write: int, durable: bool = False) -> float:
    """`applies` ops spread over `stores` fresh stores, `per_write` to a transaction
    (`durable`: `synchronous=FULL`, as a local append commits)."""
    per_store = -(-applies // stores)
    with claimed_dir("logsync-sim-", scratch_base()) as root:
        conns = []
        for n in range(stores):
            store = Store.open(root / f"n{n}")
            path = store.db_path
            store.close()
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            conns.append(conn)
        rows = [_op(i) for i in range(per_store)]
        began = time.perf_counter()
        for conn in conns:
            for start in range(0, per_store, per_write):
                conn.execute("BEGIN IMMEDIATE")
                for row, digest in rows[start : start + per_write]:
                    conn.execute(INSERT_EVENT, row)
                    conn.execute(INSERT_CHAIN, (row[14], row[15], digest, None))
                conn.execute("COMMIT")
        seconds = time.perf_counter() - began
        for conn in conns:
            conn.close()
    return seconds


def _op(i: int) -> tuple[tuple[Any, ...], bytes]:
    origin = f"r{i % 24:031d}"
    row = (f"ev-{i:020d}", "ask", "work", "room", "topic", "agent-a", "agent-b", f"c{i}",
           None, None, "open", BODY, "2026-12-03T10:00:00.000Z", "{}", origin,
           i // 24 + 1, f"{1_700_000_000_000 + i:013d}-0000-{origin[:8]}")
    return row, hashlib.sha256(row[0].encode()).digest()


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    sim = run_sim(args.scenario, args.nodes)
    own = max(1, round(sim["applies"] / max(sim["frames"], 1)))
    appends = floor_seconds(sim["nodes"], sim["events"], 1, durable=True)
    floors = [{"per_write": k, "seconds": appends
               + floor_seconds(sim["nodes"], sim["applies"], k)} for k in sorted({1, own, 10})]
    return {"benchmark": "sim_floor", "scenario": args.scenario.name, "sim": sim,
            "own_per_write": own, "appends_s": appends, "floors": floors,
            "machine": machine()}


def render(r: dict[str, Any]) -> list[str]:
    s, m = r["sim"], r["machine"]
    lines = [f"sim_floor: {r['scenario']}, {s['nodes']} nodes, {s['events']} events, "
             f"{s['applies']} applies in {s['frames']} change frames; "
             f"{m['cpus']} cpus, load {m['loadavg_1m']:.2f}",
             f"  simulator run                      {s['wall_s']:7.2f} s  "
             f"({s['wall_s'] / s['applies'] * 1e6:.0f} us an apply, appends and all)"]
    lines.append(f"  SQLite floor of the local appends    {r['appends_s']:7.2f} s  (one durable "
                 "transaction each; in every floor below)")
    for f in r["floors"]:
        mark = "  <- the run's own ops per frame" if f["per_write"] == r["own_per_write"] else ""
        lines.append(f"  SQLite floor, {f['per_write']:>2} ops a transaction   "
                     f"{f['seconds']:7.2f} s  ({f['seconds'] / s['applies'] * 1e6:.0f} us an "
                     f"apply; run/floor {s['wall_s'] / f['seconds']:.1f}x){mark}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("sim_floor", args, measure, render)


if __name__ == "__main__":
    raise SystemExit(main())
