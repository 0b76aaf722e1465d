"""Convergence latency: how long until an event appended on A is stored on B.

Two topologies, one run:

  daemon -> daemon  two `logsync serve` processes peered with each other
                    (default anti-entropy interval, change notifications on),
                    three pairs (the streams' poll only, `--commit-check-ms 0`;
                    no frame coalescing, `--coalesce-ms 0`; the defaults), each
                    measured twice: events appended to A's palace by this
                    process through the Store API, then by the CLI
                    (`logsync append` subprocesses, one per event). Both are
                    writers outside A's daemon, so A notices them the way it
                    notices any other writer (`server.changes`).
  hub -> daemon     a MemPalace 3.11 hub as the source, a logsync daemon
                    pulling from it; events are appended by upstream's own
                    `Logstream` in a helper process in the MemPalace venv.

One event at a time: append, then poll B's SQLite (read-only, every 2 ms)
until the id is there, then a random pause. Latency runs from the moment the
append returned (the commit; for the CLI, the event's HLC wall clock, taken just
before its commit) to the first poll that sees it on B. Prints the median
and p99 (targets daemon -> daemon: median < 20 ms, p99 < 60 ms; upstream's hub
pulls on a 15 s poll).

Usage: python benchmarks/latency.py [--appends 200] [--no-hub] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import (
    Bench,
    BenchError,
    HarnessError,
    ServerProcess,
    child_env,
    emit,
    logsync_env,
    machine,
    percentile,
    positive_float,
    positive_int,
    wait_for,
    write_peers_json,
)

from logsync.store import Store

POLL_S = 0.002
WARM_UPS = 3
UPSTREAM_POLL_S = 15.0
TARGET_MEDIAN_S, TARGET_P99_S = 0.020, 0.060  # daemon -> daemon (issue 12)

_HUB_APPENDER = """\
import json, sys, time
from mempalace.logstream import Logstream
ls = Logstream(db_path=sys.argv[1])
for line in sys.stdin:
    event = ls.append_event(type="bench.ping", stream="bench", room="latency",
                            from_agent="bench@hub", body=line.strip())
    print(json.dumps({"id": event["id"], "at": time.time()}), flush=True)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=positive_int, default=200,
                        help="events measured per topology")
    parser.add_argument("--max-gap", type=positive_float, default=0.05,
                        help="upper bound of the random pause between appends, seconds")
    parser.add_argument("--timeout", type=positive_float, default=60.0,
                        help="bound on one event's wait (a miss fails the run), seconds")
    parser.add_argument("--upstream-samples", type=int, default=5,
                        help="events timed hub -> hub on upstream's own 15 s sync (0: skip)")
    parser.add_argument("--no-hub", action="store_true",
                        help="daemon -> daemon only (no MemPalace hub needed)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    args = parser.parse_args(argv)
    if args.upstream_samples < 0:
        parser.error(f"--upstream-samples {args.upstream_samples} is invalid: must be >= 0")
    return args


class Arrivals:
    """Cheap presence checks on a replica's SQLite, from outside its daemon."""

    def __init__(self, palace: Path) -> None:
        db = palace / "logstream.sqlite3"
        wait_for(db.exists, 30, f"{db} to be created")
        self._conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)

    def has(self, event_id: str) -> bool:
        return self._found("SELECT 1 FROM events WHERE id = ?", event_id)

    def has_body(self, body: str) -> bool:
        return self._found("SELECT 1 FROM events WHERE body = ?", body)

    def _found(self, query: str, value: str) -> bool:
        try:
            return self._conn.execute(query, (value,)).fetchone() is not None
        except sqlite3.OperationalError:  # table not there yet
            return False

    def wait(self, event_id: str, since: float, timeout: float) -> float:
        """Seconds from `since` (time.time()) until the id is stored; BenchError past timeout."""
        self.until(lambda: self.has(event_id), timeout, f"event {event_id}")
        return time.time() - since

    def until(self, check: Any, timeout: float, what: str) -> float:
        """Poll `check` every POLL_S; the time.time() it passed. BenchError past timeout."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise BenchError(f"{what} did not reach the replica in {timeout:.0f} s")
            time.sleep(POLL_S)
        return time.time()

    def close(self) -> None:
        self._conn.close()


def waited(append: Any, arrivals: Arrivals, timeout: float) -> Any:
    """timed(body) -> latency: append (returns id, commit time), then wait for the id."""
    def timed(body: str) -> float:
        event_id, at = append(body)
        return arrivals.wait(event_id, at, timeout)

    return timed


def measure(timed: Any, count: int, args: argparse.Namespace, rng: random.Random,
            warm_ups: int = WARM_UPS, max_gap: float | None = None) -> list[float]:
    """Warm up (stream connected, first round done), then time `count` events."""
    max_gap = max_gap if max_gap is not None else args.max_gap
    for i in range(warm_ups):
        timed(f"warm-up {i}")
    latencies = []
    for i in range(count):
        latencies.append(timed(f"ping {i}"))
        time.sleep(rng.uniform(0, max_gap))
    return latencies


def daemon_to_daemon(bench: Bench, args: argparse.Namespace,
                     variant: str = "", extra: tuple[str, ...] = ()) -> dict[str, list[float]]:
    """Latencies of Store API appends, then of CLI appends, on the same two daemons."""
    a = bench.daemon(f"a{variant}", bench.path(f"palace-a{variant}"), extra_args=extra)
    b = bench.daemon(f"b{variant}", bench.path(f"palace-b{variant}"), extra_args=extra)
    write_peers_json(a.palace, [b])
    write_peers_json(b.palace, [a])
    store = Store.open(a.palace)
    arrivals = Arrivals(b.palace)

    def append(body: str) -> tuple[str, float]:
        event = store.append_event("bench.ping", "bench", "latency", "bench@a", body=body)
        return event["id"], time.time()

    try:
        api = measure(waited(append, arrivals, args.timeout), args.appends, args,
                      random.Random(args.seed))
        cli = measure(cli_timed(bench, a.palace, arrivals, args.timeout), args.appends, args,
                      random.Random(args.seed), warm_ups=1)
        return {"store_api": api, "cli": cli}
    finally:
        arrivals.close()
        store.close()
        for daemon in (b, a):  # idle daemons still poll; keep them out of the next topology
            daemon.stop()


def cli_timed(bench: Bench, palace: Path, arrivals: Arrivals, timeout: float) -> Any:
    """timed(body) -> latency of one `logsync append` process: B is watched (for the
    body) while the CLI runs, since the event may arrive before the CLI has exited; the
    latency runs from the event's HLC wall clock (ms, taken just before its commit)."""
    env = logsync_env(bench.path(f"home-cli-{palace.name}"))

    def timed(body: str) -> float:
        argv = [sys.executable, "-m", "logsync", "--palace", str(palace), "append", "--json",
                "--type", "bench.ping", "--stream", "bench", "--room", "latency",
                "--from-agent", "bench@cli", "--body", f"cli {body}"]
        proc = subprocess.Popen(argv, env=env, cwd=bench.root, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            seen = arrivals.until(lambda: arrivals.has_body(f"cli {body}"), timeout,
                                  f"the CLI's event {body!r}")
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchError(f"`logsync append` took more than {timeout:.0f} s") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            raise BenchError(f"`logsync append` failed: {err.decode()[-500:]}")
        return seen - int(json.loads(out)["hlc"].split("-")[0]) / 1000

    return timed


def hub_appender(bench: Bench, hub: ServerProcess, name: str) -> Any:
    """append(body) -> (id, commit time) through upstream's Logstream in its own venv."""
    python = bench.mempalace_exe.parent / "python"
    helper = bench.helper([str(python), "-c", _HUB_APPENDER,
                           str(hub.palace / "logstream.sqlite3")],
                          child_env(bench.path(f"home-{name}")))

    def append(body: str) -> tuple[str, float]:
        assert helper.stdin is not None and helper.stdout is not None
        helper.stdin.write(body.encode() + b"\n")
        helper.stdin.flush()
        line = helper.stdout.readline()
        if not line:
            err = helper.stderr.read().decode(errors="replace")[-500:] if helper.stderr else ""
            raise BenchError(f"the MemPalace appender exited: {err}")
        answer = json.loads(line)
        return answer["id"], float(answer["at"])

    return append


def hub_to_daemon(bench: Bench, args: argparse.Namespace, hub: ServerProcess) -> list[float]:
    c = bench.daemon("c", bench.path("palace-c"))
    write_peers_json(c.palace, [hub])
    append = hub_appender(bench, hub, "appender-1")
    arrivals = Arrivals(c.palace)
    try:
        return measure(waited(append, arrivals, args.timeout), args.appends, args,
                       random.Random(args.seed + 1))
    finally:
        arrivals.close()
        c.stop()


def hub_to_hub(bench: Bench, args: argparse.Namespace, source: ServerProcess) -> list[float]:
    """The upstream baseline: a second hub pulling the first on its own sync thread."""
    sink_palace = bench.path("palace-hub2")
    write_peers_json(sink_palace, [source])
    bench.hub("hub2", sink_palace)
    append = hub_appender(bench, source, "appender-2")
    arrivals = Arrivals(sink_palace)
    bound = 2 * UPSTREAM_POLL_S + args.timeout
    try:
        return measure(waited(append, arrivals, bound), args.upstream_samples, args,
                       random.Random(args.seed + 2), warm_ups=1,
                       max_gap=UPSTREAM_POLL_S)  # else every append lands just after a pull
    finally:
        arrivals.close()


def summary(latencies: list[float]) -> dict[str, Any]:
    return {"count": len(latencies), "median_s": percentile(latencies, 50),
            "p90_s": percentile(latencies, 90), "p99_s": percentile(latencies, 99),
            "max_s": max(latencies), "min_s": min(latencies)}


ROWS = (("daemon_to_daemon_poll", "  (poll only) API"),
        ("daemon_to_daemon_cli_poll", "  (poll only) CLI"),
        ("daemon_to_daemon_eager", "  (no coalescing) API"),
        ("daemon_to_daemon_cli_eager", "  (no coalescing) CLI"),
        ("daemon_to_daemon", "logsync -> logsync, API"),
        ("daemon_to_daemon_cli", "logsync -> logsync, CLI"),
        ("hub_to_daemon", "MemPalace hub -> logsync"),
        ("hub_to_hub_upstream", "hub -> hub (upstream sync)"))


def render(result: dict[str, Any]) -> list[str]:
    m = result["machine"]
    lines = [f"convergence latency, append on A -> stored on B ({m['cpus']} cpus, "
             f"load {m['loadavg_1m']}; daemon interval {result['interval_s']:.0f} s, "
             "notifications on; poll only: --commit-check-ms 0, the streams' 100 ms poll; "
             "no coalescing: --coalesce-ms 0)"]
    for key, label in ROWS:
        s = result.get(key)
        if s is None:
            continue
        lines.append(f"  {label:26s} n={s['count']:4d}  median {s['median_s'] * 1000:7.1f} ms  "
                     f"p90 {s['p90_s'] * 1000:7.1f} ms  p99 {s['p99_s'] * 1000:7.1f} ms  "
                     f"max {s['max_s'] * 1000:7.1f} ms")
    for key in ("daemon_to_daemon", "daemon_to_daemon_cli"):
        s = result[key]
        base = result["daemon_to_daemon_poll" if key == "daemon_to_daemon"
                      else "daemon_to_daemon_cli_poll"]
        lines.append(f"  {key}: median {base['median_s'] / s['median_s']:.1f}x, p99 "
                     f"{base['p99_s'] / s['p99_s']:.1f}x lower than poll only")
        met = s["median_s"] < TARGET_MEDIAN_S and s["p99_s"] < TARGET_P99_S
        lines.append(f"  target median < {TARGET_MEDIAN_S * 1000:.0f} ms, p99 < "
                     f"{TARGET_P99_S * 1000:.0f} ms ({key}): {'met' if met else 'MISSED'}")
    lines.append(f"  upstream hubs pull every {UPSTREAM_POLL_S:.0f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from logsync.defaults import DEFAULT_INTERVAL_S

    try:
        with Bench(keep=args.keep) as bench:
            poll = daemon_to_daemon(bench, args, "-poll", ("--commit-check-ms", "0"))
            eager = daemon_to_daemon(bench, args, "-eager", ("--coalesce-ms", "0"))
            d2d = daemon_to_daemon(bench, args)
            h2d, h2h = [], []
            if not args.no_hub:
                hub = bench.hub("hub", bench.path("palace-hub"))
                hub.version_vector()  # the hub has created its store
                h2d = hub_to_daemon(bench, args, hub)
                h2h = hub_to_hub(bench, args, hub) if args.upstream_samples else []
    except (BenchError, HarnessError) as exc:
        print(f"latency benchmark failed: {exc}", file=sys.stderr)
        return 1
    result = {"benchmark": "latency", "appends": args.appends, "interval_s": DEFAULT_INTERVAL_S,
              "daemon_to_daemon": summary(d2d["store_api"]),
              "daemon_to_daemon_cli": summary(d2d["cli"]),
              "daemon_to_daemon_poll": summary(poll["store_api"]),
              "daemon_to_daemon_cli_poll": summary(poll["cli"]),
              "daemon_to_daemon_eager": summary(eager["store_api"]),
              "daemon_to_daemon_cli_eager": summary(eager["cli"]),
              "hub_to_daemon": summary(h2d) if h2d else None,
              "hub_to_hub_upstream": summary(h2h) if h2h else None,
              "upstream_poll_s": UPSTREAM_POLL_S, "machine": machine()}
    emit(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
