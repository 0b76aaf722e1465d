"""Serving: requests per second for full `/sync/ops` pages under concurrent pullers.

One origin of N events is served by a logsync daemon and, from a copy of
the same palace, by a MemPalace 3.11 hub. For each concurrency K, K pullers
(one `httpx.AsyncClient` each, so one connection each) fetch 500-event pages
at random offsets for a fixed time; bodies are read in full but not decoded,
to keep the load generator cheap (it shares the machine's cores with the
server under test). Targets: the daemon in upstream shapes (JSON), the
daemon with msgpack negotiated, the hub (JSON). Before timing, one page from
each target is decoded and must hold exactly 500 events.

Usage: python benchmarks/serving.py [--pullers 1,4,8] [--seconds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any

import httpx
import msgpack
from _harness import (
    Bench,
    BenchError,
    ServerProcess,
    copy_palace,
    machine,
    percentile,
    positive_float,
    positive_int,
    run_main,
)
from workload import build_origin

PAGE = 500
MSGPACK = "application/msgpack"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=positive_int, default=20_000)
    parser.add_argument("--patches", type=positive_int, default=500)
    parser.add_argument("--pullers", type=concurrency_list, default=[1, 4, 8],
                        help="comma-separated concurrency levels")
    parser.add_argument("--seconds", type=positive_float, default=5.0,
                        help="measured time per target and concurrency")
    parser.add_argument("--warm-up", type=float, default=0.5, help="untimed seconds before each")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    args = parser.parse_args(argv)
    if args.events < PAGE:
        parser.error(f"--events {args.events} is invalid: must be >= {PAGE} for full pages")
    if args.patches > args.events:
        parser.error(f"--patches {args.patches} is invalid: must be <= --events {args.events}")
    return args


def concurrency_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "integers") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: every level must be >= 1")
    return values


class Target:
    """One server and one way of asking it for pages."""

    def __init__(self, label: str, server: ServerProcess, origin: str, events: int,
                 accept: str = "application/json") -> None:
        self.label, self.server, self.origin, self.events = label, server, origin, events
        self.headers = {"Authorization": f"Bearer {server.token}", "Accept": accept}

    def params(self, rng: random.Random) -> dict[str, Any]:
        return {"origin": self.origin, "after": rng.randrange(0, self.events - PAGE + 1),
                "limit": PAGE}

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.server.url, headers=self.headers,
                                 timeout=30.0, trust_env=False)

    async def check(self) -> int:
        """One page decoded: it must hold a full page of this origin's events in order."""
        async with self.client() as http:
            response = await http.get("/sync/ops", params={"origin": self.origin, "after": 0,
                                                          "limit": PAGE})
        if response.status_code != 200:
            raise BenchError(f"{self.label}: /sync/ops answered {response.status_code}")
        ctype = response.headers.get("content-type", "")
        body = (msgpack.unpackb(response.content) if ctype.startswith(MSGPACK)
                else json.loads(response.content))
        seqs = [e["origin_seq"] for e in body["events"]]
        if seqs != list(range(1, PAGE + 1)):
            raise BenchError(f"{self.label}: first page is not origin_seq 1..{PAGE} "
                             f"({len(seqs)} events)")
        return len(response.content)


async def puller(target: Target, rng: random.Random, stop_at: float, record: bool,
                 stats: dict[str, Any]) -> None:
    async with target.client() as http:
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            try:
                response = await http.get("/sync/ops", params=target.params(rng))
                body = response.content
                ok = response.status_code == 200
            except httpx.HTTPError:
                body, ok = b"", False
            if record:
                stats["latencies"].append(time.perf_counter() - began)
                stats["bytes"] += len(body)
                stats["errors"] += 0 if ok else 1


async def load(target: Target, pullers: int, seconds: float, warm_up: float,
               seed: int) -> dict[str, Any]:
    """Warm up, then K pullers for `seconds`; requests/s counts completed requests."""
    rng = random.Random(seed)
    scratch: dict[str, Any] = {"latencies": [], "bytes": 0, "errors": 0}
    if warm_up > 0:
        stop = time.perf_counter() + warm_up
        await asyncio.gather(*(puller(target, random.Random(rng.random()), stop, False, scratch)
                               for _ in range(pullers)))
    stats: dict[str, Any] = {"latencies": [], "bytes": 0, "errors": 0}
    began = time.perf_counter()
    stop = began + seconds
    await asyncio.gather(*(puller(target, random.Random(rng.random()), stop, True, stats)
                           for _ in range(pullers)))
    elapsed = time.perf_counter() - began
    lat = stats["latencies"]
    if not lat:
        raise BenchError(f"{target.label}: no request completed in {seconds:.1f} s")
    done = len(lat) - stats["errors"]
    return {"pullers": pullers, "seconds": elapsed, "requests": len(lat),
            "errors": stats["errors"], "requests_per_s": done / elapsed,
            "events_per_s": done * PAGE / elapsed, "mb_per_s": stats["bytes"] / elapsed / 2**20,
            "median_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000}


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    origin_dir = bench.root / "origin"
    store = build_origin(origin_dir, args.events, args.patches)
    origin_id = store.replica_id
    store.close()
    copy_palace(origin_dir, bench.root / "hub-palace")
    daemon = bench.daemon("daemon", origin_dir, extra_args=["--log-level", "warning"])
    hub = bench.hub("hub", bench.root / "hub-palace")
    targets = [
        Target("logsync daemon, JSON", daemon, origin_id, args.events),
        Target("logsync daemon, msgpack", daemon, origin_id, args.events, accept=MSGPACK),
        Target("MemPalace hub, JSON", hub, origin_id, args.events),
    ]
    results = []
    for target in targets:
        page_bytes = asyncio.run(target.check())
        for k in args.pullers:
            run = asyncio.run(load(target, k, args.seconds, args.warm_up, args.seed + k))
            results.append({"target": target.label, "page_bytes": page_bytes, **run})
    return {"benchmark": "serving", "events": args.events, "page": PAGE, "runs": results,
            "ratios": ratios(results), "machine": machine()}


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """Daemon over hub, requests/s, at each concurrency."""
    by = {(r["target"], r["pullers"]): r["requests_per_s"] for r in results}
    out = {}
    for (label, k), rps in by.items():
        hub = by.get(("MemPalace hub, JSON", k))
        if label.startswith("logsync") and hub:
            out[f"{label} / hub @ {k}"] = rps / hub
    return out


def render(result: dict[str, Any]) -> list[str]:
    m = result["machine"]
    lines = [f"serving: /sync/ops pages of {result['page']} events from {result['events']} "
             f"(load generator on the same {m['cpus']} cpus, load {m['loadavg_1m']})"]
    for r in result["runs"]:
        lines.append(
            f"  {r['target']:25s} K={r['pullers']:3d}  {r['requests_per_s']:8.1f} req/s  "
            f"{r['events_per_s']:9.0f} ev/s  {r['mb_per_s']:7.1f} MB/s  median "
            f"{r['median_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}")
    for label, ratio in result["ratios"].items():
        lines.append(f"  {label}: {ratio:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    return run_main("serving", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())
