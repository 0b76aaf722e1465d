"""How cost grows (issue 12, item 7): three tables, printed as markdown with the command
and the date.

(a) The store at N stored events (default 10k, 100k, 1M; one store grown in place):
    the time of `Store.version_vector()`, of answering one `/sync/ops` page of 500 (the
    responder the server and the simulator call, in process: no HTTP), of
    `Store.apply_remote` of one 500-op page above an origin's top, and the store's size
    on disk. The ops (RFC 003-sized bodies, one in 40 naming a patch artifact) belong to
    four remote origins in turn and are written with the store's bulk path (rows inserted
    in 20 000-op transactions, each with its chain entries, as `apply_page` writes them).
(b) The simulator: broadcast-25's settings (hub-and-spoke, 100 ms, 100 events/s for
    20 s) at 5 / 25 / 100 nodes: wall time, requests and messages (each request, answer
    and change frame, as Maelstrom counts) per event, reach.
(c) The daemon at idle: a real `logsync serve` with 1 / 10 / 50 peers configured (idle
    stub peers on loopback, `_idle_peers.py`: an empty vector and an open change stream
    each), its CPU time sampled from /proc over `--idle-seconds` after a warm-up.

Each timing is the median of several calls; figures are this machine's under its load
(printed). Usage: python benchmarks/growth.py [--sizes 10000,100000,1000000]
[--nodes 5,25,100] [--peers 1,10,50] [--idle-seconds 20] [--json] [--keep]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (  # noqa: E402
    REPO_ROOT,
    Bench,
    BenchError,
    machine,
    run_main,
    write_peers_json,
)
from workload import AGENTS, ROOMS, STREAMS, fake_patch  # noqa: E402

from logsync import model  # noqa: E402
from logsync.sim import parse_scenario, run_scenario  # noqa: E402
from logsync.sim.serve import serve  # noqa: E402
from logsync.store import INSERT_ARTIFACT, INSERT_EVENT, Store, chaining  # noqa: E402

PAGE = 500
BUILD_CHUNK = 20_000
PATCH_EVERY = 40
ORIGINS = tuple(f"rep_{0xA0 + i:032x}" for i in range(4))
T0_MS = 1_790_000_000_000
CALLS = 7  # per timing, median taken
APPLY_PAGES = 3
WARM_UP_S = 5.0
MAX_SIZE = 5_000_000
MAX_NODES = 200
MAX_PEERS = 200


def size_list(text: str, most: int) -> list[int]:
    """`a,b,c` of increasing positive integers up to `most`; one sentence otherwise."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") \
            from None
    if not values or values != sorted(set(values)) or values[0] < 1 or values[-1] > most:
        raise argparse.ArgumentTypeError(
            f"{text!r} is invalid: must be increasing positive integers up to {most}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda t: size_list(t, MAX_SIZE),
                        default=[10_000, 100_000, 1_000_000], help="stored events")
    parser.add_argument("--nodes", type=lambda t: size_list(t, MAX_NODES), default=[5, 25, 100],
                        help="simulated nodes")
    parser.add_argument("--peers", type=lambda t: size_list(t, MAX_PEERS), default=[1, 10, 50],
                        help="peers of the idle daemon")
    parser.add_argument("--idle-seconds", type=float, default=20.0,
                        help="CPU sampling window per idle daemon")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    args = parser.parse_args(argv)
    if not 1 <= args.idle_seconds <= 600:
        parser.error(f"--idle-seconds {args.idle_seconds:g} is invalid: must be 1 to 600")
    return args


def median_time(call: Callable[[], Any], times: int = CALLS) -> float:
    took = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        took.append(time.perf_counter() - start)
    return statistics.median(took)


# ── (a) the store ────────────────────────────────────────────────────────


class Grower:
    """One store grown in place to each size, ops of `ORIGINS` in turn."""

    def __init__(self, palace: Path, seed: int = 12) -> None:
        self.rng = random.Random(seed)
        self.store = Store.open(palace, check=False)
        self.held = 0
        self.tops = dict.fromkeys(ORIGINS, 0)

    def grow_to(self, total: int) -> float:
        start = time.perf_counter()
        while self.held < total:
            self._chunk(min(BUILD_CHUNK, total - self.held))
        return time.perf_counter() - start

    def _chunk(self, count: int) -> None:
        rng, events, arts, links = self.rng, [], [], []
        for _ in range(count):
            self.held += 1
            origin = ORIGINS[self.held % len(ORIGINS)]
            self.tops[origin] += 1
            seq, ms = self.tops[origin], T0_MS + self.held
            eid = f"evt_20260901T000000_{self.held:012x}"
            events.append((
                eid, rng.choice(("task.request", "task.reply", "event.ack", "patch.ready")),
                rng.choice(STREAMS), rng.choice(ROOMS), None, rng.choice(AGENTS),
                rng.choice(AGENTS), f"task_{self.held // 4}", None, None,
                rng.choice(("open", "ready", "applied", None)),
                "Please look at the flaky test in search ranking. " * rng.randint(2, 60),
                model.utc_now_iso(ms), '{"attempt": 1}', origin, seq,
                f"{ms:013d}-000000-{origin}",
            ))
            if self.held % PATCH_EVERY == 0:
                content = fake_patch(rng, rng.randint(20, 400))
                aid = f"art_20260901T000000_{self.held:012x}"
                arts.append((aid, "patch", model.sha256_hex(content), len(content.encode()),
                             content, "pi@laptop", model.utc_now_iso(ms), "{}", origin))
                links.append((eid, aid))
        with self.store._atomic(durable=False) as conn:  # the bulk path, for the fixture only
            conn.executemany(INSERT_ARTIFACT, arts)
            conn.executemany(INSERT_EVENT, events)
            conn.executemany("INSERT INTO event_artifacts VALUES (?, ?)", links)
            chaining.extend_chains(conn, events, links)

    def page_time(self) -> tuple[float, int]:
        """Median time to answer one `/sync/ops` page at a random position of an origin."""
        origin, sizes = ORIGINS[0], []

        def one() -> None:
            after = self.rng.randrange(max(1, self.tops[origin] - PAGE))
            status, body = serve(self.store, "/sync/ops",
                                 {"origin": origin, "after": after, "limit": PAGE},
                                 logsync=True, max_page=PAGE)
            if status != 200 or not body.get("events"):
                raise BenchError(f"/sync/ops answered {status} with no ops at after={after}")
            sizes.append(len(body["events"]))
        return median_time(one), min(sizes)

    def apply_time(self) -> float:
        """Median time of `apply_remote` of a 500-op page above origin 0's top (new ops
        shaped from a served page: new ids, seqs and stamps)."""
        origin, took = ORIGINS[0], []
        for _ in range(APPLY_PAGES):
            after = self.rng.randrange(max(1, self.tops[origin] - PAGE))
            template = self.store.list_ops(origin, after, PAGE)
            ops = []
            for op in template:
                self.held += 1
                self.tops[origin] += 1
                ms = T0_MS + self.held
                fresh = {k: v for k, v in op.items() if k != "seq"}
                fresh.update(id=f"evt_20260902T000000_{self.held:012x}",
                             origin_seq=self.tops[origin], hlc=f"{ms:013d}-000000-{origin}")
                ops.append(fresh)
            start = time.perf_counter()
            result = self.store.apply_remote(ops, [])
            took.append(time.perf_counter() - start)
            if result.applied != len(ops):
                raise BenchError(f"apply_remote applied {result.applied} of {len(ops)} ops")
        return statistics.median(took)

    def disk_bytes(self) -> int:
        """The database file after a checkpoint that empties the WAL (the bulk build's
        large transactions leave a WAL as large as one; a daemon's stays small)."""
        self.store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        db = self.store.db_path
        return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def measure_store(root: Path, sizes: list[int]) -> list[dict[str, Any]]:
    grower, rows = Grower(root / "grown"), []
    try:
        for size in sizes:
            built = grower.grow_to(size)
            vv = median_time(grower.store.version_vector)
            page, page_ops = grower.page_time()
            apply = grower.apply_time()
            counts = grower.store.counts()
            rows.append({"events": size, "build_s": round(built, 1),
                         "version_vector_ms": vv * 1000, "ops_page_ms": page * 1000,
                         "ops_page_ops": page_ops, "apply_page_ms": apply * 1000,
                         "disk_mb": grower.disk_bytes() / 1e6,
                         "events_after": counts["events"], "artifacts": counts["artifacts"]})
    finally:
        grower.store.close()
    return rows


# ── (b) the simulator ────────────────────────────────────────────────────


def measure_sim(nodes: list[int]) -> list[dict[str, Any]]:
    text = (REPO_ROOT / "simulations" / "broadcast-25.toml").read_text(encoding="utf-8")
    if "count = 25" not in text:
        raise BenchError("simulations/broadcast-25.toml no longer says `count = 25` in [nodes]")
    rows = []
    for n in nodes:
        scenario = parse_scenario(text.replace("count = 25", f"count = {n}", 1),
                                  source="broadcast-25.toml")
        report = run_scenario(scenario)
        if not report.ok or report.lost:
            raise BenchError(f"broadcast at {n} nodes: {report.text()}")
        rows.append({"nodes": n, "events": report.events, "wall_s": report.wall_seconds,
                     "requests_per_event": report.requests_per_event,
                     "messages_per_event": report.messages_per_event,
                     "reach_median_s": report.reach_median, "reach_max_s": report.reach_max})
    return rows


# ── (c) the idle daemon ──────────────────────────────────────────────────


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_idle(bench: Bench, peers: list[int], window: float) -> list[dict[str, Any]]:
    rows = []
    for n in peers:
        seen = bench.root / f"idle-{n}-requests.json"
        stub = bench.helper([sys.executable, str(Path(__file__).parent / "_idle_peers.py"),
                             str(n), str(seen)], os.environ)
        assert stub.stdout is not None
        line = stub.stdout.readline()
        if not line:
            raise BenchError(f"the idle peers did not start: {stub.stderr.read()[-400:]!r}")
        ports = json.loads(line)["ports"]
        palace = bench.path(f"idle-{n}")
        write_peers_json(palace, [{"name": f"p{i}", "url": f"http://127.0.0.1:{port}",
                                   "token": "idle"} for i, port in enumerate(ports)])
        daemon = bench.daemon(f"idle-{n}", palace)
        if daemon.proc is None:
            raise BenchError("the idle daemon has no process")
        pid = daemon.proc.pid
        time.sleep(WARM_UP_S)
        before = cpu_seconds(pid)
        time.sleep(window)
        used = cpu_seconds(pid) - before
        daemon.stop()
        time.sleep(1.2)  # the stub's counts are rewritten every second
        got = json.loads(seen.read_text())
        idle = [i for i, c in enumerate(got) if not c.get("/sync/version_vector")
                or not c.get("/logstream/stream")]
        if idle:
            raise BenchError(f"the daemon with {n} peers never asked peer(s) {idle[:5]} for "
                             "their vector or stream: the figure would not be an idle daemon's")
        rows.append({"peers": n, "cpu_s": used, "window_s": window,
                     "cpu_percent": 100 * used / window,
                     "vector_requests": sum(c.get("/sync/version_vector", 0) for c in got),
                     "stream_connects": sum(c.get("/logstream/stream", 0) for c in got),
                     "other_requests": sum(c.get("other", 0) for c in got)})
    return rows


# ── the whole ────────────────────────────────────────────────────────────


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    began = time.perf_counter()
    result: dict[str, Any] = {
        "command": "python benchmarks/growth.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
    }
    result["store"] = measure_store(bench.root, args.sizes)
    result["sim"] = measure_sim(args.nodes)
    result["idle"] = measure_idle(bench, args.peers, args.idle_seconds)
    result["machine_after"] = machine()
    result["total_s"] = round(time.perf_counter() - began, 1)
    return result


def render(r: dict[str, Any]) -> list[str]:
    m, after = r["machine"], r["machine_after"]
    lines = [f"`{r['command'].strip()}` on {r['date']} ({m['cpus']} CPUs, load "
             f"{m['loadavg_1m']} at the start and {after['loadavg_1m']} at the end, Python "
             f"{m['python']}, {r['total_s']:.0f} s in all)", "",
             "| stored events | `version_vector` | one `/sync/ops` page (500 ops) | "
             "`apply_remote`, one 500-op page | size on disk | grown to it in |",
             "|---|---|---|---|---|---|"]
    base = r["store"][0]
    for s in r["store"]:
        def x(key: str, s: dict[str, Any] = s) -> str:  # growth against the first size
            return "" if s is base else f" (×{s[key] / base[key]:.1f})"
        lines.append(f"| {_n(s['events'])} | {s['version_vector_ms']:.2f} ms"
                     f"{x('version_vector_ms')} | {s['ops_page_ms']:.1f} ms{x('ops_page_ms')} | "
                     f"{s['apply_page_ms']:.1f} ms{x('apply_page_ms')} | "
                     f"{_n(s['disk_mb'])} MB{x('disk_mb')} | {s['build_s']:.0f} s |")
    lines += ["", "| simulated nodes | events | wall | requests/event | messages/event | "
              "reach median / max |", "|---|---|---|---|---|---|"]
    first = r["sim"][0]
    for s in r["sim"]:
        grew = "" if s is first else f" (×{s['wall_s'] / first['wall_s']:.1f})"
        lines.append(f"| {s['nodes']} | {_n(s['events'])} | {s['wall_s']:.1f} s{grew} | "
                     f"{s['requests_per_event']:.1f} | {s['messages_per_event']:.1f} | "
                     f"{s['reach_median_s']:.3f} / {s['reach_max_s']:.3f} s |")
    lines += ["", "| idle daemon, peers | CPU time over the window | CPU | requests the "
              "peers saw in all (vector / stream / other) |", "|---|---|---|---|"]
    for s in r["idle"]:
        lines.append(f"| {s['peers']} | {s['cpu_s']:.2f} s in {s['window_s']:.0f} s | "
                     f"{s['cpu_percent']:.2f} % | {s['vector_requests']} / "
                     f"{s['stream_connects']} / {s['other_requests']} |")
    return lines


def _n(value: float) -> str:
    return f"{value:,.0f}".replace(",", " ")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_main("growth", args, measure, render)


if __name__ == "__main__":
    sys.exit(main())
