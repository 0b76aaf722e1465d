"""How far a running round has got, read from its live report: one rule for the `sync`
display, the daemon's catch-up log lines and the `catchup` entry `status` shows.

A pull's report (`RoundReport`) and a push's (`PushReport`) both hold per-origin
progress with `start`, `target` and `reached`; done is the sum of `reached - start`,
total the sum of `target - start` (what the peer's vector promised, or what we offered).
Both are plain data the round updates as it goes, so a watcher only reads them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

log = logging.getLogger("logsync.progress")

EVERY_S = 5.0  # a log line (not a terminal) or a saved catch-up entry this often


@dataclass(frozen=True)
class Snapshot:
    done: int
    total: int
    per_origin: dict[str, tuple[int, int]]  # origin -> (done, total)


def snapshot(report: Any) -> Snapshot:
    """Done and total ops of a pull or push report, now."""
    per: dict[str, tuple[int, int]] = {}
    for origin, p in list(report.origins.items()):
        total = max(0, p.target - p.start)
        per[origin] = (min(max(0, p.reached - p.start), total), total)
    return Snapshot(sum(d for d, _ in per.values()), sum(t for _, t in per.values()), per)


def rate_and_eta(done: int, total: int, elapsed: float) -> tuple[float, float | None]:
    """Ops per second so far, and seconds left at that rate (None before any op)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    return rate, ((total - done) / rate if rate > 0 else None)


def line(verb: str, peer: str, snap: Snapshot, elapsed: float) -> str:
    """`pulling from desk: 65000/200000 ops (13000 ops/s, about 10 s left)`."""
    rate, eta = rate_and_eta(snap.done, snap.total, elapsed)
    left = f", about {eta:.0f} s left" if eta is not None and snap.done < snap.total else ""
    return f"{verb} {peer}: {snap.done}/{snap.total} ops ({rate:.0f} ops/s{left})"


async def watch(report: Any, verb: str, peer: str, *, terminal: bool,
                emit: Callable[[str], None] | None = None) -> None:
    """Show a round's progress until cancelled: a rich display per origin on a terminal,
    else a line every `EVERY_S` seconds once the round has something to show."""
    began = time.monotonic()
    if terminal:
        try:
            await _rich(report, verb, peer, began)
            return
        except Exception as exc:  # noqa: BLE001 - a display fault stays with the display
            log.warning("progress display failed (%s: %s); showing lines instead",
                        type(exc).__name__, exc)
    say = emit or (lambda text: print(text, file=sys.stderr, flush=True))
    while True:
        await anyio.sleep(EVERY_S)
        snap = snapshot(report)
        if snap.total:
            say(line(verb, peer, snap, time.monotonic() - began))


async def _rich(report: Any, verb: str, peer: str, began: float) -> None:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeRemainingColumn())
    tasks: dict[str, TaskID] = {}
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        while True:
            snap = snapshot(report)
            elapsed = time.monotonic() - began
            for origin, (done, total) in snap.per_origin.items():
                if origin not in tasks:
                    tasks[origin] = bar.add_task(f"{verb} {peer} {origin[:12]}", total=total,
                                                 rate="")
                rate, _ = rate_and_eta(done, total, elapsed)
                bar.update(tasks[origin], completed=done, total=total, rate=f"{rate:.0f} ops/s")
            await anyio.sleep(0.2)


def daemon_logger(log: logging.Logger) -> Callable[[str], None]:
    return lambda text: log.info("%s", text)
