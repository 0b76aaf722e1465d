"""Memory: peak RSS of a `logsync serve` daemon bootstrapping a large backlog.

A source daemon serves an origin of N events (default 200 000) with P patch
artifacts; a fresh daemon gets the source in its peers.json and pulls it all
(the first round starts when it reads peers.json). Its RSS is sampled from
/proc every 50 ms while it pulls, and its kernel-kept peak (VmHWM) is read
before it is stopped. Memory should be bounded by page size, not by backlog,
so the peak should not grow with N. Target: peak < 200 MB. The sink must
end with all N events and P artifacts, or the run fails.

Usage: python benchmarks/memory.py [--events 200000] [--patches P] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from _harness import (
    Bench,
    BenchError,
    ServerProcess,
    count_rows,
    machine,
    positive_float,
    positive_int,
    rss_kb,
    run_main,
    write_peers_json,
)
from workload import build_origin

SAMPLE_S = 0.05
VECTOR_EVERY_S = 0.5
TARGET_MB = 200.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=positive_int, default=200_000)
    parser.add_argument("--patches", type=int, default=None,
                        help="patch artifacts (default: events/40, the RFC 003 ratio)")
    parser.add_argument("--timeout", type=positive_float, default=1800.0,
                        help="bound on the whole bootstrap, seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    args = parser.parse_args(argv)
    if args.patches is None:
        args.patches = args.events // 40
    if not 0 <= args.patches <= args.events:
        parser.error(f"--patches {args.patches} is invalid: must be 0..--events ({args.events})")
    return args


def pid_of(server: ServerProcess) -> int:
    if server.proc is None:
        raise BenchError(f"{server.name} is not running")
    return server.proc.pid


class RssSampler:
    """VmRSS samples of one process: (seconds since start, MB)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.began = time.monotonic()
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> None:
        fields = rss_kb(self.pid)
        if "VmRSS" in fields:
            self.samples.append((time.monotonic() - self.began, fields["VmRSS"] / 1024))

    def peak_mb(self) -> float:
        """The kernel's high-water mark (catches spikes between samples)."""
        fields = rss_kb(self.pid)
        if "VmHWM" not in fields:
            raise BenchError(f"cannot read VmHWM of pid {self.pid} from /proc")
        return fields["VmHWM"] / 1024


def bootstrap(sink: ServerProcess, source: ServerProcess, events: int,
              timeout: float) -> tuple[float, RssSampler]:
    """Point the sink at the source and sample its RSS until it holds every event."""
    origin = source.replica_id()
    sampler = RssSampler(pid_of(sink))
    write_peers_json(sink.palace, [source])
    began = time.monotonic()
    next_check = began
    while True:
        sampler.sample()
        now = time.monotonic()
        if now >= next_check:
            if sink.version_vector().get(origin, 0) >= events:
                return now - began, sampler
            next_check = now + VECTOR_EVERY_S
        if now - began > timeout:
            raise BenchError(f"the sink did not pull {events} events within {timeout:.0f} s")
        if not sink.running:
            raise BenchError(f"the sink daemon died: {sink.log_tail(15)}")
        time.sleep(SAMPLE_S)


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    began = time.perf_counter()
    origin = build_origin(bench.root / "origin", args.events, args.patches)
    counts = origin.counts()
    origin.close()
    built = time.perf_counter() - began
    source = bench.daemon("source", bench.root / "origin", extra_args=["--log-level", "warning"])
    sink = bench.daemon("sink", bench.path("sink"), extra_args=["--log-level", "warning"])
    idle_mb = rss_kb(pid_of(sink)).get("VmRSS", 0) / 1024
    seconds, sampler = bootstrap(sink, source, counts["events"], args.timeout)
    # The kernel updates VmHWM lazily, so a sample can read a little above it.
    peak_mb = max(sampler.peak_mb(), max((mb for _, mb in sampler.samples), default=0.0))
    source_peak_mb = rss_kb(pid_of(source)).get("VmHWM", 0) / 1024
    got = (count_rows(sink.palace, "events"), count_rows(sink.palace, "artifacts"))
    if got != (counts["events"], counts["artifacts"]):
        raise BenchError(f"the sink holds {got[0]} events / {got[1]} artifacts, expected "
                         f"{counts['events']} / {counts['artifacts']}")
    sampled = [mb for _, mb in sampler.samples]
    return {"benchmark": "memory", "events": counts["events"], "artifacts": counts["artifacts"],
            "origin_db_mb": (bench.root / "origin" / "logstream.sqlite3").stat().st_size / 2**20,
            "origin_build_seconds": built, "bootstrap_seconds": seconds,
            "events_per_s": counts["events"] / seconds, "idle_rss_mb": idle_mb,
            "peak_rss_mb": peak_mb, "max_sampled_rss_mb": max(sampled, default=0.0),
            "samples": len(sampled), "source_peak_rss_mb": source_peak_mb,
            "target_mb": TARGET_MB, "target_met": peak_mb < TARGET_MB, "machine": machine()}


def render(r: dict[str, Any]) -> list[str]:
    m = r["machine"]
    return [
        f"memory: a fresh daemon bootstraps {r['events']} events + {r['artifacts']} artifacts "
        f"({r['origin_db_mb']:.0f} MB origin db) from a logsync daemon; {m['cpus']} cpus, "
        f"load {m['loadavg_1m']}",
        f"  bootstrap        {r['bootstrap_seconds']:8.1f} s  {r['events_per_s']:8.0f} events/s "
        "(sink verified complete)",
        f"  sink RSS idle    {r['idle_rss_mb']:8.1f} MB",
        f"  sink RSS peak    {r['peak_rss_mb']:8.1f} MB (VmHWM or samples; max of {r['samples']} "
        f"samples "
        f"{r['max_sampled_rss_mb']:.1f} MB)   target < {r['target_mb']:.0f} MB: "
        f"{'met' if r['target_met'] else 'MISSED'}",
        f"  source RSS peak  {r['source_peak_rss_mb']:8.1f} MB (serving the pull)",
    ]


def main(argv: list[str] | None = None) -> int:
    return run_main("memory", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())
