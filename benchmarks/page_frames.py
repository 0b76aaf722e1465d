"""Taking page frames: one transaction per stream write against one per page.

A subscriber's stream delivers small page frames (an op or a few, each a page of one
origin) several to a write. Builds `--origins` origins of `--events` ops each (ids that
the origin's key does not certify, as in the simulator, or `--certified` ones, whose
signatures the subscriber checks), relayed by one peer; then takes the same writes of
`--per-write` one-op pages on fresh subscribers
(a) with `streamframes.take_pages` (one `Store.batch` transaction per write), and
(b) page by page with `streamframes.take_page` (one transaction per page).
Prints microseconds per page for each, best of `--repeat`, and (b)/(a).

Usage: python benchmarks/page_frames.py [--events N] [--per-write K] [--certified]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import positive_int  # noqa: E402

from logsync import streamframes  # noqa: E402
from logsync.responder import push_page  # noqa: E402
from logsync.store import Store  # noqa: E402


def build(root: Path, origins: int, events: int, certified: bool) -> list[Store]:
    rng = random.Random(1)
    stores = []
    for index in range(origins + 1):  # the first relays the others' ops
        rid = None if certified else f"rep_{rng.getrandbits(128):032x}"
        store = Store.open(root / f"o{index}", replica_id=rid)
        for seq in range(events):
            store.append_event("task.request", "s", "r", "a@b", body=f"op {seq} " + "x" * 200)
        stores.append(store)
    return stores


def writes(stores: list[Store], events: int, per_write: int) -> list[list[bytes]]:
    """Writes of `per_write` one-op pages, origins in turn, as a relay's stream sends."""
    relay, origins = stores[0].replica_id, stores[1:]
    pages = [push_page(o, o.replica_id, seq, 1, 1 << 20, relay).body
             for seq in range(events) for o in origins]
    return [pages[i:i + per_write] for i in range(0, len(pages), per_write)]


def timed(root: Path, name: str, work: list[list[bytes]], relay: str, together: bool) -> float:
    with Store.open(root / name) as sub:
        start = time.perf_counter()
        for write in work:
            if together:
                streamframes.take_pages(sub, write, relay)
            else:
                for page in write:
                    streamframes.take_page(sub, page, relay)
        elapsed = time.perf_counter() - start
        held = sum(sub.version_vector().values())
    if held != sum(len(w) for w in work):
        raise SystemExit(f"{name}: the subscriber holds {held} ops, not every op sent")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=positive_int, default=600, help="ops per origin")
    parser.add_argument("--origins", type=positive_int, default=2)
    parser.add_argument("--per-write", type=positive_int, default=2, help="pages per write")
    parser.add_argument("--repeat", type=positive_int, default=5)
    parser.add_argument("--certified", action="store_true",
                        help="self-certifying ids: the subscriber verifies each signature")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="logsync-bench-") as tmp:
        root = Path(tmp)
        stores = build(root, args.origins, args.events, args.certified)
        work = writes(stores, args.events, args.per_write)
        relay = stores[0].replica_id
        best = {True: float("inf"), False: float("inf")}
        for run in range(args.repeat):  # interleaved, so both meet the same load
            for together in (True, False):
                name = f"{'batch' if together else 'each'}{run}"
                best[together] = min(best[together], timed(root, name, work, relay, together))
        for store in stores:
            store.close()
    pages = sum(len(w) for w in work)
    per = {k: v / pages * 1e6 for k, v in best.items()}
    print(f"pages={pages} per_write={args.per_write} certified={args.certified} "
          f"best of {args.repeat}")
    print(f"(a) one transaction per write : {per[True]:7.1f} us/page")
    print(f"(b) one transaction per page  : {per[False]:7.1f} us/page")
    print(f"ratio (b)/(a)                 : {per[False] / per[True]:7.2f}x")


if __name__ == "__main__":
    main()
