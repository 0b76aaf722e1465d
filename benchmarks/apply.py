"""apply_remote throughput against the raw limit, measured in one run.

Builds an origin with N events and P patch artifacts, then times
(a) `Store.apply_remote` on a fresh replica in pages of 500 (validation,
    idempotency checks, conflict detection, one transaction per page), and
(b) the same rows inserted straight into an identical schema with
    `executemany`, one transaction per page, no checks;
(c) `Store.apply_chained` of the signed pages a pull applies (4000 ops, chain
    digests and signatures checked), one after another, and
(d) the same with each page prepared (`Store.prepare_chained`) in a second thread
    while the page before is written, and the store in bulk mode (its log copied into
    the database by a third thread), as the client does; timed until the copy ends.
Prints the rates and the ratios. Usage: python benchmarks/apply.py [--events N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import build_origin  # noqa: E402

from logsync import store as store_mod  # noqa: E402
from logsync.pagechain import carries_signature  # noqa: E402
from logsync.store import Store  # noqa: E402

PAGE = 500
CHAINED_PAGE = 4000  # what a pull from a logsync peer asks for (large pages)


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


def chained_pages(origin: Store) -> list[tuple[Any, ...]]:
    """The signed pages of `origin` as a logsync server serves them (`apply_chained`'s
    arguments): ops, artifacts, origin, after, prev, the signatures a page carries."""
    out, after, me = [], 0, origin.replica_id
    while True:
        ops = origin.list_ops(me, after, CHAINED_PAGE, max_limit=CHAINED_PAGE)
        if not ops:
            return out
        last = ops[-1]["origin_seq"]
        signed = [op["origin_seq"] for op in ops if carries_signature(op["origin_seq"], last)]
        arts = origin.get_artifacts([a for op in ops for a in op["artifact_ids"]])
        out.append((ops, arts, me, after, origin.chain_digests_at(me, [after])[0],
                    origin.chain_signatures(me, signed)))
        after = last


def time_chained(work: list[tuple[Any, ...]], root: Path, key: tuple[str, bytes],
                 ahead: bool) -> float:
    """`apply_chained` page after page; `ahead`: each page prepared in a second thread
    while the one before is written."""
    replica = Store.open(root)
    replica.pin_keys({key[0]: key[1]}, "origin")
    with ThreadPoolExecutor(1) as pool:
        start = time.perf_counter()
        with replica.bulk_writes() if ahead else contextlib.nullcontext():
            nxt = pool.submit(replica.prepare_chained, *work[0]) if ahead and work else None
            for index, page in enumerate(work):
                prepared = nxt.result() if nxt is not None else None
                if ahead and index + 1 < len(work):
                    nxt = pool.submit(replica.prepare_chained, *work[index + 1])
                result = replica.apply_chained(*page, prepared=prepared)
                if result.applied != len(page[0]):
                    raise SystemExit(f"apply_chained applied {result.applied} of "
                                     f"{len(page[0])}")
        replica.log_copied(120.0)  # timed until the log is in the database file
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
        signed = chained_pages(origin)
        key = (origin.replica_id, origin.public_key)
        # Best of three for each, interleaved, so a busy machine skews all alike.
        times: dict[str, list[float]] = {"raw": [], "apply": [], "chained": [], "ahead": []}
        for i in range(3):
            times["raw"].append(time_raw(work, root / f"raw{i}"))
            times["apply"].append(time_apply(work, root / f"apply{i}"))
            times["chained"].append(time_chained(signed, root / f"chained{i}", key, False))
            times["ahead"].append(time_chained(signed, root / f"ahead{i}", key, True))
    raw, applied, chained, ahead = (min(times[k]) for k in ("raw", "apply", "chained", "ahead"))
    n = args.events
    print(f"events={n} patches={args.patches} pages={len(work)} page_size={PAGE} "
          f"(signed: {len(signed)} pages of up to {CHAINED_PAGE}); "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    print(f"raw executemany               : {raw:7.3f} s  {n / raw:10.0f} events/s")
    print(f"Store.apply_remote            : {applied:7.3f} s  {n / applied:10.0f} events/s")
    print(f"Store.apply_chained           : {chained:7.3f} s  {n / chained:10.0f} events/s")
    print(f"  ahead, in bulk (log copied) : {ahead:7.3f} s  {n / ahead:10.0f} events/s")
    print(f"ratio apply/raw               : {applied / raw:7.2f}x  (target <= 1.5x)")
    print(f"ratio chained/raw             : {chained / raw:7.2f}x")
    print(f"ratio chained, ahead/raw      : {ahead / raw:7.2f}x  (the pull's target <= 1.3x)")


if __name__ == "__main__":
    main()
