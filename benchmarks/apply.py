"""apply_remote throughput against the raw limit, measured in one run.

Builds an origin with N events and P patch artifacts, then times
(a) `Store.apply_remote` on a fresh replica in pages of 500 (validation,
    idempotency checks, conflict detection, one transaction per page), and
(b) the same rows inserted straight into an identical schema with
    `executemany`, one transaction per page, no checks.
Prints both rates and the ratio. Usage: python benchmarks/apply.py [--events N]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import build_origin  # noqa: E402

from logsync import store as store_mod  # noqa: E402
from logsync.store import Store  # noqa: E402

PAGE = 500


def pages(origin: Store) -> list[tuple[list[dict], list[dict]]]:
    out, after = [], 0
    while True:
        ops = origin.list_ops(origin.replica_id, after, PAGE)
        if not ops:
            return out
        ids = [a for op in ops for a in op["artifact_ids"]]
        out.append((ops, origin.get_artifacts(ids)))
        after = ops[-1]["origin_seq"]


def time_apply(work: list[tuple[list[dict], list[dict]]], root: Path) -> float:
    replica = Store.open(root / "replica")
    start = time.perf_counter()
    for ops, arts in work:
        replica.apply_remote(ops, arts)
    elapsed = time.perf_counter() - start
    replica.close()
    return elapsed


def time_raw(work: list[tuple[list[dict], list[dict]]], root: Path) -> float:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "raw.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(store_mod.UPSTREAM_SCHEMA)
    conn.execute("CREATE UNIQUE INDEX events_origin_seq_idx ON events(origin_replica, origin_seq)")
    conn.execute("CREATE INDEX events_hlc_idx ON events(hlc)")
    conn.execute("CREATE INDEX events_topic_created_idx ON events(topic, created_at)")
    start = time.perf_counter()
    for ops, arts in work:
        conn.execute("BEGIN")
        conn.executemany(store_mod.INSERT_ARTIFACT, [
            (a["id"], a["kind"], a["sha256"], a["size_bytes"], a["content"], a["created_by"],
             a["created_at"], "{}", a["origin_replica"]) for a in arts])
        conn.executemany(store_mod.INSERT_EVENT, [
            (e["id"], e["type"], e["stream"], e["room"], e["topic"], e["from_agent"],
             e["to_agent"], e["correlation_id"], e["branch"], e["base_commit"], e["status"],
             e["body"], e["created_at"], '{"attempt": 1}', e["origin_replica"],
             e["origin_seq"], e["hlc"]) for e in ops])
        conn.executemany("INSERT INTO event_artifacts VALUES (?, ?)",
                         [(e["id"], a) for e in ops for a in e["artifact_ids"]])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--patches", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        origin = build_origin(root / "origin", args.events, args.patches)
        work = pages(origin)
        # Best of three for each, interleaved, so a busy machine skews both alike.
        raw = min(time_raw(work, root / f"raw{i}") for i in range(3))
        applied = min(time_apply(work, root / f"apply{i}") for i in range(3))
    n = args.events
    print(f"events={n} patches={args.patches} pages={len(work)} page_size={PAGE}")
    print(f"raw executemany   : {raw:7.3f} s  {n / raw:10.0f} events/s")
    print(f"Store.apply_remote: {applied:7.3f} s  {n / applied:10.0f} events/s")
    print(f"ratio apply/raw   : {applied / raw:7.2f}x  (target <= 1.5x)")


if __name__ == "__main__":
    main()
