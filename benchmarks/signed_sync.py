"""What chains and signatures cost (issue 10): append and bootstrap, each against the
same work without them, measured in one run.

(a) Append: `Store.append_event` (durable, one transaction each) with the palace's key
    signing every op vs with no key (`store.signing_key = None`), best of three,
    interleaved; the ratio is signed / unsigned.
(b) Bootstrap: a fresh replica pulls N ops (one origin, one in 40 naming a patch) from a
    logsync peer through the real engine and responder, every answer msgpack-encoded and
    decoded as on the wire, pages of 5000. Three ways, interleaved, best of three:
    `plain`: no chain at all (the chain switched off, no `chain` extension: what a
    replica did before issue 10); `chain`: chains and tips, the origin unsigned (its key
    withheld); `signed`: chains and signatures, verified per page. Ratios against plain.

Usage: python benchmarks/signed_sync.py [--ops 20000] [--appends 300] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Bench, BenchError, machine, positive_int, run_main  # noqa: E402
from workload import build_origin  # noqa: E402

from logsync.effects import STORE_EFFECTS, perform  # noqa: E402
from logsync.engine import pull_round  # noqa: E402
from logsync.errors import PeerError  # noqa: E402
from logsync.responder import LOGSYNC_SERVER, Profile, answer  # noqa: E402
from logsync.store import Store, chaining  # noqa: E402
from logsync.wire import EXT_CHAIN, Batch, Request  # noqa: E402

PATCH_EVERY = 40
WAYS = ("plain", "chain", "signed")
UNCHAINED = Profile(extensions=tuple(e for e in LOGSYNC_SERVER.extensions if e != EXT_CHAIN))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=positive_int, default=20_000, help="ops bootstrapped")
    parser.add_argument("--appends", type=positive_int, default=300, help="appends timed")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (debugging)")
    return parser.parse_args(argv)


class WirePeer:
    """A peer in this process: the responder's answers, msgpack-encoded and decoded."""

    def __init__(self, store: Store, profile: Profile, withhold_keys: bool) -> None:
        self.store, self.profile, self.withhold_keys = store, profile, withhold_keys
        self.bytes = 0

    def __call__(self, request: Request) -> Any:
        status, body = answer(self.store, request.path, request.params, profile=self.profile)
        if status == 404 and request.missing_ok:
            return None
        if status != 200:
            raise BenchError(f"{request.path} answered {status}: {body}")
        if self.withhold_keys and request.path == "/sync/version_vector":
            body["logsync"].pop("keys", None)
        if self.withhold_keys and "chain" in body:
            body["chain"]["sigs"] = []
        data = msgpack.packb(body, use_bin_type=True)
        self.bytes += len(data)
        return msgpack.unpackb(data, raw=False, strict_map_key=False)


def drive(round_gen: Any, peer: WirePeer, store: Store) -> Any:
    try:
        step = next(round_gen)
        while True:
            if isinstance(step, STORE_EFFECTS):
                reply: Any = perform(store, step)
            elif isinstance(step, Batch):
                reply = [_one(peer, r) for r in step.requests]
            else:
                reply = peer(step)
            step = round_gen.send(reply)
    except StopIteration as stop:
        return stop.value


def _one(peer: WirePeer, request: Request) -> Any:
    try:
        return peer(request)
    except PeerError as exc:
        return exc


def time_bootstrap(origin: Store, palace: Path, way: str, ops: int) -> tuple[float, int]:
    chaining._ENABLED = way != "plain"
    try:
        replica = Store.open(palace, check=False)
        peer = WirePeer(origin, UNCHAINED if way == "plain" else LOGSYNC_SERVER,
                        withhold_keys=way == "chain")
        try:
            start = time.perf_counter()
            while replica.version_vector().get(origin.replica_id, 0) < ops:
                report = drive(pull_round(replica.replica_id, "bench", batch_artifacts=True),
                               peer, replica)
                if report.total("applied") == 0:
                    raise BenchError(f"{way}: a round applied nothing: "
                                     f"{report.origins[origin.replica_id].stop_reason}")
            elapsed = time.perf_counter() - start
            signed = replica.chain_signature(origin.replica_id, ops) is not None
        finally:
            replica.close()
    finally:
        chaining._ENABLED = True
    if signed != (way == "signed"):
        raise BenchError(f"{way}: the replica's tip signature is {'' if signed else 'not '}held")
    return elapsed, peer.bytes


def time_appends(palace: Path, count: int, signed: bool) -> float:
    store = Store.open(palace, check=False)
    if not signed:
        store.signing_key = None  # local appends then write no signature
    try:
        start = time.perf_counter()
        for i in range(count):
            store.append_event("task.ask", "s", "r", "alice", body=f"append {i}")
        elapsed = time.perf_counter() - start
        held = store.chain_signature(store.replica_id, count)
    finally:
        store.close()
    if (held is not None) != signed:
        raise BenchError(f"append signed={signed}: the last op's signature is {held!r}")
    return elapsed


def measure(args: argparse.Namespace, bench: Bench) -> dict[str, Any]:
    root = bench.root
    result: dict[str, Any] = {"machine": machine()}
    times: dict[str, list[float]] = {"signed": [], "unsigned": []}
    for i in range(3):
        times["unsigned"].append(time_appends(root / f"au{i}", args.appends, signed=False))
        times["signed"].append(time_appends(root / f"as{i}", args.appends, signed=True))
    result["append"] = {"ops": args.appends, "unsigned_s": min(times["unsigned"]),
                        "signed_s": min(times["signed"]),
                        "ratio": min(times["signed"]) / min(times["unsigned"])}
    origin = build_origin(root / "origin", args.ops, max(1, args.ops // PATCH_EVERY))
    if origin.chain_signature(origin.replica_id, args.ops) is None:
        raise BenchError("the origin's tip is not signed")
    boot: dict[str, list[float]] = {way: [] for way in WAYS}
    wire: dict[str, int] = {}
    try:
        for i in range(3):
            for way in WAYS:
                elapsed, sent = time_bootstrap(origin, root / f"{way}{i}", way, args.ops)
                boot[way].append(elapsed)
                wire[way] = sent
    finally:
        origin.close()
    best = {way: min(t) for way, t in boot.items()}
    result["bootstrap"] = {
        "ops": args.ops, **{f"{way}_s": best[way] for way in WAYS},
        **{f"{way}_wire_bytes": wire[way] for way in WAYS},
        "ratio_chain_plain": best["chain"] / best["plain"],
        "ratio_signed_plain": best["signed"] / best["plain"],
    }
    return result


def render(r: dict[str, Any]) -> list[str]:
    a, b, m = r["append"], r["bootstrap"], r["machine"]
    return [
        f"machine: {m['cpus']} cpus, load {m['loadavg_1m']}, python {m['python']}",
        f"append: {a['ops']} durable appends",
        f"  unsigned                 : {a['unsigned_s']:8.3f} s",
        f"  signed                   : {a['signed_s']:8.3f} s",
        f"  ratio signed / unsigned  : {a['ratio']:8.3f}x",
        f"bootstrap: {b['ops']} ops from a logsync peer (engine + responder, msgpack)",
        *(f"  {way:<25}: {b[f'{way}_s']:8.3f} s  ({b[f'{way}_wire_bytes'] / 1e6:.1f} MB)"
          for way in WAYS),
        f"  ratio chain / plain      : {b['ratio_chain_plain']:8.3f}x",
        f"  ratio signed / plain     : {b['ratio_signed_plain']:8.3f}x",
    ]


def main(argv: list[str] | None = None) -> int:
    return run_main("signed_sync", parse_args(argv), measure, render)


if __name__ == "__main__":
    sys.exit(main())
