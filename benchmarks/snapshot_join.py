"""Snapshot join (RFC 004 §9.6): a fresh replica joining from a snapshot, in one run.

  (s) `logsync sync --pull-only` from a logsync daemon into an empty palace: snapshot join
  (p) the same with `--no-snapshot`: the op-by-op pull
  (u) upstream's `mempalace logstream sync` from a MemPalace hub serving the same palace
at `--compare-events` (default 20 000) events, `--rounds` (default 3) rounds interleaved,
each variant's best round kept (every round is printed); then at `--events` (default 50 000, try
1 000 000) the join alone in a child process (its peak RSS from getrusage) against a
plain HTTP GET over loopback of a file of the same size, written to disk the same way.
The daemon is started just before that join, so the first joiner also waits for the
copy the daemon makes as it starts (its honest cost, in the target ratio); a second
joiner then takes the cached copy, which shows what the join itself costs.
Every replica must end with all events and artifacts, or the run fails.

Usage: python benchmarks/snapshot_join.py [--events N] [--compare-events N] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _harness import (
    Bench,
    BenchError,
    child_env,
    copy_palace,
    count_rows,
    free_port,
    logsync_env,
    machine,
    positive_float,
    positive_int,
    run_main,
    run_timed,
)
from workload import build_origin

# The joiner's child: join, then print seconds, CPU seconds and peak RSS (kB) as JSON.
JOIN_CHILD = """
import json, resource, sys, time
from pathlib import Path
from logsync.peers import Peer
from logsync.snapshot.joining import join_if_empty
def used():  # this process and the proof's forked child (reaped by then)
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, \
        max(own.ru_maxrss, kids.ru_maxrss)
began = time.perf_counter()
cpu_before, _ = used()
joined = join_if_empty(Path(sys.argv[1]), [Peer(url=sys.argv[2], token=sys.argv[3])],
                       say=lambda line: print(line, file=sys.stderr))
if joined is None:
    sys.exit("no snapshot was installed")
cpu_after, peak = used()
print(json.dumps({"seconds": time.perf_counter() - began, "bytes": joined.bytes,
                  "cpu_seconds": cpu_after - cpu_before, "peak_rss_kb": peak}))
"""
# A plain GET of a file over loopback, streamed to disk, in a child the same way.
GET_CHILD = """
import json, os, sys, time, httpx
began, size = time.perf_counter(), 0
with httpx.stream("GET", sys.argv[1], timeout=120) as r, open(sys.argv[2], "wb") as out:
    for chunk in r.iter_raw(256 * 1024):
        out.write(chunk)
        size += len(chunk)
    out.flush()
    os.fsync(out.fileno())
print(json.dumps({"seconds": time.perf_counter() - began, "bytes": size}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=positive_int, default=50_000,
                        help="size of the join vs plain GET comparison")
    parser.add_argument("--compare-events", type=positive_int, default=20_000,
                        help="size of the comparison with upstream and the op-by-op pull")
    parser.add_argument("--patches", type=positive_int, default=200)
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="rounds of (s), (p) and (u), interleaved; each keeps its best")
    parser.add_argument("--cli-timeout", type=positive_float, default=1800.0)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    return parser.parse_args(argv)


def child(argv: list[str], timeout: float) -> dict[str, Any]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise BenchError(f"{argv[2][:40]!r} child exited {done.returncode}: "
                         f"{done.stderr[-800:]}")
    return json.loads(done.stdout)


def expect(palace: Path, events: int, artifacts: int, label: str) -> None:
    got = (count_rows(palace, "events"), count_rows(palace, "artifacts"))
    if got != (events, artifacts):
        raise BenchError(f"{label}: replica holds {got[0]} events / {got[1]} artifacts, "
                         f"expected {events} / {artifacts}")


def compare(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    """(s), (p) and (u) at the comparison size."""
    origin_dir = bench.root / "origin"
    store = build_origin(origin_dir, args.compare_events, min(args.patches,
                                                              args.compare_events))
    counts = store.counts()
    store.close()
    copy_palace(origin_dir, bench.root / "hub-palace")
    daemon = bench.daemon("daemon", origin_dir)
    hub = bench.hub("hub", bench.root / "hub-palace")
    runs: dict[str, Any] = {}
    for round_no in range(args.rounds):  # interleaved: a slow minute hits every variant
        for key, server, extra, exe in (
                ("s_snapshot", daemon, [], None),
                ("p_op_by_op", daemon, ["--no-snapshot"], None),
                ("u_upstream", hub, [], bench.mempalace_exe)):
            palace = bench.path(f"{key}-{round_no}")
            if exe is None:
                argv = [sys.executable, "-m", "logsync", "--palace", str(palace), "sync",
                        "--peer", server.url, "--token", server.token, "--pull-only", *extra]
                env = logsync_env(bench.path(f"home-{key}-{round_no}"))
            else:
                argv = [str(exe), "--palace", str(palace), "logstream", "sync", "--peer",
                        server.url, "--token", server.token, "--json"]
                env = child_env(bench.path(f"home-{key}-{round_no}"))
            seconds, _ = run_timed(argv, env, bench.root, args.cli_timeout)
            expect(palace, counts["events"], counts["artifacts"], key)
            runs.setdefault(key, {"rounds": []})["rounds"].append(seconds)
    for run in runs.values():
        run["seconds"] = min(run["rounds"])  # the best round of each, as bootstrap.py keeps
    return {"events": counts["events"], "artifacts": counts["artifacts"], "runs": runs}


def large(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    """The join alone at `--events` vs a plain GET of a file the size of the snapshot."""
    origin_dir = bench.root / "large-origin"
    store = build_origin(origin_dir, args.events, min(args.patches, args.events))
    counts = store.counts()
    store.close()
    daemon = bench.daemon("large-daemon", origin_dir)
    joins = []
    for label in ("large-joiner", "large-joiner-cached"):
        joiner = bench.path(label)
        joins.append(child([sys.executable, "-c", JOIN_CHILD, str(joiner), daemon.url,
                            daemon.token], args.cli_timeout))
        expect(joiner, counts["events"], counts["artifacts"], label)
    join, cached = joins
    served = bench.path("plain-http")
    copy_palace(origin_dir, served)  # a file of the snapshot's size, served as-is
    http = plain_server(bench, served)
    get = child([sys.executable, "-c", GET_CHILD, f"{http}/logstream.sqlite3",
                 str(bench.root / "plain-get.sqlite3")], args.cli_timeout)
    return {"events": counts["events"], "join": join, "cached_join": cached, "plain_get": get}


def plain_server(bench: Bench, directory: Path) -> str:
    """`python -m http.server` on loopback over `directory`; its URL once it answers."""
    import httpx

    port = free_port()
    bench.helper([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                  "--directory", str(directory)], child_env(bench.path("home-http")))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.head(url + "/logstream.sqlite3", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise BenchError("the plain HTTP server never answered")


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    small, big = compare(args, bench), large(args, bench)
    s, p, u = (small["runs"][k]["seconds"] for k in ("s_snapshot", "p_op_by_op",
                                                       "u_upstream"))
    ratios = {"upstream_over_snapshot": {"value": u / s, "target": ">= 15"},
              "op_by_op_over_snapshot": {"value": p / s},
              "join_over_plain_get": {"value": big["join"]["seconds"]
                                      / big["plain_get"]["seconds"], "target": "<= 2"},
              "cached_join_over_plain_get": {"value": big["cached_join"]["seconds"]
                                             / big["plain_get"]["seconds"]},
              "joiner_peak_rss_mb": {"value": max(big["join"]["peak_rss_kb"],
                                                  big["cached_join"]["peak_rss_kb"]) / 1024,
                                     "target": "< 100"}}
    return {"benchmark": "snapshot_join", "compare": small, "large": big, "ratios": ratios,
            "machine": machine(bench.root)}


def render(result: dict[str, Any]) -> list[str]:
    small, big, r, m = result["compare"], result["large"], result["ratios"], result["machine"]
    runs = small["runs"]
    return [
        f"snapshot join: {small['events']} events, {small['artifacts']} artifacts (every "
        f"replica verified complete); {m['cpus']} cpus, load {m['loadavg_1m']}, fsync "
        f"{m['fsync_ms']:.2f} ms",
        f"  (s) `logsync sync`, snapshot join           {_rounds(runs['s_snapshot'])}",
        f"  (p) `logsync sync --no-snapshot`, op by op  {_rounds(runs['p_op_by_op'])}",
        f"  (u) `mempalace logstream sync` from a hub   {_rounds(runs['u_upstream'])}",
        f"  upstream/(s): {r['upstream_over_snapshot']['value']:6.1f}x   (target >= 15x)",
        f"  (p)/(s):      {r['op_by_op_over_snapshot']['value']:6.1f}x",
        f"at {big['events']} events ({big['join']['bytes']} bytes): join "
        f"{big['join']['seconds']:.2f} s, plain GET {big['plain_get']['seconds']:.2f} s",
        f"  join/GET:     {r['join_over_plain_get']['value']:6.2f}x   (target <= 2x); the join "
        f"used {big['join']['cpu_seconds']:.2f} s of CPU (all its threads)",
        f"  a second joiner (the daemon's copy cached): {big['cached_join']['seconds']:.2f} s, "
        f"{r['cached_join_over_plain_get']['value']:.2f}x the GET, "
        f"{big['cached_join']['cpu_seconds']:.2f} s of CPU",
        f"  joiner peak RSS {r['joiner_peak_rss_mb']['value']:.0f} MB   (target < 100 MB)",
    ]


def _rounds(run: dict[str, Any]) -> str:
    """The best round, then every round in the order run."""
    return (f"{run['seconds']:8.2f} s  (best of "
            f"{' / '.join(f'{t:.2f}' for t in run['rounds'])})")


def main(argv: list[str] | None = None) -> int:
    return run_main("snapshot_join", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())
