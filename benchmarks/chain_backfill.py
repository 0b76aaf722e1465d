"""The per-origin hash chain (issue 10, item 1): its backfill cost and its apply cost,
each against a baseline measured in the same run.

(a) Backfill: a store of N ops (RFC 003-sized bodies, one in 40 naming a patch artifact)
    is written with the chain switched off, then `Store._backfill_chains` (what an open
    of a pre-chain store runs) is timed against a plain `SELECT rowid, * FROM events`
    scan of the same rows in the same file (warm page cache, best of two); the ratio is
    backfill / scan. The open-time check of a store whose chain is current is timed too.
(b) Apply: `Store.apply_remote` of M ops in pages of 500 into a fresh replica, with the
    chain vs with it switched off (`chaining._ENABLED`, a private switch), best of three,
    interleaved; the ratio is with / without.

Usage: python benchmarks/chain_backfill.py [--ops 100000] [--apply-ops 20000] [--json]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Bench, BenchError, machine, positive_int, run_main  # noqa: E402
from workload import AGENTS, ROOMS, STREAMS, build_origin, fake_patch  # noqa: E402

from logsync import model  # noqa: E402
from logsync.pagechain import CHECKPOINT  # noqa: E402
from logsync.store import INSERT_ARTIFACT, INSERT_EVENT, Store, chaining  # noqa: E402

PAGE = 500
BUILD_CHUNK = 20_000
PATCH_EVERY = 40
T0_MS = 1_790_000_000_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=positive_int, default=100_000,
                        help="ops in the store to backfill (the issue's figure: 1000000)")
    parser.add_argument("--apply-ops", type=positive_int, default=20_000,
                        help="ops applied with and without the chain")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    return parser.parse_args(argv)


def build_unchained(palace: Path, ops: int, seed: int = 11) -> Store:
    """N ops of one origin written straight into a store's tables (no chain entries)."""
    rng = random.Random(seed)
    store = Store.open(palace, check=False)
    rid = store.replica_id
    seq = 0
    while seq < ops:
        events, arts, links = [], [], []
        for _ in range(min(BUILD_CHUNK, ops - seq)):
            seq += 1
            ms = T0_MS + seq
            eid = f"evt_20260901T000000_{seq:012x}"
            events.append((
                eid, rng.choice(("task.request", "task.reply", "event.ack", "patch.ready")),
                rng.choice(STREAMS), rng.choice(ROOMS), None, rng.choice(AGENTS),
                rng.choice(AGENTS), f"task_{seq // 4}", None, None,
                rng.choice(("open", "ready", "applied", None)),
                "Please look at the flaky test in search ranking. " * rng.randint(2, 60),
                model.utc_now_iso(ms), '{"attempt": 1}', rid, seq, f"{ms:013d}-000000-{rid}",
            ))
            if seq % PATCH_EVERY == 0:
                content = fake_patch(rng, rng.randint(20, 400))
                aid = f"art_20260901T000000_{seq:012x}"
                arts.append((aid, "patch", model.sha256_hex(content), len(content.encode()),
                             content, "pi@laptop", model.utc_now_iso(ms), "{}", rid))
                links.append((eid, aid))
        with store._atomic(durable=False) as conn:
            conn.executemany(INSERT_ARTIFACT, arts)
            conn.executemany(INSERT_EVENT, events)
            conn.executemany("INSERT INTO event_artifacts VALUES (?, ?)", links)
    return store


def time_scan(db: Path) -> float:
    conn = sqlite3.connect(db)
    try:
        start = time.perf_counter()
        rows = 0
        for _row in conn.execute("SELECT rowid, * FROM events ORDER BY rowid"):
            rows += 1
        return time.perf_counter() - start
    finally:
        conn.close()


def measure_backfill(root: Path, ops: int) -> dict[str, Any]:
    chaining._ENABLED = False
    try:
        store = build_unchained(root / "backfill", ops)
    finally:
        chaining._ENABLED = True
    try:
        time_scan(store.db_path)  # warm the page cache for both
        scan = time_scan(store.db_path)
        key, store.signing_key = store.signing_key, None  # the chain alone first
        start = time.perf_counter()
        written = store._backfill_chains()
        backfill = time.perf_counter() - start
        store.signing_key = key
        start = time.perf_counter()
        again = store._backfill_chains()  # now signs our own checkpoints and tip, once
        current_and_sign = time.perf_counter() - start
        start = time.perf_counter()
        store._backfill_chains()
        current = time.perf_counter() - start
        signed = sum(1 for s in range(CHECKPOINT, ops + 1, CHECKPOINT)
                     if store.chain_signature(store.replica_id, s) is not None)
        scan = min(scan, time_scan(store.db_path))
        tip = store.chain_tip(store.replica_id)
    finally:
        store.close()
    if written != ops or again != 0 or tip is None or tip[0] != ops:
        raise BenchError(f"backfill wrote {written} entries for {ops} ops (then {again}), "
                         f"tip {tip and tip[0]}")
    size = (root / "backfill" / "logstream.sqlite3").stat().st_size
    if signed != ops // CHECKPOINT:
        raise BenchError(f"{signed} of {ops // CHECKPOINT} own checkpoints signed")
    return {"ops": ops, "db_bytes": size, "scan_s": scan, "backfill_s": backfill,
            "ratio_backfill_scan": backfill / scan, "current_check_s": current,
            "sign_own_s": max(0.0, current_and_sign - current), "signed_checkpoints": signed,
            "backfill_ops_per_s": ops / backfill}


def pages(origin: Store) -> list[tuple[list[dict], list[dict]]]:
    out, after = [], 0
    while ops := origin.list_ops(origin.replica_id, after, PAGE):
        out.append((ops, origin.get_artifacts({a for op in ops for a in op["artifact_ids"]})))
        after = ops[-1]["origin_seq"]
    return out


def time_apply(work: list[tuple[list[dict], list[dict]]], palace: Path, chained: bool) -> float:
    chaining._ENABLED = chained
    try:
        replica = Store.open(palace, check=False)
        try:
            start = time.perf_counter()
            for ops, arts in work:
                replica.apply_remote(ops, arts)
            elapsed = time.perf_counter() - start
            held = replica.counts()["events"]
        finally:
            replica.close()
    finally:
        chaining._ENABLED = True
    expected = sum(len(ops) for ops, _ in work)
    if held != expected:
        raise BenchError(f"the replica holds {held} events, expected {expected}")
    return elapsed


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    root = bench.root
    result: dict[str, Any] = {"machine": machine()}
    result["backfill"] = measure_backfill(root, args.ops)
    origin = build_origin(root / "origin", args.apply_ops, max(1, args.apply_ops // PATCH_EVERY))
    work = pages(origin)
    origin.close()
    with_chain, without = [], []
    for i in range(3):  # interleaved, so a busy machine skews both alike
        without.append(time_apply(work, root / f"plain{i}", chained=False))
        with_chain.append(time_apply(work, root / f"chain{i}", chained=True))
    n = args.apply_ops
    result["apply"] = {
        "ops": n, "pages": len(work),
        "without_s": min(without), "with_s": min(with_chain),
        "without_ops_per_s": n / min(without), "with_ops_per_s": n / min(with_chain),
        "ratio_with_without": min(with_chain) / min(without),
    }
    return result


def render(r: dict[str, Any]) -> list[str]:
    b, a, m = r["backfill"], r["apply"], r["machine"]
    return [
        f"machine: {m['cpus']} cpus, load {m['loadavg_1m']}, python {m['python']}",
        f"backfill: {b['ops']} ops ({b['db_bytes'] / 1e6:.0f} MB store)",
        f"  SELECT scan of the events  : {b['scan_s']:8.2f} s",
        f"  chain backfill             : {b['backfill_s']:8.2f} s "
        f"({b['backfill_ops_per_s']:.0f} ops/s)",
        f"  ratio backfill / scan      : {b['ratio_backfill_scan']:8.2f}x",
        f"  open-time check, chain current: {b['current_check_s'] * 1000:.1f} ms",
        f"  signing our own {b['signed_checkpoints']} checkpoints and tip once: "
        f"{b['sign_own_s']:.2f} s",
        f"apply: {a['ops']} ops in {a['pages']} pages of {PAGE}",
        f"  without the chain          : {a['without_s']:8.3f} s "
        f"({a['without_ops_per_s']:.0f} ops/s)",
        f"  with the chain             : {a['with_s']:8.3f} s ({a['with_ops_per_s']:.0f} ops/s)",
        f"  ratio with / without       : {a['ratio_with_without']:8.3f}x",
    ]


def main(argv: list[str] | None = None) -> int:
    return run_main("chain_backfill", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())
